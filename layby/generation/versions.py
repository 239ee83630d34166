"""A parked run meeting another version of its agent: what it was parked with, as a migrate
hook sees it (`StoredRun`), and whether it can go on here (`what_changed`).

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

from pydantic import Field

from layby.generation.answers import _pydantic_errors
from layby.generation.interrupts import Interrupt, ResumeEntry, ResumeMode
from layby.generation.messages import Message, Wire

if TYPE_CHECKING:
    from layby.generation.agents import Agent

AGENT_CHANGED = "agent_changed"


class StoredRun(Wire):
    """A parked run as stored, for an agent's `migrate` hook: its history, the interrupts
    it waits on (each with the tool's name and the input the model gave it) and their
    answers (by interrupt id). The hook returns it changed: `messages`, `interrupts` and
    `answers` are what the resume goes on with; the rest is there to read (changes to it
    are not kept). `rename_tool` and `replace_input` change the history and the interrupts
    together, as the resume needs them to agree."""

    id: str
    agent: str
    agent_version: str | None = None  # the version the run started on (None: unknown)
    parked_version: str | None = None  # the version it parked on (None: unknown)
    messages: list[Message]
    interrupts: list[Interrupt]
    answers: dict[str, ResumeEntry] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)

    def rename_tool(self, old: str, new: str) -> StoredRun:
        """A copy in which tool `old` is called `new`: in the history's requests and
        responses, and in the interrupts."""
        def renamed(message: Message) -> Message:
            content = []
            for part in message.content:
                if part.tool_request is not None and part.tool_request.name == old:
                    part = part.model_copy(update={"tool_request": part.tool_request.model_copy(
                        update={"name": new})})
                if part.tool_response is not None and part.tool_response.name == old:
                    part = part.model_copy(update={
                        "tool_response": part.tool_response.model_copy(update={"name": new})})
                content.append(part)
            return message.model_copy(update={"content": content})

        return self.model_copy(update={
            "messages": [renamed(m) for m in self.messages],
            "interrupts": [i.model_copy(update={"tool_name": new}) if i.tool_name == old
                           else i for i in self.interrupts]})

    def replace_input(self, interrupt_id: str, new_input: Any) -> StoredRun:
        """A copy in which the tool call interrupt `interrupt_id` waits on has `new_input`:
        in the parked model message (what a tool run again is given) and the interrupt."""
        intr = next((i for i in self.interrupts if i.id == interrupt_id), None)
        if intr is None:
            raise KeyError(f"the run waits on no interrupt {interrupt_id!r}")
        messages = list(self.messages)
        if messages and messages[-1].role == "model":
            last = messages[-1]
            messages[-1] = last.model_copy(update={"content": [
                p.model_copy(update={"tool_request": p.tool_request.model_copy(
                    update={"input": new_input})})
                if p.tool_request is not None and p.tool_request.ref == intr.tool_call_id
                else p for p in last.content]})
        return self.model_copy(update={
            "messages": messages,
            "interrupts": [i.model_copy(update={"tool_input": new_input})
                           if i.id == interrupt_id else i for i in self.interrupts]})


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
        errors = _pydantic_errors(tool.parse_input, given)
        if errors:
            whose = "the input the reviewer gave it" if replaced is not None \
                else "the input it was called with"
            return Changed(tool.name, "input",
                           f"tool {tool.name!r} no longer takes {whose} "
                           f"{_where(agent, parked_on)}: {_said(errors)}", errors)
        if answer is not None and answer.status == "resolved" and tool.is_interrupt \
                and intr.mode is ResumeMode.RESPOND:
            errors = _pydantic_errors(tool.output.validate_python, answer.payload)
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
