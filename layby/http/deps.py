"""What every route depends on: the application object (`Runtime`, kept on the FastAPI app
by `create_app`), the API key check, and the check that a body can be stored."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import Depends, Request
from fastapi.requests import HTTPConnection
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from layby.access import tokens
from layby.access.rights import Identity
from layby.broker_config.settings import MAX_KEY_BYTES
from layby.control import Runtime
from layby.errors import ConfigError, Unauthorized
from layby.generation.answers import check_storable


class _Bearer(HTTPBearer):
    """HTTPBearer (the OpenAPI document's security scheme), reading what the gateway's
    first middleware already read and checked (`request.state.caller`) instead of parsing
    the header again."""

    async def __call__(self, request: HTTPConnection) -> HTTPAuthorizationCredentials | None:
        checked: HTTPAuthorizationCredentials | None = getattr(request.state, "credentials",
                                                                None)
        if checked is not None:
            return checked
        return await super().__call__(request)


bearer = _Bearer(auto_error=False, scheme_name="HTTPBearer")


# The dependencies are `async def` though nothing in them waits: FastAPI runs a plain `def`
# dependency on a worker thread, a hop that costs more than the dependency itself.
async def runtime_of(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


Rt = Annotated[Runtime, Depends(runtime_of)]


def check_key(rt: Runtime, credentials: HTTPAuthorizationCredentials | None) -> Identity:
    """Who calls (`Identity`: recorded with their answers as `api:<name>`, or
    `api-key:<fingerprint>` for a key without a name), from a key of LAYBY_API_KEYS or of
    LAYBY_KEYS_FILE, or a run token (`layby.access.tokens`, checked by its signature: no
    store read); Unauthorized without one.

    Taken as bytes: the header arrives as Latin-1 text (HTTP's bytes, as Starlette decodes
    them)."""
    presented = credentials.credentials if credentials else ""
    if tokens.is_run_token(presented):
        try:
            keys = rt.reviewers.token_keys()
        except ConfigError:
            raise Unauthorized("run tokens are not taken here: no LAYBY_TOKEN_KEYS to check "
                               "them with") from None
        return tokens.read(keys, presented, time.time()).identity()
    given = presented.encode("latin-1")
    key = rt.keyring.find(given) if 0 < len(given) <= MAX_KEY_BYTES else None
    if key is None:
        raise Unauthorized("missing or unknown API key: send `Authorization: Bearer <key>` "
                           "with a key from LAYBY_API_KEYS or LAYBY_KEYS_FILE")
    return key.identity()


async def require_key(request: Request, rt: Rt,
                      credentials: Annotated[HTTPAuthorizationCredentials | None,
                                             Depends(bearer)]) -> Identity:
    identity = getattr(request.state, "identity", None)  # checked by the first middleware
    return identity if identity is not None else check_key(rt, credentials)


# Who calls, with what rights (layby.access.rights).
Caller = Annotated[Identity, Depends(require_key)]


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
