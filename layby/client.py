"""A Python client of layby's HTTP API, for other services: `Client` (sync) and `AsyncClient`
(asyncio), both on httpx, with the same methods.

    with layby.Client("http://127.0.0.1:8000", api_key=KEY) as client:
        run = client.start("demo.transfer", input="Send 250 to Bob", idempotency_key="o-42")
        run = client.wait(run.id, until={"interrupted"})
        client.answer(run.id, run.open_interrupts[0].id, payload={"approved": True})
        print(client.wait(run.id).result)

Replies are `layby.wire`'s models (`RunView`, `RunSummary`, `Answered`, `Event`), the ones
the server answers with. Every refusal raises one of `layby.errors`' classes, chosen by the
HTTP status (401 `Unauthorized`, 403 `Forbidden`, 404 `NotFound`, 409 `Conflict`, 413
`TooLarge`, 422 `Invalid`, 503 `Unavailable`, other 4xx `RequestError`, 5xx
`LaybyError`), carrying the API's error `code`, `message` and `detail`, and the response's
`status_code`. `wait` and `events` follow the run's event stream (server-sent events,
resumed with `Last-Event-ID` after a dropped connection); they do not poll. `stream` starts
a run and follows it in one request, for a caller that follows every run it starts:

    with client.stream("demo.trivia", input="Quiz me") as run:
        for event in run:  # from run.created on; run.id is the run's
            ...

Reads, and writes the server recognizes when they come again (`start`, `answer` and
`resume` carry an `Idempotency-Key`, one of their own unless given), are retried after a
503 (as long as its `Retry-After` says, at most 10 s) or a lost connection, five times,
backing off: a retry never starts a second run or meets its own answer as a rival's.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import random
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Iterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from urllib.parse import quote, unquote

import httpx
from opentelemetry import propagate
from pydantic import BaseModel

from layby import running
from layby.errors import (
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
from layby.generation.interrupts import ResumeEntry
from layby.generation.messages import Message
from layby.wire import (
    FINAL_EVENTS,
    FINISHED,
    Answered,
    Event,
    RunList,
    RunSummary,
    RunView,
    Status,
)

DEFAULT_URL = "http://127.0.0.1:8000"
# The server sends a keep-alive every 15 s on an idle stream: a read that waits longer
# than this has lost its connection.
STREAM_READ_TIMEOUT_S = 40.0
# What status an event says the run has reached; `wait` reads the run again on these.
_STATUS_OF_EVENT = {"run.started": Status.RUNNING, "run.interrupted": Status.INTERRUPTED,
                    "run.resuming": Status.RESUMING, "run.completed": Status.COMPLETED,
                    "run.failed": Status.FAILED, "run.cancelled": Status.CANCELLED,
                    "run.retrying": Status.RETRYING, "run.requeued": None}
_ERROR_OF_STATUS: dict[int, type[LaybyError]] = {
    401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 413: TooLarge,
    422: Invalid, 503: Unavailable}

M = TypeVar("M", bound=BaseModel)
AnswerStatus = Literal["resolved", "cancelled"]


# -- what both clients share: requests, replies, errors, the event stream -----------------


@dataclass(frozen=True)
class _Call:
    method: str
    path: str
    json: Any = None
    params: dict[str, Any] | None = None
    headers: dict[str, str] | None = None

    @property
    def retriable(self) -> bool:
        """Safe to send again after a 503 or a lost connection: a read, or a write the
        server recognizes as the same (its Idempotency-Key)."""
        return self.method == "GET" or "Idempotency-Key" in (self.headers or {})


# Retries of a retriable call: after 503s and connection errors, backing off (or as the
# server's Retry-After says, within MAX_RETRY_AFTER_S).
RETRY_DELAYS_S = (0.25, 0.5, 1.0, 2.0, 4.0)
MAX_RETRY_AFTER_S = 10.0


def _retry_delay(attempt: int, response: httpx.Response | None) -> float | None:
    """How long to wait before trying again, or None when it is no use."""
    if attempt >= len(RETRY_DELAYS_S):
        return None
    if response is not None:
        if response.status_code != 503:
            return None
        after = response.headers.get("retry-after", "")
        if after.isdigit():
            return min(float(after), MAX_RETRY_AFTER_S)
    return RETRY_DELAYS_S[attempt] * random.uniform(0.5, 1.0)


def _new_key() -> str:
    return f"layby-client-{uuid.uuid4().hex}"


def _start(agent: str, input: Any, messages: list[Message] | list[dict[str, Any]] | None,
           metadata: dict[str, Any] | None, idempotency_key: str | None) -> _Call:
    if (input is None) == (messages is None):
        raise Invalid("give either `input` (the user's request) or `messages` (a history), "
                      "not both and not neither")
    body: dict[str, Any] = {"agent": agent}
    if input is not None:
        body["input"] = input
    if messages is not None:
        body["messages"] = [m.wire() if isinstance(m, Message) else m for m in messages]
    if metadata is not None:
        body["metadata"] = metadata
    # A key of its own when the caller gives none: a retry never starts a second run.
    return _Call("POST", "/v1/runs", body,
                 headers={"Idempotency-Key": idempotency_key or _new_key()})


def _traced(headers: dict[str, str] | None) -> dict[str, str] | None:
    """The headers with the caller's current trace context (W3C `traceparent`), when the
    caller has a span: the gateway continues its trace. Without OpenTelemetry's SDK in the
    caller's process there is none, and nothing is added."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {**(headers or {}), **carrier} if carrier else headers


