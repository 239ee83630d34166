"""Answers from reviewers' systems (`POST /callbacks/answers`): signed per Standard Webhooks
with the reviewer's secret (and naming the reviewer), or carrying the notification's token.

Retries are safe: a signed callback's `webhook-id` (Standard Webhooks' own idempotency key)
or an `Idempotency-Key` header makes the same callback again (a retry after a lost reply or
a 503, or a replay) get the first one's result, recording nothing new; a callback that was
not taken is taken afresh, so its retry gets the real reason.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema
from standardwebhooks import Webhook, WebhookVerificationError

from layby.answering import answers
from layby.control import Runtime, commands
from layby.errors import Invalid, Unauthorized
from layby.generation.interrupts import ResumeEntry
from layby.parking import Transition, Verdict
from layby.reviewers.directory import Reviewer
from layby.reviewers.tokens import BadToken
from layby.wire import Body, Status

# The specification's tolerance: a timestamp further than this from now is refused.
TOLERANCE_S = 300
MAX_KEY_CHARS = 200  # as /v1 takes an Idempotency-Key


class BadSignature(Unauthorized):
    """A callback's Standard Webhooks signature does not verify."""


class Callback(Body):
    """An answer POSTed by a reviewer's system, or its hand-over to another reviewer."""

    # The document says what `receive` checks: an answer or a hand-over, not both.
    model_config = ConfigDict(json_schema_extra={"oneOf": [
        {"required": ["status"], "not": {"required": ["delegateTo"]}},
        {"required": ["delegateTo"], "not": {"required": ["status"]}}]})

    run_id: str = Field(max_length=128)
    interrupt_id: str = Field(max_length=128)
    # Documented as strings, not nullable: the one a callback leaves out is absent, and a
    # null would count as given under the document's `oneOf`.
    status: Annotated[str, Field(pattern="^(resolved|cancelled)$")] | SkipJsonSchema[None] = (
        Field(None, description="the answer; leave out with `delegateTo`"))
    delegate_to: Annotated[str, Field(max_length=200)] | SkipJsonSchema[None] = Field(
        None, description="hand the request to this reviewer of the directory instead of "
                          "answering")
    payload: Any = None
    metadata: dict[str, Any] | None = None
    reviewer: str | None = Field(None, max_length=200,
                                 description="the signing reviewer's id")
    token: str | None = Field(None, max_length=200, description="the token from the "
                              "notification, instead of a signature")


def receive(rt: Runtime, body: Callback, raw: bytes, headers: dict[str, str]
            ) -> dict[str, Any]:
    """Record the callback's answer, or hand the request on (`delegateTo`); returns the
    answer as recorded (`_answered`)."""
    if (body.status is None) == (body.delegate_to is None):
        raise Invalid("give either \"status\" (an answer) or \"delegateTo\" (a reviewer to "
                      "hand the request to), not both and not neither")
    key = headers.get("idempotency-key") or None
    if key is not None and len(key) > MAX_KEY_CHARS:
        raise Invalid(f"the Idempotency-Key is {len(key)} characters; at most "
                      f"{MAX_KEY_CHARS} are taken")
    try:
        if "webhook-signature" in headers:
            reviewer = _signed(rt, body, raw, headers)
            key = key or f"webhook-id:{headers.get('webhook-id', '')}"
            opened = answers.open_for(rt, reviewer, body.run_id, body.interrupt_id)
        else:
            opened = _by_token(rt, body)
    except answers.NotAllowed:
        handed = _handed_before(rt, body, headers)
        if handed is not None:
            return handed  # a retry of a hand-over already made
        raise
    if body.delegate_to is not None:
        answers.delegate(rt, opened, body.delegate_to, channel="webhook",
                         note=(body.metadata or {}).get("note"))
        return _answered(rt, opened, None, delegated_to=body.delegate_to)
    entry = ResumeEntry(interrupt_id=body.interrupt_id,
                        status=body.status,  # type: ignore[arg-type]
                        payload=body.payload, metadata=body.metadata)
    result = answers.answer(rt, opened, entry, channel="webhook", idempotency_key=key)
    return _answered(rt, opened, result)


def _by_token(rt: Runtime, body: Callback) -> answers.Opened:
    if not body.token:
        raise Unauthorized("sign the callback per Standard Webhooks with your webhook "
                           "secret (and set \"reviewer\"), or include the notification's "
                           "\"token\"")
    opened = answers.open_token(rt, body.token)
    if (opened.run.id, opened.interrupt.id) != (body.run_id, body.interrupt_id):
        raise BadToken("this token was issued for another interrupt "
                       f"({opened.interrupt.id} of run {opened.run.id})")
    return opened


def _handed_before(rt: Runtime, body: Callback, headers: dict[str, str]
                   ) -> dict[str, Any] | None:
    """The reply to a hand-over this reviewer already made to the same reviewer (a retry
    after a lost reply), once the caller is known to be that reviewer; else None."""
    if body.delegate_to is None:
        return None
    if "webhook-signature" in headers:
        reviewer_id = body.reviewer or ""
    else:
        grant = answers.verify_token(rt, body.token or "")
        reviewer_id = grant.reviewer
    run = commands.get_run(rt, body.run_id)
    intr = next((i for i in run.interrupts if i.id == body.interrupt_id), None)
    if intr is None or not any(d.reviewer == reviewer_id and d.to == body.delegate_to
                               for d in intr.delegations):
        return None
    return {"runId": run.id, "interruptId": intr.id, "state": intr.state.value,
            "answer": None, "resumed": False, "delegatedTo": body.delegate_to}


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


def _signed(rt: Runtime, body: Callback, raw: bytes, headers: dict[str, str]) -> Reviewer:
    """The reviewer whose signature the callback carries."""
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
    return reviewer


def _answered(rt: Runtime, opened: answers.Opened, result: Transition | None, *,
              delegated_to: str | None = None) -> dict[str, Any]:
    """What a reviewer's system learns: its own answer as recorded (or its approval, while
    the request waits for more), not the run's history or anyone else's answers; `resumed`
    when this answer was the last one the run waited for (a retry learns it from where the
    run stands)."""
    run = commands.get_run(rt, opened.run.id)
    mine = next(i for i in run.interrupts if i.id == opened.interrupt.id)
    if result is None:
        resumed = False
    else:
        resumed = result.resumed if result.verdict is not Verdict.EXISTS \
            else run.status is not Status.INTERRUPTED
    answer = mine.answer or next((a for a in mine.approvals if a.answered_by ==
                                  f"reviewer:{opened.reviewer.id}"), None)
    reply = {"runId": run.id, "interruptId": mine.id, "state": mine.state.value,
             "answer": answer.wire() if answer else None, "resumed": resumed}
    if delegated_to is not None:
        reply["delegatedTo"] = delegated_to
    return reply
