"""What the provider adapters share: their error, the mapping of SDK errors onto it, the
mapping of Genkit's generation config, and JSON helpers.

Every failure of an adapter is a `ProviderError` whose message says what went wrong and what
to do about it. `transient` tells a caller whether trying again may help (timeouts, 429, 5xx,
a reply that could not be read); the SDKs have already retried those `max_retries` times.
No message ever contains the API key: server messages are quoted with it blanked out.
"""

from __future__ import annotations

import json
import os
import re
import threading
from types import ModuleType
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr

from layby.errors import RunFailed

_DETAIL_CHARS = 300


class ProviderError(RunFailed):
    """A model provider could not give a reply. `transient`: another try may succeed."""

    def __init__(self, message: str, *, provider: str, status_code: int | None = None,
                 transient: bool = False, request_id: str | None = None) -> None:
        super().__init__(message, detail={"provider": provider, "statusCode": status_code,
                                          "transient": transient, "requestId": request_id})
        self.provider = provider
        self.status_code = status_code
        self.transient = transient
        self.request_id = request_id

    def __reduce__(self) -> tuple[Any, ...]:  # survives pickling (Celery results, processes)
        return (_rebuild, (self.message, self.provider, self.status_code, self.transient,
                           self.request_id))


def _rebuild(message: str, provider: str, status_code: int | None, transient: bool,
             request_id: str | None) -> ProviderError:
    return ProviderError(message, provider=provider, status_code=status_code,
                         transient=transient, request_id=request_id)


def redact(text: str, secret: str | None) -> str:
    """`text` with the secret, and any 8 characters of it in a row, blanked out."""
    if not secret:
        return text
    text = text.replace(secret, "[redacted]")
    if len(secret) >= 8:
        for i in range(len(secret) - 7):
            window = secret[i:i + 8]
            if window in text:
                text = text.replace(window, "[redacted]")
    return text


def safe_url(url: str) -> str:
    """A URL fit for messages: no user:password part, no query."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(an invalid URL)"
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, "", "")).rstrip("/")


def dumps(value: Any) -> str:
    """JSON text for a tool's input or output, as the providers expect it."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# Genkit's common generation config, by provider. Other keys go to the request body as they are.
OPENAI_CONFIG = {"temperature": "temperature", "maxOutputTokens": "max_tokens",
                 "topP": "top_p", "stopSequences": "stop"}
ANTHROPIC_CONFIG = {"temperature": "temperature", "maxOutputTokens": "max_tokens",
                    "topP": "top_p", "topK": "top_k", "stopSequences": "stop_sequences"}


def request_params(temperature: float | None, options: dict[str, Any], config: dict[str, Any],
                   names: dict[str, str]) -> dict[str, Any]:
    """Body parameters: the adapter's temperature and options, then the agent's config."""
    params: dict[str, Any] = {}
    if temperature is not None:
        params["temperature"] = temperature
    params.update(options)
    for key, value in config.items():
        if key == "version":  # Genkit's model version selector: the adapter names the model
            continue
        params[names.get(key, key)] = value
    return params


def tool_schema(definition: dict[str, Any]) -> dict[str, Any]:
    schema = (definition.get("inputSchema") or definition.get("input_schema")
              or definition.get("parameters"))
    return schema if isinstance(schema, dict) else {"type": "object", "properties": {}}


def _server_detail(exc: Exception, key: str | None) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict) and "error" in body:
        body = body["error"]
    if isinstance(body, dict):
        text = body.get("message") or body.get("detail") or json.dumps(body)
    elif isinstance(body, str) and body.strip():
        text = body
    else:
        text = getattr(exc, "message", None) or str(exc)
    text = redact(" ".join(str(text).split()), key)
    if len(text) > _DETAIL_CHARS:
        text = text[:_DETAIL_CHARS] + "…"
    return text


_MODEL_MISSING = re.compile(r"model.*(not[ _]found|does not exist|unknown|not available"
                            r"|no such|invalid model)|(unknown|invalid) model", re.IGNORECASE)


