"""The store's format version: which format its records are in, which one processes write,
and the check every process makes before it serves.

One key holds it, `<p>:format` (a hash; `parking.keys`): `version`, the format every record
is in (migrations bring records up to it); `writing`, the format processes write now
(`version`, or the next one while a deployment rolls: see `layby.parking.migrations`);
and a running migration's cursors and counts.

A store without the key is either empty (the first process to see it stamps the newest
format this code knows) or was written by layby 0.1.0, which kept no version: it is read
only after `layby migrate` (migration 1) has run. Code reads the newest format it knows
and the one before it, so that two consecutive versions of layby can share a store while
a deployment is rolled one process at a time.

The key also holds the store's layout: `shards`, how many shards a store made on a cluster
has (LAYBY_STORE_SHARDS when it was made; `parking.shards`), absent for the one-shard
layout of a store on one server. A process reads it before anything else (`keys_of`);
one given another number refuses to start. (layby 0.2.0 cannot reach a cluster at all.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from importlib import metadata
from typing import cast

from redis import Redis

from layby.errors import ConfigError
from layby.parking.keys import Keys
from layby.wire import Status

FIRST = 1  # the format of layby 0.2.0, which migration 1 brings a store of 0.1.0 to
# How old a process's idea of the format it writes may be (`Store.writing`): a switch
# reaches every process within it, so a migration waits that long after one.
FRESH_S = 5.0


class FormatError(ConfigError):
    """The store's format is not one this code reads: nothing is served until it is."""


@dataclass(frozen=True)
class FormatState:
    """What `<p>:format` says; `version` None: the store has no version (empty, or 0.1.0's)."""

    version: int | None
    writing: int | None
    migrating: int | None = None  # the migration under way, if one is
    shards: int | None = None  # the sharded layout's shard count (None: one, the legacy)

    @property
    def written(self) -> int | None:
        """The format records are written in now."""
        return self.writing if self.writing is not None else self.version


def reads(newest: int) -> range:
    """The formats code whose newest is `newest` reads: that one and the one before (but
    not 0, a store without a version: migration 1 reads it, nothing else does)."""
    return range(max(1, newest - 1), newest + 1)


def read(client: Redis, keys: Keys) -> FormatState:
    raw = cast("list[str | None]", client.hmget(keys.format, "version", "writing",
                                                 "migrating", "shards"))
    version, writing, migrating, shards = (int(v) if v else None for v in raw)
    return FormatState(version, writing, migrating, shards)


def keys_of(client: Redis, prefix: str) -> Keys:
    """The store's keys under `prefix`, in the layout its format key says (the format key
    is named the same in every layout)."""
    return Keys(prefix, read(client, Keys(prefix)).shards)


def has_data(client: Redis, keys: Keys) -> bool:
    """Whether any run is indexed (every run is in one state's index of its shard while its
    keys live): a store without runs has nothing to migrate."""
    return bool(client.exists(*(shard.index(s) for shard in keys.shards for s in Status)))


def readable(state: FormatState, newest: int, *, empty: bool) -> str | None:
    """Why code whose newest format is `newest` cannot serve a store in `state` (None when
    it can). One line, saying what to run."""
    known = reads(newest)
    span = f"format {known.start}" if len(known) == 1 else \
        f"formats {known.start}–{known.stop - 1}"
    me = f"layby {release()} reads {span}"
    if state.version is None:
        if empty:
            return None
        return (f"the store has no format version (written by layby 0.1.0, which kept "
                f"none); {me}: stop every layby process, run `layby migrate`, then start "
                "them again")
    if state.written not in known or state.version not in known:
        newer = max(state.version, state.written or 0) > known.stop - 1
        if newer:
            return (f"the store is at format {state.written} (written by a newer layby); "
                    f"{me}: deploy that newer version here")
        return (f"the store is at format {state.version}; {me}: run `layby migrate` with "
                f"the layby version that wrote format {state.version} (or the next one) "
                "first, then deploy this one")
    return None


def release() -> str:
    """This code's release (the installed package's version)."""
    try:
        return metadata.version("layby")
    except metadata.PackageNotFoundError:  # a checkout used without installing it
        return "unknown"


def settle_after_switch(client: Redis, keys: Keys) -> float:
    """Wait until every process writes the format the store switched to (FRESH_S after
    the switch, by the server's clock), so that a migration's scan is not followed by
    records written in the format before; returns the seconds waited."""
    raw = cast("str | None", client.hget(keys.format, "switched_at"))
    if not raw:
        return 0.0
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    left = (int(raw) + (FRESH_S + 1) * 1000 - now_ms) / 1000
    if left > 0:
        time.sleep(left)
    return max(0.0, left)


def check(client: Redis, keys: Keys, newest: int, *, shards: int | None = None
          ) -> FormatState:
    """The store's format, for code whose newest format is `newest`: raises `FormatError`
    (one line: which formats it reads and what to run) when it cannot read it. An empty
    store without a version is stamped with `newest`, and with `shards` when given (a
    cluster's store, or LAYBY_STORE_SHARDS set: the sharded layout), first come first
    served; a store whose layout is not that is refused (`layout_problem`)."""
    state = read(client, keys)
    if state.version is None and not has_data(client, keys):
        with client.pipeline(transaction=True) as pipe:
            # One MULTI: the first process's version and layout, or neither.
            pipe.hsetnx(keys.format, "version", newest)
            if shards is not None:
                pipe.hsetnx(keys.format, "shards", shards)
            pipe.execute()
        state = read(client, keys)
    why = readable(state, newest, empty=False) or layout_problem(state, shards)
    if why is not None:
        raise FormatError(why, code="store_format")
    return state


def layout_problem(state: FormatState, shards: int | None) -> str | None:
    """Why a process that wants `shards` shards cannot serve a store in `state` (None when
    it can). One that wants none in particular (None: a store on one server, without
    LAYBY_STORE_SHARDS) takes the store's layout as it is."""
    if shards is None or state.shards == shards or state.version is None:
        return None  # (a store without a version has no layout yet: the first stamps it)
    if state.shards is None:
        return (f"the store has the one-shard layout of a store made on one server, and "
                f"this process is set for {shards} shards (LAYBY_STORE_SHARDS, or a cluster "
                "URL): a store's layout is fixed when it is made; unset LAYBY_STORE_SHARDS")
    return (f"the store was made with {state.shards} shards and this process is set for "
            f"{shards}: a store's shard count is fixed when it is made; set "
            f"LAYBY_STORE_SHARDS={state.shards} on every process")
