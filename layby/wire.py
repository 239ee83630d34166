"""The HTTP API's shapes, shared by the server and `layby.Client`: runs, interrupts and answers
as readers see them, events, request bodies, and the error body. camelCase on the wire.

Run and interrupt states are here too, since both sides read them::

    queued → running → interrupted → resuming → running → … → completed | failed | cancelled
                     → retrying → queued (a failed tool call waits to be tried again)

Messages and interrupts themselves are `layby.generation`'s (Genkit's and AG-UI's shapes).
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from layby.generation.interrupts import Interrupt, ResumeEntry
from layby.generation.messages import Message, Wire


class Status(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    INTERRUPTED = "interrupted"
    RESUMING = "resuming"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # The step waits to try failed tool calls again (`RetryPolicy`); then queued.
    RETRYING = "retrying"

    @property
    def finished(self) -> bool:
        return self in FINISHED


FINISHED = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})
# The events a run's stream ends with.
FINAL_EVENTS = frozenset({"run.completed", "run.failed", "run.cancelled"})


class InterruptState(StrEnum):
    OPEN = "open"
    RESOLVED = "resolved"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


class Answer(Wire):
    """An answer as recorded: the resume entry, and who gave it, how and when."""

    interrupt_id: str
    status: Literal["resolved", "cancelled"]
    payload: Any = None
    metadata: dict[str, Any] | None = None
    state: InterruptState
    answer_id: str | None = None  # unique per request: tells a replay from a rival
    answered_by: str
    channel: str
    answered_at: str

    def entry(self) -> ResumeEntry:
        return ResumeEntry(interrupt_id=self.interrupt_id, status=self.status,
                           payload=self.payload, metadata=self.metadata)


class Delegation(Wire):
    """A request handed from one reviewer to another: by that reviewer (a button on the
    page, `delegate bob` by mail, a callback), or by the directory (`away_until`)."""

    reviewer: str  # who handed it on
    to: str
    by: str  # "reviewer:<id>", "directory" (away), "api:<caller>"
    channel: str
    at: str
    note: str | None = None


class Escalated(Wire):
    """An escalation level reached: its reviewers were asked."""

    level: int  # 1 for the first level after the reviewers first asked
    at: str


class Review(Wire):
    """How people review one interrupt: approvals so far, levels reached, hand-overs."""

    approvals: list[Answer] = Field(default_factory=list)
    escalations: list[Escalated] = Field(default_factory=list)
    delegations: list[Delegation] = Field(default_factory=list)


class InterruptView(Interrupt):
    """An interrupt as readers see it: AG-UI's fields and layby's, where it stands, who
    answered it, how and when, and how its review went (approvals, escalation, hand-overs;
    `rule` names the policy rule that routed or answered it)."""

    state: InterruptState
    answer: Answer | None = None
    approvals: list[Answer] = Field(default_factory=list)
    escalation_level: int = 0  # 0 while only the first reviewers are asked
    escalations: list[Escalated] = Field(default_factory=list)
    delegations: list[Delegation] = Field(default_factory=list)

    @classmethod
    def of(cls, spec: Interrupt, answer: Answer | None, is_open: bool,
           review: Review | None = None) -> InterruptView:
        if is_open:
            state = InterruptState.OPEN
        elif answer is None:  # closed unanswered: the run was cancelled while it waited
            state = InterruptState.CANCELLED
        else:
            state = answer.state
        review = review or Review()
        return cls(**dict(spec), state=state, answer=answer, approvals=review.approvals,
                   escalation_level=max((e.level for e in review.escalations), default=0),
                   escalations=review.escalations, delegations=review.delegations)


class Notification(Wire):
    """One announcement of one interrupt to one reviewer on one channel, and how it went.

    `kind` is "request" (when the run parks), "escalation" (to the next level, when nobody
    answered in time) or "reminder" (every `remind_every`, and before the interrupt
    expires).
    The token it carries is stored beside it, never shown.
    """

    id: str
    interrupt_id: str
    reviewer: str
    channel: Literal["email", "webhook", "slack"]
    # "escalation": a request to a level asked because nobody answered in time
    kind: Literal["request", "reminder", "escalation"] = "request"
    level: int = 0  # the escalation level whose reviewer this is (0: those asked first)
    state: Literal["pending", "sending", "retrying", "sent", "failed", "skipped"] = "pending"
    attempts: int = 0
    last_error: str | None = None
    next_attempt_at: str | None = None
    sent_at: str | None = None
    created_at: str | None = None
    token: str | None = Field(None, exclude=True, repr=False)
    # Where the message went, to update it later: a Slack post's "<channel>/<ts>". Optional
    # and stored under its long name: a reader that does not know it ignores it.
    message: str | None = None


class ToolRetry(Wire):
    """A tool call that failed and waits to be tried again."""

    tool_call_id: str  # the call's ref
    tool_name: str
    attempt: int  # the attempt that comes next (2, 3, …)
    max_attempts: int
    last_error: str  # "Type: message" of the attempt before
    first_attempt_at: str


class RetryWait(Wire):
    """What a run waits for while its step waits to try failed tool calls again: the calls,
    and when the next try is due (the step is then queued again; the calls run then)."""

    calls: list[ToolRetry]
    next_attempt_at: str | None = None


class RunView(Wire):
    """A run: where it stands, its history, its interrupts and how they were answered."""

    id: str
    agent: str
    status: Status
    version: int
    # The version of the agent the run started on (`Agent.version`; None: started before
    # layby recorded it); `pinned`: its steps run only where that version is hosted.
    agent_version: str | None = None
    pinned: bool = False
    input: Any = None
    messages: list[Message]
    interrupts: list[InterruptView]
    notifications: list[Notification] = Field(default_factory=list)
    result: str | None = None
    error: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    # While the step waits to try failed tool calls again (`retrying`), and while it runs
    # them again: which, which attempt, the last error, when the next try is due.
    retry: RetryWait | None = None
    # Whose run it is: the tenant of the key that started it (who may see it), and that key
    # when four eyes may apply (it may not approve the run's interrupts).
    tenant: str = "default"
    started_by: str | None = None
    created_at: str
    updated_at: str

    @property
    def open_interrupts(self) -> list[InterruptView]:
        """The interrupts still waiting for an answer."""
        return [i for i in self.interrupts if i.state is InterruptState.OPEN]


class RunSummary(Wire):
    id: str
    agent: str
    status: Status
    version: int
    agent_version: str | None = None
    open_interrupts: int
    retry: RetryWait | None = None  # as RunView's
    tenant: str = "default"
    created_at: str
    updated_at: str


class Event(Wire):
    """One entry of a run's event stream (`run.interrupted`, `interrupt.answered`, …)."""

    id: str
    type: str
    version: int
    at: str
    data: Any = None


