"""The reviewers' inbox as HTML: signing in, the requests waiting for a reviewer (each with
its form), a selection approved at once, and the history.

Rendering only: the HTTP edge (`layby.http.inbox`) signs reviewers in, reads the lists
(`layby.inbox.waiting`) and records answers. Pages work without JavaScript; with it, new
requests appear as they arrive (`inbox.js`, over `/inbox/events`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from layby.answering import pages as answer_pages
from layby.answering.forms import EDIT, Form, form_for, input_fields
from layby.answering.pages import field_controls
from layby.control import timeline as timelines
from layby.control.timeline import Entry
from layby.generation.messages import Message
from layby.inbox.waiting import Answered, Listing, Waiting

# The inbox's templates, beside the answer page's: its base, its macros and its filters.
templates = answer_pages.templates.overlay(loader=jinja2.ChoiceLoader([
    jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    jinja2.FileSystemLoader(answer_pages.TEMPLATES)]))
# The page's script: new requests appear without a reload.
SCRIPT = (Path(__file__).parent / "templates" / "inbox.js").read_text()
SIGN_IN_STATES = frozenset({"ask", "sent", "confirm", "refused", "denied", "continue"})
_CONVERSATION = 12  # the last messages shown of a run's history
_SAID = 600  # characters of one message shown


@dataclass
class Signed:
    """Who the page is for, and what its forms carry."""

    label: str
    csrf: str
    can_sign_out: bool  # signed in by a link (a proxy's sign-in is the proxy's to end)


@dataclass
class Notice:
    text: str
    kind: str = "ok"  # "ok", "notice" or "errors"


def render_sign_in(state: str, *, message: str | None = None,
                   signing_in_as: str | None = None) -> str:
    """`ask` for an address, say a link was `sent`, `confirm` a link's sign-in, say why a
    link was `refused` (and ask again) or a form `denied`, or `continue` to the inbox (a
    page reached from another site, a mail's link, carries no session cookie: it is
    `SameSite=Strict`; the next step, from this site, does)."""
    if state not in SIGN_IN_STATES:
        raise ValueError(f"unknown sign-in state {state!r}; expected one of "
                         f"{sorted(SIGN_IN_STATES)}")
    headline = {"ask": "Sign in to your inbox", "sent": "Check your mail",
                "confirm": "Sign in to your inbox",
                "refused": "This sign-in link cannot be used",
                "denied": "Nothing was recorded", "continue": "Opening your inbox…"}[state]
    return templates.get_template("inbox_sign_in.html").render(
        state=state, headline=headline, message=message, signing_in_as=signing_in_as,
        reviewer_label=None, live=False, refresh_to="/inbox" if state == "continue" else None)


def render_inbox(who: Signed, listing: Listing, *, filters: Mapping[str, str | None],
                 handover_to: Mapping[str, list[tuple[str, str]]],
                 notice: Notice | None = None,
                 errors: Mapping[str, list[dict[str, Any]]] | None = None,
                 values: Mapping[str, Mapping[str, str]] | None = None,
                 editable: frozenset[str] = frozenset(),
                 refresh_url: str = "/inbox?partial=1", partial: bool = False) -> str:
    """The requests waiting for the reviewer, each with its form; `errors` and `values`
    (by request ref) show a refused answer again beside what was typed; `editable`: the
    requests whose arguments the reviewer may edit. `partial`: the list alone, for the
    page's script to swap in."""
    errors, values = errors or {}, values or {}
    context = {
        "items": [_item(w, errors.get(w.ref, []), values.get(w.ref), handover_to.get(w.ref, []),
                        w.ref in editable)
                  for w in listing.items],
        "truncated": listing.truncated, "filtered": any(filters.values()),
        "total": listing.total,
        "csrf": who.csrf,
    }
    if partial:
        return templates.get_template("inbox_items.html").render(context)
    return templates.get_template("inbox.html").render(
        context, listing=listing, filters={k: v or "" for k, v in filters.items()},
        notice=notice, refresh_url=refresh_url, current="requests", live=True,
        **_signed(who))


