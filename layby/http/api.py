"""The `/v1` API: start runs, read and list them, answer their interrupts, cancel them, follow
their events (or start a run and follow its events in one request). Bearer API keys,
camelCase JSON.

Handlers are thin: parse, call `layby.control.commands`, shape the reply. Every refusal is
a JSON body `{"error": {"code", "message", "detail"}}` (`layby.http.errors`).
"""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from layby.access.rights import ADMIN, READ, Identity
from layby.control import Runtime, commands
from layby.errors import Forbidden, Invalid
from layby.generation.interrupts import ResumeEntry
from layby.generation.messages import Wire
from layby.http.deps import Caller, Rt, SaneBody
from layby.http.errors import documented, event_stream
from layby.http.events import EVENT_ID, STREAM_HEADERS, EventStreamResponse, run_tenant, sse
from layby.parking import Verdict
from layby.parking.registries import CURSOR
from layby.wire import (
    AnswerBody,
    Answered,
    CancelBody,
    MintedToken,
    MintToken,
    ResumeBody,
    RunList,
    RunView,
    StartRun,
    Status,
    TokensRevoked,
)

# Every /v1 route needs the key, may meet a body past its limit or a store away.
router = APIRouter(prefix="/v1", tags=["runs"], responses=documented(401, 403, 422, 503))
# An offset costs Redis more the deeper it goes (all states' lists are merged up to it):
# deeper pages follow the cursor, which costs the same at any depth.
MAX_OFFSET = 1000


class _View(TypedDict):
    response_model_by_alias: bool
    response_model_exclude_none: bool


# The replies' shape (camelCase, no nulls), spread into every route that returns a run.
VIEW: _View = {"response_model_by_alias": True, "response_model_exclude_none": True}
# Ids as layby makes them (run ids as callers may choose them: `commands.RUN_ID`).
RunId = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.-]+$")]
InterruptId = Annotated[str, Path(min_length=1, max_length=128)]
IdempotencyKey = Annotated[str | None, Header(
    max_length=200, description="the same key again (a retry) gets the first reply")]


def _json(reply: Wire, status_code: int = 200, headers: dict[str, str] | None = None
          ) -> Response:
    """A reply the route's `response_model` documents, written once by pydantic (FastAPI
    would check and write it again)."""
    return Response(reply.wire_json(), status_code=status_code, headers=headers,
                    media_type="application/json")


def _links(*operations: str, interrupt: bool = False) -> dict[str, Any]:
    """OpenAPI links from a reply holding a run to the operations on that run (clients and
    fuzzers follow them with real ids)."""
    ids = {"run_id": "$response.body#/id"}
    if interrupt:
        ids["interrupt_id"] = "$response.body#/interrupts/0/id"
    return {"links": {op: {"operationId": op, "parameters": {
        k: v for k, v in ids.items() if k == "run_id" or op == "answerInterrupt"}}
        for op in operations}}


@router.post("/runs", status_code=202, response_model=RunView, dependencies=[SaneBody],
             operation_id="startRun", **VIEW,
             responses={202: {**_links("getRun", "cancelRun", "runEvents"),
                              "description": "the run is started (or, for an "
                              "Idempotency-Key seen before, was): the run, or, asked with "
                              "`Accept: text/event-stream`, its events from the first, as "
                              "`GET /v1/runs/{run_id}/events` sends them",
                              "content": event_stream(
                                  "", {"$ref": "#/components/schemas/Event"})["content"],
                              "headers": {"Location": {"description": "the run's path",
                                                       "schema": {"type": "string"}}}},
                        **documented(400, 404, 409, 413)})
async def start_run(request: Request, body: StartRun, rt: Rt, caller: Caller,
                    idempotency_key: IdempotencyKey = None,
                    follow: Annotated[bool, Query(description=(
                        "with `Accept: text/event-stream`: follow the run until it ends "
                        "(or end the stream at the last event there is)"))] = True
                    ) -> Response:
    """Start a run. Asked for an event stream, the reply is the run's events until it
    ends (with `follow`): what a caller that follows each run it starts would send next,
    in the same request. A dropped stream is taken up at `GET …/events` with
    `Last-Event-ID`."""
    view, created = await run_in_threadpool(
        commands.start_run, rt, body.agent, input=body.input, messages=body.messages,
        metadata=body.metadata, idempotency_key=idempotency_key, who=caller)
    headers = {"Location": f"/v1/runs/{view.id}"}
    if not created:
        headers["Idempotent-Replayed"] = "true"
    if _wants_events(request.headers.get("accept", "")):
        return EventStreamResponse(sse(rt, view.id, "0-0", follow, fresh=created),
                                   status_code=202,
                                   media_type="text/event-stream",
                                   headers={**headers, **STREAM_HEADERS})
    return _json(view, status_code=202, headers=headers)


