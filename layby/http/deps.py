"""What every route depends on: the application object (`Runtime`, kept on the FastAPI app
by `create_app`), the API key check, and the check that a body can be stored."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from layby.control import Runtime
from layby.errors import Unauthorized
from layby.generation.answers import check_storable

bearer = HTTPBearer(auto_error=False)


def runtime_of(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


Rt = Annotated[Runtime, Depends(runtime_of)]


def check_key(rt: Runtime, credentials: HTTPAuthorizationCredentials | None) -> str:
    """Who calls, as recorded with their answers (`api-key:abcd…`); Unauthorized without a
    key of LAYBY_API_KEYS."""
    given = credentials.credentials if credentials else ""
    if not given or not any(hmac.compare_digest(given, k) for k in rt.settings.api_keys):
        raise Unauthorized("missing or unknown API key: send `Authorization: Bearer <key>` "
                           "with a key from LAYBY_API_KEYS")
    return f"api-key:{given[:4]}…"


def require_key(rt: Rt, credentials: Annotated[HTTPAuthorizationCredentials | None,
                                               Depends(bearer)]) -> str:
    return check_key(rt, credentials)


Caller = Annotated[str, Depends(require_key)]


async def sane_body(request: Request) -> None:
    """Refuse a body that parses but would fail once stored: too deep, or text that is not
    Unicode. (Its size is held to LAYBY_MAX_ANSWER_BYTES as it is read: `http.limits`.)"""
    raw = await request.body()
    if not raw:
        return
    try:
        value = await request.json()
    except Exception:  # noqa: BLE001  (FastAPI itself refuses what does not parse)
        return
    check_storable(value, "the request body")


SaneBody = Depends(sane_body)
