"""Slack out: a request posted as a Block Kit message, to the reviewer (a direct message) or
to a group's channel, through Slack's Web API (`LAYBY_SLACK_API_URL`) with the bot token;
then kept up to date: updated once the request is answered (on any channel), and quorum
progress, reminders and escalations posted in its thread. Clicks on its buttons come back
to `POST /slack/interactions` (`layby.answering.slack_interactions`).

A posted message is recorded with its notification as "<channel>/<ts>" (`message`), which
is what an update needs. The buttons carry the run and interrupt ids, never a token: a
click is authenticated by Slack's request signature and the clicking user's Slack id.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from layby.broker_config import Settings
from layby.generation.interrupts import Interrupt
from layby.notifier.mail import PermanentFailure

if TYPE_CHECKING:
    from slack_sdk import WebClient
from layby.reviewers.config import Reviewers
from layby.reviewers.schemas import is_confirmation
from layby.wire import (
    Answer,
    Delegation,
    InterruptState,
    InterruptView,
    Notification,
    RunView,
)

log = logging.getLogger(__name__)

# The buttons' action ids; their value is "<run id> <interrupt id>".
APPROVE, DECLINE, ANSWER = "layby_approve", "layby_decline", "layby_answer"
# Slack's errors that will not change by trying again.
PERMANENT = {"invalid_auth", "not_authed", "account_inactive", "token_revoked",
             "user_not_found", "users_not_found", "channel_not_found", "is_archived",
             "not_in_channel", "user_disabled", "cannot_dm_bot", "missing_scope",
             "invalid_blocks", "msg_too_long", "no_permission", "team_access_not_granted"}
_TEXT_MAX = 2900  # a section's text is at most 3000 characters


def client(settings: Settings) -> WebClient:
    """A Web API client with the bot token (one per call: cheap, and no state to share
    between forked workers)."""
    if settings.slack_bot_token is None:
        raise PermanentFailure("Slack is not configured: set LAYBY_SLACK_BOT_TOKEN (and "
                               "LAYBY_SLACK_SIGNING_SECRET)")
    base = settings.slack_api_url.rstrip("/") + "/"
    # slack_sdk costs every process about 20 ms and 36 modules at its start: only a
    # deployment that posts to Slack loads it.
    from slack_sdk import WebClient

    return WebClient(token=settings.slack_bot_token.get_secret_value(), base_url=base,
                     timeout=int(max(1, settings.slack_timeout_s)))


def call(settings: Settings, method: str, **params: Any) -> dict[str, Any]:
    """One Web API call ("chat.postMessage"), through slack_sdk's method of that name (which
    sends each method's arguments the way Slack takes them); PermanentFailure for errors
    that will not change, ConnectionError for the rest (the caller retries)."""
    from slack_sdk.errors import SlackApiError, SlackClientError

    try:
        reply = getattr(client(settings), method.replace(".", "_"))(**params)
    except SlackApiError as exc:
        error = str(exc.response.get("error") or exc.response.status_code)
        if error in PERMANENT:
            raise PermanentFailure(f"Slack refused {method}: {error}") from None
        raise ConnectionError(f"Slack refused {method}: {error}") from None
    except (SlackClientError, OSError) as exc:
        raise ConnectionError(f"Slack's Web API could not be reached for {method}: "
                              f"{type(exc).__name__}: {exc}") from None
    return dict(reply.data) if isinstance(reply.data, dict) else {}


# -- what a message says ---------------------------------------------------------------


def _mrkdwn(text: str) -> str:
    """`text` with the three characters Slack's mrkdwn gives meaning escaped."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _section(text: str) -> dict[str, Any]:
    if len(text) > _TEXT_MAX:
        text = text[:_TEXT_MAX - 1] + "…"
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def tool_input(interrupt: Interrupt) -> str:
    """The tool's input as a reviewer reads it: indented JSON in a code block."""
    shown = json.dumps(interrupt.tool_input, indent=2, ensure_ascii=False, default=str)
    if len(shown) > _TEXT_MAX - 10:
        shown = shown[:_TEXT_MAX - 11] + "…"
    return f"```{_mrkdwn(shown)}```"


def summary(run: RunView, interrupt: Interrupt) -> str:
    """The one line of a notification (what Slack shows in alerts and previews)."""
    asks = "asks for your approval" if is_confirmation(interrupt) else "asks you"
    return f"{run.agent} {asks}: {interrupt.message or interrupt.tool_name}"


def request_blocks(run: RunView, interrupt: Interrupt) -> list[dict[str, Any]]:
    """The request itself: who asks what, the tool and its input."""
    blocks: list[dict[str, Any]] = [
        _section(f"*{_mrkdwn(run.agent)}* "
                 f"{'asks for your approval' if is_confirmation(interrupt) else 'asks you'}"
                 f"\n>{_mrkdwn(interrupt.message or interrupt.tool_name)}"),
        _section(f"Tool `{_mrkdwn(interrupt.tool_name)}` with:\n{tool_input(interrupt)}"),
    ]
    context = [f"run `{run.id}`", f"interrupt `{interrupt.id}`"]
    if interrupt.expires_at:
        context.append(f"expires {_when(interrupt.expires_at)}")
    blocks.append({"type": "context",
                   "elements": [{"type": "mrkdwn", "text": " · ".join(context)}]})
    return blocks


