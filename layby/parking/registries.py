"""The store's registries: sorted sets of what is waiting, each member scored by a time in
ms on the Redis server's clock (as rq keeps one sorted set per job state). The transition
scripts change them; these classes read them, for the sweeper, the on-call commands, the
API's lists and `/metrics`.

| registry           | members                        | scored by                      |
|--------------------|--------------------------------|--------------------------------|
| `RunIndex`         | run ids, one set per state     | the last change of state       |
| `Deadlines`        | "<run id> <interrupt id>"      | when the interrupt expires     |
| `Leases`           | running run ids                | when the claim lapses          |
| `OutboxRegistry`   | outbox entry ids               | when to (re)publish            |
| `DueNotifications` | "<run id> <notification id>"   | when to (re)send               |

Each shard of the store has its own (`Shard`): a reader that scans a registry reads every
shard's and merges them by score (`lowest_first`, `RunIndex` over several shards).

`/metrics` reads them all at once, in one round trip (`layby.parking.gauges`).
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, cast

from redis import Redis

from layby.errors import Invalid
from layby.parking.keys import ShardKeys
from layby.wire import FINISHED, Status


def now_ms(client: Redis) -> int:
    """The Redis server's clock, which every score is written with."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


class Registry:
    """One sorted set of members scored by a time in ms."""

    def __init__(self, client: Redis, key: str) -> None:
        self.client = client
        self.key = key

    def count(self) -> int:
        return int(self.client.zcard(self.key))

    def count_due(self, at_ms: float) -> int:
        """Members scored at or before `at_ms`."""
        return int(self.client.zcount(self.key, "-inf", at_ms))

    def oldest(self) -> tuple[str, int] | None:
        """The member with the lowest score, and its score."""
        return first_scored(cast("list[tuple[str, float]]",
                                 self.client.zrange(self.key, 0, 0, withscores=True)))

    def due(self, at_ms: float, limit: int, *, with_scores: bool = False) -> list[Any]:
        """Members scored at or before `at_ms`, lowest first, at most `limit`."""
        return list(self.client.zrangebyscore(self.key, "-inf", at_ms, 0, limit,
                                              withscores=with_scores))


def first_scored(reply: list[tuple[str, float]]) -> tuple[str, int] | None:
    """A `ZRANGE … WITHSCORES` reply's first member, as (member, score)."""
    return (reply[0][0], int(reply[0][1])) if reply else None


def lowest_first(replies: Iterable[list[tuple[str, float]]], limit: int
                 ) -> list[tuple[str, int]]:
    """`ZRANGE … WITHSCORES` replies of several sets (each lowest first) merged as one set
    would order them, by score, then member: the first `limit` (member, score)."""
    merged = heapq.merge(*[[(member, int(score)) for member, score in reply]
                           for reply in replies], key=lambda p: (p[1], p[0]))
    return list(islice(merged, limit))


def due_in(registries: Sequence[Registry], at_ms: float, limit: int) -> list[tuple[str, int]]:
    """(member, score) scored at or before `at_ms` in any of `registries` (one per shard),
    lowest first, at most `limit`: each read up to `limit`, in one round trip."""
    if not registries:
        return []
    pipe = registries[0].client.pipeline(transaction=False)
    for registry in registries:
        pipe.zrangebyscore(registry.key, "-inf", at_ms, 0, limit, withscores=True)
    return lowest_first(pipe.execute(), limit)


# Where a page ended: the last item's score (its last change, ms) and id. Readable rather
# than opaque, so that its form (CURSOR) says everything that makes one usable.
CURSOR = re.compile(r"^(\d{1,15})\.([A-Za-z0-9_.-]{1,128})$")


class BadCursor(Invalid):
    """A list cursor this store did not make."""

    def __init__(self, cursor: str) -> None:
        super().__init__(f"the cursor {cursor[:80]!r} is not one a page of this list gave: "
                         "start again without `cursor`, then pass each page's `nextCursor`",
                         code="invalid_cursor")


def tenants_in(client: Redis, shards: Sequence[ShardKeys]) -> dict[str, frozenset[str]]:
    """The tenants other than `default` with runs in each of `shards` (by its keys' base):
    one round trip. Their runs are in indexes of their own (`ShardKeys.of_tenant`)."""
    pipe = client.pipeline(transaction=False)
    for shard in shards:
        pipe.smembers(shard.tenants)
    return {shard.base: frozenset(cast("set[str]", names))
            for shard, names in zip(shards, pipe.execute(), strict=True) if names}


def families(shards: Sequence[ShardKeys], tenants: dict[str, frozenset[str]]
             ) -> list[ShardKeys]:
    """Every index family of `shards`: each shard's own (`default`'s runs) and its
    tenants'."""
    return [*shards, *(shard.of_tenant(t) for shard in shards
                       for t in sorted(tenants.get(shard.base, ())))]