def _request(http: httpx.Client | httpx.AsyncClient, call: _Call,
             timeout: httpx.Timeout | None) -> httpx.Request:
    return http.build_request(call.method, call.path, json=call.json, params=call.params,
                              headers=_traced(call.headers),
                              timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout)


def _stream_run(agent: str, input: Any,
                messages: list[Message] | list[dict[str, Any]] | None,
                metadata: dict[str, Any] | None, idempotency_key: str | None,
                follow: bool) -> _Call:
    start = _start(agent, input, messages, metadata, idempotency_key)
    return _Call("POST", "/v1/runs", start.json,
                 params=None if follow else {"follow": "false"},
                 headers={**(start.headers or {}), "Accept": "text/event-stream"})


def _streamed(response: httpx.Response) -> bool:
    """Whether a start asked for events got them (a server that does not stream starts
    answers with the run: its events are then read with `GET …/events`)."""
    kind: str = response.headers.get("content-type", "")
    return kind.startswith("text/event-stream")


def _started(response: httpx.Response) -> tuple[str, bool]:
    """The run a start asked for events started (its `Location`, or the run answered
    with), and whether it was started before (the Idempotency-Key seen before)."""
    replayed = "idempotent-replayed" in response.headers
    if not _streamed(response):
        return _reply(response, RunView).id, replayed
    location = response.headers.get("location", "")
    run_id = location.removeprefix("/v1/runs/")
    if run_id == location or not run_id or "/" in run_id:
        raise LaybyError(f"{response.request.url} answered {response.status_code} without "
                         "the run's Location (/v1/runs/<id>): not layby's reply")
    return unquote(run_id), replayed


def _seg(value: str) -> str:
    """An id as one path segment: a `/` or `?` in it cannot reach another route."""
    return quote(str(value), safe="")


def _status(value: Status | str) -> Status:
    try:
        return Status(value)
    except ValueError:
        raise Invalid(f"{value!r} is not a run status: use one of "
                      f"{[s.value for s in Status]}") from None


def _list(status: Status | str | None, limit: int, offset: int = 0,
          cursor: str | None = None, agent_version: str | None = None) -> _Call:
    params: dict[str, Any] = {"limit": limit}
    if agent_version is not None:
        params["agentVersion"] = agent_version
    if offset:
        params["offset"] = offset
    if cursor is not None:
        params["cursor"] = cursor
    if status is not None:
        params["status"] = _status(status).value
    return _Call("GET", "/v1/runs", params=params)


