"""`GET /metrics`: what is parked and what is late, read from Redis at each scrape.

A `prometheus_client` collector; every number comes from a few cheap Redis commands
(ZCARD, ZCOUNT, ZRANGE of one member, HGETALL of the small `stats` hash), timed by the
Redis server's clock like the scripts that write the scores. Nothing is kept in the gateway
process, so any number of gateways report the same values.
"""

from __future__ import annotations

from collections.abc import Iterator

import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, Metric,
                                    SummaryMetricFamily)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from parking import Keys, Status

CONTENT_TYPE = CONTENT_TYPE_LATEST
# Runs waiting on people, counted by how long they have waited (cumulative, like `le`).
WAIT_BUCKETS_S = (60, 300, 3600, 86400)


def _age_of_oldest(client: redis.Redis, key: str, now_ms: int, due_only: bool) -> float:
    """Seconds since the lowest score of `key` (0 when empty, or when nothing is due yet)."""
    first = client.zrange(key, 0, 0, withscores=True)
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

        runs = GaugeMetricFamily("layby_runs", "Runs by state (finished ones until retention)",
                                 labels=["state"])
        for status in Status:
            runs.add_metric([status.value], c.zcard(k.index(status)))
        yield runs

        parked = k.index(Status.INTERRUPTED)
        waiting = GaugeMetricFamily(
            "layby_runs_waiting_by_age",
            "Interrupted runs that have waited at most `le` seconds since they parked "
            "(cumulative)", labels=["le"])
        for bound in WAIT_BUCKETS_S:
            waiting.add_metric([str(float(bound))], c.zcount(parked, now_ms - bound * 1000,
                                                             "+inf"))
        waiting.add_metric(["+Inf"], c.zcard(parked))
        yield waiting
        yield GaugeMetricFamily("layby_runs_waiting_oldest_seconds",
                                "How long the longest-waiting interrupted run has waited",
                                value=_age_of_oldest(c, parked, now_ms, due_only=False))

        yield GaugeMetricFamily("layby_interrupt_deadlines",
                                "Open interrupts that expire (each has a deadline)",
                                value=c.zcard(k.deadlines))
        yield GaugeMetricFamily("layby_interrupt_deadlines_overdue",
                                "Open interrupts past their deadline the sweeper has not "
                                "expired yet", value=c.zcount(k.deadlines, "-inf", now_ms))
        yield GaugeMetricFamily("layby_leases_lapsed",
                                "Running runs past their lease the sweeper has not requeued",
                                value=c.zcount(k.leases, "-inf", now_ms))

        yield GaugeMetricFamily("layby_outbox_backlog",
                                "Tasks in the outbox (written, not yet acked as published)",
                                value=c.zcard(k.outbox))
        yield GaugeMetricFamily("layby_outbox_due",
                                "Outbox entries past their grace time: the sweeper's to publish",
                                value=c.zcount(k.outbox, "-inf", now_ms))
        yield GaugeMetricFamily("layby_outbox_lag_seconds",
                                "Sweeper lag: how long the oldest due outbox entry has waited",
                                value=_age_of_oldest(c, k.outbox, now_ms, due_only=True))
        yield GaugeMetricFamily("layby_notifications_due",
                                "Notifications due to be sent (first sends, retries, reminders)",
                                value=c.zcount(k.notify_due, "-inf", now_ms))
        yield GaugeMetricFamily("layby_notifications_lag_seconds",
                                "How long the oldest due notification has waited to be sent",
                                value=_age_of_oldest(c, k.notify_due, now_ms, due_only=True))

        stats = c.hgetall(k.stats)
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
        yield SummaryMetricFamily(
            "layby_answer_latency_seconds",
            "Time from a run parking to each answer to it",
            count_value=int(stats.get("answer_latency_count", 0)),
            sum_value=float(stats.get("answer_latency_ms_sum", 0)) / 1000)


def render(client: redis.Redis, keys: Keys) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LaybyCollector(client, keys))
    return generate_latest(registry)
