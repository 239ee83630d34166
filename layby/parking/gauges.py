"""What `/metrics` reports, read from the registries and the `stats` counters in one round
trip, timed by the Redis server's clock like the scripts that write the scores."""

from __future__ import annotations

from dataclasses import dataclass

from redis import Redis

from layby.parking.keys import Keys
from layby.parking.registries import first_scored, now_ms
from layby.wire import Status


@dataclass(frozen=True)
class Gauges:
    now_ms: int
    runs: dict[Status, int]            # by state
    parked_since: dict[int, int]       # interrupted runs parked at most this many seconds ago
    oldest_parked: tuple[str, int] | None
    deadlines: int
    deadlines_overdue: int
    leases_lapsed: int
    outbox: int
    outbox_due: int
    oldest_outbox: tuple[str, int] | None
    notifications_due: int
    oldest_notification: tuple[str, int] | None
    stats: dict[str, str]              # the scripts' counters (see `layby.parking.keys`)
    last_sweep_ms: int | None = None   # when the sweeper last finished a sweep


def read(client: Redis, keys: Keys, wait_buckets_s: tuple[int, ...]) -> Gauges:
    now = now_ms(client)
    parked = keys.index(Status.INTERRUPTED)
    pipe = client.pipeline(transaction=False)  # replies are taken in the order asked
    for status in Status:
        pipe.zcard(keys.index(status))
    for bound in wait_buckets_s:
        pipe.zcount(parked, now - bound * 1000, "+inf")
    for key in (parked, keys.outbox, keys.notify_due):
        pipe.zrange(key, 0, 0, withscores=True)
    pipe.zcard(keys.deadlines)
    for key in (keys.deadlines, keys.leases, keys.outbox, keys.notify_due):
        pipe.zcount(key, "-inf", now)
    pipe.zcard(keys.outbox)
    pipe.hgetall(keys.stats)
    pipe.get(keys.swept)
    replies = iter(pipe.execute())
    runs = {status: int(next(replies)) for status in Status}
    parked_since = {bound: int(next(replies)) for bound in wait_buckets_s}
    oldest_parked, oldest_outbox, oldest_note = (first_scored(next(replies)) for _ in range(3))
    deadlines = int(next(replies))
    overdue, lapsed, outbox_due, notes_due = (int(next(replies)) for _ in range(4))
    outbox, stats, swept = int(next(replies)), next(replies), next(replies)
    return Gauges(now, runs, parked_since, oldest_parked, deadlines, overdue, lapsed,
                  outbox, outbox_due, oldest_outbox, notes_due, oldest_note, stats,
                  int(swept) if swept else None)
