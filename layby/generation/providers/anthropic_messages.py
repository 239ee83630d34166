"""`AnthropicModel`: layby's model interface over Anthropic's Messages API.

The history translates without loss:

    model message (text + N toolRequests)  ->  an assistant message: text blocks and N
                                               `tool_use` blocks (`id` = the request's ref)
    tool message (N toolResponses)         ->  a user message with N `tool_result` blocks
                                               (`tool_use_id` = ref, content = output as JSON)
    `system` and system messages           ->  the top-level `system` prompt

and back: `tool_use` blocks become toolRequest parts (`ref` = the block's id), text blocks text
parts. Blocks layby has no part for (`thinking`, `redacted_thinking`, …) are kept whole in a
part's `metadata.anthropic` and sent back as they were, as extended thinking requires.
Anthropic's ids allow only `[A-Za-z0-9_-]`: a ref with other characters is sent as a
deterministic safe id (the same for the call and its result).
"""

from __future__ import annotations

import hashlib
import logging
import re
from types import ModuleType
from typing import Any, ClassVar

from pydantic import Field

from layby.generation.messages import Message, Part, ToolRequest
from layby.generation.models import ModelRequest, ModelResponse
from layby.generation.providers.common import (
    ANTHROPIC_CONFIG,
    ProviderError,
    ProviderModel,
    dumps,
    request_params,
    safe_url,
    stable_ref,
    take_unpaired,
    tool_schema,
)
from layby.generation.providers.settings import AnthropicSettings

log = logging.getLogger(__name__)

PROVIDER = "anthropic"
ENV = "LAYBY_ANTHROPIC"
_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls",
           "max_tokens": "length", "model_context_window_exceeded": "length",
           "refusal": "blocked", "pause_turn": "other"}
_SAFE_ID = re.compile(r"[A-Za-z0-9_-]{1,200}")


class AnthropicModel(ProviderModel):
    """A Claude model, called through the official `anthropic` SDK.

    `api_key` falls back to `LAYBY_ANTHROPIC_API_KEY`, then `ANTHROPIC_API_KEY`. `max_tokens`
    (which the API requires) is overridden by the agent's `config.maxOutputTokens`. `options`
    go into every request body as they are (`{"thinking": {...}}`, `{"top_k": 5}`).
    """

    PROVIDER: ClassVar[str] = PROVIDER
    LABEL: ClassVar[str] = "Anthropic API"
    ENV: ClassVar[str] = ENV
    KEY_ENV: ClassVar[str] = "ANTHROPIC_API_KEY"

    max_tokens: int = Field(4096, ge=1)

    @classmethod
    def from_settings(cls, settings: AnthropicSettings | None = None,
                      **overrides: Any) -> AnthropicModel:
        """An adapter from `LAYBY_ANTHROPIC_*` (or the settings given), fields overridable."""
        s = settings or AnthropicSettings()
        values: dict[str, Any] = {"model": s.model, "base_url": s.base_url,
                                  "api_key": s.api_key, "timeout_s": s.timeout_s,
                                  "max_retries": s.max_retries, "temperature": s.temperature,
                                  "max_tokens": s.max_tokens}
        values.update(overrides)
        if not values.get("model"):
            raise ProviderError("no model is configured for the Anthropic adapter: set "
                                "LAYBY_ANTHROPIC_MODEL (e.g. claude-sonnet-4-5)",
                                provider=PROVIDER)
        return cls(**values)

    # -- the Model interface ----------------------------------------------------------------

    def generate(self, request: ModelRequest) -> ModelResponse:
        client = self._get_client()
        where = safe_url(str(client.base_url))
        params = request_params(self.temperature, self.options, request.config,
                                ANTHROPIC_CONFIG)
        max_tokens = params.pop("max_tokens", self.max_tokens)
        systems, messages = to_anthropic_messages(request.messages)
        system = "\n\n".join(s for s in [request.system or "", *systems] if s)
        kwargs: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens,
                                  "messages": messages}
        if system:
            kwargs["system"] = system
        if request.tools:
            kwargs["tools"] = to_anthropic_tools(request.tools)
        log.debug("messages: model %s at %s, %d messages, %d tools", self.model, where,
                  len(messages), len(request.tools))
        try:
            reply = client.messages.create(**kwargs, extra_body=params or None)
        except Exception as exc:  # noqa: BLE001  (the SDK's errors, told apart by _error)
            raise self._error(exc, where) from None
        return from_anthropic_message(reply, model=self.model, where=where)

    # -- internals --------------------------------------------------------------------------

    def _sdk(self) -> ModuleType:
        import anthropic

        return anthropic

    def _make_client(self) -> Any:
        try:
            import anthropic
        except ImportError as exc:
            raise ProviderError("the Anthropic adapter needs the anthropic package: "
                                "pip install anthropic", provider=PROVIDER) from exc
        key = self._key()
        if key is None:
            if self.base_url is None:
                raise ProviderError("no API key for the Anthropic API: set "
                                    "LAYBY_ANTHROPIC_API_KEY (or ANTHROPIC_API_KEY)",
                                    provider=PROVIDER)
            key = "no-key"  # a compatible server given by base_url may not need one
        return anthropic.Anthropic(api_key=key, base_url=self.base_url, timeout=self.timeout_s,
                                   max_retries=self.max_retries)