def buttons(run_id: str, interrupt: Interrupt) -> dict[str, Any]:
    """Approve and Decline for a confirmation, "Answer…" (a modal) for any other question."""
    value = f"{run_id} {interrupt.id}"
    if is_confirmation(interrupt):
        elements = [
            {"type": "button", "action_id": APPROVE, "style": "primary", "value": value,
             "text": {"type": "plain_text", "text": "Approve"}},
            {"type": "button", "action_id": DECLINE, "style": "danger", "value": value,
             "text": {"type": "plain_text", "text": "Decline"}}]
    else:
        elements = [{"type": "button", "action_id": ANSWER, "value": value,
                     "text": {"type": "plain_text", "text": "Answer…"}}]
    return {"type": "actions", "block_id": "layby_answer", "elements": elements}


def open_blocks(run: RunView, interrupt: InterruptView) -> list[dict[str, Any]]:
    blocks = request_blocks(run, interrupt)
    if interrupt.required_approvals > 1:
        blocks.append(_section(progress(interrupt)))
    return [*blocks, buttons(run.id, interrupt)]


def closed_blocks(run: RunView, interrupt: InterruptView, label: Any = None
                  ) -> list[dict[str, Any]]:
    """The message once its request takes no more answers: who answered, how and when (or
    why it closed), and no buttons."""
    return [*request_blocks(run, interrupt), _section(outcome(run, interrupt, label))]


def outcome(run: RunView, interrupt: InterruptView, label: Any = None) -> str:
    """What became of the request, in a line: who answered, how and when."""
    answer = interrupt.answer
    if answer is None:
        state = interrupt.state.value.replace("_", " ")
        return f":no_entry_sign: This request is {state} (the run is {run.status.value})."
    verb = {"resolved": "answered", "cancelled": "declined"}.get(answer.state.value,
                                                                  answer.state.value)
    if answer.state is InterruptState.RESOLVED and is_confirmation(interrupt):
        verb = "approved"
    icon = ":white_check_mark:" if verb in ("approved", "answered") else ":x:"
    return (f"{icon} *{verb.capitalize()}* by {_who(answer, label)} via {answer.channel} "
            f"{_when(answer.answered_at)}.")


def progress(interrupt: InterruptView, label: Any = None) -> str:
    names = ", ".join(_who(a, label) for a in interrupt.approvals) or "nobody yet"
    return (f":hourglass_flowing_sand: {len(interrupt.approvals)} of "
            f"{interrupt.required_approvals} approvals: {names}.")


def _who(answer: Answer, label: Any = None) -> str:
    by = answer.answered_by
    if by.startswith("reviewer:") and callable(label):
        return str(label(by.removeprefix("reviewer:")))
    return _mrkdwn(by)


