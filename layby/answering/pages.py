"""The reviewer's page: one interrupt, where it stands, and the form that answers it.

Rendering only: the caller verifies the link, loads the interrupt, records answers and picks
the `state`. The page is plain HTML (a form POST, no JavaScript) so it works in any mail
client's browser and with scripts off; GET renders, it never records.

States:
    open       the form
    answered   someone already answered (who, how, when); no form
    expired    the request ran out of time; no form
    cancelled  the run was cancelled or is over; no form
    done       thanks after a successful answer: what was recorded, and that the run goes on
    approved   this reviewer's approval is recorded, and the request waits for more
    handed     this reviewer handed the request on: to whom; no form
    refused    the link is bad, expired or forged: `message` says why; no form
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2

from layby.answering.forms import DECISIONS, PAYLOAD, Form
from layby.control import timeline as timelines
from layby.control.timeline import Entry
from layby.generation.interrupts import Interrupt
from layby.reviewers.schemas import is_confirmation
from layby.wire import InterruptView

STATES = frozenset({"open", "answered", "expired", "cancelled", "done", "approved", "handed",
                    "refused"})

TEMPLATES = Path(__file__).parent / "templates"
templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    autoescape=True,
    undefined=jinja2.StrictUndefined,  # a misspelt name fails loudly instead of showing nothing
    trim_blocks=True,
    lstrip_blocks=True,
)


def render_review(*, agent: str, interrupt: InterruptView | None, reviewer_label: str | None,
                  state: str, form: Form | None, errors: list[dict[str, Any]] | None = None,
                  values: Mapping[str, str] | None = None, message: str | None = None,
                  decision: str | None = None,
                  handover_to: list[tuple[str, str]] | None = None,
                  timeline: list[Entry] | None = None) -> str:
    """The review page as HTML.

    `errors` are `{path, message}` items (from `notifier.forms.Invalid.detail["errors"]`);
    `values` are what was posted, shown again so nothing typed is lost; `message` is the
    reason on a `refused` page and an extra line elsewhere; `decision` is the button a link
    preselected (`?decision=approve`); `handover_to` the (id, name) of the reviewers the
    request can be handed to; `timeline` what the run did so far (`control.timeline`).
    """
    if state not in STATES:
        raise ValueError(f"unknown review page state {state!r}; expected one of {sorted(STATES)}")
    errors = list(errors or [])
    chosen = decision if decision in DECISIONS else (form.decision if form else None)
    return templates.get_template("review.html").render(
        agent=agent,
        interrupt=interrupt,
        reviewer_label=reviewer_label,
        state=state,
        form=form if state == "open" else None,
        controls=field_controls(form, errors, values) if form and state == "open" else [],
        errors=errors,
        message=message,
        decision=chosen,
        confirmation=interrupt is not None and is_confirmation(interrupt),
        tool_input=interrupt.tool_input if interrupt is not None else None,
        outcome=outcome(interrupt) if interrupt is not None else None,
        answer=getattr(interrupt, "answer", None),
        recorded=_recorded(interrupt),
        handover_to=handover_to or [],
        timeline=[(e, _took(e.took_ms)) for e in timeline or []],
    )


def _took(ms: int | None) -> str:
    return "" if ms is None else timelines.duration(ms)


def field_controls(form: Form, errors: list[dict[str, Any]], values: Mapping[str, str] | None
              ) -> list[dict[str, Any]]:
    """Each field with what it shows now and the errors about it."""
    controls = []
    for field in form.fields:
        # After a POST an unticked checkbox is simply absent: absent means unticked then.
        current = field.value if values is None else values.get(field.name, "")
        mine = [e["message"] for e in errors if _field_of(e.get("path", "")) == field.name]
        controls.append({"field": field, "id": f"f-{field.name}", "value": current,
                         "errors": mine})
    return controls


def _field_of(path: str) -> str:
    parts = path.split("/")
    if len(parts) < 2 or not parts[1]:
        return PAYLOAD  # the whole answer: the single field, if the form has one
    return parts[1]


def outcome(interrupt: Interrupt) -> str:
    """One word for how the interrupt was settled: approved, declined, answered, …"""
    state = str(getattr(interrupt, "state", "open"))
    answer = getattr(interrupt, "answer", None)
    if state in ("open", "expired") or answer is None:
        return state
    if is_confirmation(interrupt):
        if answer.status == "cancelled":
            return "declined"
        payload = answer.payload if isinstance(answer.payload, dict) else {}
        return "declined" if payload.get("approved") is False else "approved"
    return "cancelled" if answer.status == "cancelled" else "answered"


def _recorded(interrupt: Interrupt | None) -> dict[str, Any] | None:
    """What the recorded answer said, for the thank-you page: the value and any note."""
    answer = getattr(interrupt, "answer", None)
    if interrupt is None or answer is None:
        return None
    payload, meta = answer.payload, answer.metadata or {}
    note = meta.get("reason") or meta.get("note")
    if is_confirmation(interrupt):
        rest = payload if isinstance(payload, dict) else {}
        note = rest.get("note") or note
        # Approve / decline says it all unless the form asked for more than that.
        extra = {k: v for k, v in rest.items() if k not in ("approved", "note")}
        return {"value": _pretty(extra) if extra else None, "note": note}
    if answer.status == "cancelled":
        return {"value": None, "note": note}
    return {"value": payload if isinstance(payload, str) else _pretty(payload), "note": note}


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _when(value: str | None) -> str:
    """An RFC 3339 time as people read it, in UTC; anything unparsable as it came."""
    if not value:
        return ""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%d %b %Y, %H:%M:%S UTC")


def _label(key: object) -> str:
    """A field name as a label: `amount` → Amount, `dueDate` and `due_date` → Due date."""
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", str(key)).replace("_", " ").strip()
    return words[:1].upper() + words[1:].lower() if words else str(key)


templates.filters["when"] = _when
templates.filters["label"] = _label
templates.filters["json"] = _pretty


def render_mailbox(messages: list[Any], current: Any | None,
                   reply_outcome: str | None = None) -> str:
    """The mail catcher's page (`layby up` only): the caught mails, one of them open with a
    reply box."""
    html = getattr(current, "html", None)
    return templates.get_template("mailbox.html").render(
        messages=messages, current=current, reply_outcome=reply_outcome,
        mail_html=_links_in_new_tabs(html) if html else None)


def _links_in_new_tabs(html: str) -> str:
    """The mail's HTML with `<base target="_blank">` at the start of its head: in the
    sandboxed frame, a link that opened in the frame itself would show the page inside
    the mail."""
    base = '<base target="_blank">'
    head = re.search(r"<head(\s[^>]*)?>", html, flags=re.IGNORECASE)
    if head is None:
        return base + html
    return html[:head.end()] + base + html[head.end():]
