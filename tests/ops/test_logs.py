"""Structured logs and the metrics port, as an operator sees them: the log files of a real
system's worker, sweeper and gateway with LAYBY_LOG_FORMAT=json, and a Prometheus scrape of
LAYBY_METRICS_PORT without the API key."""

from __future__ import annotations

import hashlib
import io
import json
import logging
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from layby.broker_config import Settings, logs
from layby.ops.embedded import free_port
from tests.support.harness import API_KEY, wait_until


def _json_lines(text: str, where: str) -> list[dict[str, Any]]:
    lines = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            lines.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"a line of the {where} log is not JSON: {line!r}") from None
    return lines


def test_json_logs_carry_run_and_interrupt_ids(isolated) -> None:
    metrics_port = free_port()
    system = isolated(LAYBY_LOG_FORMAT="json", LAYBY_METRICS_PORT=str(metrics_port)).start()
    run_id = system.start_run("demo.transfer", "Send 250 to Bob")["id"]
    run = system.wait_status(run_id, "interrupted")
    (approval,) = system.open_interrupts(run)
    assert system.answer(run_id, approval["id"], payload={"approved": True}).status_code == 200
    system.wait_status(run_id, "completed")

    def about_the_run(name: str) -> list[dict[str, Any]]:
        lines = _json_lines(system.procs[name].output(), name)
        for line in lines:
            assert {"time", "level", "logger", "message"} <= line.keys(), line
        return [line for line in lines if line.get("run_id") == run_id]

    # The worker: its task lines (Celery's own "received"/"succeeded" included) name the
    # run and the task, every line parses, and the banner is gone.
    tasks = {"layby.run_turn", "layby.resume_run"}
    worker = wait_until(lambda: tasks <= {w.get("task_name") for w in about_the_run("worker")}
                        and about_the_run("worker"), what="worker lines about the run's tasks")
    assert all(w.get("task_id") for w in worker)
    assert any(w["logger"].startswith("celery") for w in worker)
    # The gateway records who answered which interrupt.
    answered = wait_until(lambda: [g for g in about_the_run("gateway")
                                   if g.get("interrupt_id") == approval["id"]],
                          what="the gateway's line about the answer")
    fingerprint = hashlib.sha256(API_KEY.encode()).hexdigest()[:12]
    assert answered[0]["message"].endswith(f"resolved by api-key:{fingerprint} via api")
    assert answered[0]["level"] == "INFO"
    _json_lines(system.procs["sweeper"].output(), "sweeper")
    for proc in system.procs.values():
        assert API_KEY not in proc.output()

    # The metrics port answers without the key; the gateway's /metrics still needs it.
    scrape = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
    assert scrape.status_code == 200
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(scrape.text)
               for s in family.samples}
    assert samples[("layby_redis_up", ())] == 1
    assert samples[("layby_runs", (("state", "completed"),))] == 1
    assert samples[("layby_resume_latency_seconds_count", ())] == 1
    assert httpx.get(f"{system.base_url}/metrics", timeout=10).status_code == 401


def test_text_logs_name_the_run_after_the_message() -> None:
    out = io.StringIO()
    logs.configure(Settings(log_format="text"), stream=out)
    try:
        log = logging.getLogger("layby.test")
        with logs.about(run_id="run-1", interrupt_id="intr-2"):
            log.info("parked")
        log.info("no run here")
        log.info("given", extra={"run_id": "run-3"})
    finally:
        logging.getLogger().handlers.clear()
    first, second, third = out.getvalue().splitlines()
    assert first.endswith("INFO layby.test parked [run=run-1 interrupt=intr-2]")
    assert second.endswith("INFO layby.test no run here")
    assert third.endswith("given [run=run-3]")


def test_a_wrong_log_setting_says_what_to_use() -> None:
    try:
        Settings(log_level="chatty")
    except ValueError as exc:
        assert "DEBUG, INFO, WARNING, ERROR, CRITICAL" in str(exc)
    else:
        raise AssertionError("a log level that does not exist was accepted")


def test_lines_and_tracebacks_are_scrubbed_of_tokens_and_secrets() -> None:
    """Whatever a library logs (a URL with a token, an error quoting a key), the line that
    is written holds neither."""
    out = io.StringIO()
    key = "k-0123456789-never-in-a-log"
    logs.configure(Settings(log_format="json", api_keys=[key]), stream=out)
    try:
        log = logging.getLogger("some.library")
        log.info('"GET /review/t1-abcdefgh-ijklmnop?x=1 HTTP/1.1" 200')
        log.info("POST /inbound/email?to=reply%2Bt1-abcdefgh-ijklmnop%40example.com")
        try:
            raise ValueError(f"refused Bearer {key} for reply+t1-abcdefgh-ijklmnop@x.org")
        except ValueError:
            log.exception("failed with %s", key)
    finally:
        logging.getLogger().handlers.clear()
    text = out.getvalue()
    assert "t1-abcdefgh" not in text and key not in text, text
    first, second, third = (json.loads(line) for line in text.splitlines())
    assert first["message"] == '"GET /review/<token>?x=1 HTTP/1.1" 200'
    assert second["message"] == "POST /inbound/email?to=reply%2B<token>%40example.com"
    assert third["message"] == "failed with <secret>"
    assert "ValueError: refused Bearer <secret> for reply+<token>@x.org" in third["exc_info"]
