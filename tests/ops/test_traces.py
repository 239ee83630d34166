"""Traces: a run seen end to end in the caller's tracing backend. Real parts: a gateway,
worker and sweeper exporting over OTLP/HTTP (only the OTEL_* variables set) to a local
receiver that decodes what they send (`tests.support.otlp`)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import API_KEY, LaybySystem, wait_until
from tests.support.otlp import Receiver, Span

pytestmark = pytest.mark.integration
TOKEN_KEYS = "k1:tokens-0123456789abcdef"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver().start()
    yield running
    running.stop()


@pytest.fixture
def traced(isolated: Callable[..., LaybySystem], receiver: Receiver) -> LaybySystem:
    """A system whose processes trace: the standard variables only (and a short export
    delay, so the test need not wait 5 s for each batch)."""
    return isolated(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
                    OTEL_BSP_SCHEDULE_DELAY="100", LAYBY_TOKEN_KEYS=TOKEN_KEYS).start()


def _caller_trace() -> tuple[str, str]:
    return secrets.token_hex(16), secrets.token_hex(8)


def _of(receiver: Receiver, trace_id: str) -> list[Span]:
    return [s for s in list(receiver.spans) if s.trace_id == trace_id]


def _parked_transfer(traced: LaybySystem, receiver: Receiver
                     ) -> tuple[str, str, str, dict[str, Any]]:
    trace_id, caller_span = _caller_trace()
    with traced.api() as api:
        reply = api.post("/v1/runs", json={"agent": "demo.transfer",
                                           "input": "Send 250 to Bob"},
                         headers={"traceparent": f"00-{trace_id}-{caller_span}-01"})
    assert reply.status_code == 202, reply.text
    run_id = reply.json()["id"]
    run = traced.wait_status(run_id, "interrupted")
    receiver.wait_for("execute_tool transfer_funds", **{"layby.run.id": run_id})
    return run_id, trace_id, caller_span, run


def test_a_run_started_with_a_traceparent_shows_gateway_turn_model_and_tool_in_that_trace(
        traced: LaybySystem, receiver: Receiver) -> None:
    run_id, trace_id, caller_span, _ = _parked_transfer(traced, receiver)
    # Each process sends its spans in batches as they end, on its own schedule: the worker's
    # step span (which the park's event ends) and the gateway's request span may come in
    # either order.
    wait_until(lambda: any(e[0] == "layby.run.parked" for s in _of(receiver, trace_id)
                           for e in s.events), 30, what="the step's span with its park")

    def continued() -> list[Span]:
        return [s for s in _of(receiver, trace_id)
                if s.service == "layby-gateway" and s.parent_id == caller_span]

    wait_until(continued, 30, what="a gateway span that continues the caller's")
    spans = _of(receiver, trace_id)
    by_id = {s.span_id: s for s in spans}
    turn = receiver.wait_for("invoke_agent demo.transfer", **{"layby.run.id": run_id})[0]
    assert turn.trace_id == trace_id and turn.service == "layby-worker"
    assert turn.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert turn.attributes["gen_ai.agent.name"] == "demo.transfer"
    chat = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "chat"]
    assert chat and all(s.parent_id == turn.span_id for s in chat)
    assert chat[0].attributes["gen_ai.provider.name"]
    assert chat[0].attributes["gen_ai.request.model"]
    tool = receiver.named("execute_tool transfer_funds", **{"layby.run.id": run_id})[0]
    assert tool.trace_id == trace_id and tool.parent_id == turn.span_id
    assert tool.attributes["gen_ai.tool.name"] == "transfer_funds"
    assert tool.attributes["gen_ai.tool.call.id"]
    assert tool.attributes["layby.tool.outcome"] == "interrupt"
    # The worker's span of the step is a child of the gateway's, through the message.
    step = by_id[turn.parent_id]
    chain = [step]
    while chain[-1].parent_id in by_id:
        chain.append(by_id[chain[-1].parent_id])
    assert chain[-1].parent_id == caller_span, [s.name for s in chain]
    parked = [e for s in spans for e in s.events if e[0] == "layby.run.parked"]
    assert parked and parked[0][1]["layby.run.id"] == run_id
    # Prompts and replies stay out unless asked for (below).
    assert not [k for s in spans for k in s.attributes if k.endswith(".messages")]


def test_prompts_and_replies_are_recorded_only_when_asked_for(
        isolated: Callable[..., LaybySystem], receiver: Receiver) -> None:
    asked = isolated(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
                     OTEL_BSP_SCHEDULE_DELAY="100",
                     OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="SPAN_ONLY").start()
    run_id = asked.start_run("demo.transfer", "Send 250 to Bob")["id"]
    asked.wait_status(run_id, "interrupted")
    [chat] = receiver.wait_for("chat scripted", **{"layby.run.id": run_id})
    assert "Send 250 to Bob" in str(chat.attributes.get("gen_ai.input.messages")), \
        chat.attributes
    assert "transfer_funds" in str(chat.attributes.get("gen_ai.output.messages"))


def test_the_answers_trace_and_the_runs_trace_are_linked_both_ways(
        traced: LaybySystem, receiver: Receiver) -> None:
    run_id, run_trace, _, run = _parked_transfer(traced, receiver)
    [interrupt] = traced.open_interrupts(run)
    answer_trace, answer_span = _caller_trace()
    with traced.api() as api:
        reply = api.post(f"/v1/runs/{run_id}/interrupts/{interrupt['id']}",
                         json={"status": "resolved", "payload": {"approved": True}},
                         headers={"traceparent": f"00-{answer_trace}-{answer_span}-01"})
    assert reply.status_code == 200, reply.text
    traced.wait_status(run_id, "completed")
    answer = receiver.wait_for("layby.answer", **{"layby.run.id": run_id})[0]
    assert answer.trace_id == answer_trace
    assert answer.attributes["layby.answer.channel"] == "api"
    assert any(t == run_trace for t, _ in answer.links), answer.links
    resume = receiver.wait_for("layby.resume", **{"layby.run.id": run_id})[0]
    assert resume.trace_id == answer_trace
    assert any(t == run_trace for t, _ in resume.links)
    back = receiver.wait_for("layby.run.resumed", **{"layby.run.id": run_id})[0]
    assert back.trace_id == run_trace
    assert (resume.trace_id, resume.span_id) in back.links
    # The resumed turn and its tool call are in the answer's trace.
    tool = receiver.wait_for("execute_tool transfer_funds", **{"layby.run.id": run_id,
                                                               "layby.tool.outcome": "output"})
    assert tool[0].trace_id == answer_trace


def test_no_key_or_token_appears_in_any_span(traced: LaybySystem,
                                             receiver: Receiver) -> None:
    """A run token minted by the key, read with and answered with: neither the key nor the
    token is in anything exported (the answer is traced all the same)."""
    run_id, _, _, run = _parked_transfer(traced, receiver)
    [interrupt] = traced.open_interrupts(run)
    with traced.api() as api:
        minted = api.post(f"/v1/runs/{run_id}/tokens", json={"can": ["read", "answer"]})
    assert minted.status_code == 201, minted.text
    token = minted.json()["token"]
    with traced.api(key=token) as browser:
        assert browser.get(f"/v1/runs/{run_id}").status_code == 200
        declined = browser.post(f"/v1/runs/{run_id}/interrupts/{interrupt['id']}",
                                json={"status": "cancelled", "metadata": {"reason": "no"}})
    assert declined.status_code == 200, declined.text
    traced.wait_status(run_id, "completed")
    answer = receiver.wait_for("layby.answer", **{"layby.run.id": run_id})[0]
    assert answer.attributes["layby.answer.channel"] == "token"
    receiver.wait_for("layby.run.resumed", **{"layby.run.id": run_id})
    exported = b"".join(receiver.raw)
    assert API_KEY.encode() not in exported
    assert token.encode() not in exported and token.split(".")[-1].encode() not in exported
    assert TOKEN_KEYS.split(":")[1].encode() not in exported


_PROBE = """
import sys, threading
from layby.broker_config import tracing
on = tracing.configure("worker")
tracing.instrument_celery()
exporting = any(t.name.startswith("OtelBatch") for t in threading.enumerate())
from opentelemetry import trace
print(on, exporting, not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider))
"""


@pytest.mark.parametrize(("env", "seen"), [
    ({}, "False False False"),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"},
     "False False False"),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"},
     "False False False"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, "True True True"),
])
def test_tracing_off_sets_no_provider_and_starts_no_exporter_thread(
        env: dict[str, str], seen: str) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", _PROBE], env={**clean, **env},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == seen


def test_an_exporter_layby_does_not_ship_is_refused_with_what_to_use() -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", _PROBE],
                          env={**clean, "OTEL_TRACES_EXPORTER": "zipkin"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "OTEL_TRACES_EXPORTER names zipkin" in done.stderr
    assert "otlp or console" in done.stderr
    # Checked with the rest of the configuration before any part starts: one line, exit 2.
    for asked in ({"OTEL_TRACES_EXPORTER": "zipkin"},
                  {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
                   "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}):
        refused = subprocess.run([str(Path(sys.executable).parent / "layby"), "check"],
                                 env={**clean, **asked}, capture_output=True, text=True,
                                 timeout=60)
        assert refused.returncode == 2, refused.stderr
        [line] = refused.stderr.strip().splitlines()
        assert line.startswith("error: OTEL_") and ("zipkin" in line or "grpc" in line)
