"""The gateway's ASGI app: `create_app(runtime)` puts the routes together (`/v1`, AG-UI, the
reviewers' routes, the mail catcher's pages, `/metrics`, `/healthz`), the error handlers
that give every refusal the same JSON body, and the middleware. `uvicorn --factory
layby.http.app:create_app` (what `layby gateway` and `layby up` run) calls it with no
runtime: it builds one from the LAYBY_* settings, checks them (the user's modules import, the
reviewer directory loads: one line on stderr and exit code 2 if not, before it listens) and
sets up the process's logs. `/healthz` says the process lives; `/readyz` whether it can serve
(503 with the reason until it can)."""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from http import HTTPStatus
from typing import Any, NoReturn

import redis.exceptions
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from fastapi.telemetry import TelemetryConfig
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from layby import __version__
from layby.access.keys import KeysFileError
from layby.access.rights import ADMIN
from layby.access.tokens import ExpiredRunToken
from layby.broker_config import logs, tracing
from layby.broker_config.settings import Settings, settings_problem
from layby.control import Runtime, audit, build
from layby.control.announce import about, announce, process_name, withdraw
from layby.control.runtime import check_config
from layby.errors import ConfigError, LaybyError, Unauthorized
from layby.http import agui, api, audited, inbox, mailbox, reviewers
from layby.http.deps import Caller, Rt, bearer, check_key
from layby.http.drain import Drain
from layby.http.errors import body_problem, error_response, refusal, why_redis_is_away
from layby.http.events import close_clients
from layby.http.limits import LimitBodies
from layby.http.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from layby.http.metrics import render as render_metrics
from layby.http.metrics import serve as serve_metrics
from layby.parking import NotReplicated, migrations
from layby.parking.formats import FormatError
from layby.wire import ErrorBody, Event

log = logging.getLogger(__name__)

_RUN_PATH = re.compile(r"^/v1/runs/(?P<run_id>[^/]+)(?:/interrupts/(?P<interrupt_id>[^/]+))?")


def create_app(runtime: Runtime | None = None) -> FastAPI:
    """The gateway for `runtime` (built from the environment, logs set up, when None)."""
    if runtime is None:
        runtime = _checked_runtime()
        # uvicorn has set up its loggers by the time it calls the factory: send them through
        # layby's handler, so the gateway writes the configured format (JSON with ids, or
        # text), scrubbed of reviewer tokens (its access lines hold /review/<token>).
        logs.configure(runtime.settings)
        _check_store(runtime)
    rt = runtime

    drain = Drain()
    lifespan = _lifespan(rt, drain)
    # The OTEL_* variables turn traces on (`tracing`); LAYBY_TELEMETRY, FastAPI's spans and
    # metrics for the providers a process set up itself.
    traced = tracing.configure("gateway")
    tracing.instrument_celery()
    on = rt.settings.telemetry or traced
    # Never the reviewer routes: their paths and bodies carry tokens and answers. No log
    # records either: exceptions' messages are not scrubbed there as layby's logs are.
    telemetry: TelemetryConfig = {"tracing": on, "metrics": on, "logs": False,
                                  "operation_spans": on, "exclude": _carries_tokens}
    app = FastAPI(title="layby", version=__version__, lifespan=lifespan, telemetry=telemetry,
                  description="Durable interrupts for agent runs: start runs, answer their "
                              "interrupts, follow their events.")
    app.state.runtime = rt
    app.state.drain = drain
    _handle_errors(app)
    _middleware(app, rt)
    for router in (api.router, audited.router, agui.router, reviewers.router, inbox.router,
                   mailbox.router):
        app.include_router(router)
    _plain_routes(app)
    _document(app, rt)
    return app


