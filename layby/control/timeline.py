"""A run's timeline, for people without a tracing backend: its events read back as what
happened and how long it took. When each step ran and on which worker, how long its model
call and each tool call took, where the run waited and for whom, its retries, and every
answer with who gave it, on which channel and after how long a wait.

Read from the run's own events (the store's stream, folded or not), so it needs nothing
but the store and is the same in `layby runs show RUN --timeline`, on the answer page and
in the reviewers' inbox. A step's timings come from the step's event (a worker of a release
before them wrote none: the step shows without them)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from layby.generation.messages import Wire
from layby.parking import Store
from layby.wire import Event

PAGE = 500


class Entry(Wire):
    """One line of the timeline. `depth` 1: a part of the step above (a model or tool call).
    As data (`layby runs show --timeline --json`), camelCase like the API's shapes."""

    at: str  # RFC 3339, the event's time
    offset_ms: int  # since the run was created
    what: str  # created, step, model, tool, parked, notified, escalated, answered, …
    detail: str
    took_ms: int | None = None  # how long it took (a step, a call) or waited (an answer)
    worker: str | None = None
    by: str | None = None  # who answered, approved or was notified
    channel: str | None = None
    depth: int = 0


# What a page shows at most (the answer page, the inbox): a run of a long loop can have
# thousands of events, and a page is rendered at each visit.
PAGE_EVENTS = 2000


def of_run(store: Store, run_id: str, max_events: int | None = None) -> list[Entry]:
    """The run's timeline from its events (read a page at a time): all of them, or its
    first `max_events`, then a line saying the rest is left out."""
    events: list[Event] = []
    after = "0-0"
    while True:
        page = store.runs.events(run_id, after, count=PAGE)
        events.extend(page)
        if max_events is not None and len(events) > max_events:
            break
        if len(page) < PAGE:
            return build(events)
        after = page[-1].id
    entries = build(events[:max_events])
    last = entries[-1] if entries else None
    return [*entries, Entry(at=last.at if last else "", offset_ms=last.offset_ms if last else 0,
                            what="more", detail="later events are left out here: "
                                                "`layby runs show RUN --timeline` has them all")]


def _ms(at: str) -> int:
    return int(datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp() * 1000)


def build(events: list[Event]) -> list[Entry]:
    """The timeline of a run from its events, oldest first."""
    if not events:
        return []
    start = _ms(events[0].at)
    entries: list[Entry] = []
    state: dict[str, Any] = {"step_at": None, "parked_at": None}
    for event in events:
        at = _ms(event.at)
        data = event.data if isinstance(event.data, dict) else {}
        for entry in _read(event.type, data, at, state):
            entries.append(entry.model_copy(update={"at": event.at, "offset_ms": at - start}))
    return entries


def _entry(what: str, detail: str, **more: Any) -> Entry:
    return Entry(at="", offset_ms=0, what=what, detail=detail, **more)


def _read(kind: str, data: dict[str, Any], at: int, state: dict[str, Any]) -> list[Entry]:
    """The lines one event makes; `state` carries when the step began and the run parked."""
    if kind == "run.created":
        return [_entry("created", f"run of {data.get('agent', '?')}")]
    if kind == "run.started":
        state["step_at"] = at
        began = {"queued": "queued", "resuming": "answered", "running": "its lease lapsed",
                 "retrying": "a retry is due"}.get(str(data.get("from")), str(data.get("from")))
        return [_entry("step", f"taken up ({began})")]
    if kind in ("turn.committed", "run.completed", "run.interrupted"):
        return _step(kind, data, at, state)
    if kind in ("interrupt.answered", "interrupt.auto_answered"):
        return [_answered(kind, data, at, state)]
    if kind == "interrupt.approved":
        return [_entry("approved", f"{data.get('interruptId')}: approval "
                       f"{data.get('approvals')} of {data.get('requiredApprovals')}",
                       by=data.get("by"))]
    return [e for e in [_other(kind, data, at, state)] if e is not None]


