"""`GET /metrics` scraped from a real gateway and parsed with prometheus_client's own parser;
`layby doctor` run as a subprocess against real Valkey servers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from layby.ops.embedded import EmbeddedRedis
from tests.support.harness import BASE_ENV, ROOT, LaybySystem, Proc, wait_until


def _scrape(system: LaybySystem) -> dict[str, dict[tuple, float]]:
    with system.api() as api:
        reply = api.get("/metrics")
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain")
    found: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(reply.text):
        assert family.name.startswith("layby_"), family.name
        assert family.documentation, family.name
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def _listed(system: LaybySystem, status: str) -> int:
    with system.api() as api:
        reply = api.get("/v1/runs", params={"status": status, "limit": 200})
    assert reply.status_code == 200, reply.text
    return len(reply.json()["runs"])


def _open_one(system: LaybySystem, run_id: str) -> dict:
    run = system.wait_status(run_id, "interrupted")
    (question,) = system.open_interrupts(run)
    return question


def test_metrics_count_runs_by_state_and_answers(isolated) -> None:
    system = isolated().start()
    done = system.start_run("demo.trivia", "quiz me")
    question = _open_one(system, done["id"])
    assert system.answer(done["id"], question["id"], payload="Jaws").status_code == 200
    system.wait_status(done["id"], "completed")
    parked = system.start_run("demo.trivia", "quiz me again")
    _open_one(system, parked["id"])

    metrics = _scrape(system)
    assert metrics["layby_redis_up"][()] == 1
    for state in ("queued", "running", "interrupted", "resuming", "completed", "failed",
                  "cancelled"):
        assert metrics["layby_runs"][(("state", state),)] == _listed(system, state), state
    assert metrics["layby_runs"][(("state", "completed"),)] == 1
    assert metrics["layby_runs"][(("state", "interrupted"),)] == 1
    waiting = metrics["layby_runs_waiting_by_age"]
    assert waiting[(("le", "+Inf"),)] == 1
    assert waiting[(("le", "60.0"),)] == 1  # parked just now
    assert metrics["layby_runs_waiting_oldest_seconds"][()] < 60
    assert metrics["layby_answers_total"][(("channel", "api"),)] == 1
    assert metrics["layby_answer_latency_seconds_count"][()] == 1
    assert 0 <= metrics["layby_answer_latency_seconds_sum"][()] < 60
    answered = metrics["layby_answer_latency_seconds_bucket"]
    assert answered[(("le", "60.0"),)] == answered[(("le", "+Inf"),)] == 1
    # The answer resumed the run once: one continuation taken up by a worker, soon.
    resumed = metrics["layby_resume_latency_seconds_bucket"]
    assert metrics["layby_resume_latency_seconds_count"][()] == 1
    assert resumed[(("le", "+Inf"),)] == resumed[(("le", "300.0"),)] == 1
    counts = [v for (label,), v in sorted(resumed.items(), key=lambda kv: float(kv[0][0][1]))]
    assert counts == sorted(counts)  # cumulative: each bucket holds the ones below it
    assert 0 <= metrics["layby_resume_latency_seconds_sum"][()] < 300
    assert metrics["layby_notifications_failed_total"][()] == 0
    for name in ("layby_outbox_backlog", "layby_outbox_due", "layby_outbox_lag_seconds",
                 "layby_notifications_due", "layby_notifications_lag_seconds",
                 "layby_interrupt_deadlines", "layby_interrupt_deadlines_overdue",
                 "layby_leases_lapsed"):
        assert () in metrics.get(name, {}), f"{name} is not reported"


def test_metrics_need_the_api_key(system: LaybySystem) -> None:
    assert httpx.get(f"{system.base_url}/metrics", timeout=10).status_code == 401
    with system.api("not-a-key") as api:
        assert api.get("/metrics").status_code == 401
    assert _scrape(system)["layby_redis_up"][()] == 1


def _doctor(system_env: dict[str, str], redis_url: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "layby.ops.cli", "doctor"], cwd=ROOT,
                          env={**system_env, "LAYBY_REDIS_URL": redis_url,
                               "LAYBY_DATA_DIR": str(cwd)},
                          capture_output=True, text=True, timeout=60)


def test_doctor_passes_on_the_embedded_valkey(system: LaybySystem, tmp_path: Path) -> None:
    done = _doctor(system.env, system.redis_url, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert all(line.startswith("OK") for line in lines), done.stdout
    for name in ("redis appendonly", "redis appendfsync", "redis maxmemory-policy",
                 "clock skew", "celery task_acks_late", "celery visibility_timeout"):
        assert any(name in line for line in lines), name


def test_the_sweepers_liveness_is_in_metrics_and_doctor(system: LaybySystem,
                                                        tmp_path: Path) -> None:
    """The sweeper sweeps on its own clock (no task in Flower a second): each sweep it
    finishes is noted, so /metrics and `layby doctor` show it alive, and a stopped one."""
    age = _scrape(system)["layby_sweeper_last_sweep_age_seconds"][()]
    assert 0 <= age < 5, age  # it sweeps every 0.5 s here
    done = _doctor(system.env, system.redis_url, tmp_path)
    assert any(x.startswith("OK") and "sweeper: last sweep" in x
               for x in done.stdout.splitlines()), done.stdout

    # A deployment whose sweeper stopped two minutes ago (its own key prefix).
    client = redis.Redis.from_url(system.redis_url)
    seconds, micros = client.time()
    client.set("stopped:swept", seconds * 1000 + micros // 1000 - 120_000)
    try:
        done = _doctor({**system.env, "LAYBY_KEY_PREFIX": "stopped"}, system.redis_url,
                       tmp_path)
    finally:
        client.delete("stopped:swept")
        client.close()
    assert done.returncode == 1, done.stdout
    (line,) = [x for x in done.stdout.splitlines() if "sweeper" in x]
    assert line.startswith("PROBLEM") and re.search(r"last sweep 12\d s ago", line), line
    assert "is `layby sweeper` running?" in line


@pytest.mark.integration
def test_a_worker_sweeps_when_started_with_beat_and_only_then(redis_server: EmbeddedRedis,
                                                             tmp_path: Path) -> None:
    """`layby worker --beat` (no `layby sweeper` beside it) sweeps on its own clock, its
    sweeps noted as the sweeper's; a worker started without it never sweeps, even one that
    reads the sweep queue (a deployment has the one sweeper it starts)."""
    url = f"redis://127.0.0.1:{redis_server.port}/14"
    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushdb()
    env = {**os.environ, **BASE_ENV, "LAYBY_REDIS_URL": url,
           "LAYBY_DATA_DIR": str(tmp_path / "data")}

    def worker(name: str, *options: str) -> Proc:
        started = Proc(name, [sys.executable, "-m", "layby", "worker", "--concurrency", "1",
                              *options], tmp_path / f"{name}.log")
        started.start(env)
        return started

    plain = worker("plain", "--queues", "layby.jobs,layby.sweep")
    beating = None
    try:
        wait_until(lambda: "ready." in plain.output(), 60, what="the plain worker")
        seconds = float(BASE_ENV["LAYBY_SWEEP_INTERVAL_S"]) * 6
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:  # six sweeps' time: none comes
            assert client.get("layby:swept") is None
            time.sleep(0.1)

        beating = worker("beating", "--beat", "--queues", "layby.jobs")
        first = int(wait_until(lambda: client.get("layby:swept"), 60,
                               what="the --beat worker's first sweep"))
        wait_until(lambda: int(client.get("layby:swept") or 0) > first, 10,
                   what="a second sweep")
    finally:
        for started in (plain, beating):
            if started is not None:
                started.stop()
        client.flushdb()
        client.close()
    for started in (plain, beating):
        assert started is not None and "Traceback" not in started.output(), \
            started.output()[-3000:] if started else ""


def test_doctor_finds_an_evicting_server(system: LaybySystem, tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "valkey").start()
    try:
        redis.Redis(port=server.port).config_set("maxmemory-policy", "allkeys-lru")
        done = _doctor(system.env, server.url, tmp_path)
    finally:
        server.stop()
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = [x for x in done.stdout.splitlines() if "maxmemory-policy" in x]
    assert line.startswith("PROBLEM") and "noeviction" in line, line
    assert any(x.startswith("OK") and "appendonly" in x for x in done.stdout.splitlines())


def test_doctor_finds_a_lease_above_the_visibility_timeout(system: LaybySystem,
                                                           tmp_path: Path) -> None:
    env = {**system.env, "LAYBY_LEASE_S": "7200", "LAYBY_VISIBILITY_TIMEOUT_S": "3600"}
    done = _doctor(env, system.redis_url, tmp_path)
    assert done.returncode == 1, done.stdout
    (line,) = [x for x in done.stdout.splitlines() if "visibility_timeout" in x]
    assert line.startswith("PROBLEM") and "LAYBY_VISIBILITY_TIMEOUT_S" in line


def test_idempotency_key_still_works_with_the_stats_key(system: LaybySystem) -> None:
    # The stats hash took KEYS[20]: create_run's idempotency key moved to KEYS[21].
    with system.api() as api:
        first = api.post("/v1/runs", json={"agent": "demo.trivia", "input": "quiz"},
                         headers={"Idempotency-Key": "metrics-idem-1"})
        again = api.post("/v1/runs", json={"agent": "demo.trivia", "input": "quiz"},
                         headers={"Idempotency-Key": "metrics-idem-1"})
    assert first.json()["id"] == again.json()["id"]


def test_grants_and_failed_notifications_with_the_stats_key(system: LaybySystem) -> None:
    # Straight on the store, under a prefix of its own: grants come after the fixed KEYS
    # (from EXTRA on, lua/_prelude.lua), and a notification out of attempts counts in
    # `stats`, read by the collector.
    from layby.control.runtime import TASK_NAMES
    from layby.http.metrics import render
    from layby.parking import Announcements, Store, StoreConfig
    from layby.wire import Notification

    client = redis.Redis.from_url(system.redis_url, decode_responses=True)
    store = Store(client, StoreConfig(TASK_NAMES, prefix="metrics-test"))
    run_id = "run-metrics-1"
    client.hset(store.keys.run(run_id), mapping={"status": "interrupted", "version": 1,
                                                 "open": "i1"})
    note = Notification(id="n1", interrupt_id="i1", reviewer="alice", channel="email")
    # A store without the task messages (the broker elsewhere): the caller dispatches.
    assert store.outbox.plan_notifications(run_id, Announcements(
        [(note, None)], [("ref-1", "{}", 60_000)])) == (["n1"], ["n1"])
    assert client.get(store.keys.shard_of("ref-1").grant("ref-1")) == "{}"
    status, started = store.outbox.start_delivery(run_id, "n1", deadline_ms=60_000, max_attempts=1)
    assert status == "ok" and started is not None
    assert store.outbox.finish_delivery(run_id, started, "failed", error="refused") == "ok"
    assert client.hget(store.keys.shard_of(run_id).stats, "notifications_failed") == "1"
    # A sender that died on its last attempt: the next start records the failure.
    dead = Notification(id="n2", interrupt_id="i1", reviewer="bob", channel="email")
    planned = store.outbox.plan_notifications(run_id, Announcements([(dead, None)]))
    assert planned == (["n2"], ["n2"])
    assert store.outbox.start_delivery(run_id, "n2", deadline_ms=0, max_attempts=1)[0] == "ok"
    assert store.outbox.start_delivery(run_id, "n2", deadline_ms=0, max_attempts=1)[0] == "failed"
    text = render(store).decode()
    assert "layby_notifications_failed_total 2.0" in text
    for key in client.scan_iter("metrics-test:*"):
        client.delete(key)