def cursor_of(run_id: str, score: int) -> str:
    """The cursor of a page that ended with run `run_id`, changed at `score`."""
    return f"{score}.{run_id}"


def _from_cursor(cursor: str) -> tuple[int, str]:
    found = CURSOR.match(cursor)
    if found is None:
        raise BadCursor(cursor)
    return int(found.group(1)), found.group(2)


class RunIndex:
    """Runs by state, one sorted set per state in each shard it reads (`index:<state>`),
    scored by their last change; newest first, runs changed in the same millisecond by id
    (descending). A read of several sets (all states, several shards) merges them by score,
    so that pages follow one order whichever set a run is in."""

    def __init__(self, client: Redis, *shards: ShardKeys) -> None:
        self.client = client
        self.sets = {status: tuple(shard.index(status) for shard in shards)
                     for status in Status}

    def _sets(self, status: Status | None) -> list[str]:
        """The sets of `status` (every state's when None), in every shard."""
        return [key for s in ([status] if status else Status) for key in self.sets[s]]

    def count(self, status: Status) -> int:
        """How many runs are in `status`."""
        pipe = self.client.pipeline(transaction=False)
        for key in self.sets[status]:
            pipe.zcard(key)
        return sum(pipe.execute())

    def newest(self, status: Status | None, limit: int, offset: int = 0
               ) -> list[tuple[str, int]]:
        """(run id, last change) of the newest runs in `status` (any state when None),
        from `offset` on. One set's page (one state, one shard) costs the same at any depth;
        a merge reads a few of each set's first offset + limit runs (`_first`; callers
        bound the offset)."""
        sets = self._sets(status)
        if len(sets) == 1:
            found = cast("list[tuple[str, float]]", self.client.zrevrange(
                sets[0], offset, offset + limit - 1, withscores=True))
            return [(run_id, int(score)) for run_id, score in found]

        def queue(pipe: Any, key: str, count: int) -> None:
            pipe.zrevrange(key, 0, count - 1, withscores=True)

        return self._first(sets, offset + limit, queue)[offset:offset + limit]

    def page(self, status: Status | None, limit: int, cursor: str | None = None
             ) -> tuple[list[tuple[str, int]], str | None]:
        """A page of (run id, last change), newest first, after `cursor` (a page's
        `next`), and the cursor of the page after it (None at the end). Its cost does not
        depend on how deep it is, nor on how many runs there are: each set is read from the
        cursor's score on, a few runs of each (`_first`), one round trip as a first page."""
        sets = self._sets(status)
        top, after = ("+inf", None) if cursor is None else _from_cursor(cursor)

        def queue(pipe: Any, key: str, count: int) -> None:
            pipe.zrevrangebyscore(key, top, "-inf", 0, count, withscores=True)

        served = None
        if after is not None:
            score = int(top)  # the cursor's score (an int whenever there is a cursor)

            def served(p: tuple[str, int]) -> bool:
                # Runs changed in the cursor's millisecond sort by id: those down to the
                # cursor's own were on the pages before.
                return p[1] == score and p[0] >= after

        items = self._first(sets, limit + 1, queue, served)
        page = items[:limit]
        more = len(items) > limit
        return page, cursor_of(*page[-1]) if more and page else None

    def _first(self, sets: list[str], want: int, queue: Callable[[Any, str, int], None],
               served: Callable[[tuple[str, int]], bool] | None = None
               ) -> list[tuple[str, int]]:
        """The first `want` (run id, last change) of `sets` merged, in page order (`queue`
        queues the read of a set's first n; `served`, for a page after a cursor, tells the
        runs a set's read starts with that pages before gave). Runs are spread evenly over
        the shards (by hash): each set is read for a little more than its share of `want`
        first (`_first_read`), and only a set that may hold more of the first `want` than
        it gave is read again. So what is read stays within about twice `want` however
        many runs and shards there are, and a page after a cursor costs what a first page
        does; reading `want` of every set (48 shards: 48 times `want`) made a page at
        1,000,000 runs twice the cost of one at 1,000, where each set is short, and
        counting each set's runs at the cursor's score first (one more round trip, and more
        seeks in a long set) made a page by cursor a third dearer there."""
        counts = [_first_read(want, len(sets))] * len(sets)
        replies = self._read(sets, counts, queue)
        while True:
            # What a read gives in the cursor's millisecond sorts first among its ties, so
            # what pages before gave is where a set's read starts.
            skipped = [_served_first(found, served) for found in replies]
            merged = heapq.merge(*[[(run_id, int(score)) for run_id, score in found[k:]]
                                   for found, k in zip(replies, skipped, strict=True)],
                                 key=_order)
            items = list(islice(merged, want))
            cutoff = _order(items[-1]) if len(items) >= want else None
            # A set that gave all it was asked for may hold more: needed when it gave fewer
            # than `want` new ones and its last sorts before the `want`-th (what it holds
            # after that sorts after its last).
            deeper = [i for i, found in enumerate(replies)
                      if len(found) >= counts[i] and len(found) - skipped[i] < want
                      and (cutoff is None
                           or _order((found[-1][0], int(found[-1][1]))) < cutoff)]
            if not deeper:
                return items
            for i in deeper:
                # `want` past what was served; while a read held only served runs, how many
                # more there are is not known: at least as many again.
                counts[i] = max(skipped[i] + want,
                                2 * counts[i] if skipped[i] == counts[i] else 0)
            for i, found in zip(deeper, self._read([sets[i] for i in deeper],
                                                   [counts[i] for i in deeper], queue),
                                strict=True):
                replies[i] = found

    def _read(self, sets: list[str], counts: list[int],
              queue: Callable[[Any, str, int], None]) -> list[list[tuple[str, float]]]:
        pipe = self.client.pipeline(transaction=False)
        for key, count in zip(sets, counts, strict=True):
            queue(pipe, key, count)
        return cast("list[list[tuple[str, float]]]", pipe.execute())

    def waiting_since_before(self, statuses: tuple[Status, ...], cutoff_ms: int,
                             limit: int) -> list[str]:
        """Runs whose state last changed before `cutoff_ms`, in any of `statuses`: the
        oldest `limit` of each state (its shards merged), state after state."""
        pipe = self.client.pipeline(transaction=False)
        for s in statuses:
            for key in self.sets[s]:
                pipe.zrangebyscore(key, "-inf", cutoff_ms, 0, limit, withscores=True)
        replies = iter(pipe.execute())
        return [run_id for s in statuses
                for run_id, _ in lowest_first([next(replies) for _ in self.sets[s]], limit)]

    def finished_before(self, cutoff_ms: int) -> dict[Status, int]:
        """How many finished runs of each state ended before `cutoff_ms`."""
        pipe = self.client.pipeline(transaction=False)
        for s in sorted(FINISHED):
            for key in self.sets[s]:
                pipe.zcount(key, "-inf", cutoff_ms)
        counts = iter(pipe.execute())
        return {s: sum(int(next(counts)) for _ in self.sets[s]) for s in sorted(FINISHED)}

    def prune_finished_before(self, cutoff_ms: int) -> int:
        """Drop finished runs that ended before `cutoff_ms` (their keys have expired)."""
        pipe = self.client.pipeline(transaction=False)
        for s in sorted(FINISHED):
            for key in self.sets[s]:
                pipe.zremrangebyscore(key, "-inf", cutoff_ms)
        return sum(pipe.execute())


