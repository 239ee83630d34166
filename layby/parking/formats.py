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

The key also holds the store's layout: `shards`, how many shards its sharded layout has
(`parking.shards`; LAYBY_STORE_SHARDS when it was made, or when a store of format 1 switched
to format 2), absent for the legacy layout of format 1 on one server (layby 0.2.0's, one
shard). A process reads it before anything else (`layout`); one given another number
refuses to start. (layby 0.2.0 cannot reach a cluster at all.)

Format 2 is every record in the sharded layout (`SHARDED`, migration 2). A store of format
1 in the legacy layout moves to it online: the switch to writing format 2 records the shard
count and `sharded_at`, the layout instant (the server's clock, ms: FRESH_S and a margin
after the switch, by when every process has seen the switch). Before it, every process
uses the legacy layout (and looks for a run it does not find there in the sharded one:
`Layout.next`); from it on, new runs are made in the sharded layout, a run still in the
legacy one is moved there before anything is done with it, and whatever scans the shards
reads the legacy shard as one more (`Layout.legacy`), until `layby migrate` has moved the
rest and set the version to 2.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from importlib import metadata
from typing import cast

from redis import Redis

from layby.errors import ConfigError
from layby.parking.keys import Keys, ShardKeys
from layby.parking.shards import DEFAULT_COUNT
from layby.wire import Status

FIRST = 1  # the format of layby 0.2.0, which migration 1 brings a store of 0.1.0 to
SHARDED = 2  # every record in the sharded layout (migration 2)
# How old a process's idea of the format it writes may be (`Store.writing`): a switch
# reaches every process within it, so a migration waits that long after one.
FRESH_S = 5.0
# The layout instant comes this long after FRESH_S has passed since the switch: for a
# process's read of the format key on its way (a reply late, a process paused), and a
# migration begins this long after the instant.
LAYOUT_MARGIN_S = 1.0


class FormatError(ConfigError):
    """The store's format is not one this code reads: nothing is served until it is."""


@dataclass(frozen=True)
class FormatState:
    """What `<p>:format` says; `version` None: the store has no version (empty, or 0.1.0's)."""

    version: int | None
    writing: int | None
    migrating: int | None = None  # the migration under way, if one is
    shards: int | None = None  # the sharded layout's shard count (None: one, the legacy)
    # A store of format 1 moving to the sharded layout: from when on (the server's ms).
    sharded_at: int | None = None

    @property
    def written(self) -> int | None:
        """The format records are written in now."""
        return self.writing if self.writing is not None else self.version


def reads(newest: int) -> range:
    """The formats code whose newest is `newest` reads: that one and the one before (but
    not 0, a store without a version: migration 1 reads it, nothing else does)."""
    return range(max(1, newest - 1), newest + 1)


FIELDS = ("version", "writing", "migrating", "shards", "sharded_at")


def parsed(raw: list[str | None]) -> FormatState:
    """`FormatState` from an HMGET of `FIELDS`."""
    return FormatState(*(int(v) if v else None for v in raw))


def read(client: Redis, keys: Keys) -> FormatState:
    return parsed(cast("list[str | None]", client.hmget(keys.format, *FIELDS)))


@dataclass(frozen=True)
class Layout:
    """Where a store's records are, as a process sees them: `keys`, the layout its
    transitions write and new runs are made in; `legacy`, while a store of format 1 moves
    to the sharded layout (from its layout instant until it is at format 2), the legacy
    layout, whose runs are moved before anything is done with them and whose one shard
    every scan reads besides; `next`, between the switch and the layout instant, the
    sharded layout runs will move to (a run a transition does not find in `keys` may
    already be there: a process's idea of the instant is off by a round trip)."""

    keys: Keys
    legacy: Keys | None = None
    next: Keys | None = None

    @property
    def moving(self) -> bool:
        return self.legacy is not None

    @property
    def scanned(self) -> tuple[tuple[ShardKeys, Keys], ...]:
        """Every shard a scan reads (the legacy one last, while moving), each with the
        layout of the runs it indexes."""
        found = tuple((shard, self.keys) for shard in self.keys.shards)
        if self.legacy is not None:
            found += tuple((shard, self.legacy) for shard in self.legacy.shards)
        return found

    @property
    def shards(self) -> tuple[ShardKeys, ...]:
        return tuple(shard for shard, _ in self.scanned)