PAGE = 200  # runs a page when the client follows the cursor itself


def _answer(run_id: str, interrupt_id: str, payload: Any, status: AnswerStatus,
            metadata: dict[str, Any] | None) -> _Call:
    body: dict[str, Any] = {"status": status, "payload": payload}
    if metadata is not None:
        body["metadata"] = metadata
    return _Call("POST", f"/v1/runs/{_seg(run_id)}/interrupts/{_seg(interrupt_id)}", body,
                 headers={"Idempotency-Key": _new_key()})


def _resume(run_id: str, entries: Iterable[ResumeEntry | dict[str, Any]]) -> _Call:
    given = [e if isinstance(e, ResumeEntry) else ResumeEntry.model_validate(e)
             for e in entries]
    return _Call("POST", f"/v1/runs/{_seg(run_id)}/resume",
                 {"resume": [e.wire() for e in given]}, headers={"Idempotency-Key": _new_key()})


def _cancel(run_id: str, reason: str | None) -> _Call:
    return _Call("POST", f"/v1/runs/{_seg(run_id)}/cancel",
                 {"reason": reason} if reason else {})


def _events(run_id: str, last_event_id: str | None, follow: bool) -> _Call:
    headers = {"Accept": "text/event-stream"}
    if last_event_id:
        headers["Last-Event-ID"] = last_event_id
    return _Call("GET", f"/v1/runs/{_seg(run_id)}/events",
                 params=None if follow else {"follow": "false"}, headers=headers)


def _refusal(response: httpx.Response) -> LaybyError:
    """The exception a refused request raises: the class by status, the body's words."""
    code, message, detail = "", response.reason_phrase or "", None
    try:
        error = response.json().get("error") or {}
        code, message, detail = error.get("code", ""), error.get("message", message), \
            error.get("detail")
    except (ValueError, AttributeError):
        message = f"{response.status_code} {response.reason_phrase}: {response.text[:300]}"
    status = response.status_code
    kind = _ERROR_OF_STATUS.get(status) or (RequestError if status < 500 else LaybyError)
    exc = kind(message or f"HTTP {status}", detail=detail, code=code or None)
    exc.status_code = status
    return exc


def _reply(response: httpx.Response, model: type[M]) -> M:
    if response.is_error:
        raise _refusal(response)
    try:
        return model.model_validate_json(response.content)
    except ValueError as exc:  # not JSON, or not the API's (a proxy's page, say)
        raise LaybyError(f"{response.request.url} answered {response.status_code} with "
                         f"something that is not layby's reply: {str(exc)[:300]}") from None


def _wanted(until: Iterable[Status | str] | Status | str | None) -> frozenset[Status]:
    if not until:
        return FINISHED
    if isinstance(until, str):  # one status ("interrupted"), not its letters
        return frozenset({_status(until)})
    return frozenset(_status(s) for s in until)


def _settled(run: RunView, wanted: frozenset[Status]) -> bool:
    """Whether `wait` is done: the run is in a wanted state, or finished (it will never
    reach one then)."""
    return run.status in wanted or run.status in FINISHED


def _worth_a_look(event: Event, run: RunView, wanted: frozenset[Status]) -> bool:
    """Whether an event may mean the run reached a wanted state (read it again then);
    events of versions before the last read are history."""
    if event.type not in _STATUS_OF_EVENT or event.version < run.version:
        return False
    status = _STATUS_OF_EVENT[event.type]
    return status is None or status in wanted or status in FINISHED


class _SSE:
    """Server-sent events as the server writes them (`id:`, `event:`, `data:` lines, a
    blank line ends one; `:` lines are keep-alives)."""

    def __init__(self) -> None:
        self.last_id: str | None = None
        self._data: list[str] = []
        self._id: str | None = None

    def feed(self, line: str) -> Event | None:
        if line == "":
            if not self._data:
                return None
            data, self._data = "\n".join(self._data), []
            self.last_id = self._id or self.last_id
            return Event.model_validate_json(data)
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "data":
            self._data.append(value)
        elif field == "id":
            self._id = value
        return None


