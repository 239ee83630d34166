"""The scripted model: deterministic turns written as data, for demos and for users' tests.

A script is a list of steps; the n-th model turn of a run plays step n (counted from the
history, so a replayed or resumed turn plays the same step). A step is a `Reply` (text and
tool calls) or a `Choose`, which picks a reply from the last tool responses. Strings are
templates: `{input}` is the user's first message, named groups of `input_pattern` are
available by name, `{tool_name}` is that tool's last output and `{ref}` the output of the
call with that ref (`{tool[field]}` reaches into an object). A script can be loaded from
JSON: `ScriptedModel.model_validate_json(...)`.
"""

from __future__ import annotations

import re
import string
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from layby.generation.messages import Message, Part, ToolRequest
from layby.generation.models import ModelRequest, ModelResponse


class Call(BaseModel):
    name: str
    input: dict[str, Any] = Field(default_factory=dict)
    ref: str | None = None


class Reply(BaseModel):
    kind: Literal["reply"] = "reply"
    text: str | None = None
    calls: list[Call] = Field(default_factory=list)


class Case(BaseModel):
    """Matches when the last response of `tool` (at `field`, a dotted path) equals `equals`,
    or, with `declined`, when a reviewer cancelled that tool's request."""

    tool: str
    field: str | None = None
    equals: Any = None
    declined: bool | None = None
    reply: Reply


class Choose(BaseModel):
    kind: Literal["choose"] = "choose"
    cases: list[Case]
    otherwise: Reply


Step = Annotated[Reply | Choose, Field(discriminator="kind")]


class ScriptedModel(BaseModel):
    name: str = "scripted"
    steps: list[Step]
    input_pattern: str | None = None
    finish: Reply = Field(default_factory=lambda: Reply(text="(the script has ended)"))

    def generate(self, request: ModelRequest) -> ModelResponse:
        history = request.messages
        turn = sum(1 for m in history if m.role == "model")
        step = self.steps[turn] if turn < len(self.steps) else self.finish
        outputs, declined = _last_tool_outputs(history)
        reply = step if isinstance(step, Reply) else _choose(step, outputs, declined)
        values = self._values(history, outputs)
        content = [Part(text=_render(reply.text, values))] if reply.text is not None else []
        for i, call in enumerate(reply.calls):
            content.append(Part(tool_request=ToolRequest(
                name=call.name, ref=call.ref or f"{call.name}_{turn}_{i}",
                input=_render(call.input, values))))
        return ModelResponse(message=Message(role="model", content=content),
                             finish_reason="stop" if not reply.calls else "tool_calls")

    def _values(self, history: list[Message], outputs: dict[str, Any]) -> dict[str, Any]:
        first_user = next((m.text for m in history if m.role == "user"), "")
        values: dict[str, Any] = {"input": first_user, **outputs}
        if self.input_pattern:
            match = re.search(self.input_pattern, first_user, flags=re.IGNORECASE)
            if match:
                values.update(match.groupdict())
        return values


def _last_tool_outputs(history: list[Message]) -> tuple[dict[str, Any], set[str]]:
    outputs: dict[str, Any] = {}
    declined: set[str] = set()
    for message in history:
        if message.role != "tool":
            continue
        for part in message.content:
            resp = part.tool_response
            if resp is not None:
                outputs[resp.name] = resp.output
                if resp.ref:
                    outputs[resp.ref] = resp.output
                if part.meta("cancelled"):
                    declined.add(resp.name)
                else:
                    declined.discard(resp.name)
    return outputs, declined


def _choose(step: Choose, outputs: dict[str, Any], declined: set[str]) -> Reply:
    for case in step.cases:
        if case.declined is not None:
            if (case.tool in declined) == case.declined:
                return case.reply
            continue
        if case.tool in outputs and case.tool not in declined:
            value = outputs[case.tool]
            for key in (case.field.split(".") if case.field else []):
                value = value.get(key) if isinstance(value, dict) else None
            if _same(value, case.equals):
                return case.reply
    return step.otherwise


def _same(value: Any, expected: Any) -> bool:
    if isinstance(value, str) and isinstance(expected, str):
        return value.strip().casefold() == expected.strip().casefold()
    return bool(value == expected)


class _Lenient(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def _render(value: Any, values: dict[str, Any]) -> Any:
    if isinstance(value, str):
        try:
            return string.Formatter().vformat(value, (), _Lenient(values))
        except (KeyError, IndexError, AttributeError, ValueError):
            return value
    if isinstance(value, dict):
        return {k: _render(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [_render(v, values) for v in value]
    return value
