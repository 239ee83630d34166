"""The HTTP API (`/v1`, bearer API keys, camelCase JSON) and the demo ledger page.

Handlers are thin: parse, call `control.commands`, shape the reply. Every refusal is a JSON
body `{"error": {"code", "message", "detail"}}` with a 4xx status; bad input never
reaches a 500.
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Annotated, Any

import redis.exceptions
from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from layby.broker_config import Settings, get_settings
from layby.broker_config.logs import about
from layby.control import commands, connections, runtime
from layby.http.errors import error_response, refusal, why_redis_is_away
from layby.http.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from layby.http.metrics import render as render_metrics
from layby.http.metrics import serve as serve_metrics
from layby.errors import Invalid, LaybyError, TooLarge, Unauthorized
from layby.generation.answers import check_storable
from layby.generation.interrupts import ResumeEntry
from layby.parking import NotReplicated
from layby.wire import (
    Answered,
    AnswerBody,
    CancelBody,
    Event,
    ResumeBody,
    RunList,
    RunView,
    StartRun,
    Status,
)
from layby.parking.store import event_of

bearer = HTTPBearer(auto_error=False)


def require_key(credentials: Annotated[HTTPAuthorizationCredentials | None,
                                       Depends(bearer)]) -> str:
    keys = get_settings().api_keys
    given = credentials.credentials if credentials else ""
    if not given or not any(hmac.compare_digest(given, k) for k in keys):
        raise Unauthorized("missing or unknown API key: send `Authorization: Bearer <key>` "
                           "with a key from LAYBY_API_KEYS")
    return f"api-key:{given[:4]}…"


Caller = Annotated[str, Depends(require_key)]


# Deeper JSON parses, but pydantic refuses to serialize it (near 1000 levels) after the
# run or answer is already stored, which would leave a run nobody can read.
# A stream entry id, as `Last-Event-ID` must give it; anything else breaks XREAD mid-stream.
EVENT_ID = re.compile(r"^\d{1,20}(-\d{1,20})?$")


async def sane_body(request: Request) -> None:
    """Refuse a body that parses but would fail once stored: too big, too deep, or text
    that is not Unicode. LAYBY_MAX_ANSWER_BYTES bounds whatever a caller puts into a run."""
    raw = await request.body()
    limit = get_settings().max_answer_bytes
    if len(raw) > limit:
        raise TooLarge(f"the request body is {len(raw)} bytes; the limit is {limit} "
                       "(LAYBY_MAX_ANSWER_BYTES)")
    if not raw:
        return
    try:
        value = await request.json()
    except Exception:  # noqa: BLE001  (FastAPI itself refuses what does not parse)
        return
    check_storable(value, "the request body")


SaneBody = Depends(sane_body)


_RUN_PATH = re.compile(r"^/v1/runs/(?P<run_id>[^/]+)(?:/interrupts/(?P<interrupt_id>[^/]+))?")


class _LogIds:
    """Lines logged while serving /v1/runs/{id}… carry its ids (uvicorn's access line too:
    it is written from inside the request's context)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        found = _RUN_PATH.match(scope.get("path", "")) if scope["type"] == "http" else None
        if found is None:
            return await self.app(scope, receive, send)
        with about(**found.groupdict()):
            await self.app(scope, receive, send)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        exporter = (serve_metrics(settings.metrics_host, settings.metrics_port, runtime.store)
                    if settings.metrics_port else None)
        try:
            yield
        finally:
            if exporter is not None:
                exporter.shutdown()
                exporter.server_close()

    app = FastAPI(title="layby", version="0.1.0", lifespan=lifespan,
                  description="Durable interrupts for agent runs: start runs, answer their "
                              "interrupts, follow their events.")

    @app.exception_handler(LaybyError)
    async def _laybyerror_response(_: Request, exc: LaybyError) -> JSONResponse:
        return refusal(exc)

    @app.exception_handler(redis.exceptions.ConnectionError)
    @app.exception_handler(redis.exceptions.TimeoutError)
    async def _redis_away(_: Request, exc: Exception) -> JSONResponse:
        # Redis restarting or failing over is transient: a 503 tells clients to try again,
        # where a bare 500 would read as a bug in the request or the server.
        return error_response(503, "redis_unavailable", why_redis_is_away(exc))

    @app.exception_handler(NotReplicated)
    async def _not_replicated(_: Request, exc: NotReplicated) -> JSONResponse:
        return error_response(503, "redis_not_replicated", str(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _httperror_response(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Unknown routes, wrong methods and bodies the parser gives up on (nesting past
        # Python's recursion limit) get the same JSON error shape as every other refusal.
        phrase = HTTPStatus(exc.status_code).phrase
        return error_response(exc.status_code, phrase.lower().replace(" ", "_"), str(exc.detail))

    @app.middleware("http")
    async def _key_first(request: Request, call_next: Any) -> Any:
        # FastAPI parses a body before it runs dependencies: without this, a caller with no
        # key would get a 422 describing the route's schema instead of a 401.
        if request.url.path.startswith(("/v1/", "/agui/")):
            try:
                require_key(await bearer(request))
            except Unauthorized as exc:
                return error_response(401, "unauthorized", exc.message)
        return await call_next(request)

    app.add_middleware(_LogIds)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"path": "/" + "/".join(str(p) for p in e["loc"][1:]), "message": e["msg"]}
                  for e in exc.errors()]
        return error_response(422, "invalid_request", "the request body or parameters are invalid",
                      errors)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> JSONResponse:
        try:
            runtime.store().redis.ping()
        except Exception as exc:  # the gateway is up; what it depends on is not
            return error_response(503, "redis_unavailable", why_redis_is_away(exc))
        return JSONResponse({"status": "ok"})

    @app.get("/metrics", include_in_schema=False)
    async def metrics(_: Caller) -> Response:
        # Prometheus text format, read from Redis now (gateway.metrics); bearer key as /v1.
        store = runtime.store()
        body = await run_in_threadpool(render_metrics, store.redis, store.keys)
        return Response(body, media_type=METRICS_CONTENT_TYPE)

    @app.post("/v1/runs", status_code=202, response_model=RunView,
              response_model_by_alias=True, response_model_exclude_none=True,
              dependencies=[SaneBody])
    def start_run(body: StartRun, _: Caller,
                  idempotency_key: Annotated[str | None, Header(max_length=200)] = None
                  ) -> JSONResponse:
        view, created = commands.start_run(body.agent, input=body.input, messages=body.messages,
                                           metadata=body.metadata,
                                           idempotency_key=idempotency_key)
        headers = None if created else {"Idempotent-Replayed": "true"}
        return JSONResponse(view.wire(), status_code=202, headers=headers)

    @app.get("/v1/runs", response_model=RunList, response_model_by_alias=True)
    def list_runs(_: Caller, status: Status | None = None,
                  limit: Annotated[int, Query(ge=1, le=500)] = 50,
                  offset: Annotated[int, Query(ge=0)] = 0) -> dict[str, Any]:
        runs = runtime.store().list_runs(status, limit=limit, offset=offset)
        return RunList(runs=runs).wire()

    @app.get("/v1/runs/{run_id}", response_model=RunView, response_model_by_alias=True,
             response_model_exclude_none=True)
    def get_run(run_id: str, _: Caller) -> dict[str, Any]:
        return commands.get_run(run_id).wire()

    @app.post("/v1/runs/{run_id}/interrupts/{interrupt_id}", response_model=Answered,
              response_model_by_alias=True, response_model_exclude_none=True,
              dependencies=[SaneBody])
    def answer_one(run_id: str, interrupt_id: str, body: AnswerBody,
                   caller: Caller) -> dict[str, Any]:
        entry = ResumeEntry(interrupt_id=interrupt_id, status=body.status,  # type: ignore[arg-type]
                            payload=body.payload, metadata=body.metadata)
        return _answer(run_id, [entry], caller, require_all=False)

    @app.post("/v1/runs/{run_id}/resume", response_model=Answered,
              response_model_by_alias=True, response_model_exclude_none=True,
              dependencies=[SaneBody])
    def resume(run_id: str, body: ResumeBody, caller: Caller) -> dict[str, Any]:
        return _answer(run_id, body.resume, caller, require_all=True)

    @app.post("/v1/runs/{run_id}/cancel", response_model=RunView,
              response_model_by_alias=True, response_model_exclude_none=True,
              dependencies=[SaneBody])
    def cancel(run_id: str, caller: Caller, body: CancelBody | None = None) -> dict[str, Any]:
        return commands.cancel(run_id, by=caller, reason=body.reason if body else None).wire()

    @app.get("/v1/runs/{run_id}/events")
    async def events(run_id: str, _: Caller,
                     last_event_id: Annotated[str | None, Header()] = None,
                     follow: bool = True) -> StreamingResponse:
        # 404 before the stream starts; off the event loop, which serves every open stream.
        await run_in_threadpool(commands.get_run, run_id)
        if last_event_id is not None and not EVENT_ID.match(last_event_id):
            raise Invalid(f"Last-Event-ID {last_event_id[:100]!r} is not an event id "
                          "(give the `id:` of an event this stream sent, like 1700000000000-0)")
        return StreamingResponse(_event_stream(run_id, last_event_id or "0-0", follow),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache",
                                          "X-Accel-Buffering": "no"})

    @app.get("/v1/agents")
    def agents(_: Caller) -> dict[str, Any]:
        return {"agents": [{"name": a.name, "description": a.description,
                            "tools": [t.name for t in a.tools]}
                           for a in runtime.agents().values()]}

    from layby.http import agui, mailbox, reviewers

    app.include_router(agui.router)
    app.include_router(reviewers.router)
    app.include_router(mailbox.router)

    @app.get("/demo/ledger")
    def demo_ledger() -> dict[str, Any]:
        from layby.demo import ledger

        return ledger.read()

    return app


def _answer(run_id: str, entries: list[ResumeEntry], caller: str, *,
            require_all: bool) -> dict[str, Any]:
    result = commands.answer(run_id, entries, by=caller, channel="api",
                             require_all=require_all)
    return Answered(run=commands.get_run(run_id), resumed=bool(result.entries)).wire()


FINAL = {"run.completed", "run.failed", "run.cancelled"}


async def run_events(run_id: str, after: str, follow: bool = True
                     ) -> AsyncIterator[Event | None]:
    """The run's events after `after` (a stream id): what is there, then, with `follow`,
    each as it comes and None every 15 s without one (for a keep-alive). An async client,
    so a waiting stream holds a socket, not one of the server's threads."""
    key = runtime.store().keys.events(run_id)
    async with connections.async_redis(get_settings()) as client:
        while True:
            reply = await client.xread({key: after}, count=500,
                                       block=15_000 if follow else None)
            batch = reply[0][1] if reply else []
            if not batch:
                if not follow:
                    return
                yield None
            for event_id, fields in batch:
                after = event_id
                yield event_of(event_id, fields)


async def _event_stream(run_id: str, after: str, follow: bool) -> AsyncIterator[bytes]:
    """Server-sent events from the run's stream: replay, then follow until the run ends."""
    async for event in run_events(run_id, after, follow):
        if event is None:
            yield b": keep-alive\n\n"
            continue
        data = json.dumps(event.wire(), separators=(",", ":"))
        yield f"id: {event.id}\nevent: {event.type}\ndata: {data}\n\n".encode()
        if event.type in FINAL:
            return