def _lifespan(rt: Runtime, drain: Drain
              ) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """What the gateway does while it serves, and once it stops: it drains on SIGTERM, is
    in the registry of processes, and serves /metrics on its own port when one is set."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        drain.install()
        settings = rt.settings
        # In the registry of processes while it serves: a rolling deployment knows which
        # formats the live gateways read (`layby.control.announce`).
        stop, name = threading.Event(), process_name("gateway")
        newest = migrations.newest()
        await run_in_threadpool(announce, lambda: rt.store, name, about("gateway", newest),
                                newest, settings.heartbeat_interval_s, stop)
        exporter = (serve_metrics(settings.metrics_host, settings.metrics_port,
                                  lambda: rt.store) if settings.metrics_port else None)
        try:
            yield
        finally:
            stop.set()
            await run_in_threadpool(withdraw, lambda: rt.store, name)
            await close_clients(rt)
            if exporter is not None:
                exporter.shutdown()
                exporter.server_close()

    return lifespan


def _checked_runtime() -> Runtime:
    """The runtime of the LAYBY_* settings, its agents loaded; a process that cannot serve
    says why in one line and exits with 2 before it listens (uvicorn calls the factory
    first)."""
    try:
        settings = Settings()
        return build(settings, agents=check_config(settings))
    except ValidationError as exc:
        _exit(settings_problem(exc))
    except ConfigError as exc:
        _exit(exc.message)


def _check_store(runtime: Runtime) -> None:
    """A gateway whose code cannot read the store's format exits (one line, code 2) before
    it listens."""
    try:
        runtime.store  # noqa: B018 (made, it has checked the store's format)
    except FormatError as exc:
        _exit(exc.message)
    except redis.exceptions.RedisError:
        pass  # away for now (/readyz says so); the store checks its format once it answers


def _exit(message: str) -> NoReturn:
    print(f"layby gateway: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


# Beside the API key (FastAPI's HTTPBearer, from the routes' dependency): what the
# reviewers' routes take instead.
_SCHEMES = {
    "webhookSignature": {
        "type": "apiKey", "in": "header", "name": "webhook-signature",
        "description": "a Standard Webhooks signature of the body with the reviewer's "
                       "webhook secret, with webhook-id and webhook-timestamp; or none, "
                       "and the notification's `token` in the body"},
    "slackSignature": {
        "type": "apiKey", "in": "header", "name": "X-Slack-Signature",
        "description": "Slack's signature of the request with the app's signing secret "
                       "(LAYBY_SLACK_SIGNING_SECRET), with X-Slack-Request-Timestamp"},
    "inboundBasic": {
        "type": "http", "scheme": "basic",
        "description": "LAYBY_INBOUND_MAIL_SECRET as the password (or as a bearer token), "
                       "when it is set"},
}


def _document(app: FastAPI, rt: Runtime) -> None:
    """`/openapi.json`: FastAPI's document of the routes, with the security schemes the
    routes name by hand, and the agents this gateway serves as the values `agent` takes."""
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes,
                                 description=app.description)
            components = schema.setdefault("components", {})
            components.setdefault("securitySchemes", {}).update(_SCHEMES)
            schemas = components.setdefault("schemas", {})
            for model in (ErrorBody, Event):  # named by hand in `responses`
                found = model.model_json_schema(by_alias=True,
                                                ref_template="#/components/schemas/{model}")
                schemas.update(found.pop("$defs", {}), **{model.__name__: found})
            _require_tags(schema, schemas)
            _absent_not_null(schema)
            agents = {"type": "string", "enum": sorted(rt.agents)}
            schemas["StartRun"]["properties"]["agent"] = agents
            for parameter in schema["paths"]["/agui/{agent}"]["post"]["parameters"]:
                if parameter["name"] == "agent":
                    parameter["schema"] = {**parameter["schema"], **agents}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _absent_not_null(schema: dict[str, Any]) -> None:
    """An optional header or query parameter is absent or a string, never JSON's null
    (FastAPI writes `str | None` as "string or null", which a client would send as the
    text "null")."""
    for operations in schema["paths"].values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                options = parameter.get("schema", {}).get("anyOf", [])
                kept = [o for o in options if o.get("type") != "null"]
                if len(kept) == 1 and len(options) == 2:
                    rest = {k: v for k, v in parameter["schema"].items() if k != "anyOf"}
                    parameter["schema"] = {**kept[0], **rest}


def _require_tags(node: Any, schemas: dict[str, Any]) -> None:
    """A tagged union's tag (AG-UI's message `role`, a content part's `type`) has a default
    in its models, yet a value without it cannot be told apart: the document requires it."""
    if isinstance(node, dict):
        tag = (node.get("discriminator") or {}).get("propertyName")
        for ref in (node.get("discriminator") or {}).get("mapping", {}).values():
            model = schemas.get(ref.rsplit("/", 1)[-1], {})
            model["required"] = sorted({*model.get("required", []), tag})
        for value in node.values():
            _require_tags(value, schemas)
    elif isinstance(node, list):
        for value in node:
            _require_tags(value, schemas)


def _handle_errors(app: FastAPI) -> None:
    @app.exception_handler(LaybyError)
    async def _refused(request: Request, exc: LaybyError) -> JSONResponse:
        if exc.code in audited.KEPT and getattr(request.state, "identity", None) is not None:
            await run_in_threadpool(audited.refusal, request.app.state.runtime, request, exc)
        return refusal(exc)

    @app.exception_handler(redis.exceptions.ConnectionError)
    @app.exception_handler(redis.exceptions.TimeoutError)
    # A cluster mid-failover: slots without a primary for a moment, or a node refusing a
    # script while a slot it touches moves (TRYAGAIN).
    @app.exception_handler(redis.exceptions.ClusterError)
    @app.exception_handler(redis.exceptions.TryAgainError)
    @app.exception_handler(redis.exceptions.MasterDownError)
    @app.exception_handler(redis.exceptions.RedisClusterException)
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
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _invalid_request(request, exc)


def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    """The 422 for a request FastAPI's validation refused: every problem listed, the first
    named in the message."""
    found = exc.errors()
    problem = body_problem(request.headers.get("content-type"), list(found), exc.body)
    if problem is not None:
        return error_response(422, "invalid_request", *problem)
    errors = [{"path": "/" + "/".join(str(p) for p in e["loc"][1:]), "message": e["msg"]}
              for e in found]
    # The message names the first problem (a header, a query parameter, the body…), so
    # a client that shows only the message still says what to fix.
    first = found[0] if found else {"loc": ("request",), "msg": "invalid"}
    kind, *at = (str(p) for p in first["loc"])
    label = " ".join([_PLACES.get(kind, kind), *at[:1]])
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return error_response(422, "invalid_request",
                          f"the request is invalid: {label}: {first['msg']}{more}", errors)


_PLACES = {"header": "the header", "query": "the query parameter",
           "path": "the path parameter", "body": "the body at"}


def _methods_of(app: FastAPI, scope: Mapping[str, Any]) -> list[str]:
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
    app.add_middleware(_KeyFirst, rt=rt)
    app.add_middleware(_LogIds)


def _carries_tokens(scope: Any) -> bool:
    return str(scope.get("path", "")).startswith(("/review/", "/inbound/", "/callbacks/",
                                                  "/slack/", "/inbox"))


class _KeyFirst:
    """The API key checked before anything reads the body: FastAPI parses a body before it
    runs dependencies, so a caller with no key would get a 422 describing the route's
    schema instead of a 401. Plain ASGI (a streamed reply passes through untouched)."""

    def __init__(self, app: Any, rt: Runtime) -> None:
        self.app = app
        self.rt = rt

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        path = scope.get("path", "")
        token = False
        if path.startswith(("/v1/", "/agui/")):
            credentials = await bearer(request)
            try:
                self.rt.keyring.refresh(time.monotonic())
            except KeysFileError as exc:  # the keys it had stay; say why at each look
                log.error("%s: the keys read before stay in use until it is fixed", exc)
            try:
                identity = check_key(self.rt, credentials)
            except Unauthorized as exc:
                if isinstance(exc, ExpiredRunToken):  # a genuine token: its refusal is kept
                    await run_in_threadpool(self._expired, request, exc)
                await error_response(401, "unauthorized", exc.message)(scope, receive, send)
                return
            # The routes' `Caller` reads it here instead of checking again.
            request.state.credentials, request.state.identity = credentials, identity
            token = identity.run is not None
        # What the audit records of the request: where it came from, and its way in.
        with audit.from_request(audited.source_of(request), audited.channel_of(path, token)):
            await self.app(scope, receive, send)

    def _expired(self, request: Request, exc: ExpiredRunToken) -> None:
        with audit.from_request(audited.source_of(request), "token"):
            request.state.identity = exc.token.identity()
            audited.refusal(self.rt, request, exc)


def _plain_routes(app: FastAPI) -> None:
    @app.get("/healthz", include_in_schema=False)
    def healthz(rt: Rt) -> JSONResponse:
        try:
            rt.store.redis.ping()
        except Exception as exc:  # noqa: BLE001  (the gateway is up; what it depends on is not)
            return error_response(503, "redis_unavailable", why_redis_is_away(exc))
        return JSONResponse({"status": "ok"})

    @app.get("/readyz", include_in_schema=False)
    def readyz(rt: Rt, request: Request) -> JSONResponse:
        # Ready when a request can be served: the agents load and the store answers (in a
        # format this code reads); not once the gateway drains (SIGTERM): a load balancer
        # sends new requests elsewhere.
        if request.app.state.drain.draining:
            return error_response(503, "draining", "this gateway is stopping (SIGTERM): "
                                  "send requests to another one")
        try:
            rt.agents  # noqa: B018
        except ConfigError as exc:
            return refusal(exc)
        try:
            rt.store.redis.ping()
        except ConfigError as exc:  # the store's format is not one this code reads
            return refusal(exc)
        except Exception as exc:  # noqa: BLE001  (any failure is the reason it is not ready)
            return error_response(503, "redis_unavailable", why_redis_is_away(exc))
        return JSONResponse({"status": "ready"})

    @app.get("/metrics", include_in_schema=False)
    async def metrics(rt: Rt, caller: Caller) -> Response:
        # Prometheus text format, read from Redis now (layby.http.metrics); an admin's key:
        # the figures are every tenant's.
        caller.require(ADMIN, "read /metrics (every tenant's figures)")
        store = rt.store
        body = await run_in_threadpool(lambda: render_metrics(store))
        return Response(body, media_type=METRICS_CONTENT_TYPE)

    @app.get("/demo/ledger", include_in_schema=False)
    def demo_ledger(rt: Rt) -> dict[str, Any]:
        from layby.demo import ledger

        return ledger.read(rt.store.redis, rt.settings.key_prefix,
                           cluster=rt.settings.store_is_cluster)


class _LogIds:
    """Lines logged while serving /v1/runs/{id}… carry its ids (uvicorn's access line too:
    it is written from inside the request's context)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = _RUN_PATH.match(scope.get("path", "")) if scope["type"] == "http" else None
        if found is None:
            return await self.app(scope, receive, send)
        with logs.about(**found.groupdict()):
            await self.app(scope, receive, send)