# -- request and reply bodies -------------------------------------------------------------


class Body(Wire):
    """A request body: a field the API does not know is refused (422), so a misspelt one
    never goes silently unread."""

    model_config = ConfigDict(extra="forbid")


class StartRun(Body):
    # The document says what the validator below checks: one of the two, not both.
    model_config = ConfigDict(json_schema_extra={"oneOf": [
        {"required": ["input"], "properties": {"input": {"not": {"type": "null"}}}},
        {"required": ["messages"], "properties": {"messages": {"type": "array"}}}]})

    agent: str
    input: Any = None
    messages: list[Message] | None = Field(None, min_length=1)
    metadata: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_of(self) -> StartRun:
        if (self.input is None) == (self.messages is None):
            raise ValueError("give either `input` or `messages`")
        return self


class AnswerBody(Body):
    status: Literal["resolved", "cancelled"]
    payload: Any = None
    metadata: dict[str, Any] | None = None


class ResumeBody(Body):
    resume: list[ResumeEntry] = Field(min_length=1)


class MintToken(Body):
    """A run token's rights (some of the minting key's: read, answer, approve, cancel,
    self-approve) and lifetime."""

    can: list[str] = Field(default_factory=lambda: ["read"], min_length=1, max_length=5)
    ttl_s: int = Field(900, ge=1, le=86_400)


class MintedToken(Wire):
    """A run token: the bearer credential for its run alone, until `expires_at`."""

    token: str
    expires_at: str


class TokensRevoked(Wire):
    """Every run token of the run minted before `revoked_at` is refused."""

    revoked_at: str


class AuditEntry(Wire):
    """One thing a caller did, or was refused (`outcome`: ok, or the refusal's code)."""

    at: str
    caller: str
    tenant: str
    action: str
    run: str | None = None
    interrupt: str | None = None
    channel: str | None = None
    outcome: str = "ok"
    source: str | None = None
    subject: str | None = None  # whom it was about, when not a run: a reviewer (inbox.revoke)

    @classmethod
    def of(cls, entry: dict[str, Any]) -> AuditEntry:
        """An entry as the store gave it (its time the stream entry's id)."""
        ms = int(str(entry["id"]).partition("-")[0])
        at = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
        return cls(at=at.replace("+00:00", "Z"),
                   **{k: v for k, v in entry.items()
                      if k in cls.model_fields and k != "at" and v is not None})


class AuditPage(Wire):
    entries: list[AuditEntry]
    next_cursor: str | None = None


class CancelBody(Body):
    reason: str | None = Field(None, max_length=2000)


class RunList(Wire):
    """A page of runs, newest first; `next_cursor` asks for the page after it (None: no
    more)."""

    runs: list[RunSummary]
    next_cursor: str | None = None


class Answered(Wire):
    """The reply to an answer: the run as it stands after it, and whether it resumed."""

    run: RunView
    resumed: bool


class CallbackTaken(Wire):
    """The reply to a reviewer's callback: its own answer as recorded, not the run."""

    run_id: str
    interrupt_id: str
    state: InterruptState
    answer: Answer | None = None
    resumed: bool
    delegated_to: str | None = None  # the callback handed the request on


class MailTaken(Wire):
    """The reply to a reply mail POSTed by a mail provider."""

    run_id: str
    interrupt_id: str
    reviewer: str
    resumed: bool
    delegated_to: str | None = None  # the reply handed the request on (`delegate bob`)


class MailIgnored(Wire):
    """An automatic reply (out of office): taken, and dropped."""

    ignored: Literal[True]
    reason: str


class ErrorDetail(Wire):
    code: str
    message: str
    detail: Any = None


class ErrorBody(Wire):
    """Every refusal's body: `{"error": {"code", "message", "detail"}}`."""

    error: ErrorDetail
