"""Numbered migrations of the store's records, and the runner behind `layby migrate`.

A migration `n` takes every record from format `n - 1` to format `n` (`parking.formats`).
It names the keys it rewrites (globs after the prefix; the prefix's keys are scanned in
batches) and rewrites one key at a time, atomically and idempotently: a key already in
format `n` is left as it is, so a run that is killed and started again, or two passes over
one key, change nothing twice. Where the scan is is kept in `<p>:format` after every
batch, so a killed run goes on from its last batch; the store's `version` moves to `n`
once the scan is through. A migration may also prepare the store before its scan
(`prepare`), skip the scan when the store has nothing it rewrites (`scans`), and finish
after it (`finish`: what no scanned key carries), idempotently too.

Migrations live in this package as `m<number>_<what>.py` and register themselves
(`registry`); code reads the newest format registered and the one before it.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import cast

from redis import Redis, WatchError

from layby.errors import ConfigError
from layby.parking import formats
from layby.parking.keys import Keys
from layby.parking.migrations.registry import Migration as Migration
from layby.parking.migrations.registry import known
from layby.parking.migrations.registry import register as register
from layby.parking.shards import DEFAULT_COUNT

LOCK_MS = 30_000
DEFAULT_BATCH = 500


@dataclass
class Report:
    """What one migration did (or, dry, would do)."""

    number: int
    title: str
    seen: int = 0
    changed: int = 0
    finished: bool = False


class MigrationBusy(ConfigError):
    """Another `layby migrate` holds the store's migration lock."""


def registered() -> list[Migration]:
    _load_builtin()
    found = known()
    return [found[n] for n in sorted(found)]


def newest() -> int:
    """The newest format this code knows (the number of its last migration)."""
    _load_builtin()
    return max(known(), default=0)


def pending(state: formats.FormatState, until: int | None = None) -> list[Migration]:
    """The migrations a store in `state` has not had, up to `until` (None: all)."""
    return [m for m in registered()
            if m.number > (state.version or 0) and (until is None or m.number <= until)]


def _load_builtin() -> None:
    """Import the migrations of this package, in order (each registers itself)."""
    if not known():
        from layby.parking.migrations import m0001_versioned  # noqa: F401
    if max(known()) < 2:
        from layby.parking.migrations import m0002_sharded  # noqa: F401


def _batches(client: Redis, keys: Keys, cursor: int, batch: int
             ) -> Iterator[tuple[int, list[str]]]:
    """The store's keys, a SCAN batch at a time from `cursor`, with the cursor after each."""
    while True:
        cursor, found = cast("tuple[int, list[str]]", client.scan(
            cursor, match=f"{keys.prefix}:*", count=batch))
        yield cursor, found
        if cursor == 0:
            return


def _visited(migration: Migration, keys: Keys, found: list[str]) -> list[str]:
    """The keys of a batch the migration rewrites. (One scan of the prefix visits them
    all, and counts towards the progress bar, which then knows its length: DBSIZE.)"""
    return [k for k in found if migration.rewrites(keys, k)]


def dry_run(client: Redis, keys: Keys, *, batch: int = DEFAULT_BATCH,
            progress: Callable[[int], None] | None = None,
            until: int | None = None) -> list[Report]:
    """What `migrate` would change, counted; nothing is written."""
    keys = Keys(keys.prefix)
    state = formats.read(client, keys)
    reports = []
    for migration in pending(state, until):
        report = Report(migration.number, migration.title)
        if migration.needs_scan(client, keys):
            for _, found in _batches(client, keys, 0, batch):
                visited = _visited(migration, keys, found)
                report.seen += len(visited)
                report.changed += sum(migration.rewrite(client, keys, key, True)
                                      for key in visited)
                if progress:
                    progress(len(found))
        if migration.finish is not None:
            seen, changed = migration.finish(client, keys, True)
            report.seen += seen
            report.changed += changed
        reports.append(report)
    return reports


def migrate(client: Redis, keys: Keys, *, batch: int = DEFAULT_BATCH,
            progress: Callable[[int], None] | None = None,
            shards: int = DEFAULT_COUNT, until: int | None = None) -> list[Report]:
    """Run every pending migration in order (up to `until`: None, all), online, in
    batches; resumes where a killed run stopped. One at a time per store (a lock, renewed
    each batch). `shards`: the shard count a store gets that has none (an empty one, or
    one in the legacy layout no switch gave one: `layby migrate` switches before it
    migrates, and the switch does)."""
    keys = Keys(keys.prefix)  # (the format and the lock are named alike in every layout)
    owner = f"{socket.gethostname()}:{os.getpid()}"
    if not client.set(keys.migrate_lock, owner, nx=True, px=LOCK_MS):
        holder = cast("str | None", client.get(keys.migrate_lock))
        if holder is None or not _dead_here(holder) or not _take_over(client, keys, holder,
                                                                      owner):
            raise MigrationBusy(f"another `layby migrate` runs on this store ({holder}); wait "
                            "for it to finish (one killed on another machine: its lock lapses "
                            f"{LOCK_MS // 1000} s after)")
    try:
        state = formats.read(client, keys)
        if state.version is None and not formats.has_data(client, keys):
            formats.stamp(client, keys, newest(),
                          shards if newest() >= formats.SHARDED else None)
            return []
        return [_migrate_one(client, keys, m, owner, batch, progress, shards)
                for m in pending(state, until)]
    finally:
        # Only our own lock (it may have lapsed and been taken).
        if client.get(keys.migrate_lock) == owner:
            client.delete(keys.migrate_lock)


