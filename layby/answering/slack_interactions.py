"""Slack in: clicks on a request's buttons and the answer modal's submissions, POSTed by
Slack to `/slack/interactions` as a form with one field, `payload` (JSON).

Nothing is read before Slack's request signature (`X-Slack-Signature`, made with the app's
signing secret over `v0:<timestamp>:<body>`) verifies and its timestamp is within five
minutes. The clicking user is known by their Slack id, which must be a reviewer's
`slack_id` in the directory, and that reviewer must be asked for the request (the same
allow-list as every reviewer channel); then the answer goes through the same
`control.commands.answer` as every other way in, recorded with `channel: "slack"`. A click
on a request that is answered already records nothing, and its message is updated to say
who answered, how and when.

Slack wants its reply within 3 seconds: what may take longer (updating messages, telling
the clicking user why a click did nothing) runs after the reply (`Reply.later`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from layby.answering import answers
from layby.answering.forms import DECISION, Field, Form, entry_from_form, form_for
from layby.control import Runtime, commands
from layby.errors import Conflict, Invalid, LaybyError, NotFound, Unauthorized
from layby.notifier import slack_messages
from layby.notifier.mail import PermanentFailure
from layby.reviewers.directory import Reviewer

log = logging.getLogger(__name__)

TOLERANCE_S = 300  # Slack's own advice: refuse requests more than five minutes old
_MAX_OPTIONS = 10  # radio buttons take ten options; more become a menu
_CHECKED = "on"


class BadSignature(Unauthorized):
    """A request that Slack did not sign with the app's signing secret (or a replay)."""


class NotConfigured(NotFound):
    """Slack is not configured: the route answers like one that does not exist."""


@dataclass
class Reply:
    """What Slack is answered (None: an empty 200), and what is done after answering."""

    body: dict[str, Any] | None = None
    later: list[Callable[[], None]] = field(default_factory=list)


def verify(secret: str, raw: bytes, headers: dict[str, str], now: float | None = None
           ) -> None:
    """Refuse a request without a good Slack signature or with a stale timestamp."""
    stamp = headers.get("x-slack-request-timestamp", "")
    signature = headers.get("x-slack-signature", "")
    if not stamp or not signature:
        raise BadSignature("a Slack request carries X-Slack-Signature and "
                           "X-Slack-Request-Timestamp")
    if not stamp.isdigit() or abs((now or time.time()) - int(stamp)) > TOLERANCE_S:
        raise BadSignature(f"the X-Slack-Request-Timestamp is more than {TOLERANCE_S} s "
                           "from now: refused as a replay")
    # Here, not at the top: slack_sdk costs every gateway about 20 ms at its start.
    from slack_sdk.signature import SignatureVerifier

    verifier = SignatureVerifier(secret)
    if not verifier.is_valid(raw, stamp, signature):
        raise BadSignature("the Slack signature does not verify with the signing secret "
                           "(LAYBY_SLACK_SIGNING_SECRET)")


def receive(rt: Runtime, raw: bytes, headers: dict[str, str]) -> Reply:
    """Verify and act on one interaction; returns Slack's reply and what to do after."""
    settings = rt.settings
    if not headers.get("x-slack-signature") or not headers.get("x-slack-request-timestamp"):
        verify("", raw, headers)  # refused as unsigned, configured or not
    if settings.slack_signing_secret is None or settings.slack_bot_token is None:
        raise NotConfigured("Slack is not configured: set LAYBY_SLACK_BOT_TOKEN and "
                            "LAYBY_SLACK_SIGNING_SECRET")
    verify(settings.slack_signing_secret.get_secret_value(), raw, headers)
    payload = _payload(raw)
    kind = payload.get("type")
    if kind == "block_actions":
        return _clicked(rt, payload)
    if kind == "view_submission":
        return _submitted(rt, payload)
    return Reply()  # other interactions (a modal closed, a shortcut) ask nothing of us


