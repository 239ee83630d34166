"""A parked run as an agent's `migrate` hook sees it (`StoredRun`): what it was parked with,
and the changes a hook makes to it that must agree across the history and the interrupts
(`layby.generation.versions` checks what the hook returns)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from layby.generation.interrupts import Interrupt, ResumeEntry
from layby.generation.messages import Message, Wire


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
