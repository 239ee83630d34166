"""The one table from layby's errors to HTTP statuses, and the error body every refusal has:
`{"error": {"code", "message", "detail"}}`. Domain code raises `layby.errors`; only this
module knows status codes (as Starlette and httpx keep them at the edge)."""

from __future__ import annotations

from typing import Any

import redis.sentinel
from fastapi.responses import JSONResponse

from layby.answering.mime import MalformedMail
from layby.errors import (
    ConfigError,
    Conflict,
    Forbidden,
    Invalid,
    LaybyError,
    NotFound,
    RequestError,
    TooLarge,
    Unauthorized,
    Unavailable,
)

# Looked up along the error's class hierarchy, most specific first.
STATUS: dict[type[LaybyError], int] = {
    MalformedMail: 400,  # not a mail at all, rather than a mail that says the wrong thing
    RequestError: 400,
    Unauthorized: 401,
    Forbidden: 403,
    NotFound: 404,
    Conflict: 409,
    TooLarge: 413,
    Invalid: 422,
    Unavailable: 503,
    # The server's configuration, not the request, is wrong: try again once it is fixed.
    ConfigError: 503,
}


# What each refusal means, as the API document says it.
MEANING: dict[int, str] = {
    400: "the body cannot be read: not JSON, or not a MIME mail",
    401: "no valid credentials: a missing or unknown API key, or a bad signature",
    403: "valid credentials that may not do this: a forged, expired or foreign token",
    404: "no such run, interrupt or agent",
    409: "not open any more: answered, expired, finished; or an idempotency key reused",
    413: "the body is past its size limit (LAYBY_MAX_ANSWER_BYTES, LAYBY_MAX_MAIL_BYTES)",
    422: "the body or a parameter is invalid; `detail` lists what and where",
    503: "the store (or a setting) is away for now: try again after Retry-After",
}
_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"schema": {"type": "string"}, "description": "Bearer"}},
    503: {"Retry-After": {"schema": {"type": "integer"},
                          "description": "seconds to wait before trying again"}},
}


ERROR_SCHEMA = {"$ref": "#/components/schemas/ErrorBody"}  # `app._document` adds it


def event_stream(description: str, data: dict[str, Any]) -> dict[str, Any]:
    """A 200 of server-sent events, each event described as a reader sees it (its `data`
    one JSON document of schema `data`)."""
    return {"description": description, "content": {"text/event-stream": {"schema": {
        "type": "object", "required": ["data"], "properties": {
            "event": {"type": "string"}, "id": {"type": "string"},
            "retry": {"type": "integer"},
            "data": {"type": "string", "contentMediaType": "application/json",
                     "contentSchema": data}}}}}}


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The `responses` of a route that may refuse with `statuses`: each with the error
    body's schema (JSON, whatever the route's own replies are) and its headers."""
    return {status: {"description": MEANING[status],
                     "content": {"application/json": {"schema": ERROR_SCHEMA}},
                     **({"headers": _HEADERS[status]} if status in _HEADERS else {})}
            for status in statuses}


def status_of(exc: LaybyError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 400


def error_response(status: int, code: str, message: str, detail: Any = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": message}
    if detail is not None:
        body["detail"] = detail
    headers = dict(headers or {})
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if status == 503:  # the store or a setting away for now: when to try again
        headers.setdefault("Retry-After", "1")
    return JSONResponse({"error": body}, status_code=status, headers=headers or None)


def refusal(exc: LaybyError) -> JSONResponse:
    return error_response(status_of(exc), exc.code, exc.message, exc.detail)


def why_redis_is_away(exc: Exception) -> str:
    if isinstance(exc, redis.sentinel.MasterNotFoundError):
        # Its own text lists the settings of every sentinel client it tried.
        return ("no Redis primary: the sentinels name none right now (a failover under "
                "way?); try again in a few seconds")
    if isinstance(exc, (redis.exceptions.ClusterError, redis.exceptions.TryAgainError,
                        redis.exceptions.RedisClusterException)):
        return (f"the Redis cluster cannot serve this now ({exc}): a failover or a slot "
                "moving; try again in a few seconds")
    return f"Redis does not answer: {exc}"


def is_json_type(content_type: str | None) -> bool:
    """Whether FastAPI reads a body of this Content-Type as JSON (`application/json` or
    `application/…+json`, parameters aside)."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/")
                                          and kind.endswith("+json"))


def body_problem(content_type: str | None, errors: list[dict[str, Any]],
                 body: Any) -> tuple[str, list[dict[str, str]]] | None:
    """What is wrong with a JSON body as a person would fix it, when FastAPI's own words
    point the wrong way (a character offset for a JSON error; "Input should be a valid
    dictionary" for a body sent without `Content-Type: application/json`); None when its
    own words do. Returns the message and the error list of `detail`."""
    broken = next((e for e in errors if e.get("type") == "json_invalid"), None)
    if broken is not None:
        where = _line_and_column(body, broken["loc"][-1])
        why = (broken.get("ctx") or {}).get("error") or "not JSON"
        message = f"the body is not valid JSON: {why} at {where}"
        return message, [{"path": "/", "message": message}]
    whole_body = [e for e in errors if tuple(e.get("loc", ())) == ("body",)]
    if not whole_body:
        return None  # a field inside the body: FastAPI's path and message say it
    if not is_json_type(content_type):
        sent = f"Content-Type {content_type!r}" if content_type else "no Content-Type"
        if "x-www-form-urlencoded" in (content_type or ""):
            sent += " (what `curl -d` sends unless given another)"
        message = (f"the body must be JSON, sent with the header `Content-Type: "
                   f"application/json`; this request has {sent}")
    elif whole_body[0].get("type") == "missing":
        message = "the body is empty: send one JSON object"
    else:
        return None
    return message, [{"path": "/", "message": message}]


def _line_and_column(body: Any, offset: Any) -> str:
    """`line L, column C` of a character offset into the body (both from 1)."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    if not isinstance(text, str) or not isinstance(offset, int):
        return f"character {offset}"
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return f"line {line}, column {column}"
