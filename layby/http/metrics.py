"""`GET /metrics`: what is parked and what is late, read from Redis at each scrape.

A `prometheus_client` collector; every number comes from cheap Redis commands (ZCARD,
ZCOUNT, ZRANGE of one member, HGETALL of the small `stats` hash) in two round trips, timed
by the Redis server's clock like the scripts that write the scores. Nothing is kept in the gateway
process, so any number of gateways report the same values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from wsgiref.simple_server import WSGIServer

import redis
from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily, Metric)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from layby.errors import ConfigError
from layby.parking import Keys, Store
from layby.wire import Status
from layby.parking.scripts import LATENCY_BUCKETS_S

CONTENT_TYPE = CONTENT_TYPE_LATEST
# Runs waiting on people, counted by how long they have waited (cumulative, like `le`).
WAIT_BUCKETS_S = (60, 300, 3600, 86400)


def _age_of_oldest(first: list[tuple[str, float]], now_ms: int, due_only: bool) -> float:
    """Seconds since the lowest score (`first`: ZRANGE 0 0 WITHSCORES); 0 when the set is
    empty, or when nothing in it is due yet."""
    if not first:
        return 0.0
    score = first[0][1]
    if due_only and score > now_ms:
        return 0.0
    return max(0.0, (now_ms - score) / 1000)


class LaybyCollector:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("layby_redis_up", "1 when the Redis server answered this scrape")
        try:
            families = list(self._read())
        except redis.RedisError:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _read(self) -> Iterator[Metric]:
        c, k = self.client, self.keys
        seconds, micros = c.time()
        now_ms = seconds * 1000 + micros // 1000
        parked = k.index(Status.INTERRUPTED)
        # One round trip for the rest; the replies are taken in the order asked.
        pipe = c.pipeline(transaction=False)
        for status in Status:
            pipe.zcard(k.index(status))
        for bound in WAIT_BUCKETS_S:
            pipe.zcount(parked, now_ms - bound * 1000, "+inf")
        for key in (parked, k.outbox, k.notify_due):
            pipe.zrange(key, 0, 0, withscores=True)
        pipe.zcard(k.deadlines)
        for key in (k.deadlines, k.leases, k.outbox, k.notify_due):
            pipe.zcount(key, "-inf", now_ms)
        pipe.zcard(k.outbox)
        pipe.hgetall(k.stats)
        replies = iter(pipe.execute())

        runs = GaugeMetricFamily("layby_runs", "Runs by state (finished ones until retention)",
                                 labels=["state"])
        counts = {status: next(replies) for status in Status}
        for status, count in counts.items():
            runs.add_metric([status.value], count)
        yield runs

        waiting = GaugeMetricFamily(
            "layby_runs_waiting_by_age",
            "Interrupted runs that have waited at most `le` seconds since they parked "
            "(cumulative)", labels=["le"])
        for bound in WAIT_BUCKETS_S:
            waiting.add_metric([str(float(bound))], next(replies))
        waiting.add_metric(["+Inf"], counts[Status.INTERRUPTED])
        yield waiting
        oldest_parked, oldest_outbox, oldest_notification = (next(replies) for _ in range(3))
        yield GaugeMetricFamily("layby_runs_waiting_oldest_seconds",
                                "How long the longest-waiting interrupted run has waited",
                                value=_age_of_oldest(oldest_parked, now_ms, due_only=False))

        yield GaugeMetricFamily("layby_interrupt_deadlines",
                                "Open interrupts that expire (each has a deadline)",
                                value=next(replies))
        overdue, lapsed, outbox_due, notifications_due = (next(replies) for _ in range(4))
        yield GaugeMetricFamily("layby_interrupt_deadlines_overdue",
                                "Open interrupts past their deadline the sweeper has not "
                                "expired yet", value=overdue)
        yield GaugeMetricFamily("layby_leases_lapsed",
                                "Running runs past their lease the sweeper has not requeued",
                                value=lapsed)

        yield GaugeMetricFamily("layby_outbox_backlog",
                                "Tasks in the outbox (written, not yet acked as published)",
                                value=next(replies))
        yield GaugeMetricFamily("layby_outbox_due",
                                "Outbox entries past their grace time: the sweeper's to publish",
                                value=outbox_due)
        yield GaugeMetricFamily("layby_outbox_lag_seconds",
                                "Sweeper lag: how long the oldest due outbox entry has waited",
                                value=_age_of_oldest(oldest_outbox, now_ms, due_only=True))
        yield GaugeMetricFamily("layby_notifications_due",
                                "Notifications due to be sent (first sends, retries, reminders)",
                                value=notifications_due)
        yield GaugeMetricFamily("layby_notifications_lag_seconds",
                                "How long the oldest due notification has waited to be sent",
                                value=_age_of_oldest(oldest_notification, now_ms, due_only=True))

        stats = next(replies)
        answers = CounterMetricFamily("layby_answers",
                                      "Answers recorded to interrupts, by channel "
                                      "(expiries count under theirs)", labels=["channel"])
        for field, value in sorted(stats.items()):
            if field.startswith("answers:"):
                answers.add_metric([field.removeprefix("answers:")], float(value))
        yield answers
        yield CounterMetricFamily("layby_notifications_failed",
                                  "Notifications that ran out of attempts",
                                  value=float(stats.get("notifications_failed", 0)))
        yield _latency(stats, "answer", "Time from a run parking to each answer to it")
        yield _latency(stats, "resume", "Time from a run's last answer to a worker taking "
                                        "it up again (queueing before the continuation)")


def _latency(stats: dict[str, str], what: str, doc: str) -> HistogramMetricFamily:
    """A histogram from the scripts' counters: one per bucket, made cumulative here."""
    per_bucket = {float(field.rsplit(":", 1)[1]): int(value)
                  for field, value in stats.items()
                  if field.startswith(f"{what}_latency_le:")}
    buckets, below = [], 0
    for bound in LATENCY_BUCKETS_S[what]:
        below += per_bucket.get(float(bound), 0)
        buckets.append((str(float(bound)), below))
    buckets.append(("+Inf", int(stats.get(f"{what}_latency_count", 0))))
    return HistogramMetricFamily(f"layby_{what}_latency_seconds", doc, buckets=buckets,
                                 sum_value=float(stats.get(f"{what}_latency_ms_sum", 0)) / 1000)


def render(client: redis.Redis, keys: Keys) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LaybyCollector(client, keys))
    return generate_latest(registry)


class _CollectorOfTheStore:
    """The store is looked up at each scrape: the metrics port opens with the gateway, when
    Redis may not be configured yet (then `layby_redis_up` is 0)."""

    def __init__(self, store: Callable[[], Store]) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        try:
            store = self.store()
        except ConfigError:
            yield GaugeMetricFamily("layby_redis_up", "1 when the Redis server answered this "
                                    "scrape", value=0)
            return
        yield from LaybyCollector(store.redis, store.keys).collect()


def serve(host: str, port: int, store: Callable[[], Store]) -> WSGIServer:
    """The same metrics on a port of their own, without the API key (LAYBY_METRICS_PORT):
    for a scraper on a network the API's callers cannot reach. Stop it with `shutdown()`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_CollectorOfTheStore(store))
    server, _ = start_http_server(port, addr=host, registry=registry)
    return server
