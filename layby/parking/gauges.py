"""What `/metrics` reports, read from the registries and the `stats` counters of every shard
in one round trip, timed by the Redis server's clock like the scripts that write the scores,
and summed over the shards; and the runs by agent version, which no registry counts: a pass
over the runs of some states.

`/metrics` and `layby doctor` read the agent versions of parked runs, and `layby doctor` the
versions the live workers host."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from redis import Redis

from layby.parking.formats import Layout
from layby.parking.keys import DEFAULT_TENANT, ShardKeys
from layby.parking.registries import families, first_scored, now_ms, tenants_in
from layby.parking.scripts import standalone
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
    # Runs by tenant and state: each tenant's indexes are counted anyway (`runs` sums them).
    by_tenant: dict[str, dict[Status, int]] = field(default_factory=dict)
    # Step messages queued and not yet taken, by queue: the numbers the scripts give them
    # (`<queue>:sent`) past those a claim took (`<queue>:taken`), whatever the broker.
    queued: dict[str, int] = field(default_factory=dict)


def read(client: Redis, layout: Layout, wait_buckets_s: tuple[int, ...]) -> Gauges:
    """Every shard's gauges, summed: the legacy shard's too while the store moves to the
    sharded layout."""
    now = now_ms(client)
    tenants = tenants_in(client, layout.shards)
    pipe = client.pipeline(transaction=False)  # replies are taken in the order asked
    for shard in layout.shards:
        _ask(pipe, shard, families([shard], tenants), now, wait_buckets_s)
    pipe.get(layout.keys.swept)
    replies = iter(pipe.execute())
    each = [_told(replies, [DEFAULT_TENANT, *sorted(tenants.get(shard.base, ()))], now,
                  wait_buckets_s) for shard in layout.shards]
    swept = next(replies)
    return _summed(each, int(swept) if swept else None)


def _ask(pipe: Any, shard: ShardKeys, indexes: list[ShardKeys], now: int,
         wait_buckets_s: tuple[int, ...]) -> None:
    """One shard's reads (its runs' counts in each of its `indexes`: its own and its
    tenants'), queued on `pipe`; `_told` takes their replies in this order."""
    for family in indexes:
        parked = family.index(Status.INTERRUPTED)
        for status in Status:
            pipe.zcard(family.index(status))
        for bound in wait_buckets_s:
            pipe.zcount(parked, now - bound * 1000, "+inf")
        pipe.zrange(parked, 0, 0, withscores=True)
    for key in (shard.outbox, shard.notify_due):
        pipe.zrange(key, 0, 0, withscores=True)
    pipe.zcard(shard.deadlines)
    for key in (shard.deadlines, shard.leases, shard.outbox, shard.notify_due):
        pipe.zcount(key, "-inf", now)
    pipe.zcard(shard.outbox)
    pipe.hgetall(shard.stats)
    pipe.hgetall(shard.queues)


def _told(replies: Iterator[Any], tenants: list[str], now: int,
          wait_buckets_s: tuple[int, ...]) -> Gauges:
    """One shard's gauges, from the replies of its `_ask` (over the index families of
    `tenants`, in the order of `families`)."""
    runs: Counter[Status] = Counter()
    by_tenant: dict[str, dict[Status, int]] = {}
    parked_since: Counter[int] = Counter(dict.fromkeys(wait_buckets_s, 0))
    oldest: list[tuple[str, int] | None] = []
    for tenant in tenants:
        by_tenant[tenant] = {status: int(next(replies)) for status in Status}
        runs.update(by_tenant[tenant])
        parked_since.update({bound: int(next(replies)) for bound in wait_buckets_s})
        oldest.append(first_scored(next(replies)))
    oldest_outbox, oldest_note = (first_scored(next(replies)) for _ in range(2))
    deadlines = int(next(replies))
    overdue, lapsed, outbox_due, notes_due = (int(next(replies)) for _ in range(4))
    outbox, stats, queues = int(next(replies)), next(replies), next(replies)
    return Gauges(now, {s: runs[s] for s in Status}, dict(parked_since), _oldest(oldest),
                  deadlines, overdue, lapsed, outbox, outbox_due, oldest_outbox, notes_due,
                  oldest_note, stats, by_tenant=by_tenant, queued=_queued(queues))


def _queued(counts: dict[str, str]) -> dict[str, int]:
    """A shard's `queues` hash as how many of its steps wait in each queue."""
    sent = {f.removesuffix(":sent"): int(n) for f, n in counts.items() if f.endswith(":sent")}
    return {queue: max(0, n - int(counts.get(f"{queue}:taken", 0)))
            for queue, n in sent.items()}