def _payload(raw: bytes) -> dict[str, Any]:
    try:
        form = parse_qs(raw.decode("utf-8"), strict_parsing=False)
        payload = json.loads(form["payload"][0])
    except (UnicodeDecodeError, KeyError, IndexError, ValueError):
        raise Invalid("a Slack interaction is a form with a JSON `payload`") from None
    if not isinstance(payload, dict):
        raise Invalid("a Slack interaction's `payload` is a JSON object")
    return payload


# A payload's parts as Slack sends them, or empty when not: a signed payload of another
# shape is answered as one that asks nothing, never with a 500.
def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _seq(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _ids(value: Any) -> tuple[str, str]:
    run_id, _, interrupt_id = str(value or "").partition(" ")
    if not run_id or not interrupt_id:
        raise Invalid("the button does not name a run and an interrupt")
    return run_id, interrupt_id


# -- button clicks ---------------------------------------------------------------------


def _clicked(rt: Runtime, payload: dict[str, Any]) -> Reply:
    actions = _seq(payload.get("actions"))
    action = _obj(actions[0] if actions else None)
    action_id = action.get("action_id")
    if action_id not in (slack_messages.APPROVE, slack_messages.DECLINE, slack_messages.ANSWER):
        return Reply()
    run_id, interrupt_id = _ids(action.get("value"))
    user = str(_obj(payload.get("user")).get("id") or "")
    channel = str(_obj(payload.get("channel")).get("id")
                  or _obj(payload.get("container")).get("channel_id") or "")
    reply = Reply()

    def tell(text: str) -> None:
        reply.later.append(lambda: ephemeral(rt, channel, user, text))

    reviewer = _clicking_reviewer(rt, user, run_id, interrupt_id, tell)
    if reviewer is None:
        return reply
    try:
        opened = answers.open_for(rt, reviewer, run_id, interrupt_id)
    except (answers.NotAllowed, NotFound) as exc:
        tell(f":no_entry: {exc.message} Your click records nothing.")
        return reply
    if not opened.is_open:
        return _too_late(rt, opened, reply, tell)
    if action_id == slack_messages.ANSWER:
        _open_modal(rt, opened, str(payload.get("trigger_id") or ""), channel)
        return reply
    decision = "approve" if action_id == slack_messages.APPROVE else "decline"
    key = f"slack:{user}:{action.get('action_ts') or payload.get('trigger_id') or ''}"
    try:
        entry = entry_from_form(opened.interrupt, {DECISION: decision})
        answers.answer(rt, opened, entry, channel="slack", idempotency_key=key)
    except Conflict as exc:
        tell(f":information_source: {exc.message}. Your click records nothing.")
        reply.later.append(lambda: refresh(rt, run_id, interrupt_id))
    except Invalid:  # the approval asks for more than a click (a required note, say)
        _open_modal(rt, opened, str(payload.get("trigger_id") or ""), channel)
    except LaybyError as exc:
        tell(f":warning: {exc.message}. Your click records nothing.")
    return reply


def _clicking_reviewer(rt: Runtime, user: str, run_id: str, interrupt_id: str,
                       tell: Callable[[str], None]) -> Reviewer | None:
    """The reviewer whose `slack_id` clicked; None for a Slack user who is none, told how
    to become one."""
    reviewer = rt.reviewers.directory().by_slack_id(user)
    if reviewer is None:
        log.warning("a Slack click on run %s by %s, who is no reviewer, refused", run_id,
                    user, extra={"run_id": run_id, "interrupt_id": interrupt_id})
        tell(":no_entry: You are not a reviewer in layby's reviewer directory, so your "
             "click records nothing. Ask an operator to add your Slack id "
             f"(`{user}`) as a reviewer's `slack_id`.")
    return reviewer


def _too_late(rt: Runtime, opened: answers.Opened, reply: Reply,
              tell: Callable[[str], None]) -> Reply:
    first = opened.interrupt.answer
    if first is not None:
        tell(f":information_source: Already {first.state.value} by {first.answered_by} via "
             f"{first.channel} at {first.answered_at}: your click records nothing.")
    else:
        tell(f":information_source: This request is no longer open (the run is "
             f"{opened.run.status.value}): your click records nothing.")
    run_id, interrupt_id = opened.run.id, opened.interrupt.id
    reply.later.append(lambda: refresh(rt, run_id, interrupt_id))
    return reply


def ephemeral(rt: Runtime, channel: str, user: str, text: str) -> None:
    """A message only `user` sees, in the conversation they clicked in."""
    try:
        slack_messages.call(rt.settings, "chat.postEphemeral", channel=channel, user=user,
                            text=text)
    except (PermanentFailure, ConnectionError) as exc:
        log.warning("could not tell Slack user %s why their click did nothing: %s", user, exc)


def refresh(rt: Runtime, run_id: str, interrupt_id: str) -> None:
    try:
        run = commands.get_run(rt, run_id)
    except NotFound:
        return
    slack_messages.refresh(rt.settings, rt.reviewers, run, [interrupt_id])


# -- the answer modal --------------------------------------------------------------------


def modal(opened: answers.Opened, channel: str = "") -> dict[str, Any]:
    """The modal that answers a question: the request, then a control per field of the
    form the answer page shows (`layby.answering.forms`)."""
    interrupt = opened.interrupt
    built = form_for(interrupt)
    blocks = slack_messages.request_blocks(opened.run, interrupt)
    blocks.append({"type": "divider"})
    blocks += [_input(f) for f in _answer_fields(built)]
    meta = json.dumps({"run": opened.run.id, "interrupt": interrupt.id, "channel": channel})
    return {"type": "modal", "callback_id": "layby_answer", "private_metadata": meta,
            "title": {"type": "plain_text", "text": _cut(f"Answer {opened.run.agent}", 24)},
            "submit": {"type": "plain_text", "text": "Send"},
            "close": {"type": "plain_text", "text": "Cancel"},
            "blocks": blocks}


def _answer_fields(built: Form) -> list[Field]:
    if built.kind == "confirmation":  # a decision, then the form's own fields
        return [Field(DECISION, "Decision", "radio", True, ["approve", "decline"]),
                *built.fields]
    return built.fields


def _cut(text: str, most: int) -> str:
    return text if len(text) <= most else text[:most - 1] + "…"


def _input(f: Field) -> dict[str, Any]:
    element: dict[str, Any]
    if f.kind == "radio":
        shown = str.capitalize if f.name == DECISION else str
        options = [{"text": {"type": "plain_text", "text": _cut(shown(c), 75)},
                    "value": c[:150]} for c in f.choices]
        element = {"type": "radio_buttons" if len(options) <= _MAX_OPTIONS
                   else "static_select", "options": options[:100]}
        initial = next((o for o in options if o["value"] == f.value), None)
        if initial is not None:
            element["initial_option"] = initial
    elif f.kind == "checkbox":
        element = {"type": "checkboxes", "options": [
            {"text": {"type": "plain_text", "text": _cut(f.label, 75)}, "value": _CHECKED}]}
    elif f.kind in ("integer", "number"):
        element = {"type": "number_input", "is_decimal_allowed": f.kind == "number"}
        if f.value:
            element["initial_value"] = f.value
    else:
        element = {"type": "plain_text_input", "multiline": f.kind in ("textarea", "json")}
        if f.value:
            element["initial_value"] = f.value
    block: dict[str, Any] = {"type": "input", "block_id": f.name, "optional": not f.required,
                             "label": {"type": "plain_text", "text": _cut(f.label, 2000)},
                             "element": {**element, "action_id": "value"}}
    if f.description:
        block["hint"] = {"type": "plain_text", "text": _cut(f.description, 2000)}
    return block


def _open_modal(rt: Runtime, opened: answers.Opened, trigger_id: str, channel: str) -> None:
    """Open the answer modal now: a trigger id is good for 3 seconds."""
    try:
        slack_messages.call(rt.settings, "views.open", trigger_id=trigger_id,
                   view=modal(opened, channel))
    except (PermanentFailure, ConnectionError) as exc:
        log.warning("run %s: could not open the Slack answer modal: %s", opened.run.id, exc,
                    extra={"run_id": opened.run.id, "interrupt_id": opened.interrupt.id})


def form_values(state: dict[str, Any]) -> dict[str, str]:
    """A submitted modal's values, as the answer page's form would post them."""
    found: dict[str, str] = {}
    for block_id, actions in _obj(state.get("values")).items():
        value = _obj(_obj(actions).get("value"))
        if "selected_option" in value:
            found[block_id] = str(_obj(value["selected_option"]).get("value") or "")
        elif "selected_options" in value:
            if any(_obj(o).get("value") == _CHECKED for o in _seq(value["selected_options"])):
                found[block_id] = _CHECKED
        elif value.get("value") is not None:
            found[block_id] = str(value["value"])
    return found


def _submitted(rt: Runtime, payload: dict[str, Any]) -> Reply:
    view = _obj(payload.get("view"))
    try:
        meta = json.loads(view.get("private_metadata") or "{}")
        run_id, interrupt_id = str(meta["run"]), str(meta["interrupt"])
    except (ValueError, KeyError, TypeError):
        return Reply()  # not our modal
    blocks = [b.get("block_id") for b in map(_obj, _seq(view.get("blocks")))
              if b.get("type") == "input"]
    first = next((b for b in blocks if b), DECISION)

    def errors(problems: dict[str, str]) -> Reply:
        return Reply({"response_action": "errors", "errors": problems})

    user = str(_obj(payload.get("user")).get("id") or "")
    reviewer = rt.reviewers.directory().by_slack_id(user)
    if reviewer is None:
        return errors({first: "You are not a reviewer in layby's reviewer directory: this "
                              "answer cannot be recorded."})
    try:
        opened = answers.open_for(rt, reviewer, run_id, interrupt_id)
    except (answers.NotAllowed, NotFound) as exc:
        return errors({first: _cut(exc.message, 150)})
    if not opened.is_open:
        done = opened.interrupt.answer
        said = (f"Already {done.state.value} by {done.answered_by} via {done.channel}"
                if done else "This request is no longer open")
        return Reply({"response_action": "errors", "errors": {first: said}},
                     [lambda: refresh(rt, run_id, interrupt_id)])
    values = form_values(_obj(view.get("state")))
    # The same modal sent again with the same values is the same answer (a retry); with
    # other values, another one.
    digest = hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]
    return _record(rt, reviewer, opened, values, f"slack:{user}:{view.get('id') or ''}:{digest}",
                   first, blocks)