def render_timeline(who: Signed, w: Waiting, entries: list[Entry]) -> str:
    """The timeline of the run behind one of the reviewer's requests (`control.timeline`)."""
    return templates.get_template("inbox_timeline.html").render(
        w=w, timeline=[(e, timelines.duration(e.took_ms) if e.took_ms is not None else "")
                       for e in entries], current="inbox", live=False, **_signed(who))


def render_history(who: Signed, history: list[Answered]) -> str:
    return templates.get_template("inbox_history.html").render(
        history=history, current="history", live=False, **_signed(who))


def render_bulk_confirm(who: Signed, items: list[Waiting], skipped: str | None) -> str:
    """The selection to approve, listed, and the button that approves it."""
    return templates.get_template("inbox_bulk.html").render(
        state="confirm", items=items, skipped=skipped, current="requests", live=False,
        **_signed(who))


def render_bulk_done(who: Signed, results: list[tuple[str, str, str]], approved: int) -> str:
    """How each approval of a selection went: (ref, label, outcome)."""
    return templates.get_template("inbox_bulk.html").render(
        state="done", results=results, approved=approved, current="requests", live=False,
        **_signed(who))


def _signed(who: Signed) -> dict[str, Any]:
    return {"reviewer_label": who.label, "csrf": who.csrf, "can_sign_out": who.can_sign_out}


def _item(w: Waiting, errors: list[dict[str, Any]], values: Mapping[str, str] | None,
          handover_to: list[tuple[str, str]], editable: bool) -> dict[str, Any]:
    form = form_for(w.interrupt)
    edit = Form("fields", input_fields(w.interrupt)) if editable else None
    why = "; ".join(w.why)
    return {"waiting": w, "why": why[:1].upper() + why[1:], "form": form,
            "controls": _controls(w, form, errors, values), "errors": errors,
            "left": time_left(w.left_s),
            "soon": w.left_s is not None and w.left_s < 3600,
            "conversation": conversation(w.run.messages), "handover_to": handover_to,
            "edit_controls": _controls(w, edit, errors, values) if edit else [],
            # Shown open again when an answer that carried an edit was refused.
            "editing": bool(errors and values and any(k.startswith(EDIT) for k in values))}


def _controls(w: Waiting, form: Form, errors: list[dict[str, Any]],
              values: Mapping[str, str] | None) -> list[dict[str, Any]]:
    # Ids carry the interrupt's: every request on the page has its own form.
    return [dict(c, id=f"f-{w.interrupt.id}-{c['field'].name}")
            for c in field_controls(form, errors, values)]


def time_left(seconds: float | None) -> str:
    """How long a request has left, as people say it."""
    if seconds is None:
        return "no expiry"
    if seconds <= 0:
        return "expiring now"
    minutes = int(seconds // 60)
    if minutes < 1:
        return "expires in under a minute"
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"expires in {days} d {hours} h"
    return f"expires in {hours} h {minutes} min" if hours else f"expires in {minutes} min"


def conversation(messages: list[Message]) -> list[tuple[str, str]]:
    """The run's history as (who, what they said), the last messages only: text as it
    was written, tool calls and their results named."""
    said: list[tuple[str, str]] = []
    for message in messages:
        for part in message.content:
            if part.text:
                text = part.text
            elif part.tool_request is not None:
                text = f"asks to run {part.tool_request.name}"
            elif part.tool_response is not None:
                text = f"{part.tool_response.name} answered"
            else:
                continue
            role = {"user": "User", "model": "Agent", "tool": "Tool",
                    "system": "System"}.get(message.role, str(message.role))
            said.append((role, text if len(text) <= _SAID else text[:_SAID - 1] + "…"))
    return said[-_CONVERSATION:]
