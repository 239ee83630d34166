"""`OpenAIChatModel`: layby's model interface over an OpenAI-compatible chat completions API.

Works with OpenAI and with any server that speaks its chat completions protocol (Ollama,
vLLM, LM Studio, OpenRouter, …) through `base_url`. The history translates without loss:

    model message (text + N toolRequests)  ->  one assistant message with N `tool_calls`,
                                               each `id` = the request's `ref`
    tool message (N toolResponses)         ->  N `role: "tool"` messages, `tool_call_id` = ref,
                                               `content` = the output as JSON
    user / system messages, `system`       ->  user / system messages (the system prompt first)

and back: `tool_calls` become toolRequest parts (`ref` = the call's id, `input` = the parsed
JSON arguments), `content` a text part. A call without an id gets its ref from the turn
(`call_<turn>_<index>`), which is stored in the history and sent back as the id afterwards.
Genkit's metadata (interrupt markers) is layby's own and is not sent.
"""

from __future__ import annotations

import json
import logging
import os
from types import ModuleType
from typing import Any, ClassVar

from layby.generation.messages import Message, Part, ToolRequest
from layby.generation.models import ModelRequest, ModelResponse
from layby.generation.providers.common import (
    OPENAI_CONFIG,
    ProviderError,
    ProviderModel,
    dumps,
    redact,
    request_params,
    safe_url,
    stable_ref,
    take_unpaired,
    tool_schema,
)
from layby.generation.providers.settings import OpenAISettings

log = logging.getLogger(__name__)

PROVIDER = "openai"
ENV = "LAYBY_OPENAI"
_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls",
           "function_call": "tool_calls", "content_filter": "blocked"}


class OpenAIChatModel(ProviderModel):
    """A model on an OpenAI-compatible server, called through the official `openai` SDK.

    `api_key` falls back to `LAYBY_OPENAI_API_KEY`, then `OPENAI_API_KEY`; a server given by
    `base_url` that needs no key (Ollama, a local vLLM) gets a placeholder. `options` go into
    every request body as they are (`{"max_completion_tokens": 512, "seed": 1}`); the agent's
    `config` is applied last (Genkit's `temperature`, `maxOutputTokens`, `topP`,
    `stopSequences` are renamed, other keys pass as they are).
    """

    PROVIDER: ClassVar[str] = PROVIDER
    LABEL: ClassVar[str] = "OpenAI-compatible server"
    ENV: ClassVar[str] = ENV
    KEY_ENV: ClassVar[str] = "OPENAI_API_KEY"

    @classmethod
    def from_settings(cls, settings: OpenAISettings | None = None,
                      **overrides: Any) -> OpenAIChatModel:
        """An adapter from `LAYBY_OPENAI_*` (or the settings given), fields overridable."""
        s = settings or OpenAISettings()
        values: dict[str, Any] = {"model": s.model, "base_url": s.base_url,
                                  "api_key": s.api_key, "timeout_s": s.timeout_s,
                                  "max_retries": s.max_retries, "temperature": s.temperature}
        values.update(overrides)
        if not values.get("model"):
            raise ProviderError(
                "no model is configured for the OpenAI-compatible adapter: set "
                "LAYBY_OPENAI_MODEL (for a local Ollama, e.g. LAYBY_OPENAI_MODEL=llama3.2 and "
                "LAYBY_OPENAI_BASE_URL=http://127.0.0.1:11434/v1)", provider=PROVIDER)
        return cls(**values)

    # -- the Model interface ----------------------------------------------------------------

    def generate(self, request: ModelRequest) -> ModelResponse:
        client = self._get_client()
        where = safe_url(str(client.base_url))
        params = request_params(self.temperature, self.options, request.config, OPENAI_CONFIG)
        kwargs: dict[str, Any] = {"model": self.model,
                                  "messages": to_chat_messages(request.messages, request.system)}
        if request.tools:
            kwargs["tools"] = to_chat_tools(request.tools)
        log.debug("chat completion: model %s at %s, %d messages, %d tools", self.model, where,
                  len(kwargs["messages"]), len(request.tools))
        try:
            completion = client.chat.completions.create(**kwargs, extra_body=params or None)
        except Exception as exc:  # noqa: BLE001  (the SDK's errors, told apart by _error)
            raise self._error(exc, where) from None
        return from_chat_completion(completion, model=self.model, where=where)

    # -- internals --------------------------------------------------------------------------

    def _sdk(self) -> ModuleType:
        import openai

        return openai

    def _make_client(self) -> Any:
        try:
            import openai
        except ImportError as exc:
            raise ProviderError("the OpenAI-compatible adapter needs the openai package: "
                                "pip install openai", provider=PROVIDER) from exc
        key = self._key()
        if key is None:
            if self.base_url is None and not os.environ.get("OPENAI_BASE_URL"):
                raise ProviderError(
                    "no API key for the OpenAI API: set LAYBY_OPENAI_API_KEY (or "
                    "OPENAI_API_KEY), or point LAYBY_OPENAI_BASE_URL at a server that needs "
                    "none, such as a local Ollama (http://127.0.0.1:11434/v1)",
                    provider=PROVIDER)
            key = "no-key"  # local servers ignore it; the SDK insists on one
        return openai.OpenAI(api_key=key, base_url=self.base_url, timeout=self.timeout_s,
                             max_retries=self.max_retries)