def _record(rt: Runtime, reviewer: Reviewer, opened: answers.Opened, values: dict[str, str],
            key: str, first: str, blocks: list[Any]) -> Reply:
    try:
        entry = entry_from_form(opened.interrupt, values)
        answers.answer(rt, opened, entry, channel="slack", idempotency_key=key)
    except Invalid as exc:
        problems: dict[str, str] = {}
        for error in (exc.detail or {}).get("errors", []) if isinstance(exc.detail, dict) \
                else []:
            name = str(error.get("path", "")).strip("/").split("/")[0]
            block = name if name in blocks else first
            problems[block] = _cut(((problems.get(block) or "") + " "
                                    + str(error.get("message", ""))).strip(), 150)
        return Reply({"response_action": "errors",
                      "errors": problems or {first: _cut(exc.message, 150)}})
    except LaybyError as exc:
        return Reply({"response_action": "errors", "errors": {first: _cut(exc.message, 150)}},
                     [lambda: refresh(rt, opened.run.id, opened.interrupt.id)])
    log.info("run %s: %s answered interrupt %s in a Slack modal", opened.run.id, reviewer.id,
             opened.interrupt.id, extra={"run_id": opened.run.id,
                                         "interrupt_id": opened.interrupt.id})
    return Reply({"response_action": "clear"})  # the modal closes
