"""The run's timeline read from events as a worker, the sweeper and the notifier write them
(no process: the events are built here as the store returns them)."""

from __future__ import annotations

from typing import Any

from layby.control.timeline import build, render
from layby.wire import Event


def _event(n: int, kind: str, second: float, data: dict[str, Any]) -> Event:
    ms = int(second * 1000)
    return Event(id=f"{1_765_000_000_000 + ms}-{n}", type=kind, version=1,
                 at=f"2026-12-06T10:{int(second // 60):02d}:{second % 60:06.3f}Z", data=data)


def test_retries_notifications_escalations_and_a_lost_worker_read_as_they_happened() -> None:
    events = [_event(i, kind, at, data) for i, (kind, at, data) in enumerate([
        ("run.created", 0.0, {"agent": "payouts"}),
        ("run.started", 0.05, {"from": "queued"}),
        ("run.retrying", 0.4, {"calls": [{"toolName": "pay", "toolCallId": "c1",
                                          "attempt": 2, "maxAttempts": 5,
                                          "lastError": "ConnectionError: reset"}],
                               "nextAttemptAt": "2026-12-06T10:00:02.400Z"}),
        ("run.requeued", 2.4, {"retry": "due"}),
        ("run.started", 2.5, {"from": "queued"}),
        ("run.requeued", 9.0, {}),
        ("run.started", 9.1, {"from": "running"}),
        ("run.interrupted", 9.3, {"from": 3, "historyTo": 4,
                                  "interrupts": [{"id": "int_1", "reason": "confirmation"}]}),
        ("notification.sent", 9.4, {"id": "n1", "interruptId": "int_1", "reviewer": "ana",
                                    "channel": "email", "kind": "request", "attempts": 1}),
        ("interrupt.escalated", 69.4, {"interruptId": "int_1", "level": 1}),
        ("interrupt.answered", 75.3, {"interruptId": "int_1", "status": "cancelled",
                                      "state": "cancelled", "answeredBy": "reviewer:bo",
                                      "channel": "slack"}),
        ("run.resuming", 75.3, {}),
        ("run.started", 75.4, {"from": "resuming"}),
        ("run.failed", 75.6, {"code": "tool_failed", "message": "pay gave up"}),
    ])]
    entries = build(events)
    assert [e.what for e in entries] == [
        "created", "step", "retrying", "requeued", "step", "requeued", "step", "parked",
        "notified", "escalated", "answered", "resuming", "step", "failed"]
    by_what = {e.what: e for e in entries}
    assert "pay attempt 2 of 5 after ConnectionError: reset" in by_what["retrying"].detail
    assert entries[5].detail == "queued again: its worker was lost, or gave it back"
    assert entries[6].detail == "taken up (its lease lapsed)"
    assert by_what["parked"].took_ms == 200  # since the step was taken up
    assert (by_what["notified"].by, by_what["notified"].channel) == ("ana", "email")
    answered = by_what["answered"]
    assert (answered.by, answered.channel, answered.took_ms) == ("reviewer:bo", "slack", 66000)
    assert by_what["failed"].detail == "tool_failed: pay gave up"
    lines = render(entries)
    assert lines[10].split() == ["+75.3", "s", "answered", "int_1", "cancelled", "66.0", "s",
                                 "by", "reviewer:bo", "via", "slack"]
