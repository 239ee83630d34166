"""`GET /metrics`: what is parked and what is late, read from Redis at each scrape.

A `prometheus_client` collector over `layby.parking.gauges` (the registries and the
scripts' counters, read in one round trip): this module only names and shapes the numbers.
Nothing is kept in the gateway process, so any number of gateways report the same values.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from wsgiref.simple_server import WSGIServer

import redis
from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from layby.errors import ConfigError
from layby.parking import Store, gauges
from layby.parking.scripts import LATENCY_BUCKETS_S
from layby.wire import Status

CONTENT_TYPE = CONTENT_TYPE_LATEST
# Runs waiting on people, counted by how long they have waited (cumulative, like `le`).
WAIT_BUCKETS_S = (60, 300, 3600, 86400)


def _age_of_oldest(oldest: tuple[str, int] | None, now_ms: int, due_only: bool) -> float:
    """Seconds since the lowest score; 0 when the set is empty, or when nothing in it is due
    yet."""
    if oldest is None or (due_only and oldest[1] > now_ms):
        return 0.0
    return max(0.0, (now_ms - oldest[1]) / 1000)


class LaybyCollector:
    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("layby_redis_up", "1 when the Redis server answered this scrape")
        client, layout = self.store.redis, self.store.layout
        try:
            read = gauges.read(client, layout, WAIT_BUCKETS_S)
            by_version = gauges.runs_by_version(client, layout, (Status.INTERRUPTED,))
            live = self.store.processes.live_processes()
            used, limit = gauges.memory(client)
        except redis.RedisError:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from _runs(read)
        yield _parked_by_version(by_version)
        yield from _backlogs(read)
        yield from _counters(read.stats)
        yield from _processes(live, used, limit)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _runs(g: gauges.Gauges) -> Iterator[Metric]:
    runs = GaugeMetricFamily("layby_runs", "Runs by state (finished ones until retention)",
                             labels=["state"])
    for status, count in g.runs.items():
        runs.add_metric([status.value], count)
    yield runs
    by_tenant = GaugeMetricFamily(
        "layby_tenant_runs", "Runs by tenant and state (finished ones until retention); a "
        "tenant's count of a state it never had is 0", labels=["tenant", "state"])
    for tenant, counts in g.by_tenant.items():
        for status, count in counts.items():
            by_tenant.add_metric([tenant, status.value], count)
    yield by_tenant
    waiting = GaugeMetricFamily(
        "layby_runs_waiting_by_age",
        "Interrupted runs that have waited at most `le` seconds since they parked "
        "(cumulative)", labels=["le"])
    for bound, count in g.parked_since.items():
        waiting.add_metric([str(float(bound))], count)
    waiting.add_metric(["+Inf"], g.runs[Status.INTERRUPTED])
    yield waiting
    yield _gauge("layby_runs_waiting_oldest_seconds",
                 "How long the longest-waiting interrupted run has waited",
                 _age_of_oldest(g.oldest_parked, g.now_ms, due_only=False))
    yield _gauge("layby_interrupt_deadlines",
                 "Open interrupts that expire (each has a deadline)", g.deadlines)
    yield _gauge("layby_interrupt_deadlines_overdue",
                 "Open interrupts past their deadline the sweeper has not expired yet",
                 g.deadlines_overdue)
    yield _gauge("layby_leases_lapsed",
                 "Running runs past their lease the sweeper has not requeued", g.leases_lapsed)


def _parked_by_version(counts: Counter[gauges.VersionCount]) -> GaugeMetricFamily:
    parked = GaugeMetricFamily(
        "layby_runs_parked_by_version",
        "Interrupted runs by agent and the agent version they started on (\"unknown\": "
        "before layby recorded versions); pinned: whether they resume only on that version",
        labels=["agent", "version", "pinned"])
    for count, n in sorted(counts.items(), key=lambda c: (c[0].agent, c[0].version or "")):
        parked.add_metric([count.agent, count.version or "unknown",
                           "true" if count.pinned else "false"], n)
    return parked


def _backlogs(g: gauges.Gauges) -> Iterator[Metric]:
    yield _gauge("layby_sweeper_last_sweep_age_seconds",
                 "Seconds since the sweeper last finished a sweep (it sweeps every "
                 "LAYBY_SWEEP_INTERVAL_S; -1: no sweep recorded yet)",
                 -1.0 if g.last_sweep_ms is None
                 else max(0.0, (g.now_ms - g.last_sweep_ms) / 1000))
    yield _gauge("layby_outbox_backlog",
                 "Tasks in the outbox (written, not yet acked as published)", g.outbox)
    yield _gauge("layby_outbox_due",
                 "Outbox entries past their grace time: the sweeper's to publish", g.outbox_due)
    yield _gauge("layby_outbox_lag_seconds",
                 "Sweeper lag: how long the oldest due outbox entry has waited",
                 _age_of_oldest(g.oldest_outbox, g.now_ms, due_only=True))
    queued = GaugeMetricFamily("layby_queue_depth",
                               "Steps queued and not yet taken by a worker, by queue (layby's "
                               "own count, the same on Redis and RabbitMQ)", labels=["queue"])
    for queue, n in sorted(g.queued.items()):
        queued.add_metric([queue], n)
    yield queued
    yield _gauge("layby_notifications_due",
                 "Notifications due to be sent (first sends, retries, reminders)",
                 g.notifications_due)
    yield _gauge("layby_notifications_lag_seconds",
                 "How long the oldest due notification has waited to be sent",
                 _age_of_oldest(g.oldest_notification, g.now_ms, due_only=True))


def _processes(live: dict[str, str], used: int, limit: int) -> Iterator[Metric]:
    kinds = Counter(about.split(" ", 1)[0] or "unknown" for about in live.values())
    processes = GaugeMetricFamily("layby_processes",
                                  "Live processes by kind (worker, sweeper, gateway, listener): "
                                  "those whose heartbeat has not lapsed", labels=["kind"])
    for kind in sorted({"worker", "sweeper", "gateway", *kinds}):
        processes.add_metric([kind], kinds.get(kind, 0))
    yield processes
    yield _gauge("layby_redis_used_memory_bytes",
                 "Memory the store's server uses (on a cluster, the node nearest its limit)",
                 used)
    yield _gauge("layby_redis_maxmemory_bytes",
                 "The store server's maxmemory (0: no limit set)", limit)


def _counters(stats: dict[str, str]) -> Iterator[Metric]:
    answers = CounterMetricFamily("layby_answers",
                                  "Answers recorded to interrupts, by channel "
                                  "(expiries count under theirs; rules under policy)",
                                  labels=["channel"])
    by_rule = CounterMetricFamily("layby_policy_auto_answers",
                                  "Interrupts answered by a reviewer policy rule as the run "
                                  "parked, by rule", labels=["rule"])
    escalations = CounterMetricFamily("layby_escalations",
                                      "Escalation levels asked because nobody answered in "
                                      "time, by level", labels=["level"])
    retries = CounterMetricFamily("layby_tool_retries",
                                  "Failed tool calls given another attempt (their step waited "
                                  "to try again), by tool", labels=["tool"])
    exhausted = CounterMetricFamily("layby_tool_retries_exhausted",
                                    "Tool calls whose attempts ran out (the error went to the "
                                    "model, or failed the run), by tool", labels=["tool"])
    finished = CounterMetricFamily("layby_runs_finished",
                                   "Runs that ended, by how (completed, failed, cancelled)",
                                   labels=["state"])
    failed = CounterMetricFamily("layby_runs_failed",
                                 "Runs that failed, by their error's code", labels=["code"])
    sent = CounterMetricFamily("layby_notifications_sent",
                               "Notifications delivered, by channel", labels=["channel"])
    families = ((answers, "answers:"), (by_rule, "auto_answers:"),
                (escalations, "escalations:"), (retries, "tool_retries:"),
                (exhausted, "tool_retries_exhausted:"), (finished, "finished:"),
                (failed, "failed:"), (sent, "notifications_sent:"))
    for field, value in sorted(stats.items()):
        for family, prefix in families:
            if field.startswith(prefix):
                family.add_metric([field.removeprefix(prefix)], float(value))
    for state in ("completed", "failed", "cancelled"):
        if f"finished:{state}" not in stats:
            finished.add_metric([state], 0.0)
    for family, _ in families:
        yield family
    yield CounterMetricFamily("layby_notifications_failed",
                              "Notifications that ran out of attempts",
                              value=float(stats.get("notifications_failed", 0)))
    yield _latency(stats, "answer", "Time from a run parking to each answer to it")
    yield _latency(stats, "resume", "Time from a run's last answer to a worker taking it up "
                                    "again (queueing before the continuation)")


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


def render(store: Store) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LaybyCollector(store))
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
        yield from LaybyCollector(store).collect()


def serve(host: str, port: int, store: Callable[[], Store]) -> WSGIServer:
    """The same metrics on a port of their own, without the API key (LAYBY_METRICS_PORT):
    for a scraper on a network the API's callers cannot reach. Stop it with `shutdown()`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_CollectorOfTheStore(store))
    server, _ = start_http_server(port, addr=host, registry=registry)
    return server
