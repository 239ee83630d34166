"""The model interface: what a turn sends to a model and what it gets back.

A model is any object with `generate(request) -> ModelResponse`. Adapters for providers
translate to and from this Genkit-shaped history; the scripted model answers from data.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import Field

from layby.generation.messages import Message, Wire


class ModelRequest(Wire):
    messages: list[Message]
    tools: list[dict[str, Any]] = Field(default_factory=list)
    system: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)


class ModelResponse(Wire):
    message: Message
    finish_reason: str = "stop"
    usage: dict[str, Any] | None = None


@runtime_checkable
class Model(Protocol):
    # Read only: layby reads a model's name and never sets it (the provider models are
    # frozen, their `name` a read-only attribute).
    @property
    def name(self) -> str: ...

    def generate(self, request: ModelRequest) -> ModelResponse: ...