def _dead_here(holder: str) -> bool:
    """Whether the lock's holder was a process of this machine that is gone (killed)."""
    host, _, pid = holder.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _take_over(client: Redis, keys: Keys, holder: str, owner: str) -> bool:
    with client.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(keys.migrate_lock)  # type: ignore[no-untyped-call]
            if pipe.get(keys.migrate_lock) != holder:
                return False
            pipe.multi()
            pipe.set(keys.migrate_lock, owner, px=LOCK_MS)
            pipe.execute()
            return True
        except WatchError:
            return False


def _migrate_one(client: Redis, keys: Keys, migration: Migration, owner: str, batch: int,
                 progress: Callable[[int], None] | None, shards: int) -> Report:
    n = migration.number
    client.hset(keys.format, "migrating", n)
    if migration.prepare is not None:
        migration.prepare(client, keys, shards)
    if migration.needs_scan(client, keys):
        _scan(client, keys, migration, owner, batch, progress)
    if migration.finish is not None:
        seen, changed = migration.finish(client, keys, False)
        pipe = client.pipeline(transaction=True)
        pipe.hincrby(keys.format, f"m{n}:seen", seen)
        pipe.hincrby(keys.format, f"m{n}:changed", changed)
        pipe.execute()
    seen, changed = (int(v or 0) for v in cast("list[str | None]", client.hmget(
        keys.format, f"m{n}:seen", f"m{n}:changed")))
    pipe = client.pipeline(transaction=True)
    pipe.hset(keys.format, mapping={"version": n, f"m{n}:done": int(time.time() * 1000)})
    pipe.hdel(keys.format, "migrating", "writing", "switched_at", "sharded_at",
              f"m{n}:cursor", f"m{n}:server")
    pipe.execute()
    return Report(n, migration.title, seen, changed, finished=True)


def _scan(client: Redis, keys: Keys, migration: Migration, owner: str, batch: int,
          progress: Callable[[int], None] | None) -> None:
    """The migration's rewrites of every key of the store, a batch at a time, where the
    scan is saved after each batch."""
    n = migration.number
    # A SCAN cursor means something only to the server that made it (a restarted or
    # failed-over one orders its keys anew): one saved by another starts the scan again
    # (what was rewritten is found done).
    server = str(client.info("server").get("run_id", ""))
    at, scanned_on = cast("list[str | None]", client.hmget(keys.format, f"m{n}:cursor",
                                                           f"m{n}:server"))
    if scanned_on != server:
        at = None
        client.hset(keys.format, f"m{n}:server", server)
    if at != "done":
        for cursor, found in _batches(client, keys, int(at or 0), batch):
            visited = _visited(migration, keys, found)
            changed = sum(migration.rewrite(client, keys, key, False) for key in visited)
            # Where the scan is, after the batch's rewrites: a run killed before this line
            # does the batch again, and finds it done.
            pipe = client.pipeline(transaction=True)
            pipe.hincrby(keys.format, f"m{n}:seen", len(visited))
            pipe.hincrby(keys.format, f"m{n}:changed", changed)
            pipe.hset(keys.format, f"m{n}:cursor", cursor or "done")
            pipe.info("server")
            pipe.pexpire(keys.migrate_lock, LOCK_MS)
            replies = pipe.execute()
            if str(replies[3].get("run_id", "")) != server:
                raise MigrationBusy("the store's server changed during `layby migrate` (a "
                                    "restart or a failover): run it again, it starts its scan "
                                    "over")
            if client.get(keys.migrate_lock) != owner:
                raise MigrationBusy("this `layby migrate` lost its lock (it stalled longer "
                                    f"than {LOCK_MS // 1000} s); run it again")
            if progress:
                progress(len(found))


def finished(client: Redis, keys: Keys) -> list[Report]:
    """The migrations the store records as done, with their counts."""
    raw = cast("dict[str, str]", client.hgetall(keys.format))
    return [Report(m.number, m.title, int(raw.get(f"m{m.number}:seen", 0)),
                   int(raw.get(f"m{m.number}:changed", 0)), finished=True)
            for m in registered() if f"m{m.number}:done" in raw]