# -- history -> chat messages -----------------------------------------------------------------


def to_chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for definition in tools:
        function: dict[str, Any] = {"name": definition["name"],
                                    "parameters": tool_schema(definition)}
        if definition.get("description"):
            function["description"] = definition["description"]
        out.append({"type": "function", "function": function})
    return out


def to_chat_messages(messages: list[Message], system: str | None = None) -> list[dict[str, Any]]:
    """layby's history as chat completion messages (see the module's docstring)."""
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": system})
    # calls that had no ref, by tool name, in order: their responses take the same id
    unpaired: dict[str, list[str]] = {}
    for m_index, message in enumerate(messages):
        if message.role == "model":
            out.append(_assistant(message, m_index, unpaired))
        elif message.role == "system":
            out.append({"role": "system", "content": message.text})
        else:  # user and tool messages: responses first (they answer the last calls), then text
            texts, answered = [], False
            for p_index, part in enumerate(message.content):
                resp = part.tool_response
                if resp is not None:
                    ref = resp.ref or take_unpaired(unpaired, resp.name) \
                        or stable_ref(m_index, p_index)
                    out.append({"role": "tool", "tool_call_id": ref,
                                "content": dumps(resp.output)})
                    answered = True
                elif part.text is not None:
                    texts.append(part.text)
            if texts or (message.role == "user" and not answered):
                out.append({"role": "user", "content": "".join(texts)})
    return out


def _assistant(message: Message, m_index: int, unpaired: dict[str, list[str]]) -> dict[str, Any]:
    text = "".join(p.text for p in message.content if p.text)
    calls = []
    for p_index, part in enumerate(message.content):
        req = part.tool_request
        if req is None:
            continue
        ref = req.ref
        if not ref:
            ref = stable_ref(m_index, p_index)
            unpaired.setdefault(req.name, []).append(ref)
        calls.append({"id": ref, "type": "function",
                      "function": {"name": req.name,
                                   "arguments": dumps(req.input if req.input is not None
                                                      else {})}})
    out: dict[str, Any] = {"role": "assistant"}
    # With tool calls and no text, `content` is left out: OpenAI allows null, Ollama does not.
    if text or not calls:
        out["content"] = text
    if calls:
        out["tool_calls"] = calls
    return out


# -- chat completion -> model response ---------------------------------------------------------


def from_chat_completion(completion: Any, *, model: str, where: str) -> ModelResponse:
    choices = getattr(completion, "choices", None)
    if not choices:
        shown = redact(str(completion)[:200], None)
        raise ProviderError(f"the OpenAI-compatible server at {where} answered without a "
                            f"choice for model {model!r} ({shown!r}): check that its base URL "
                            "is the API root (it usually ends in /v1)",
                            provider=PROVIDER, transient=True)
    choice = choices[0]
    message = choice.message
    finish = getattr(choice, "finish_reason", None) or "stop"
    content: list[Part] = []
    text = _text(getattr(message, "content", None))
    if text:
        content.append(Part(text=text))
    refusal = getattr(message, "refusal", None)
    if refusal and not text:
        content.append(Part(text=refusal, metadata={"refusal": True}))
    for call in getattr(message, "tool_calls", None) or []:
        function = getattr(call, "function", None)
        call_id = getattr(call, "id", None) or None
        if function is None:
            raise ProviderError(f"the model {model!r} at {where} made a tool call of type "
                                f"{getattr(call, 'type', None)!r}; only function calls are "
                                "supported", provider=PROVIDER)
        content.append(Part(tool_request=ToolRequest(
            name=function.name, ref=call_id,
            input=parse_arguments(function.arguments, tool=function.name, call_id=call_id,
                                  model=model, where=where, finish=finish))))
    return ModelResponse(message=Message(role="model", content=content),
                         finish_reason=_FINISH.get(finish, "other"), usage=_usage(completion))


def parse_arguments(raw: Any, *, tool: str, call_id: str | None, model: str, where: str,
                    finish: str | None) -> Any:
    """A tool call's arguments as data; invalid JSON is the model's error, said plainly."""
    if raw is None or isinstance(raw, dict | list):
        return raw if raw is not None else {}
    if not str(raw).strip():
        return {}
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        shown = raw if len(raw) <= 200 else raw[:200] + "…"
        cut = (" The reply was cut off at the token limit (finish_reason 'length'): raise "
               "maxOutputTokens in the agent's config." if finish == "length" else "")
        raise ProviderError(
            f"the model {model!r} at {where} called tool {tool!r} (call id {call_id!r}) with "
            f"arguments that are not valid JSON ({exc.msg} at character {exc.pos}): "
            f"{shown!r}.{cut} Try again, or use a model that is better at tool calling.",
            provider=PROVIDER, transient=True) from None


def _text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):  # some servers send content parts
        return "".join(c.get("text", "") if isinstance(c, dict) else str(getattr(c, "text", ""))
                       for c in content)
    return str(content)


def _usage(completion: Any) -> dict[str, Any] | None:
    usage = getattr(completion, "usage", None)
    if usage is None:
        return None
    found = {"inputTokens": getattr(usage, "prompt_tokens", None),
             "outputTokens": getattr(usage, "completion_tokens", None),
             "totalTokens": getattr(usage, "total_tokens", None)}
    return {k: v for k, v in found.items() if v is not None} or None