def _step(kind: str, data: dict[str, Any], at: int, state: dict[str, Any]) -> list[Entry]:
    began = state.get("step_at")
    took = at - began if began is not None else None
    if kind == "run.interrupted":
        state["parked_at"] = at
        asked = ", ".join(f"{i.get('id')} ({i.get('reason')})"
                          for i in data.get("interrupts", []) if isinstance(i, dict))
        head = _entry("parked", f"waits for {asked or 'an answer'}", took_ms=took)
    else:
        head = _entry("committed" if kind == "turn.committed" else "completed",
                      "turn committed, the next one queued" if kind == "turn.committed"
                      else "the run's result committed", took_ms=took,
                      worker=data.get("worker"))
    parts = [_entry(t.get("kind", "call"), _call(t), took_ms=t.get("ms"), depth=1)
             for t in data.get("timings", []) if isinstance(t, dict)]
    return [*parts, head]


def _call(timing: dict[str, Any]) -> str:
    name = str(timing.get("name", "?"))
    if timing.get("kind") == "tool":
        outcome = timing.get("outcome")
        return f"{name} ({timing.get('ref')})" + (f" → {outcome}" if outcome != "output"
                                                    else "")
    return name


def _answered(kind: str, data: dict[str, Any], at: int, state: dict[str, Any]) -> Entry:
    parked = state.get("parked_at")
    waited = at - parked if parked is not None else None
    if kind == "interrupt.auto_answered":
        return _entry("answered", f"{data.get('interruptId')} {data.get('status', '')} by a "
                      "rule, as it parked", by=data.get("answeredBy"),
                      channel=data.get("channel"))
    state_word = data.get("state") or data.get("status") or ""
    return _entry("answered", f"{data.get('interruptId')} {state_word}", took_ms=waited,
                  by=data.get("answeredBy"), channel=data.get("channel"))


def _other(kind: str, data: dict[str, Any], at: int, state: dict[str, Any]) -> Entry | None:
    if kind == "run.resuming":
        return _entry("resuming", "every interrupt answered: the resume is queued")
    if kind == "run.requeued":
        why = {"now": "a retry was asked for", "due": "its retry is due"}.get(
            str(data.get("retry")), "its worker was lost, or gave it back")
        return _entry("requeued", f"queued again: {why}")
    if kind == "run.retrying":
        calls = data.get("calls", []) if isinstance(data.get("calls"), list) else []
        said = "; ".join(f"{c.get('toolName')} attempt {c.get('attempt')} of "
                         f"{c.get('maxAttempts')} after {c.get('lastError')}"
                         for c in calls if isinstance(c, dict))
        return _entry("retrying", f"waits until {data.get('nextAttemptAt')}: {said}")
    if kind == "notification.sent":
        return _entry("notified", f"{data.get('kind', 'request')} for "
                      f"{data.get('interruptId')}", by=data.get("reviewer"),
                      channel=data.get("channel"))
    if kind == "notification.failed":
        return _entry("not notified", f"gave up on {data.get('interruptId')}",
                      by=data.get("reviewer"), channel=data.get("channel"))
    if kind == "interrupt.escalated":
        return _entry("escalated", f"{data.get('interruptId')} to level {data.get('level')}")
    if kind == "interrupt.delegated":
        return _entry("handed over", f"{data.get('interruptId')} to {data.get('to')}",
                      by=data.get("by"))
    if kind in ("run.failed", "run.cancelled"):
        return _entry(kind.split(".")[1], f"{data.get('code', '')}: "
                      f"{data.get('message', data.get('reason', ''))}".strip(": "))
    return None


def render(entries: list[Entry]) -> list[str]:
    """The timeline as text lines, for a terminal."""
    lines = []
    for e in entries:
        took = f"  {duration(e.took_ms)}" if e.took_ms is not None else ""
        who = "".join(f"  {label} {value}" for label, value in
                      (("by", e.by), ("via", e.channel), ("on", e.worker)) if value)
        # A call is part of the step below it: its time is the step's, not a moment.
        when = "" if e.depth else _offset(e.offset_ms)
        lines.append(f"{when:>10}  {'  ' * e.depth}{e.what:<12}{e.detail}{took}{who}")
    return lines


def _offset(ms: int) -> str:
    return "+" + duration(ms)


def duration(ms: int) -> str:
    """A span of time as people read it: 40 ms, 1.2 s, 3.5 min, 2.1 h, 1.5 d."""
    if ms < 1000:
        return f"{ms} ms"
    seconds = ms / 1000
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