class _Stream:
    """Where a stream of events stands across connections: the last event id (to resume
    from), the deadline, and how long to wait before connecting again."""

    RETRIES = 8  # failed connections in a row, without an event between them

    def __init__(self, after: str | None, deadline: float | None) -> None:
        self.last_id = after
        self.deadline = deadline
        self.failures = 0
        self.ended = False  # the run's last event came: the server ends the stream

    def over(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def timeout(self) -> httpx.Timeout:
        left = None if self.deadline is None else max(0.01, self.deadline - time.monotonic())
        read = STREAM_READ_TIMEOUT_S if left is None else min(left, STREAM_READ_TIMEOUT_S)
        return httpx.Timeout(min(10.0, read), read=read)

    def parser(self) -> _SSE:
        """A parser for a new connection: a frame cut short by a dropped connection is
        not carried over; the server sends it again after the last id."""
        parser = _SSE()
        parser.last_id = self.last_id
        return parser

    def seen(self, event_id: str | None) -> None:
        self.last_id = event_id or self.last_id
        self.failures = 0

    def failed(self, exc: httpx.TransportError) -> float:
        """How long to wait before trying again; raises `exc` when it is no use."""
        if isinstance(exc, httpx.UnsupportedProtocol | httpx.ProxyError):
            raise exc
        self.failures += 1
        if self.failures > self.RETRIES and not isinstance(exc, httpx.ReadTimeout):
            raise exc
        return min(5.0, 0.2 * 2.0 ** (self.failures - 1)) * random.uniform(0.5, 1.0)


def _lines(response: httpx.Response, stream: _Stream) -> Iterator[Event]:
    """The events of one open stream, until it ends, the run's last event came
    (`stream.ended`) or the deadline passed."""
    parser = stream.parser()
    for line in response.iter_lines():
        event = None if stream.ended else parser.feed(line)
        if event is not None:
            stream.seen(parser.last_id)
            yield event
            # The server ends the stream after it: read to its end, so the connection is
            # kept for the next request.
            stream.ended = event.type in FINAL_EVENTS
        if not stream.ended and stream.over():  # keep-alives come every 15 s
            return


async def _alines(response: httpx.Response, stream: _Stream) -> AsyncIterator[Event]:
    """`_lines`, read asynchronously."""
    parser = stream.parser()
    async for line in response.aiter_lines():
        event = None if stream.ended else parser.feed(line)
        if event is not None:
            stream.seen(parser.last_id)
            yield event
            stream.ended = event.type in FINAL_EVENTS
        if not stream.ended and stream.over():
            return


def _timed_out(run_id: str, timeout: float | None, wanted: frozenset[Status]) -> TimeoutError:
    return TimeoutError(f"run {run_id} did not reach {sorted(wanted)} within {timeout} s")


def _base(base_url: str | None, api_key: str | None) -> tuple[str, dict[str, str]]:
    """The URL and key given, else LAYBY_URL and LAYBY_API_KEY, else those of a `layby up`
    running in this folder (`layby.running`), else the default URL and no key."""
    url = base_url or os.environ.get("LAYBY_URL")
    key = api_key or os.environ.get("LAYBY_API_KEY")
    if url is None or key is None:
        stack = running.running()
        if stack is not None:
            url = url or stack.url
            # Its key only to its own gateway: never sent to a server someone else named.
            if key is None and url.rstrip("/") == stack.url.rstrip("/"):
                key = stack.api_key()
    return url or DEFAULT_URL, ({"Authorization": f"Bearer {key}"} if key else {})


# -- the clients ---------------------------------------------------------------------------


class Client:
    """layby's API, synchronously. `base_url` and `api_key` default to the LAYBY_URL and
    LAYBY_API_KEY environment variables, then to the gateway and key of a `layby up`
    running in this folder (LAYBY_DATA_DIR, ./.layby), then to http://127.0.0.1:8000.
    Close it, or use it as a context manager."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *,
                 timeout: float = 30.0, transport: httpx.BaseTransport | None = None) -> None:
        url, headers = _base(base_url, api_key)
        self._http = httpx.Client(base_url=url, headers=headers, timeout=timeout,
                                  transport=transport)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: _Call, *, stream: bool = False,
              timeout: httpx.Timeout | None = None) -> httpx.Response:
        """The call's response, retried as the module says; with `stream`, its body not read
        yet (the caller closes it)."""
        for attempt in range(len(RETRY_DELAYS_S) + 1):
            try:
                response = self._http.send(_request(self._http, call, timeout), stream=stream)
            except httpx.TransportError:
                delay = _retry_delay(attempt, None) if call.retriable else None
                if delay is None:
                    raise
            else:
                delay = _retry_delay(attempt, response) if call.retriable else None
                if delay is None:
                    return response
                response.close()
            time.sleep(delay)
        raise AssertionError("unreachable")

    def start(self, agent: str, *, input: Any = None,
              messages: builtins.list[Message] | builtins.list[dict[str, Any]] | None = None,
              metadata: dict[str, Any] | None = None,
              idempotency_key: str | None = None) -> RunView:
        """Start a run of `agent` with the user's `input` (or a history of `messages`). The
        same `idempotency_key` again returns the run it started."""
        return _reply(self._send(_start(agent, input, messages, metadata, idempotency_key)),
                      RunView)

    def get(self, run_id: str) -> RunView:
        return _reply(self._send(_Call("GET", f"/v1/runs/{_seg(run_id)}")), RunView)

    def list(self, status: Status | str | None = None, *, limit: int = 50,
             offset: int = 0) -> builtins.list[RunSummary]:
        """Runs, newest first (in one state, or all): the first `limit` (up to 500) after
        `offset` (up to 1,000; `iter_runs` and `page` go deeper)."""
        return _reply(self._send(_list(status, limit, offset)), RunList).runs

    def page(self, status: Status | str | None = None, *, limit: int = 50,
             cursor: str | None = None, agent_version: str | None = None) -> RunList:
        """One page of runs, newest first; its `next_cursor` asks for the next one. With
        `agent_version`, only runs started on that version of their agent (a page may then
        hold fewer than `limit`, and still have a next one)."""
        return _reply(self._send(_list(status, limit, cursor=cursor,
                                       agent_version=agent_version)), RunList)

    def iter_runs(self, status: Status | str | None = None, *,
                  agent_version: str | None = None) -> Iterator[RunSummary]:
        """Every run (in one state, or all; of one agent version, or all), newest first, a
        page at a time."""
        cursor: str | None = None
        while True:
            found = self.page(status, limit=PAGE, cursor=cursor, agent_version=agent_version)
            yield from found.runs
            if found.next_cursor is None:
                return
            cursor = found.next_cursor

    def answer(self, run_id: str, interrupt_id: str, payload: Any = None, *,
               status: AnswerStatus = "resolved",
               metadata: dict[str, Any] | None = None) -> Answered:
        """Answer one interrupt; `Answered.resumed` says whether it was the last open one."""
        return _reply(self._send(_answer(run_id, interrupt_id, payload, status, metadata)),
                      Answered)

    def resume(self, run_id: str, entries: Iterable[ResumeEntry | dict[str, Any]]
               ) -> Answered:
        """Answer every open interrupt at once (AG-UI's resume entries)."""
        return _reply(self._send(_resume(run_id, entries)), Answered)

    def cancel(self, run_id: str, reason: str | None = None) -> RunView:
        return _reply(self._send(_cancel(run_id, reason)), RunView)

    def events(self, run_id: str, *, after: str | None = None,
               follow: bool = True) -> Iterator[Event]:
        """The run's events, oldest first (after the event id `after`), then, with
        `follow`, as they happen until the run ends. A dropped connection is resumed from
        the last event received."""
        yield from self._events(run_id, after, follow, None)

    def _events(self, run_id: str, after: str | None, follow: bool,
                deadline: float | None, stream: _Stream | None = None) -> Iterator[Event]:
        stream = stream or _Stream(after, deadline)
        while not stream.over():
            call = _events(run_id, stream.last_id, follow)
            try:
                with self._http.stream(call.method, call.path, params=call.params,
                                       headers=_traced(call.headers),
                                       timeout=stream.timeout()) as response:
                    if response.is_error:
                        response.read()
                        raise _refusal(response)
                    yield from _lines(response, stream)
                if stream.ended or not follow:
                    return
            except httpx.TransportError as exc:
                time.sleep(stream.failed(exc))

    def stream(self, agent: str, *, input: Any = None,
               messages: builtins.list[Message] | builtins.list[dict[str, Any]] | None = None,
               metadata: dict[str, Any] | None = None, idempotency_key: str | None = None,
               follow: bool = True) -> RunStream:
        """Start a run and follow its events in one request (`start`, then `events`, at the
        cost of one: `POST /v1/runs` with `Accept: text/event-stream`). `with
        client.stream(...) as run:`, then `run.id`, and `for event in run` from its first
        event until it ends (with `follow`). A dropped connection is resumed from the last
        event received."""
        return RunStream(self, _stream_run(agent, input, messages, metadata,
                                           idempotency_key, follow), follow)

    def wait(self, run_id: str, until: Iterable[Status | str] | Status | str | None = None, *,
             timeout: float | None = 60.0) -> RunView:
        """The run once it is in one of the states `until` (default: finished), or finished
        in another state, following its events; TimeoutError after `timeout` seconds."""
        wanted = _wanted(until)
        deadline = None if timeout is None else time.monotonic() + timeout
        run = self.get(run_id)
        if _settled(run, wanted):
            return run
        for event in self._events(run_id, None, True, deadline):
            if _worth_a_look(event, run, wanted):
                run = self.get(run_id)
                if _settled(run, wanted):
                    return run
        run = self.get(run_id)
        if _settled(run, wanted):
            return run
        raise _timed_out(run_id, timeout, wanted)

    def agents(self) -> builtins.list[dict[str, Any]]:
        response = self._send(_Call("GET", "/v1/agents"))
        if response.is_error:
            raise _refusal(response)
        return builtins.list(response.json()["agents"])


def aiohttp_transport() -> httpx.AsyncBaseTransport:
    """A transport for `AsyncClient` on aiohttp's connections (httpx-aiohttp): the same
    requests, replies, timeouts, retries and errors as on httpx's own, for about a third
    less of the client's CPU a request (`python -m bench --http`, docs/sizing.md). For a
    service that makes many requests: `AsyncClient(url, key, transport=aiohttp_transport())`.
    Needs the `aiohttp` extra (`pip install 'layby[aiohttp]'`)."""
    try:
        from httpx_aiohttp import AiohttpTransport
    except ImportError as exc:
        raise ImportError("aiohttp_transport() needs the httpx-aiohttp package: "
                          "pip install 'layby[aiohttp]'") from exc
    return AiohttpTransport()


class AsyncClient:
    """layby's API for asyncio, with `Client`'s methods as coroutines (`events` is an async
    iterator). Close it (`await client.aclose()`), or use it as an async context manager.
    `transport`: httpx's own unless given (`aiohttp_transport()` costs less CPU)."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *,
                 timeout: float = 30.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        url, headers = _base(base_url, api_key)
        self._http = httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout,
                                       transport=transport)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: _Call, *, stream: bool = False,
                    timeout: httpx.Timeout | None = None) -> httpx.Response:
        for attempt in range(len(RETRY_DELAYS_S) + 1):
            try:
                response = await self._http.send(_request(self._http, call, timeout),
                                                 stream=stream)
            except httpx.TransportError:
                delay = _retry_delay(attempt, None) if call.retriable else None
                if delay is None:
                    raise
            else:
                delay = _retry_delay(attempt, response) if call.retriable else None
                if delay is None:
                    return response
                await response.aclose()
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def start(self, agent: str, *, input: Any = None,
                    messages: builtins.list[Message] | builtins.list[dict[str, Any]] | None = None,
                    metadata: dict[str, Any] | None = None,
                    idempotency_key: str | None = None) -> RunView:
        call = _start(agent, input, messages, metadata, idempotency_key)
        return _reply(await self._send(call), RunView)

    async def get(self, run_id: str) -> RunView:
        return _reply(await self._send(_Call("GET", f"/v1/runs/{_seg(run_id)}")), RunView)

    async def list(self, status: Status | str | None = None, *, limit: int = 50,
                   offset: int = 0) -> builtins.list[RunSummary]:
        return _reply(await self._send(_list(status, limit, offset)), RunList).runs

    async def page(self, status: Status | str | None = None, *, limit: int = 50,
                   cursor: str | None = None, agent_version: str | None = None) -> RunList:
        return _reply(await self._send(_list(status, limit, cursor=cursor,
                                             agent_version=agent_version)), RunList)

    async def iter_runs(self, status: Status | str | None = None, *,
                        agent_version: str | None = None) -> AsyncIterator[RunSummary]:
        cursor: str | None = None
        while True:
            found = await self.page(status, limit=PAGE, cursor=cursor,
                                    agent_version=agent_version)
            for run in found.runs:
                yield run
            if found.next_cursor is None:
                return
            cursor = found.next_cursor

    async def answer(self, run_id: str, interrupt_id: str, payload: Any = None, *,
                     status: AnswerStatus = "resolved",
                     metadata: dict[str, Any] | None = None) -> Answered:
        call = _answer(run_id, interrupt_id, payload, status, metadata)
        return _reply(await self._send(call), Answered)

    async def resume(self, run_id: str, entries: Iterable[ResumeEntry | dict[str, Any]]
                     ) -> Answered:
        return _reply(await self._send(_resume(run_id, entries)), Answered)

    async def cancel(self, run_id: str, reason: str | None = None) -> RunView:
        return _reply(await self._send(_cancel(run_id, reason)), RunView)

    def events(self, run_id: str, *, after: str | None = None,
               follow: bool = True) -> AsyncIterator[Event]:
        """`Client.events`, as an async iterator (close it, or run it to its end)."""
        return self._events(run_id, after, follow, None)

    async def _events(self, run_id: str, after: str | None, follow: bool,
                      deadline: float | None, stream: _Stream | None = None
                      ) -> AsyncGenerator[Event, None]:
        stream = stream or _Stream(after, deadline)
        while not stream.over():
            call = _events(run_id, stream.last_id, follow)
            try:
                async with self._http.stream(call.method, call.path, params=call.params,
                                             headers=_traced(call.headers),
                                             timeout=stream.timeout()) as response:
                    if response.is_error:
                        await response.aread()
                        raise _refusal(response)
                    async for event in _alines(response, stream):
                        yield event
                if stream.ended or not follow:
                    return
            except httpx.TransportError as exc:
                await asyncio.sleep(stream.failed(exc))

    def stream(self, agent: str, *, input: Any = None,
               messages: builtins.list[Message] | builtins.list[dict[str, Any]] | None = None,
               metadata: dict[str, Any] | None = None, idempotency_key: str | None = None,
               follow: bool = True) -> AsyncRunStream:
        """`Client.stream`: `async with client.stream(...) as run:`, then `async for event
        in run`."""
        return AsyncRunStream(self, _stream_run(agent, input, messages, metadata,
                                                idempotency_key, follow), follow)

    async def wait(self, run_id: str,
                   until: Iterable[Status | str] | Status | str | None = None, *,
                   timeout: float | None = 60.0) -> RunView:
        wanted = _wanted(until)
        deadline = None if timeout is None else time.monotonic() + timeout
        run = await self.get(run_id)
        if _settled(run, wanted):
            return run
        async with aclosing(self._events(run_id, None, True, deadline)) as events:
            async for event in events:
                if _worth_a_look(event, run, wanted):
                    run = await self.get(run_id)
                    if _settled(run, wanted):
                        return run
        run = await self.get(run_id)
        if _settled(run, wanted):
            return run
        raise _timed_out(run_id, timeout, wanted)

    async def agents(self) -> builtins.list[dict[str, Any]]:
        response = await self._send(_Call("GET", "/v1/agents"))
        if response.is_error:
            raise _refusal(response)
        return builtins.list(response.json()["agents"])


# -- a run started and followed in one request (`stream`) ----------------------------------


class RunStream:
    """A run `Client.stream` started: `id` once the `with` block is entered, its events by
    iterating (once). The connection is closed when the block ends."""

    def __init__(self, client: Client, call: _Call, follow: bool) -> None:
        self._client, self._call, self._follow = client, call, follow
        self._state = _Stream(None, None)
        self._response: httpx.Response | None = None
        self.id = ""
        self.replayed = False  # the Idempotency-Key was seen before: a run started earlier

    def __enter__(self) -> RunStream:
        # Retried like any keyed call: the same key again never starts a second run.
        response = self._client._send(self._call, stream=True, timeout=self._state.timeout())
        try:
            if response.is_error or not _streamed(response):
                response.read()
            if response.is_error:
                raise _refusal(response)
            self.id, self.replayed = _started(response)
        finally:
            if not _streamed(response) or not self.id:
                response.close()
        self._response = response if _streamed(response) else None
        return self

    def __exit__(self, *_: object) -> None:
        if self._response is not None:
            self._response.close()

    def __iter__(self) -> Iterator[Event]:
        if not self.id:
            raise RuntimeError("iterate a run stream inside its `with` block")
        response, self._response = self._response, None
        if response is not None:
            try:
                yield from _lines(response, self._state)
            except httpx.TransportError as exc:
                time.sleep(self._state.failed(exc))
            finally:
                response.close()
            if self._state.ended or not self._follow:
                return
        # The run came as JSON (its events read from the start), or the stream dropped.
        yield from self._client._events(self.id, None, self._follow, None, self._state)


class AsyncRunStream:
    """`RunStream`, for `AsyncClient.stream`: `async with`, `async for`."""

    def __init__(self, client: AsyncClient, call: _Call, follow: bool) -> None:
        self._client, self._call, self._follow = client, call, follow
        self._state = _Stream(None, None)
        self._response: httpx.Response | None = None
        self.id = ""
        self.replayed = False

    async def __aenter__(self) -> AsyncRunStream:
        response = await self._client._send(self._call, stream=True,
                                            timeout=self._state.timeout())
        try:
            if response.is_error or not _streamed(response):
                await response.aread()
            if response.is_error:
                raise _refusal(response)
            self.id, self.replayed = _started(response)
        finally:
            if not _streamed(response) or not self.id:
                await response.aclose()
        self._response = response if _streamed(response) else None
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._response is not None:
            await self._response.aclose()

    async def __aiter__(self) -> AsyncIterator[Event]:
        if not self.id:
            raise RuntimeError("iterate a run stream inside its `async with` block")
        response, self._response = self._response, None
        if response is not None:
            try:
                async for event in _alines(response, self._state):
                    yield event
            except httpx.TransportError as exc:
                await asyncio.sleep(self._state.failed(exc))
            finally:
                await response.aclose()
            if self._state.ended or not self._follow:
                return
        async for event in self._client._events(self.id, None, self._follow, None,
                                                self._state):
            yield event


__all__ = ["AsyncClient", "AsyncRunStream", "Client", "RunStream"]