# -- history -> Messages API -------------------------------------------------------------------


def safe_id(ref: str) -> str:
    """`ref` if Anthropic accepts it as a tool_use id, else a deterministic id that it does."""
    if _SAFE_ID.fullmatch(ref):
        return ref
    digest = hashlib.sha256(ref.encode()).hexdigest()[:12]
    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', ref)[:60]}_{digest}"


def to_anthropic_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for definition in tools:
        tool: dict[str, Any] = {"name": definition["name"],
                                "input_schema": tool_schema(definition)}
        if definition.get("description"):
            tool["description"] = definition["description"]
        out.append(tool)
    return out


def to_anthropic_messages(messages: list[Message]) -> tuple[list[str], list[dict[str, Any]]]:
    """layby's history as (system texts, Messages API messages); see the module's docstring."""
    systems: list[str] = []
    out: list[dict[str, Any]] = []
    unpaired: dict[str, list[str]] = {}  # calls stored without a ref, by tool name
    for m_index, message in enumerate(messages):
        if message.role == "system":
            if message.text:
                systems.append(message.text)
            continue
        if message.role == "model":
            role, blocks = "assistant", _assistant_blocks(message, m_index, unpaired)
        else:
            role, blocks = "user", _user_blocks(message, m_index, unpaired)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:  # the API wants user and assistant in turns
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return systems, out


def _assistant_blocks(message: Message, m_index: int,
                      unpaired: dict[str, list[str]]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for p_index, part in enumerate(message.content):
        raw = part.meta("anthropic")
        req = part.tool_request
        if isinstance(raw, dict) and req is None and part.text is None:
            blocks.append(raw)
        elif req is not None:
            ref = req.ref
            if not ref:
                ref = stable_ref(m_index, p_index)
                unpaired.setdefault(req.name, []).append(ref)
            blocks.append({"type": "tool_use", "id": safe_id(ref), "name": req.name,
                           "input": req.input if req.input is not None else {}})
        elif part.text:  # the API refuses empty text blocks
            blocks.append({"type": "text", "text": part.text})
    return blocks


def _user_blocks(message: Message, m_index: int,
                 unpaired: dict[str, list[str]]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    texts: list[dict[str, Any]] = []
    for p_index, part in enumerate(message.content):
        resp = part.tool_response
        if resp is not None:
            ref = resp.ref or take_unpaired(unpaired, resp.name) \
                or stable_ref(m_index, p_index)
            results.append({"type": "tool_result", "tool_use_id": safe_id(ref),
                            "content": dumps(resp.output)})
        elif part.text:
            texts.append({"type": "text", "text": part.text})
    return results + texts  # tool results must come first in their message


# -- Messages API -> model response ------------------------------------------------------------


def from_anthropic_message(reply: Any, *, model: str, where: str) -> ModelResponse:
    blocks = getattr(reply, "content", None)
    if blocks is None:
        raise ProviderError(f"the Anthropic API at {where} answered without content for model "
                            f"{model!r}: check its base URL (the API root, without /v1)",
                            provider=PROVIDER, transient=True)
    content: list[Part] = []
    for block in blocks:
        kind = getattr(block, "type", None)
        if kind == "text":
            if block.text:
                content.append(Part(text=block.text))
        elif kind == "tool_use":
            content.append(Part(tool_request=ToolRequest(
                name=block.name, ref=getattr(block, "id", None) or None,
                input=block.input if block.input is not None else {})))
        else:
            raw = block.model_dump(mode="json", exclude_none=True) \
                if hasattr(block, "model_dump") else dict(block)
            content.append(Part(metadata={"anthropic": raw}))
    stop = getattr(reply, "stop_reason", None) or "end_turn"
    return ModelResponse(message=Message(role="model", content=content),
                         finish_reason=_FINISH.get(stop, "other"), usage=_usage(reply))


def _usage(reply: Any) -> dict[str, Any] | None:
    usage = getattr(reply, "usage", None)
    if usage is None:
        return None
    found = {"inputTokens": getattr(usage, "input_tokens", None),
             "outputTokens": getattr(usage, "output_tokens", None)}
    if found["inputTokens"] is not None and found["outputTokens"] is not None:
        found["totalTokens"] = found["inputTokens"] + found["outputTokens"]
    for name, key in (("cache_read_input_tokens", "cacheReadTokens"),
                      ("cache_creation_input_tokens", "cacheWriteTokens")):
        value = getattr(usage, name, None)
        if value is not None:
            found[key] = value
    return {k: v for k, v in found.items() if v is not None} or None
