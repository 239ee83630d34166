"""Messages and parts, shaped as Genkit's (camelCase on the wire).

A part is one of `text`, `toolRequest`, `toolResponse`; `metadata` carries Genkit's
interrupt markers (`interrupt`, `pendingOutput`, `resolvedInterrupt`, `interruptResponse`,
`source`). The history of a run is a list of `Message`; it is the only state a run needs.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

Role = Literal["system", "user", "model", "tool"]


class Wire(BaseModel):
    """Base for every model that crosses a boundary: camelCase out, either case in. Fields
    a reader does not know are ignored: a record written by a newer layby, or a reply from
    a newer server, still reads (request bodies refuse them: `layby.wire.Body`)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def wire_json(self) -> bytes:
        """`wire()` as JSON, written by pydantic's own serializer (no dict in between)."""
        return self.model_dump_json(by_alias=True, exclude_none=True).encode()


class ToolRequest(Wire):
    name: str
    ref: str | None = None
    input: Any = None


class ToolResponse(Wire):
    name: str
    ref: str | None = None
    output: Any = None


class Part(Wire):
    text: str | None = None
    tool_request: ToolRequest | None = None
    tool_response: ToolResponse | None = None
    metadata: dict[str, Any] | None = None

    def meta(self, key: str, default: Any = None) -> Any:
        return (self.metadata or {}).get(key, default)


class Message(Wire):
    role: Role
    content: list[Part]
    metadata: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.content if p.text)

    @property
    def tool_requests(self) -> list[Part]:
        return [p for p in self.content if p.tool_request is not None]


def text_message(role: Role, text: str) -> Message:
    return Message(role=role, content=[Part(text=text)])


def dump_messages(messages: list[Message]) -> list[dict[str, Any]]:
    return [m.wire() for m in messages]


def load_messages(data: list[Any]) -> list[Message]:
    return [Message.model_validate(m) for m in data]


def why_not_a_start(messages: list[Message]) -> str | None:
    """Why a history given to start a run cannot begin one, or None: the model needs a
    user message to answer, and every tool response must follow the model's request for
    it (by `ref`, or by tool name when a response has no ref)."""
    if not any(m.role == "user" for m in messages):
        roles = ", ".join(m.role for m in messages)
        return (f"`messages` holds no user message (roles: {roles}): a run begins with what "
                "the user asks; add {\"role\": \"user\", \"content\": [{\"text\": \"…\"}]}")
    asked: dict[str, set[str | None]] = {}  # tool name → the refs of its requests
    for at, message in enumerate(messages):
        for part in message.content:
            if part.tool_request is not None and message.role == "model":
                asked.setdefault(part.tool_request.name, set()).add(part.tool_request.ref)
            response = part.tool_response
            refs = asked.get(response.name) if response is not None else None
            if response is not None and not (refs is not None and (
                    response.ref is None or None in refs or response.ref in refs)):
                call = f"{response.name!r}" + (f" (ref {response.ref!r})" if response.ref else "")
                return (f"`messages[{at}]` holds a tool response to {call} that no earlier "
                        "model message requested: a tool response must follow the model "
                        "message whose toolRequest it answers")
    return None
