"""Migration 2: a store of format 1 in the legacy layout (layby 0.2.0's, on one server) in
the sharded layout, format 2 (`parking.keys`: `Keys(prefix, shards)`).

A store made by this layby is in the sharded layout from the start (format 2, `shards` in
its format key); so is one made on a cluster at format 1 (`shards` without `sharded_at`):
this migration has nothing to move there, and only sets the version.

A store of 0.2.0 moves online. The switch to writing format 2 (`switch_format.lua`) gives
it its shard count and its layout instant (`sharded_at`); from that instant on every
process makes new runs in the sharded layout and moves a run still in the legacy one
before anything else it does with it (`lua/move_run.lua`, `parking.store:Store.keys_of`).
`layby migrate` waits for the instant (`formats.settle_after_switch`), then:

- its scan moves every run still in the legacy layout with the same script (`{*}:run`:
  the legacy run hashes), and every idempotency key (`idem:*`, into the shard of the key,
  where a start with it looks) and grant (`grant:*`, into the shard of its ref, where a
  token's reader looks) with `move_key.lua`, their lifetimes kept;
- then (`finish`) what no key it scanned carries: entries the legacy shard's sorted sets
  still hold (an index entry, a deadline, a lease, a notification due, an outbox entry) go
  to the shard of their run when the run is in the sharded layout, and are dropped when it
  is gone (past retention: as the sweeper would prune them); the legacy counters are added
  to shard 0's (`merge_stats.lua`); the legacy registry of processes is merged into the
  sharded one's (a process dead before the instant is still reaped); the legacy shard's
  keys are deleted (its queue numbers and fold cursor too: a moved run has no number, and
  every shard's fold starts over, so that runs moved after their shard's fold passed their
  park are folded too); then every run still waiting is put in the reviewers' request
  index (`asks`: in the legacy layout there was none); and only then is the version set
  to 2.

Without a switch (a store no process serves: `layby up`'s own before its parts start, or a
store of 0.1.0 migrated straight on), `prepare` gives the store its shard count and a
layout instant of now.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import Any, cast

from redis import Redis

from layby.parking import formats
from layby.parking.keys import Keys, ShardKeys
from layby.parking.migrations import asks, m0001_versioned
from layby.parking.migrations.registry import Migration, register
from layby.parking.scripts import standalone
from layby.parking.shards import DEFAULT_COUNT
from layby.wire import Status

# Members of the legacy shard's sorted sets read at a time by `finish`.
PAGE = 1000

# The layout a `layby migrate` run moves the store to, by client and prefix: read once, as
# it prepares (a store's shard count never changes once it has one).
_TARGETS: dict[tuple[int, str], Keys] = {}


def _format(client: Redis, keys: Keys) -> formats.FormatState:
    return formats.read(client, keys)


def _sharded(client: Redis, keys: Keys) -> Keys:
    """The sharded layout the store moves to (its format key's count; the default while
    it has none: a dry run before the switch)."""
    found = _TARGETS.get((id(client), keys.prefix))
    if found is None:
        shards = _format(client, keys).shards
        found = Keys(keys.prefix, shards if shards is not None else DEFAULT_COUNT)
    return found


def prepare(client: Redis, keys: Keys, shards: int) -> None:
    """A store in the legacy layout that no switch gave a shard count gets `shards`, and a
    layout instant of now (no process serves it). One whose instant has not come yet is
    waited for (`layby migrate` waits a margin longer: `formats.settle_after_switch`):
    before it, processes still make runs in the legacy layout."""
    if client.hsetnx(keys.format, "shards", shards):
        client.hset(keys.format, "sharded_at", formats.server_ms(client.time()))
    at = _format(client, keys).sharded_at
    if at is not None:
        left = (at - formats.server_ms(client.time())) / 1000
        if left > 0:
            time.sleep(left)
    _TARGETS.pop((id(client), keys.prefix), None)
    _TARGETS[(id(client), keys.prefix)] = _sharded(client, keys)


def scans(client: Redis, keys: Keys) -> bool:
    """Whether the store may hold anything in the legacy layout: not one sharded from the
    start (a shard count without a layout instant)."""
    state = _format(client, keys)
    return state.shards is None or state.sharded_at is not None


def rewrite(client: Redis, keys: Keys, key: str, dry: bool) -> bool:
    """Move a legacy run, idempotency key or grant into the sharded layout."""
    if dry:
        return bool(client.exists(key))
    name = key.removeprefix(f"{keys.prefix}:")
    sharded = _sharded(client, keys)
    if name.startswith(("idem:", "grant:")):
        kind, _, of = name.partition(":")
        shard = sharded.shard_of(of)
        to = shard.idempotency(of) if kind == "idem" else shard.grant(of)
        return bool(standalone(client, "move_key")(keys=[key, to]) == "moved")
    run_id = key[key.index("{") + 1:key.rindex("}")]
    reply = standalone(client, "move_run")(
        keys=[*keys.for_scripts(run_id), *sharded.for_scripts(run_id)])
    return bool(reply[0] == "moved")


def finish(client: Redis, keys: Keys, dry: bool) -> tuple[int, int]:
    """What the scan leaves in the legacy shard, moved or dropped, and the legacy shard's
    keys deleted; then every waiting run in the reviewers' request index
    (`asks.index_waiting`). Returns (what it looked at, what it changed), or would."""
    sharded = _sharded(client, keys)
    if not scans(client, keys):
        return asks.index_waiting(client, sharded, dry)
    seen, changed = _finish_legacy(client, keys, sharded, dry)
    indexed = asks.index_waiting(client, sharded, dry)
    return seen + indexed[0], changed + indexed[1]


def _finish_legacy(client: Redis, keys: Keys, sharded: Keys, dry: bool) -> tuple[int, int]:
    old = keys.legacy
    found = 0
    for status in Status:
        found += _members(client, keys, sharded, old.index(status), dry,
                          lambda shard, status=status: shard.index(status),
                          lambda member: member)
    found += _members(client, keys, sharded, old.leases, dry, lambda shard: shard.leases,
                      lambda member: member)
    found += _members(client, keys, sharded, old.retries, dry, lambda shard: shard.retries,
                      lambda member: member)
    found += _members(client, keys, sharded, old.deadlines, dry,
                      lambda shard: shard.deadlines, _first_word)
    found += _members(client, keys, sharded, old.notify_due, dry,
                      lambda shard: shard.notify_due, _first_word)
    found += _outbox(client, keys, sharded, dry)
    counters = int(client.hlen(old.stats))
    registry = int(client.zcard(keys.workers)) + int(client.hlen(keys.workers_about)) \
        + int(client.hlen(keys.hosting))
    rest = [old.queues, old.fold_cursor]
    left = int(client.exists(*rest))
    if dry:
        return (found + counters + registry + left,
                found + (counters > 0) + (registry > 0) + left)
    if counters:
        standalone(client, "merge_stats")(keys=[old.stats, sharded.shards[0].stats])
    while names := cast("list[str]", client.zrange(keys.workers, 0, PAGE - 1)):
        _move(client, keys.workers, sharded.workers, names, False,
              (keys.workers_about, sharded.workers_about, keys.hosting, sharded.hosting))
    client.delete(keys.workers_about, keys.hosting, *rest,
                  *(old.index(s) for s in Status), old.leases, old.retries, old.deadlines,
                  old.notify_due,
                  old.outbox, old.outbox_entries, old.stats)
    client.delete(*(shard.fold_cursor for shard in sharded.shards))
    _TARGETS.pop((id(client), keys.prefix), None)
    return (found + counters + registry + left,
            found + (counters > 0) + (registry > 0) + left)


def _first_word(member: str) -> str:
    """The run of a member "<run id> <other id>"."""
    return member.split(" ", 1)[0]


def _move(client: Redis, source: str, target: str, members: list[str], drop: bool,
          hashes: tuple[str, ...] = ()) -> int:
    return int(standalone(client, "move_members")(keys=[source, target, *hashes],
                                                  args=["members", json.dumps(members),
                                                        "drop", "1" if drop else "0"]))


def _where(client: Redis, keys: Keys, sharded: Keys, run_ids: list[str]) -> list[bool]:
    """Whether each run is in the sharded layout, once moved if it was still in the
    legacy one (a run made there after the scan passed it: by a process a round trip
    late to the layout instant)."""
    pipe = client.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.exists(keys.run(run_id))
    legacy = [run_id for run_id, there in zip(run_ids, pipe.execute(), strict=True) if there]
    for run_id in legacy:
        standalone(client, "move_run")(keys=[*keys.for_scripts(run_id),
                                             *sharded.for_scripts(run_id)])
    pipe = client.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.exists(sharded.run(run_id))
    return [bool(there) for there in pipe.execute()]


def _members(client: Redis, keys: Keys, sharded: Keys, source: str, dry: bool,
             target: Any, run_of: Any) -> int:
    """Every member of the legacy sorted set `source`, moved to `target(shard)` of its
    run's shard (`run_of(member)`), or dropped when its run is gone. Dry: how many would be
    (those of runs the scan does not move: not in the legacy layout)."""
    if dry:
        return _left(client, keys, [run_of(m) for m, _ in client.zscan_iter(source)])
    done = 0
    while members := cast("list[str]", client.zrange(source, 0, PAGE - 1)):
        runs = [run_of(m) for m in members]
        groups: dict[tuple[str, bool], list[str]] = defaultdict(list)
        for member, run_id, there in zip(members, runs, _where(client, keys, sharded, runs),
                                         strict=True):
            groups[(target(sharded.shard_of(run_id)), not there)].append(member)
        for (to, drop), group in groups.items():
            done += _move(client, source, to, group, drop)
            client.zrem(source, *group)  # (one a move found gone meanwhile)
    return done


def _outbox(client: Redis, keys: Keys, sharded: Keys, dry: bool) -> int:
    """The legacy outbox's entries, each moved with its record to its run's shard (the
    record's first argument), or dropped when its run is gone or it has no record."""
    old: ShardKeys = keys.legacy
    if dry:
        ids = [entry_id for entry_id, _ in client.zscan_iter(old.outbox)]
        records = cast("list[str | None]", client.hmget(old.outbox_entries, ids)) \
            if ids else []
        return _left(client, keys, [_run_of_entry(record) or "" for record in records])
    done = 0
    while ids := cast("list[str]", client.zrange(old.outbox, 0, PAGE - 1)):
        records = cast("list[str | None]", client.hmget(old.outbox_entries, ids))
        runs = [_run_of_entry(record) for record in records]
        there = _where(client, keys, sharded, [r or "" for r in runs])
        groups: dict[tuple[ShardKeys, bool], list[str]] = defaultdict(list)
        for entry_id, run_id, is_there in zip(ids, runs, there, strict=True):
            groups[(sharded.shard_of(run_id or entry_id),
                    run_id is None or not is_there)].append(entry_id)
        for (shard, drop), group in groups.items():
            done += _move(client, old.outbox, shard.outbox, group, drop,
                          (old.outbox_entries, shard.outbox_entries))
            client.zrem(old.outbox, *group)
    return done


def _left(client: Redis, keys: Keys, run_ids: list[str]) -> int:
    """How many of `run_ids` are not in the legacy layout (their entries are left for
    `finish`: the scan's moves carry the others)."""
    left = 0
    for at in range(0, len(run_ids), PAGE):
        pipe = client.pipeline(transaction=False)
        for run_id in run_ids[at:at + PAGE]:
            pipe.exists(keys.run(run_id))
        left += sum(not there for there in pipe.execute())
    return left


def _run_of_entry(record: str | None) -> str | None:
    if not record:
        return None
    try:
        run_id = json.loads(record)["args"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return run_id if isinstance(run_id, str) and run_id else None


assert m0001_versioned.MIGRATION.number == 1  # registered before this one
MIGRATION = register(Migration(
    2, "the sharded layout: every run, idempotency key and grant in its shard",
    ("{*}:run", "idem:*", "grant:*"), rewrite, prepare=prepare, scans=scans, finish=finish))