def _wants_events(accept: str) -> bool:
    """An `Accept` that names server-sent events and not JSON before them."""
    kinds = [part.split(";")[0].strip().lower() for part in accept.split(",")]
    return "text/event-stream" in kinds and (
        "application/json" not in kinds
        or kinds.index("text/event-stream") < kinds.index("application/json"))


@router.get("/runs", response_model=RunList, response_model_by_alias=True,
            operation_id="listRuns", responses=documented(400))
def list_runs(rt: Rt, caller: Caller, status: Status | None = None,
              limit: Annotated[int, Query(ge=1, le=500)] = 50,
              cursor: Annotated[str | None, Query(
                  max_length=150, pattern=CURSOR.pattern, description="the `nextCursor` of "
                  "the page before: pages cost the same however deep")] = None,
              # The bound is documented, and checked below with a message that says what
              # to do instead.
              offset: Annotated[int, Query(ge=0, json_schema_extra={"maximum": MAX_OFFSET},
                                           description=f"runs to skip, at most {MAX_OFFSET}: "
                                           "deeper, follow `nextCursor`")] = 0,
              agent_version: Annotated[str | None, Query(
                  alias="agentVersion", min_length=1, max_length=64,
                  pattern=r"^[A-Za-z0-9._:+-]+$",
                  description="only runs started on this version of their agent; a page "
                  "reads a bounded stretch of the list, so it may hold fewer than `limit` "
                  "runs and still have a `nextCursor`")] = None
              ) -> Response:
    if offset > MAX_OFFSET:
        raise Invalid(f"offset {offset} is past {MAX_OFFSET}: deeper pages are read with the "
                      "cursor (pass each page's `nextCursor` as `cursor`), which costs the "
                      "same at any depth", detail={"maxOffset": MAX_OFFSET})
    caller.require(READ, "runs")
    if caller.run is not None:
        raise Forbidden("a run token reads its run alone, not lists of runs",
                        detail={"right": READ})
    # A tenant's keys list its runs alone, read from its own indexes; an admin's, all.
    runs, after = rt.store.lists.list_page(status, limit=limit, cursor=cursor, offset=offset,
                                           agent_version=agent_version,
                                           tenant=None if caller.has(ADMIN) else caller.tenant)
    return _json(RunList(runs=runs, next_cursor=after))


@router.get("/runs/{run_id}", response_model=RunView, operation_id="getRun", **VIEW,
            responses={200: _links("answerInterrupt", "cancelRun", interrupt=True),
                       **documented(404)})
def get_run(run_id: RunId, rt: Rt, caller: Caller) -> Response:
    return _json(commands.get_run(rt, run_id, caller))


@router.post("/runs/{run_id}/interrupts/{interrupt_id}", response_model=Answered,
             dependencies=[SaneBody], responses=documented(400, 404, 409, 413),
             operation_id="answerInterrupt", **VIEW)
def answer_one(run_id: RunId, interrupt_id: InterruptId, body: AnswerBody, rt: Rt,
               caller: Caller, idempotency_key: IdempotencyKey = None) -> Response:
    entry = ResumeEntry(interrupt_id=interrupt_id, status=body.status, payload=body.payload,
                        metadata=body.metadata)
    return _answer(rt, run_id, [entry], caller, require_all=False, key=idempotency_key)


@router.post("/runs/{run_id}/resume", response_model=Answered, dependencies=[SaneBody],
             responses=documented(400, 404, 409, 413), operation_id="resumeRun", **VIEW)
def resume(run_id: RunId, body: ResumeBody, rt: Rt, caller: Caller,
           idempotency_key: IdempotencyKey = None) -> Response:
    return _answer(rt, run_id, body.resume, caller, require_all=True, key=idempotency_key)


