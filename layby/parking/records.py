"""What the store hands its callers besides the API's shapes (`layby.wire`): outbox entries
(the Celery messages a transition queued, to publish after it, when the broker is not the
store's server), a run as a worker's claim reads it, and announcements to record."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from layby.generation.interrupts import Interrupt
from layby.generation.messages import Message, Wire
from layby.wire import Answer, Delegation, Notification, Status


class OutboxEntry(Wire):
    id: str
    task: str
    queue: str
    args: list[Any]
    agent: str | None = None  # the run's, shown in Flower beside the ids (never an argument)
    trace: str | None = None  # the run's trace context (a traceparent), sent as a header


@dataclass
class RunRecord:
    """A run as a worker needs it to take a step, all of it read by the claim."""

    id: str
    agent: str
    status: Status
    version: int
    messages: list[Message]
    metadata: dict[str, Any]
    checkpoints: dict[str, Any] = field(default_factory=dict)
    # A parked turn: the interrupts it waited on (none unless the step resumes a park), and
    # their answers.
    parked_on: list[Interrupt] = field(default_factory=list)
    answers: dict[str, Answer] = field(default_factory=dict)
    agent_version: str | None = None  # the version the run started on (None: unknown)
    pinned: bool = False  # its steps run only where that version is hosted
    tenant: str = "default"  # whose run it is (read where who may act on it is checked)
    started_by: str | None = None  # the caller that started it, when four eyes may apply
    # The trace context its steps continue (a W3C traceparent; None: not traced), and the
    # one its last park was in, once an answer's trace took over (for the resume's link).
    trace: str | None = None
    trace_was: str | None = None


@dataclass
class Announcements:
    """What one planning records (`layby.notifier.planning` makes it): notifications, each
    with when to send it (epoch ms, None for now); the grants of their new tokens (ref, the
    grant as `Grant.stored()` writes it, lifetime in ms; opaque here); the hand-overs of
    reviewers away (interrupt id, delegation)."""

    notes: list[tuple[Notification, int | None]] = field(default_factory=list)
    grants: list[tuple[str, str, int]] = field(default_factory=list)
    handovers: list[tuple[str, Delegation]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.notes or self.handovers)


@dataclass(frozen=True)
class Ownership:
    """Whose a run is, as the checks of who may see and act on it read it: whether it
    exists, its tenant, who started it (when kept), its status, and since when its run
    tokens are revoked (ms; None: never)."""

    exists: bool
    tenant: str = "default"
    started_by: str | None = None
    status: Status | None = None
    tokens_after: int | None = None
