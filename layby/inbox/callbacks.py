"""Answers from reviewers' systems (`POST /callbacks/answers`): signed per Standard Webhooks
with the reviewer's secret (and naming the reviewer), or carrying the notification's token.

A signed callback is accepted once: its `webhook-id` is remembered past the timestamp
tolerance, so a replay is refused; a callback that is not taken is forgotten again, so a
retry of it gets the real reason, not "already received".
"""

from __future__ import annotations

from typing import Any

from pydantic import Field
from standardwebhooks import Webhook, WebhookVerificationError

from layby.control import Runtime, commands
from layby.errors import Conflict, Invalid, Unauthorized
from layby.generation.interrupts import ResumeEntry
from layby.wire import Body
from layby.inbox import answers
from layby.reviewers.directory import Reviewer
from layby.reviewers.tokens import BadToken

# The specification's tolerance: a timestamp further than this from now is refused.
TOLERANCE_S = 300


class BadSignature(Unauthorized):
    """A callback's Standard Webhooks signature does not verify."""


class Replayed(Conflict):
    """A callback's webhook-id was seen before."""


class Callback(Body):
    """An answer POSTed by a reviewer's system."""

    run_id: str
    interrupt_id: str
    status: str = Field(pattern="^(resolved|cancelled)$")
    payload: Any = None
    metadata: dict[str, Any] | None = None
    reviewer: str | None = Field(None, description="the signing reviewer's id")
    token: str | None = Field(None, description="the token from the notification, instead "
                                                "of a signature")


def receive(rt: Runtime, body: Callback, raw: bytes, headers: dict[str, str]
            ) -> dict[str, Any]:
    """Record the callback's answer; returns the answer as recorded (`_answered`)."""
    entry = ResumeEntry(interrupt_id=body.interrupt_id,
                        status=body.status,  # type: ignore[arg-type]
                        payload=body.payload, metadata=body.metadata)
    if "webhook-signature" in headers:
        reviewer, seen = _signed(rt, body, raw, headers)
        try:
            opened = answers.open_for(rt, reviewer, body.run_id, body.interrupt_id)
            result = answers.answer(rt, opened, entry, channel="webhook")
        except BaseException:
            rt.store.forget_sight(seen)
            raise
        return _answered(rt, opened, bool(result.entries))
    if not body.token:
        raise Unauthorized("sign the callback per Standard Webhooks with your webhook "
                           "secret (and set \"reviewer\"), or include the notification's "
                           "\"token\"")
    opened = answers.open_token(rt, body.token)
    if (opened.run.id, opened.interrupt.id) != (body.run_id, body.interrupt_id):
        raise BadToken("this token was issued for another interrupt "
                       f"({opened.interrupt.id} of run {opened.run.id})")
    result = answers.answer(rt, opened, entry, channel="webhook")
    return _answered(rt, opened, bool(result.entries))


def verify(secret: str, body: bytes, headers: dict[str, str]) -> None:
    """Refuse a callback whose signature does not match or whose timestamp is outside the
    tolerance. The caller still refuses a replayed `webhook-id`."""
    try:
        Webhook(secret).verify(body, headers, json_parse=False)
    except WebhookVerificationError as exc:
        reason = str(exc)
        if "too old" in reason or "too new" in reason:
            raise BadSignature(f"the webhook-timestamp is more than {TOLERANCE_S} s from "
                               "now; send the callback with the current time (and check "
                               "the clock of the sending system)") from exc
        raise BadSignature(f"the webhook signature does not verify ({reason}): sign the "
                           "exact body with your webhook secret, per Standard Webhooks") \
            from exc
    except (ValueError, TypeError) as exc:  # damaged base64 in a signature
        raise BadSignature(f"the webhook signature headers are damaged: {exc}") from exc


def _signed(rt: Runtime, body: Callback, raw: bytes, headers: dict[str, str]
            ) -> tuple[Reviewer, str]:
    """The reviewer whose signature the callback carries, and the key remembering its
    webhook-id (to forget if the callback is not taken)."""
    if not body.reviewer:
        raise Invalid("a signed callback names its reviewer: set \"reviewer\" to your id in "
                      "the reviewer directory")
    reviewer = rt.reviewers.get(body.reviewer)
    if reviewer is None or reviewer.webhook is None:
        # The same words as a wrong signature: callers learn nothing of the directory.
        raise BadSignature("the webhook signature does not verify for reviewer "
                           f"{body.reviewer[:80]!r}: sign the exact body with your webhook "
                           "secret, per Standard Webhooks")
    verify(reviewer.webhook.secret, raw, headers)
    webhook_id = headers.get("webhook-id", "")
    sight = f"webhook:{reviewer.id}:{webhook_id}"
    # Remembered for twice the tolerance: an older replay fails on its timestamp anyway.
    if not rt.store.first_sight(sight, 2 * TOLERANCE_S):
        raise Replayed(f"webhook-id {webhook_id[:80]!r} was already received; a replayed "
                       "callback is refused (send a new id for a new answer)")
    return reviewer, sight


def _answered(rt: Runtime, opened: answers.Opened, resumed: bool) -> dict[str, Any]:
    """What a reviewer's system learns: its own answer as recorded, not the run's history
    or anyone else's answers."""
    run = commands.get_run(rt, opened.run.id)
    mine = next(i for i in run.interrupts if i.id == opened.interrupt.id)
    return {"runId": run.id, "interruptId": mine.id, "state": mine.state.value,
            "answer": mine.answer.wire() if mine.answer else None, "resumed": resumed}