@router.post("/runs/{run_id}/cancel", response_model=RunView, dependencies=[SaneBody],
             responses=documented(400, 404, 409, 413), operation_id="cancelRun", **VIEW)
def cancel(run_id: RunId, rt: Rt, caller: Caller, body: CancelBody | None = None
           ) -> Response:
    return _json(commands.cancel(rt, run_id, by=caller.caller,
                                 reason=body.reason if body else None, who=caller))


@router.post("/runs/{run_id}/tokens", status_code=201, response_model=MintedToken,
             response_model_by_alias=True, dependencies=[SaneBody], operation_id="mintToken",
             responses=documented(400, 404, 409, 413))
def mint_token(run_id: RunId, body: MintToken, rt: Rt, caller: Caller) -> Response:
    """A run token: a bearer credential for this run alone (its view, events, answers and
    AG-UI thread, within `can`), for a browser that must not hold the key. Its rights are
    some of the key's own; it expires after `ttlS`, and once the run ends."""
    token, expires = commands.mint_token(rt, run_id, caller, body.can, body.ttl_s)
    return _json(MintedToken(token=token, expires_at=expires), status_code=201)


@router.delete("/runs/{run_id}/tokens", response_model=TokensRevoked,
               response_model_by_alias=True, operation_id="revokeTokens",
               responses=documented(404))
def revoke_tokens(run_id: RunId, rt: Rt, caller: Caller) -> Response:
    """Refuse every run token of this run minted until now."""
    return _json(TokensRevoked(revoked_at=commands.revoke_tokens(rt, run_id, caller)))


@router.get("/runs/{run_id}/events", response_class=EventStreamResponse,
            operation_id="runEvents", responses={
                200: event_stream("the run's events, as server-sent events",
                                  {"$ref": "#/components/schemas/Event"}),
                **documented(404)})
async def events(run_id: RunId, rt: Rt, caller: Caller,
                 last_event_id: Annotated[str | None, Header(
                     max_length=39, json_schema_extra={"pattern": EVENT_ID.pattern},
                     description="the `id` of the last event read: the stream goes on "
                                 "after it")] = None,
                 follow: bool = True) -> EventStreamResponse:
    # 404 before the stream starts (another tenant's run too), then 403 without `read`
    # (read on the event loop's own client: no thread).
    if caller.run is not None:  # a run token: its run's state read with it
        await run_in_threadpool(commands.reach, rt, run_id, caller, READ)
    else:
        tenant = await run_tenant(rt, run_id)
        if tenant is None:
            commands.not_found(run_id)
        caller.reach(run_id, tenant)
        caller.require(READ, f"run {run_id}")
    if last_event_id is not None and not EVENT_ID.match(last_event_id):
        raise Invalid(f"Last-Event-ID {last_event_id[:100]!r} is not an event id "
                      "(give the `id:` of an event this stream sent, like 1700000000000-0)")
    return EventStreamResponse(sse(rt, run_id, last_event_id or "0-0", follow),
                               media_type="text/event-stream", headers=STREAM_HEADERS)


@router.get("/agents", operation_id="listAgents")
def agents(rt: Rt, caller: Caller) -> dict[str, Any]:
    """The agents this key may start (all of them for a key of every agent)."""
    return {"agents": [{"name": a.name, "description": a.description,
                        "tools": [t.name for t in a.tools], "version": a.version,
                        "onChange": a.on_change}
                       for a in rt.agents.values() if caller.may_start_named(a.name)]}


def _answer(rt: Runtime, run_id: str, entries: list[ResumeEntry], caller: Identity, *,
            require_all: bool, key: str | None) -> Response:
    """Record the answers. With an `Idempotency-Key`, the same request again (a retry after
    a lost reply or a 503) gets the same reply, not a 409."""
    # Answers given with a run token say so: channel `token`, by the key that minted it.
    result = commands.answer(rt, run_id, entries, by=caller.caller,
                             channel="api" if caller.run is None else "token",
                             require_all=require_all, idempotency_key=key, view=True,
                             who=caller)
    run = result.view or commands.get_run(rt, run_id)
    # A retry's answers were taken before: the run resumed then if it left `interrupted`.
    resumed = result.resumed if result.verdict is not Verdict.EXISTS \
        else run.status is not Status.INTERRUPTED
    return _json(Answered(run=run, resumed=resumed))