def _first_read(want: int, sets: int) -> int:
    """How many runs of each of `sets` a merge of the first `want` reads first: the share,
    three standard deviations of it (a shard holds a Poisson count of a page's runs) and
    three more. A set holding more of the page than that is read again, one more round
    trip: at twice the share and one (5 of each of 48 sets for a page of 50), one page in
    five was read so; with this (8), about one in 1,700 (20,000 pages simulated)."""
    share = want / sets
    return min(want, math.ceil(share + 3 * math.sqrt(share)) + 3)


def _served_first(found: list[tuple[str, float]],
                  served: Callable[[tuple[str, int]], bool] | None) -> int:
    """How many runs a set's read starts with that pages before gave."""
    if served is None:
        return 0
    return next((k for k, (run_id, score) in enumerate(found)
                 if not served((run_id, int(score)))), len(found))


def _order(item: tuple[str, int]) -> tuple[int, tuple[int, ...]]:
    """Where (run id, last change) comes in a page: newest first, then by id descending."""
    return -item[1], _desc(item[0])


def _desc(run_id: str) -> tuple[int, ...]:
    """A key that sorts ids in descending order, as ZREVRANGE does within one score."""
    return (*(-b for b in run_id.encode()), 1)  # the 1: a prefix sorts after what extends it


class Deadlines(Registry):
    """Open interrupts that expire."""


class Leases(Registry):
    """Running runs and when their claim lapses."""


class Retries(Registry):
    """Retrying runs and when their next try is due."""


class OutboxRegistry(Registry):
    """Outbox entries and when they are (re)published if nobody acks them first."""


class DueNotifications(Registry):
    """Notifications and when they are (re)sent."""


@dataclass(frozen=True)
class Shard:
    """One shard's registries, on its keys: what a transition of one of its runs writes."""

    keys: ShardKeys
    runs: RunIndex
    deadlines: Deadlines
    leases: Leases
    outbox: OutboxRegistry
    due_notifications: DueNotifications
    retries: Retries

    @classmethod
    def of(cls, client: Redis, keys: ShardKeys) -> Shard:
        return cls(keys, RunIndex(client, keys), Deadlines(client, keys.deadlines),
                   Leases(client, keys.leases), OutboxRegistry(client, keys.outbox),
                   DueNotifications(client, keys.notify_due), Retries(client, keys.retries))