def memory(client: Redis) -> tuple[int, int]:
    """(used, maxmemory) bytes of the store's server (0: no limit); on a cluster, of the node
    nearest its limit."""
    info: dict[str, Any] = client.info("memory")
    nodes = [info] if "used_memory" in info else [n for n in info.values()
                                                  if isinstance(n, dict)]
    found = [(int(n.get("used_memory", 0)), int(n.get("maxmemory", 0))) for n in nodes]
    return max(found, key=lambda f: f[0] / f[1] if f[1] else 0.0, default=(0, 0))


def _summed(each: list[Gauges], last_sweep_ms: int | None) -> Gauges:
    """The shards' gauges as one: counts and counters added up, the oldest of the oldest."""
    stats: Counter[str] = Counter()
    for g in each:
        stats.update({name: int(n) for name, n in g.stats.items()})
    return Gauges(
        now_ms=each[0].now_ms,
        runs={s: sum(g.runs[s] for g in each) for s in Status},
        parked_since={b: sum(g.parked_since[b] for g in each) for b in each[0].parked_since},
        oldest_parked=_oldest(g.oldest_parked for g in each),
        deadlines=sum(g.deadlines for g in each),
        deadlines_overdue=sum(g.deadlines_overdue for g in each),
        leases_lapsed=sum(g.leases_lapsed for g in each),
        outbox=sum(g.outbox for g in each),
        outbox_due=sum(g.outbox_due for g in each),
        oldest_outbox=_oldest(g.oldest_outbox for g in each),
        notifications_due=sum(g.notifications_due for g in each),
        oldest_notification=_oldest(g.oldest_notification for g in each),
        stats={name: str(n) for name, n in stats.items()},
        last_sweep_ms=last_sweep_ms,
        by_tenant={t: {s: sum(g.by_tenant.get(t, {}).get(s, 0) for g in each) for s in Status}
                   for t in sorted({t for g in each for t in g.by_tenant})},
        queued=_added_up(g.queued for g in each))


def _added_up(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Counts by name added up, those at 0 kept (a queue that is empty is still shown)."""
    total: dict[str, int] = {}
    for each in counts:
        for name, n in each.items():
            total[name] = total.get(name, 0) + n
    return total


def _oldest(found: Iterable[tuple[str, int] | None]) -> tuple[str, int] | None:
    """The lowest scored of (member, score)s, as one set would order them."""
    scored = [f for f in found if f is not None]
    return min(scored, key=lambda f: (f[1], f[0])) if scored else None


# Runs of an index counted a round trip by `runs_by_version`: a script call of about 0.7 ms
# of the server's time, short enough not to hold up the transitions queued behind it.
VERSION_PAGE = 500


@dataclass(frozen=True)
class VersionCount:
    agent: str
    version: str | None  # None: started before layby recorded versions
    pinned: bool


def runs_by_version(client: Redis, layout: Layout, statuses: Iterable[Status]
                    ) -> Counter[VersionCount]:
    """How many runs in `statuses` each agent version has: each index read a page at a
    time, its runs counted by a script where they are (lua/count_versions.lua), one round
    trip a page: at 100,000 runs, about 0.2 s, 0.13 s of it the server's. Runs that move on
    while it reads may be counted in two states, or none (and so may runs moved to the
    sharded layout while it reads the legacy shard)."""
    count = standalone(client, "count_versions")
    found: Counter[VersionCount] = Counter()
    tenants = tenants_in(client, [shard for shard, _ in layout.scanned])
    for index, keys in ((family.index(status), keys) for status in statuses
                        for shard, keys in layout.scanned
                        for family in families([shard], tenants)):
        start = 0
        while True:
            run_ids = cast("list[str]", client.zrange(index, start, start + VERSION_PAGE - 1))
            if not run_ids:
                break
            reply = count(keys=[keys.run(run_id) for run_id in run_ids])
            for i in range(0, len(reply), 4):
                agent, version, pinned, n = reply[i:i + 4]
                found[VersionCount(agent, version or None, pinned == "1")] += int(n)
            start += VERSION_PAGE
    return found


def live_hosting(client: Redis, layout: Layout) -> dict[str, list[str]]:
    """Live worker (its beat not lapsed) → the agent versions it hosts (`<agent>@<version>`;
    empty for one that takes no steps). While the store moves to the sharded layout, the
    legacy registry's too (a process there has not beaten since the layout instant)."""
    found: dict[str, list[str]] = {}
    now = now_ms(client)
    for keys in [layout.keys] + ([layout.legacy] if layout.legacy is not None else []):
        live = cast("list[str]", client.zrangebyscore(keys.workers, f"({now}", "+inf"))
        if not live:
            continue
        told = cast("list[str | None]", client.hmget(keys.hosting, live))
        found.update({name: json.loads(raw) if raw else []
                      for name, raw in zip(live, told, strict=True) if name not in found})
    return found
