"""A step's spans, in the terms of OpenTelemetry's GenAI semantic conventions: the agent's
turn (`invoke_agent`), each model call (`chat`) and each tool call (`execute_tool`), made by
OpenTelemetry's GenAI utilities (`opentelemetry-util-genai`), with layby's own attributes
(`layby.run.id`, `layby.run.version`, `layby.tool.outcome`).

Pure: the OpenTelemetry API only. Where no process set up a tracer provider (the SDK is off:
`layby.broker_config.tracing`) nothing is made at all: each helper gives `None` and costs a
check. Prompts, replies, tool arguments and results are recorded only when
`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT` asks for them (the utilities decide).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import cache
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from layby.generation.messages import Message

if TYPE_CHECKING:
    from opentelemetry.util.genai.handler import TelemetryHandler

SCOPE = "layby"
# What each helper gives where nothing is traced: entered and left for next to nothing.
_OFF: AbstractContextManager[Any] = nullcontext()


def on() -> bool:
    """Whether this process traces: a tracer provider was set (layby's, or its host's)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


@cache
def _handler() -> TelemetryHandler:
    from importlib import metadata

    from opentelemetry.util.genai.handler import TelemetryHandler

    try:
        version = metadata.version("layby")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        version = "0.0.0"
    return TelemetryHandler(instrumentation_scope_name=SCOPE,
                            instrumentation_scope_version=version)


def provider_and_model(name: str) -> tuple[str, str]:
    """`openai:gpt-4o` → (`openai`, `gpt-4o`); a model named without a provider is its own."""
    provider, _, model = name.partition(":")
    return (provider, model) if model else (name, name)


def agent_turn(agent: str, model: str, run_id: str, version: int
               ) -> AbstractContextManager[Any]:
    """The agent's step of a run: `invoke_agent <agent>`."""
    return _agent_turn(agent, model, run_id, version) if on() else _OFF


@contextmanager
def _agent_turn(agent: str, model: str, run_id: str, version: int) -> Iterator[Any]:
    with _handler().invoke_local_agent(agent_name=agent,
                                       request_model=provider_and_model(model)[1]) as span:
        span.attributes.update({"layby.run.id": run_id, "layby.run.version": version})
        yield span


def model_call(model: str, run_id: str, messages: list[Message]
               ) -> AbstractContextManager[Any]:
    """One call of the model: `chat <model>`; `record_reply` on what it gives."""
    return _model_call(model, run_id, messages) if on() else _OFF


@contextmanager
def _model_call(model: str, run_id: str, messages: list[Message]) -> Iterator[Any]:
    provider, request_model = provider_and_model(model)
    handler = _handler()
    with handler.inference(provider, request_model=request_model) as span:
        span.attributes["layby.run.id"] = run_id
        if handler.should_capture_content():
            span.input_messages = [_message(m, output=False) for m in messages]
        yield span


def record_reply(span: Any, message: Message, finish_reason: str,
                 usage: dict[str, Any] | None) -> None:
    """What the model answered, on its `chat` span (None: not traced)."""
    if span is None:
        return
    span.finish_reasons = [finish_reason]
    usage = usage or {}
    if isinstance(usage.get("inputTokens"), int):
        span.input_tokens = usage["inputTokens"]
    if isinstance(usage.get("outputTokens"), int):
        span.output_tokens = usage["outputTokens"]
    if _handler().should_capture_content():
        span.output_messages = [_message(message, output=True, finish_reason=finish_reason)]


def tool_call(tool: str, call_id: str, agent: str, run_id: str
              ) -> AbstractContextManager[Any]:
    """One tool call: `execute_tool <tool>`; `record_outcome` on what it gives."""
    return _tool_call(tool, call_id, agent, run_id) if on() else _OFF


@contextmanager
def _tool_call(tool: str, call_id: str, agent: str, run_id: str) -> Iterator[Any]:
    with _handler().tool(tool, agent_name=agent) as span:
        span.tool_call_id = call_id
        span.attributes["layby.run.id"] = run_id
        yield span


def record_outcome(span: Any, outcome: str) -> None:
    """How a tool call ended (output, interrupt, end, retry, error), on its span."""
    if span is not None:
        span.attributes["layby.tool.outcome"] = outcome


def _message(message: Message, *, output: bool, finish_reason: str | None = None) -> Any:
    from opentelemetry.util.genai.types import (
        InputMessage,
        OutputMessage,
        TextPart,
        ToolCallRequestPart,
        ToolCallResponsePart,
    )

    parts: list[Any] = []
    for part in message.content:
        if part.text is not None:
            parts.append(TextPart(content=part.text))
        elif part.tool_request is not None:
            req = part.tool_request
            parts.append(ToolCallRequestPart(arguments=req.input, name=req.name, id=req.ref))
        elif part.tool_response is not None:
            res = part.tool_response
            parts.append(ToolCallResponsePart(response=res.output, id=res.ref))
    role = "assistant" if message.role == "model" else message.role
    if output:
        return OutputMessage(role=role, parts=parts, finish_reason=finish_reason)
    return InputMessage(role=role, parts=parts)
