"""How much of a request body the gateway reads: every route has a limit (the inbound-mail
webhook LAYBY_MAX_MAIL_BYTES, every other route LAYBY_MAX_ANSWER_BYTES), checked against
`Content-Length` before reading and counted while reading, so no body is ever held whole
past its limit. Over it, the answer is a 413 with the JSON error body; the rest of the
body is drained by the server, so the sender reads the 413 instead of a connection reset.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from layby.http.errors import error_response


class BodyTooLarge(Exception):
    """Raised into the app from `receive` once the body passes its limit."""


def limit_message(size: str, limit: int, setting: str) -> str:
    return (f"the request body is {size} bytes; the limit is {limit} ({setting}): "
            "send less, or raise the setting")


class LimitBodies:
    """ASGI middleware. `limit_of(path)` is the limit in bytes and the setting that sets it.

    Pure ASGI, not a BaseHTTPMiddleware: it wraps `receive`, which is where a body comes in.
    """

    def __init__(self, app: ASGIApp, limit_of: Callable[[str], tuple[int, str]]) -> None:
        self.app = app
        self.limit_of = limit_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit, setting = self.limit_of(scope["path"])
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            return await self._refuse(scope, receive, send,
                                      limit_message(str(declared), limit, setting))
        seen, over, started = 0, False, False

        async def refuse() -> None:
            # Made only when needed: rendering it costs every request a JSON body.
            await self._refuse(scope, receive, send,
                               limit_message(f"over {limit}", limit, setting))

        async def counted() -> Any:
            nonlocal seen, over
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    over = True
                    raise BodyTooLarge
            return message

        async def watched(message: Any) -> None:
            nonlocal started
            if over:
                # Whatever the app makes of the interrupted read (FastAPI answers its own
                # 400, "error parsing the body"), the reason is the size.
                if not started:
                    started = True
                    await refuse()
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BodyTooLarge:
            if not started:
                started = True
                await refuse()

    @staticmethod
    async def _refuse(scope: Any, receive: Any, send: Any, message: str) -> None:
        response = error_response(413, "toolarge", message)
        await response(scope, receive, send)


def _content_length(scope: Any) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() and len(text) < 20 else None
    return None