def layout(state: FormatState, prefix: str, now_ms: int) -> Layout:
    """The layout of a store in `state` at `now_ms` (the server's clock)."""
    legacy = Keys(prefix)
    if state.shards is None:
        return Layout(legacy)
    sharded = Keys(prefix, state.shards)
    if state.sharded_at is None or (state.version or 0) >= SHARDED:
        return Layout(sharded)
    if now_ms < state.sharded_at:
        return Layout(legacy, next=sharded)
    return Layout(sharded, legacy=legacy)


def server_ms(reply: tuple[int | str, int | str]) -> int:
    """TIME's reply in ms."""
    return int(reply[0]) * 1000 + int(reply[1]) // 1000


def layout_of(client: Redis, prefix: str) -> Layout:
    """The store's layout now (its format key, and the server's clock when the store moves
    to the sharded layout: a store on a cluster never does, and a cluster's pipeline has
    no TIME)."""
    state = read(client, Keys(prefix))
    moving = state.sharded_at is not None and (state.version or 0) < SHARDED
    return layout(state, prefix, server_ms(client.time()) if moving else 0)


def keys_of(client: Redis, prefix: str) -> Keys:
    """The store's keys under `prefix`, in the layout its transitions write now (the
    format key is named the same in every layout)."""
    return layout_of(client, prefix).keys


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
    the switch, by the server's clock), and uses the sharded layout when the store moves
    to it (LAYOUT_MARGIN_S after its layout instant), so that a migration's scan is not
    followed by records written in the format or the layout before; returns the seconds
    waited."""
    switched, sharded = cast("list[str | None]", client.hmget(keys.format, "switched_at",
                                                               "sharded_at"))
    waits = [int(at) + s * 1000 for at, s in ((switched, FRESH_S + 1),
                                              (sharded, LAYOUT_MARGIN_S)) if at]
    if not waits:
        return 0.0
    until = max(waits)
    left = (until - server_ms(client.time())) / 1000
    if left > 0:
        time.sleep(left)
    return max(0.0, left)


def check(client: Redis, keys: Keys, newest: int, *, shards: int | None = None,
          stamp_shards: int = DEFAULT_COUNT) -> FormatState:
    """The store's format, for code whose newest format is `newest`: raises `FormatError`
    (one line: which formats it reads and what to run) when it cannot read it. An empty
    store without a version is stamped (`stamp`) with `newest`, and with `shards` when
    given (a cluster's store, or LAYBY_STORE_SHARDS set), else `stamp_shards` (the
    process's LAYBY_STORE_SHARDS) from format 2 on, first come first served; a store whose
    layout is not that is refused (`layout_problem`)."""
    state = read(client, keys)
    if state.version is None and not has_data(client, keys):
        stamp(client, keys, newest, shards if shards is not None else
              stamp_shards if newest >= SHARDED else None)
        state = read(client, keys)
    why = readable(state, newest, empty=False) or layout_problem(state, shards)
    if why is not None:
        raise FormatError(why, code="store_format")
    return state


def stamp(client: Redis, keys: Keys, newest: int, shards: int | None) -> None:
    """An empty store's format: `newest`, and its shard count when given; first come first
    served."""
    with client.pipeline(transaction=True) as pipe:
        # One MULTI: the first process's version and layout, or neither.
        pipe.hsetnx(keys.format, "version", newest)
        if shards is not None:
            pipe.hsetnx(keys.format, "shards", shards)
        pipe.execute()


def layout_problem(state: FormatState, shards: int | None) -> str | None:
    """Why a process that wants `shards` shards cannot serve a store in `state` (None when
    it can). One that wants none in particular (None: a store on one server, without
    LAYBY_STORE_SHARDS) takes the store's layout as it is; so does one on a store of
    format 1 in the legacy layout, which the switch to format 2 gives the sweeper's
    shard count."""
    if shards is None or state.shards in (shards, None) or state.version is None:
        return None  # (a store without a version has no layout yet: the first stamps it)
    return (f"the store was made with {state.shards} shards and this process is set for "
            f"{shards}: a store's shard count is fixed when it is made; set "
            f"LAYBY_STORE_SHARDS={state.shards} on every process")
