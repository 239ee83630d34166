"""The gateway's ASGI app: `create_app(runtime)` puts the routes together (`/v1`, AG-UI, the
reviewers' routes, the mail catcher's pages, `/metrics`, `/healthz`), the error handlers
that give every refusal the same JSON body, and the middleware. `uvicorn --factory
layby.http.app:create_app` (what `layby gateway` and `layby up` run) calls it with no
runtime: it builds one from the LAYBY_* settings and sets up the process's logs."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Any

import redis.exceptions
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from layby.broker_config import logs
from layby.control import Runtime, build
from layby.errors import LaybyError, Unauthorized
from layby.http import agui, api, mailbox, reviewers
from layby.http.deps import Caller, Rt, bearer, check_key
from layby.http.errors import error_response, refusal, why_redis_is_away
from layby.http.limits import LimitBodies
from layby.http.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from layby.http.metrics import render as render_metrics
from layby.http.metrics import serve as serve_metrics
from layby.parking import NotReplicated

_RUN_PATH = re.compile(r"^/v1/runs/(?P<run_id>[^/]+)(?:/interrupts/(?P<interrupt_id>[^/]+))?")


def create_app(runtime: Runtime | None = None) -> FastAPI:
    """The gateway for `runtime` (built from the environment, logs set up, when None)."""
    if runtime is None:
        runtime = build()
        # uvicorn has set up its loggers by the time it calls the factory: send them through
        # layby's handler, so the gateway writes the configured format (JSON with ids, or
        # text), scrubbed of reviewer tokens (its access lines hold /review/<token>).
        logs.configure(runtime.settings)
    rt = runtime

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        settings = rt.settings
        exporter = (serve_metrics(settings.metrics_host, settings.metrics_port,
                                  lambda: rt.store) if settings.metrics_port else None)
        try:
            yield
        finally:
            if exporter is not None:
                exporter.shutdown()
                exporter.server_close()

    app = FastAPI(title="layby", version="0.1.0", lifespan=lifespan,
                  description="Durable interrupts for agent runs: start runs, answer their "
                              "interrupts, follow their events.")
    app.state.runtime = rt
    _handle_errors(app)
    _middleware(app, rt)
    for router in (api.router, agui.router, reviewers.router, mailbox.router):
        app.include_router(router)
    _plain_routes(app)
    return app


def _handle_errors(app: FastAPI) -> None:
    @app.exception_handler(LaybyError)
    async def _refused(_: Request, exc: LaybyError) -> JSONResponse:
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
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Unknown routes, wrong methods and bodies the parser gives up on (nesting past
        # Python's recursion limit) get the same JSON error shape as every other refusal.
        phrase = HTTPStatus(exc.status_code).phrase
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # every method the path takes, not the first route's
            headers["Allow"] = ", ".join(_methods_of(app, request.scope))
        return error_response(exc.status_code, phrase.lower().replace(" ", "_"),
                              str(exc.detail), headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"path": "/" + "/".join(str(p) for p in e["loc"][1:]), "message": e["msg"]}
                  for e in exc.errors()]
        return error_response(422, "invalid_request",
                              "the request body or parameters are invalid", errors)


def _methods_of(app: FastAPI, scope: dict[str, Any]) -> list[str]:
    """The methods some route takes at the request's path (Starlette's own `Allow` names
    only the first route that matched the path)."""
    return [method for method in ("GET", "POST", "PUT", "PATCH", "DELETE")
            if any(route.matches({**scope, "method": method})[0] is Match.FULL
                   for route in app.router.routes)]


def _middleware(app: FastAPI, rt: Runtime) -> None:
    def limit_of(path: str) -> tuple[int, str]:
        if path == "/inbound/email":
            return rt.settings.max_mail_bytes, "LAYBY_MAX_MAIL_BYTES"
        return rt.settings.max_answer_bytes, "LAYBY_MAX_ANSWER_BYTES"

    # Innermost: it sees what the app makes of a body cut at its limit.
    app.add_middleware(LimitBodies, limit_of=limit_of)

    @app.middleware("http")
    async def _key_first(request: Request, call_next: Any) -> Any:
        # FastAPI parses a body before it runs dependencies: without this, a caller with no
        # key would get a 422 describing the route's schema instead of a 401.
        if request.url.path.startswith(("/v1/", "/agui/")):
            try:
                check_key(rt, await bearer(request))
            except Unauthorized as exc:
                return error_response(401, "unauthorized", exc.message)
        return await call_next(request)

    app.add_middleware(_LogIds)


def _plain_routes(app: FastAPI) -> None:
    @app.get("/healthz", include_in_schema=False)
    def healthz(rt: Rt) -> JSONResponse:
        try:
            rt.store.redis.ping()
        except Exception as exc:  # the gateway is up; what it depends on is not
            return error_response(503, "redis_unavailable", why_redis_is_away(exc))
        return JSONResponse({"status": "ok"})

    @app.get("/metrics", include_in_schema=False)
    async def metrics(rt: Rt, _: Caller) -> Response:
        # Prometheus text format, read from Redis now (layby.http.metrics); bearer key.
        store = rt.store
        body = await run_in_threadpool(render_metrics, store.redis, store.keys)
        return Response(body, media_type=METRICS_CONTENT_TYPE)

    @app.get("/demo/ledger", include_in_schema=False)
    def demo_ledger(rt: Rt) -> dict[str, Any]:
        from layby.demo import ledger

        return ledger.read(rt.store.redis, rt.settings.key_prefix)


class _LogIds:
    """Lines logged while serving /v1/runs/{id}… carry its ids (uvicorn's access line too:
    it is written from inside the request's context)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        found = _RUN_PATH.match(scope.get("path", "")) if scope["type"] == "http" else None
        if found is None:
            return await self.app(scope, receive, send)
        with logs.about(**found.groupdict()):
            await self.app(scope, receive, send)
