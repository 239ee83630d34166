"""What the store hands out: answers as recorded, runs and interrupts as readers see them,
outbox entries to publish. Plain pydantic models, camelCase on the wire."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from layby.generation.interrupts import Interrupt, ResumeEntry
from layby.generation.messages import Message, Wire
from layby.parking.states import InterruptState, Status


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


class InterruptView(Interrupt):
    """An interrupt as readers see it: AG-UI's fields and layby's, where it stands, and who
    answered it, how and when."""

    state: InterruptState
    answer: Answer | None = None

    @classmethod
    def of(cls, spec: Interrupt, answer: Answer | None, is_open: bool) -> InterruptView:
        if is_open:
            state = InterruptState.OPEN
        elif answer is None:  # closed unanswered: the run was cancelled while it waited
            state = InterruptState.CANCELLED
        else:
            state = answer.state
        return cls(**dict(spec), state=state, answer=answer)


class Notification(Wire):
    """One announcement of one interrupt to one reviewer on one channel, and how it went.

    `kind` is "request" (when the run parks) or "reminder" (before the interrupt expires).
    The token it carries is stored beside it, never shown.
    """

    id: str
    interrupt_id: str
    reviewer: str
    channel: Literal["email", "webhook"]
    kind: Literal["request", "reminder"] = "request"
    state: Literal["pending", "sending", "retrying", "sent", "failed", "skipped"] = "pending"
    attempts: int = 0
    last_error: str | None = None
    next_attempt_at: str | None = None
    sent_at: str | None = None
    created_at: str | None = None
    token: str | None = Field(None, exclude=True, repr=False)


class RunView(Wire):
    id: str
    agent: str
    status: Status
    version: int
    input: Any = None
    messages: list[Message]
    interrupts: list[InterruptView]
    notifications: list[Notification] = Field(default_factory=list)
    result: str | None = None
    error: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    created_at: str
    updated_at: str


class RunSummary(Wire):
    id: str
    agent: str
    status: Status
    version: int
    open_interrupts: int
    created_at: str
    updated_at: str


class OutboxEntry(Wire):
    id: str
    task: str
    queue: str
    args: list[Any]


class Event(Wire):
    id: str
    type: str
    version: int
    at: str
    data: Any = None