def map_error(exc: Exception, sdk: Any, *, provider: str, label: str, where: str, model: str,
              env: str, key: str | None, retries: int, timeout_s: float) -> ProviderError:
    """A clear `ProviderError` for an exception raised by an SDK call.

    `label` names the server in messages ("OpenAI-compatible server"), `where` its URL,
    `env` the settings prefix whose variables fix the problem (`LAYBY_OPENAI`).
    """
    status = getattr(exc, "status_code", None)
    request_id = _request_id(exc)
    at = f"the {label} at {where}"
    tries = f"{retries + 1} {'try' if retries == 0 else 'tries'}"

    def err(message: str, transient: bool) -> ProviderError:
        if request_id:
            message += f" [request id {request_id}]"
        return ProviderError(redact(message, key), provider=provider, status_code=status,
                             transient=transient, request_id=request_id)

    if isinstance(exc, sdk.APITimeoutError):
        return err(f"{at} did not answer within {timeout_s:g} s ({tries}): raise "
                   f"{env}_TIMEOUT_S or check that the server is not overloaded", True)
    if isinstance(exc, sdk.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        why = f" ({type(cause).__name__}: {redact(str(cause), key)})" if cause else ""
        return err(f"cannot reach {at}{why} ({tries}): is it running? check {env}_BASE_URL",
                   True)
    if not isinstance(exc, sdk.APIStatusError) or not isinstance(status, int):
        return err(f"{at} failed for model {model!r}: {type(exc).__name__}: "
                   f"{redact(str(exc), key)}", False)
    return err(*_status_problem(status, _server_detail(exc, key), at=at, model=model, env=env,
                                tries=tries))


def _request_id(exc: Exception) -> str | None:
    """The provider's id of the failed request, when its reply has one (OpenAI's
    `x-request-id`, Anthropic's `request-id`)."""
    response = getattr(exc, "response", None)
    if response is None:
        return None
    headers = getattr(response, "headers", {}) or {}
    return headers.get("x-request-id") or headers.get("request-id")


def _status_problem(status: int, detail: str, *, at: str, model: str, env: str,
                    tries: str) -> tuple[str, bool]:
    """What a refused request's HTTP status means, with what to change, and whether it
    may pass (`transient`)."""
    said = f' (it said: "{detail}")' if detail else ""
    if status == 401:
        return (f"{at} refused the API key (401){said}: set {env}_API_KEY to a valid key",
                False)
    if status == 403:
        return (f"{at} denied this API key access to model {model!r} (403){said}: check the "
                f"key's permissions, or set {env}_API_KEY to a key that has them", False)
    if status == 404 or (status in (400, 422) and _MODEL_MISSING.search(detail)):
        return (f"{at} has no model {model!r}, or no such endpoint ({status}){said}: check "
                f"{env}_MODEL (on Ollama, `ollama pull` it first) and that {env}_BASE_URL "
                "is the API's root (for OpenAI-compatible servers it usually ends in /v1)",
                False)
    if status in (400, 413, 422):
        return (f"{at} rejected the request for model {model!r} ({status}){said}: check that "
                "the model supports tool calling and the agent's config and options", False)
    if status == 429:
        return (f"{at} is rate limiting requests (429){said}, still after {tries}: try again "
                "later, or lower the number of concurrent runs", True)
    if status >= 500 or status in (408, 409):
        return (f"{at} failed with a server error ({status}){said}, still after {tries}: "
                "try again later", True)
    return f"{at} answered {status}{said} for model {model!r}", False


class ProviderModel(BaseModel):
    """What both adapters are made of: where the provider is, its key, timeouts and retries,
    and one SDK client per adapter, made on first use. Subclasses name their provider and
    make the client."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    PROVIDER: ClassVar[str]
    LABEL: ClassVar[str]  # how messages name the server
    ENV: ClassVar[str]  # the settings' prefix: <ENV>_API_KEY comes first
    KEY_ENV: ClassVar[str]  # the SDK's own variable, the fallback

    model: str = Field(min_length=1)
    base_url: str | None = None
    api_key: SecretStr | None = None
    timeout_s: float = Field(60.0, gt=0)
    max_retries: int = Field(2, ge=0)
    temperature: float | None = None
    options: dict[str, Any] = Field(default_factory=dict)

    _client: Any = PrivateAttr(default=None)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return f"{self.PROVIDER}:{self.model}"

    def _key(self) -> str | None:
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        return os.environ.get(f"{self.ENV}_API_KEY") or os.environ.get(self.KEY_ENV) or None

    def _get_client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._make_client()
            return self._client

    def _make_client(self) -> Any:
        raise NotImplementedError

    def _sdk(self) -> ModuleType:
        raise NotImplementedError

    def _error(self, exc: Exception, where: str) -> ProviderError:
        if isinstance(exc, ProviderError):
            return exc
        return map_error(exc, self._sdk(), provider=self.PROVIDER, label=self.LABEL,
                         where=where, model=self.model, env=self.ENV, key=self._key(),
                         retries=self.max_retries, timeout_s=self.timeout_s)


def stable_ref(message_index: int, part_index: int) -> str:
    """The id of a tool request stored without a ref (one written by the scripted model or
    a client's history): the same every time the history is sent, in every adapter."""
    return f"call_m{message_index}_p{part_index}"


def take_unpaired(unpaired: dict[str, list[str]], name: str) -> str | None:
    """The first id still unpaired among the calls of tool `name`, taken off its list (None
    when there is none left)."""
    waiting = unpaired.get(name)
    return waiting.pop(0) if waiting else None
