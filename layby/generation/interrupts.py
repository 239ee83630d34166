"""Interrupts and the answers to them, as AG-UI shapes them.

`Interrupt` is what a paused tool call asks for (AG-UI's `Interrupt` plus what layby needs
to apply the answer later: the tool's name and input, whether the answer is the tool's
output or a go-ahead to run it again, and what happens at expiry). `ResumeEntry` is one
answer (`resolved` with a payload, or `cancelled`). Both are plain data: they are stored,
sent over HTTP and read back by another process.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Any, Literal

from pydantic import ConfigDict, Field

from layby.generation.messages import Wire

# AG-UI's core reasons; anything else must be namespaced (`ns:name`).
TOOL_CALL = "tool_call"
INPUT_REQUIRED = "input_required"
CONFIRMATION = "confirmation"
BACKGROUND_JOB = "layby:background_job"
CORE_REASONS = frozenset({TOOL_CALL, INPUT_REQUIRED, CONFIRMATION})


class ResumeMode(StrEnum):
    """How a `resolved` answer is applied (Genkit's two ways of resuming)."""

    RESPOND = "respond"  # the payload is the tool's output
    RESTART = "restart"  # the tool runs again and sees the payload as `ctx.resumed`


class ExpiryAction(StrEnum):
    CANCEL = "cancel"
    FAIL = "fail"
    RESOLVE = "resolve"


class OnExpire(Wire):
    action: ExpiryAction = ExpiryAction.CANCEL
    payload: Any = None  # the answer used by `resolve`


class Escalation(Wire):
    """One level of an escalation chain: who is asked once the request has waited `after_s`
    seconds unanswered (earlier levels can still answer)."""

    after_s: float
    reviewers: list[str]


class Interrupt(Wire):
    """One open question, approval or job. Field names follow AG-UI's `Interrupt`."""

    id: str
    reason: str
    message: str | None = None
    tool_call_id: str
    response_schema: dict[str, Any] | None = None
    expires_at: str | None = None  # RFC 3339, UTC
    metadata: dict[str, Any] | None = None
    # layby's own fields, kept beside AG-UI's
    tool_name: str
    tool_input: Any = None
    input_schema: dict[str, Any] | None = None
    mode: ResumeMode
    on_expire: OnExpire = Field(default_factory=OnExpire)
    reviewers: list[str] | None = None
    created_at: str | None = None
    turn: int = 0
    # The pydantic model the question was asked with (`module:Name`): a restarted tool gets
    # its answer as an instance of it.
    response_type: str | None = None
    # How it is reviewed: approvals from distinct reviewers it needs, who is asked next when
    # nobody answers, how often reviewers are reminded, and the policy rule that routed it.
    required_approvals: int = 1
    escalation: list[Escalation] | None = None
    remind_every_s: float | None = None
    rule: str | None = None
    # The version of the agent that asked (`Agent.version`): a resume on another version
    # checks, pins or migrates the run (`layby.generation.versions`). None: not recorded.
    agent_version: str | None = None


class ResumeEntry(Wire):
    """AG-UI's resume entry: the answer to one interrupt."""

    model_config = ConfigDict(extra="forbid")  # sent by callers: a misspelt field is refused

    interrupt_id: str
    status: Literal["resolved", "cancelled"]
    payload: Any = None
    metadata: dict[str, Any] | None = None


def interrupt_id(run_id: str, version: int, ref: str) -> str:
    """Deterministic, so a turn that is run twice names its interrupts the same way."""
    digest = hashlib.sha256(f"{run_id}\x00{version}\x00{ref}".encode()).hexdigest()
    return f"int_{digest[:20]}"


def check_reason(reason: str) -> str:
    if reason in CORE_REASONS or (":" in reason and all(reason.split(":", 1))):
        return reason
    raise ValueError(
        f"interrupt reason {reason!r} is neither one of {sorted(CORE_REASONS)} "
        "nor namespaced as 'namespace:name'"
    )
