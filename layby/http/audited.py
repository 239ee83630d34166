"""The edge's part of the audit trail (`layby.control.audit`): every request served with
where it came from and its way in, and every refusal of a known caller kept (a missing right,
four eyes, another tenant's run, a run token past its use); the audit's own route for admins
(`GET /v1/audit`).

A refusal of a caller nobody knows (no key, a key that is not one) is not kept: it is
refused before it costs a write.
"""

from __future__ import annotations

import logging
import re
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from layby.access.keys import TENANT
from layby.access.rights import ADMIN, Identity
from layby.control import Runtime, audit
from layby.errors import Forbidden, LaybyError
from layby.http.deps import Caller, Rt
from layby.http.errors import documented
from layby.parking.audit import CURSOR
from layby.wire import AuditPage

log = logging.getLogger(__name__)

# The way in of a request, by the start of its path.
_CHANNELS = (("/v1/", "api"), ("/agui/", "agui"), ("/inbox", "inbox"), ("/review/", "page"),
             ("/inbound/", "email"), ("/callbacks/", "webhook"), ("/slack/", "slack"))
# What a refused request tried, by method and path.
_ACTIONS = (
    ("POST", re.compile(r"^/v1/runs/?$"), "start"),
    ("GET", re.compile(r"^/v1/runs/?$"), "list"),
    ("POST", re.compile(r"^/v1/runs/[^/]+/(interrupts/[^/]+|resume)$"), "answer"),
    ("POST", re.compile(r"^/v1/runs/[^/]+/cancel$"), "cancel"),
    ("POST", re.compile(r"^/v1/runs/[^/]+/tokens$"), "token.mint"),
    ("DELETE", re.compile(r"^/v1/runs/[^/]+/tokens$"), "token.revoke"),
    ("GET", re.compile(r"^/v1/runs/[^/]+(/events)?$"), "read"),
    ("GET", re.compile(r"^/v1/audit$"), "audit"),
    ("POST", re.compile(r"^/agui/"), "agui"),
)
KEPT = {"forbidden", "self_approval", "notfound", "unauthorized"}


def channel_of(path: str, token: bool = False) -> str:
    found = next((name for start, name in _CHANNELS if path.startswith(start)), "http")
    return "token" if token and found == "api" else found


def source_of(request: Request) -> str | None:
    return request.client.host if request.client else None


def _action(request: Request) -> str:
    path = request.url.path
    return next((name for method, pattern, name in _ACTIONS
                 if request.method == method and pattern.match(path)), "call")


def refusal(rt: Runtime, request: Request, exc: LaybyError) -> None:
    """Keep the refusal of a known caller (its identity is on the request) in the audit."""
    who: Identity | None = getattr(request.state, "identity", None)
    if who is None or exc.code not in KEPT:
        return
    params = request.path_params
    try:
        audit.refused(rt, who.caller, who.tenant, _action(request), exc.code,
                      run=params.get("run_id") or exc.run_id,
                      interrupt=params.get("interrupt_id"))
    except Exception:  # a refusal is answered whether or not it could be kept
        log.warning("a refusal of %s could not be kept in the audit trail", who.caller,
                    exc_info=True)


router = APIRouter(prefix="/v1", tags=["audit"], responses=documented(401, 403, 422, 503))
@router.get("/audit", response_model=AuditPage, response_model_by_alias=True,
            response_model_exclude_none=True, operation_id="readAudit")
async def read_audit(rt: Rt, caller: Caller,
                     run: Annotated[str | None, Query(
                         max_length=128, pattern=r"^[A-Za-z0-9_.-]+$")] = None,
                     by: Annotated[str | None, Query(alias="caller", max_length=200,
                                                     description="api:<name>, "
                                                     "reviewer:<id>, policy:<rule>")] = None,
                     tenant: Annotated[str | None, Query(
                         max_length=64, pattern=TENANT.pattern)] = None,
                     since: Annotated[str | None, Query(
                         max_length=64, json_schema_extra={"format": "date-time"},
                         description="only entries from this time on (RFC 3339)")] = None,
                     cursor: Annotated[str | None, Query(
                         max_length=40, pattern=CURSOR.pattern,
                         description="the `nextCursor` of the page before")] = None,
                     limit: Annotated[int, Query(ge=1, le=500)] = 100) -> Response:
    """Who did what, newest first: every start, answer (on every channel), cancel, run token
    and refused attempt, with its time, caller, tenant, action, run, interrupt, channel,
    outcome and source address. For `admin` keys."""
    if not caller.has(ADMIN):
        raise Forbidden(f"{caller.caller} may not read the audit trail: it takes `admin`",
                        detail={"right": ADMIN})
    page = await run_in_threadpool(audit.read_page, rt, run=run, caller=by, tenant=tenant,
                                   since=since, cursor=cursor, limit=limit, relative=False)
    return Response(page.wire_json(), media_type="application/json")