def _when(moment: str | None) -> str:
    """A time as Slack shows it in the reader's own time zone (with the UTC fallback)."""
    if not moment:
        return ""
    try:
        epoch = int(datetime.fromisoformat(moment.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return moment
    return f"<!date^{epoch}^{{date_short_pretty}} at {{time}}|{moment}>"


# -- sending ---------------------------------------------------------------------------


def destination(settings: Settings, reviewers: Reviewers, note: Notification) -> str:
    """Where a notification goes: the group's channel, or a DM with the reviewer."""
    directory = reviewers.directory()
    channel = directory.slack_channels.get(note.reviewer)
    if channel is not None:
        return channel
    reviewer = directory.reviewers.get(note.reviewer)
    if reviewer is None:
        raise PermanentFailure(f"{note.reviewer!r} is no longer in the directory")
    if not reviewer.slack_id:
        raise PermanentFailure(f"reviewer {reviewer.id!r} has no slack_id any more")
    opened = call(settings, "conversations.open", users=reviewer.slack_id)
    return str(opened["channel"]["id"])


def earlier_message(run: RunView, note: Notification) -> str | None:
    """The message of this reviewer's (or group's) first Slack notification of the same
    interrupt, which a reminder is posted under."""
    return next((n.message for n in run.notifications
                 if n.channel == "slack" and n.message and n.id != note.id
                 and (n.interrupt_id, n.reviewer) == (note.interrupt_id, note.reviewer)
                 and n.kind != "reminder"), None)


def send(settings: Settings, reviewers: Reviewers, run: RunView, interrupt: InterruptView,
         note: Notification) -> str:
    """Post the notification; returns where its message is ("<channel>/<ts>"). A reminder
    goes in the thread of the request it reminds of (and to the channel too)."""
    label = _labeller(reviewers)
    if interrupt.state is not InterruptState.OPEN:
        raise PermanentFailure(f"interrupt {interrupt.id} is no longer open")
    earlier = earlier_message(run, note) if note.kind == "reminder" else None
    if earlier is not None:
        channel, _, ts = earlier.partition("/")
        text = (":bell: Reminder: this request still waits for an answer"
                + (f", {progress(interrupt, label)}" if interrupt.required_approvals > 1
                   else "") + ".")
        posted = call(settings, "chat.postMessage", channel=channel, thread_ts=ts,
                      reply_broadcast=True, text=text)
        return f"{posted['channel']}/{posted['ts']}"
    channel = destination(settings, reviewers, note)
    lead = {"reminder": ":bell: Reminder: ", "escalation": ":rotating_light: Escalated: "
            }.get(note.kind, "")
    posted = call(settings, "chat.postMessage", channel=channel,
                  text=lead + summary(run, interrupt), blocks=open_blocks(run, interrupt),
                  unfurl_links=False, unfurl_media=False)
    if note.kind == "escalation":
        escalated(settings, run, interrupt, note, label)
    return f"{posted['channel']}/{posted['ts']}"


def escalated(settings: Settings, run: RunView, interrupt: InterruptView,
              note: Notification, label: Any) -> None:
    """Say, in the threads of the earlier levels' messages, that the request went on."""
    text = (f":rotating_light: No answer yet: escalated to {label(note.reviewer)} "
            f"(level {note.level}).")
    for message in messages(run, interrupt.id):
        if message == note.message:
            continue
        channel, _, ts = message.partition("/")
        try:
            call(settings, "chat.postMessage", channel=channel, thread_ts=ts, text=text)
        except (PermanentFailure, ConnectionError) as exc:
            log.warning("run %s: could not note the escalation in Slack: %s", run.id, exc)


def messages(run: RunView, interrupt_id: str) -> list[str]:
    """The Slack messages posted of a request ("<channel>/<ts>"), without the reminders
    posted in their threads."""
    found: list[str] = []
    for n in run.notifications:
        if (n.channel == "slack" and n.interrupt_id == interrupt_id and n.message
                and n.kind != "reminder" and n.message not in found):
            found.append(n.message)
    return found


def refresh(settings: Settings, reviewers: Reviewers, run: RunView,
            interrupt_ids: list[str] | None = None, *, approval: bool = False) -> int:
    """Bring the Slack messages of the run's interrupts (those named, or all) up to date:
    an answered or closed request shows who answered, how and when, and loses its buttons;
    one still open after a new `approval` (of a quorum) gets the count in the thread. Returns how
    many messages were updated. Failures are logged: a message left stale still refuses
    a click (the click is checked against the stored request)."""
    label = _labeller(reviewers)
    updated = 0
    for interrupt in run.interrupts:
        if interrupt_ids is not None and interrupt.id not in interrupt_ids:
            continue
        for message in messages(run, interrupt.id):
            channel, _, ts = message.partition("/")
            try:
                if interrupt.state is InterruptState.OPEN:
                    handed = _handed_on(run, interrupt, message)
                    if handed is not None:  # its reviewer gave it to someone else
                        call(settings, "chat.update", channel=channel, ts=ts,
                             text=handed_text(handed, label),
                             blocks=[*request_blocks(run, interrupt),
                                     _section(handed_text(handed, label))])
                        updated += 1
                    elif approval and interrupt.required_approvals > 1:
                        call(settings, "chat.postMessage", channel=channel, thread_ts=ts,
                             text=progress(interrupt, label))
                        call(settings, "chat.update", channel=channel, ts=ts,
                             text=summary(run, interrupt), blocks=open_blocks(run, interrupt))
                        updated += 1
                    continue
                call(settings, "chat.update", channel=channel, ts=ts,
                     text=outcome(run, interrupt, label),
                     blocks=closed_blocks(run, interrupt, label))
                updated += 1
            except (PermanentFailure, ConnectionError) as exc:
                log.warning("run %s: could not update Slack message %s: %s", run.id, message,
                            exc, extra={"run_id": run.id, "interrupt_id": interrupt.id})
    return updated


def _handed_on(run: RunView, interrupt: InterruptView, message: str) -> Delegation | None:
    """The hand-over by the reviewer a message was sent to, if they handed the request on."""
    handed = {d.reviewer: d for d in interrupt.delegations}
    return next((handed[n.reviewer] for n in run.notifications
                 if n.message == message and n.reviewer in handed), None)


def handed_text(handed: Delegation, label: Any = None) -> str:
    name = label if callable(label) else _mrkdwn
    return (f":arrow_right_hook: *Handed on* to {name(handed.to)} by {name(handed.reviewer)} "
            f"via {handed.channel} {_when(handed.at)}: this message no longer answers it.")


def _labeller(reviewers: Reviewers) -> Any:
    def label(reviewer_id: str) -> str:
        try:
            found = reviewers.get(reviewer_id)
        except Exception:  # noqa: BLE001  (a directory that does not load: the bare id)
            found = None
        if found is None:
            return _mrkdwn(reviewer_id)
        return f"<@{found.slack_id}>" if found.slack_id else _mrkdwn(found.label)
    return label
