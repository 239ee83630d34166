"""A parked run meeting another version of its agent: whether it can go on here
(`what_changed`), after its agent's migrate hook changed it (`migrated`).

A run parks with interrupts that name a tool, the input the model gave it and, once
answered, the answer. Resumed on another version of the agent, each of those must still
fit: the tool still there, its input (or the reviewer's replacement) still valid against
its input schema, an answer that becomes the tool's output still valid against its output.
What does not fit ends the run with `agent_changed`, naming the tool and the change:
never a tool error the model would be left to read, never a retry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from layby.generation.answers import pydantic_errors
from layby.generation.interrupts import Interrupt, ResumeMode
from layby.generation.stored_run import StoredRun

if TYPE_CHECKING:
    from layby.generation.agents import Agent

AGENT_CHANGED = "agent_changed"


@dataclass(frozen=True)
class Changed:
    """Why a parked run cannot go on with this version of its agent."""

    tool: str | None  # None: the migrate hook failed
    change: str  # "removed" | "input" | "answer" | "migrate"
    message: str
    errors: list[dict[str, Any]] = field(default_factory=list)

    def error(self, agent: Agent, parked_on: str | None) -> dict[str, Any]:
        """The run's error, as the fail path stores it."""
        return {"code": AGENT_CHANGED, "message": self.message, "detail": {
            "tool": self.tool, "change": self.change, "agentVersion": agent.version,
            "parkedVersion": parked_on, **({"errors": self.errors} if self.errors else {})}}


def parked_version(interrupts: list[Interrupt]) -> str | None:
    """The version of the agent the interrupts were raised on (one turn's: all alike);
    None when they do not say (parked by a layby that did not record it)."""
    return next((i.agent_version for i in interrupts if i.agent_version), None)


def _where(agent: Agent, parked_on: str | None) -> str:
    on = f"was parked on {parked_on}" if parked_on else "parked before layby recorded versions"
    if parked_on == agent.version:
        on += ": the agent changed without a new version"
    return f"in version {agent.version} of agent {agent.name!r} (the run {on})"


def _said(errors: list[dict[str, Any]]) -> str:
    return "; ".join(f"{e['path'] or '/'}: {e['message']}" for e in errors[:3])


def what_changed(agent: Agent, run: StoredRun) -> Changed | None:
    """None when every interrupt the run waits on still fits `agent`; else the first that
    does not, and why."""
    parked_on = run.parked_version
    last = run.messages[-1] if run.messages else None
    requested = {p.tool_request.ref: p.tool_request.input for p in (last.content if last else [])
                 if p.tool_request is not None}
    for intr in run.interrupts:
        tool = agent.tool(intr.tool_name)
        if tool is None:
            return Changed(intr.tool_name, "removed",
                           f"tool {intr.tool_name!r} is gone {_where(agent, parked_on)}")
        answer = run.answers.get(intr.id)
        replaced = (answer.metadata or {}).get("replaceInput") if answer is not None \
            and answer.status == "resolved" and intr.mode is ResumeMode.RESTART else None
        # What the tool will be given: the reviewer's replacement, or what the model asked.
        given = replaced if replaced is not None else requested.get(intr.tool_call_id,
                                                                    intr.tool_input)
        errors = pydantic_errors(tool.parse_input, given)
        if errors:
            whose = "the input the reviewer gave it" if replaced is not None \
                else "the input it was called with"
            return Changed(tool.name, "input",
                           f"tool {tool.name!r} no longer takes {whose} "
                           f"{_where(agent, parked_on)}: {_said(errors)}", errors)
        if answer is not None and answer.status == "resolved" and tool.is_interrupt \
                and intr.mode is ResumeMode.RESPOND:
            errors = pydantic_errors(tool.output.validate_python, answer.payload)
            if errors:
                return Changed(tool.name, "answer",
                               f"tool {tool.name!r} no longer takes the answer it was given "
                               f"as its output {_where(agent, parked_on)}: {_said(errors)}",
                               errors)
    return None


def migrated(agent: Agent, run: StoredRun) -> StoredRun | Changed:
    """The run as `agent.migrate` returns it, or why the hook could not make it."""
    assert agent.migrate is not None
    where = _where(agent, run.parked_version)
    try:
        # Typed loosely: a user's hook may return anything.
        changed: Any = agent.migrate(run.model_copy(deep=True))
    except Exception as exc:  # noqa: BLE001  (the hook's failure is the run's, told once)
        return Changed(None, "migrate", f"the migrate hook {where} failed: "
                                        f"{type(exc).__name__}: {exc}")
    if not isinstance(changed, StoredRun):
        return Changed(None, "migrate", f"the migrate hook {where} returned "
                                        f"{type(changed).__name__}, not a StoredRun")
    return changed
