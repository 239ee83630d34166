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

`/metrics` reads them all at once, in one round trip (`layby.parking.gauges`).
"""

from __future__ import annotations

from typing import Any

from redis import Redis

from layby.parking.keys import Keys
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
        return first_scored(self.client.zrange(self.key, 0, 0, withscores=True))

    def due(self, at_ms: float, limit: int, *, with_scores: bool = False) -> list[Any]:
        """Members scored at or before `at_ms`, lowest first, at most `limit`."""
        return list(self.client.zrangebyscore(self.key, "-inf", at_ms, 0, limit,
                                              withscores=with_scores))


def first_scored(reply: list[tuple[str, float]]) -> tuple[str, int] | None:
    """A `ZRANGE … WITHSCORES` reply's first member, as (member, score)."""
    return (reply[0][0], int(reply[0][1])) if reply else None


class RunIndex:
    """Runs by state, one sorted set per state (`index:<state>`)."""

    def __init__(self, client: Redis, keys: Keys) -> None:
        self.client = client
        self.of = {status: Registry(client, keys.index(status)) for status in Status}

    def newest(self, status: Status | None, limit: int, offset: int = 0
               ) -> list[tuple[str, int]]:
        """(run id, last change) of the newest runs in `status` (any state when None)."""
        statuses = [status] if status else list(Status)
        pipe = self.client.pipeline(transaction=False)
        for s in statuses:
            pipe.zrevrange(self.of[s].key, 0, offset + limit - 1, withscores=True)
        scored = sorted(((run_id, int(score)) for found in pipe.execute()
                         for run_id, score in found), key=lambda p: -p[1])
        return scored[offset:offset + limit]

    def waiting_since_before(self, statuses: tuple[Status, ...], cutoff_ms: int,
                             limit: int) -> list[str]:
        """Runs whose state last changed before `cutoff_ms`, in any of `statuses`."""
        pipe = self.client.pipeline(transaction=False)
        for s in statuses:
            pipe.zrangebyscore(self.of[s].key, "-inf", cutoff_ms, 0, limit)
        return [run_id for found in pipe.execute() for run_id in found]

    def finished_before(self, cutoff_ms: int) -> dict[Status, int]:
        """How many finished runs of each state ended before `cutoff_ms`."""
        pipe = self.client.pipeline(transaction=False)
        for s in sorted(FINISHED):
            pipe.zcount(self.of[s].key, "-inf", cutoff_ms)
        return dict(zip(sorted(FINISHED), (int(n) for n in pipe.execute()), strict=True))

    def prune_finished_before(self, cutoff_ms: int) -> int:
        """Drop finished runs that ended before `cutoff_ms` (their keys have expired)."""
        pipe = self.client.pipeline(transaction=False)
        for s in sorted(FINISHED):
            pipe.zremrangebyscore(self.of[s].key, "-inf", cutoff_ms)
        return sum(pipe.execute())


class Deadlines(Registry):
    """Open interrupts that expire."""

    def due_pairs(self, at_ms: int, limit: int) -> list[tuple[str, str]]:
        """(run id, interrupt id) of interrupts past their deadline."""
        return [tuple(m.rsplit(" ", 1)) for m in self.due(at_ms, limit)]  # type: ignore[misc]


class Leases(Registry):
    """Running runs and when their claim lapses."""


class OutboxRegistry(Registry):
    """Outbox entries and when they are (re)published if nobody acks them first."""


class DueNotifications(Registry):
    """Notifications and when they are (re)sent."""
