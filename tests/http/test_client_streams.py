"""`layby.Client` and `layby.AsyncClient` (on httpx's transport and on aiohttp's) on the edges
of the event stream, against a local HTTP server that speaks the gateway's protocol with
scripted answers (the states a real gateway only reaches by chance: a connection dropped in
the middle of an event, a run nobody answers, a reply with a field this client does not
know yet)."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from layby import AsyncClient, Client, Status
from layby.client import aiohttp_transport

RUN = {"id": "run_a", "agent": "demo.trivia", "status": "interrupted", "version": 2,
       "messages": [], "interrupts": [], "createdAt": "2026-01-01T00:00:00.000Z",
       "updatedAt": "2026-01-01T00:00:00.000Z", "tags": ["from a newer server"]}


def frame(event_id: str, kind: str, version: int) -> bytes:
    data = {"id": event_id, "type": kind, "version": version, "at": "2026-01-01T00:00:00Z"}
    return f"id: {event_id}\nevent: {kind}\ndata: {json.dumps(data)}\n\n".encode()


class Scripted(ThreadingHTTPServer):
    """Answers GET /v1/runs/run_a with RUN, and each connection to its events with the next
    script in `streams` (a list of byte chunks; None closes the connection there)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.streams: list[list[bytes | None]] = []
        self.last_event_ids: list[str | None] = []
        self.pause_s = 0.0
        self.unavailable = 0  # answer this many requests 503 first
        self.keys: list[str | None] = []  # the Idempotency-Key of every POST
        self.streamed_starts = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: Scripted

    def log_message(self, *_: Any) -> None:
        pass

    def _away(self) -> bool:
        if self.server.unavailable <= 0:
            return False
        self.server.unavailable -= 1
        body = b'{"error": {"code": "redis_unavailable", "message": "Redis does not answer"}}'
        self.send_response(503)
        self.send_header("Retry-After", "0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        return True

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.keys.append(self.headers.get("Idempotency-Key"))
        if self._away():
            return
        if self.path.startswith("/v1/runs?") or self.path == "/v1/runs":
            if self.server.streamed_starts and "text/event-stream" in self.headers["Accept"]:
                return self._stream({"Location": "/v1/runs/run_a"})
            body = json.dumps(RUN).encode()  # a server that does not stream starts
            self.send_response(202)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        body = json.dumps({"run": RUN, "resumed": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self._away():
            return
        if self.path == "/v1/runs/run_a":
            body = json.dumps(RUN).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self._stream({})

    def _stream(self, headers: dict[str, str]) -> None:
        self.server.last_event_ids.append(self.headers.get("Last-Event-ID"))
        chunks = self.server.streams.pop(0) if self.server.streams else [b": keep-alive\n\n"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        for chunk in chunks:
            if chunk is None:
                return  # the connection drops here
            self.wfile.write(chunk)
            self.wfile.flush()
            time.sleep(self.server.pause_s)
        self.close_connection = True


@pytest.fixture
def server() -> Iterator[Scripted]:
    scripted = Scripted()
    thread = threading.Thread(target=scripted.serve_forever, daemon=True)
    thread.start()
    yield scripted
    scripted.shutdown()
    scripted.server_close()


def test_a_reply_with_fields_this_client_does_not_know_still_reads(server: Scripted) -> None:
    with Client(server.url, api_key="k") as client:
        run = client.get("run_a")
    assert run.status is Status.INTERRUPTED and run.version == 2


def test_wait_keeps_its_timeout_while_the_server_sends_only_keep_alives(
        server: Scripted) -> None:
    server.streams = [[b": keep-alive\n\n"] * 200]
    server.pause_s = 0.05  # far more often than the gateway's 15 s, for ten seconds
    started = time.monotonic()
    with Client(server.url, api_key="k") as client, pytest.raises(TimeoutError):
        client.wait("run_a", until="completed", timeout=1.0)
    assert time.monotonic() - started < 3


def test_events_resume_after_the_last_whole_event_when_the_connection_drops(
        server: Scripted) -> None:
    cut = frame("3-0", "run.resuming", 3)
    server.streams = [
        [frame("1-0", "run.created", 1), frame("2-0", "run.started", 1), cut[:30], None],
        [cut, frame("4-0", "run.completed", 4)],
    ]
    with Client(server.url, api_key="k") as client:
        got = [(e.id, e.type) for e in client.events("run_a")]
    assert got == [("1-0", "run.created"), ("2-0", "run.started"), ("3-0", "run.resuming"),
                   ("4-0", "run.completed")]
    assert server.last_event_ids == [None, "2-0"]


def test_reads_and_keyed_answers_are_retried_after_a_503(server: Scripted) -> None:
    server.unavailable = 2
    with Client(server.url, api_key="k") as client:
        assert client.get("run_a").id == "run_a"  # after two 503s
        server.unavailable = 1
        assert client.answer("run_a", "int_1", payload="Jaws").resumed is True
    # The retry carried the same key as the first try, so the server takes it as the same.
    assert len(server.keys) == 2 and server.keys[0] == server.keys[1] is not None


def test_a_started_stream_that_drops_goes_on_from_the_runs_events(server: Scripted) -> None:
    """`stream`: the POST meets a 503 and is sent again with the same key; its stream drops
    in the middle of an event; the rest comes from the run's events after the last whole
    one."""
    server.unavailable = 1
    cut = frame("2-0", "run.interrupted", 2)
    server.streams = [[frame("1-0", "run.created", 1), cut[:25], None],
                      [cut, frame("3-0", "run.completed", 3)]]
    with Client(server.url, api_key="k") as client, \
            client.stream("demo.trivia", input="Quiz me") as run:
        assert run.id == "run_a" and run.replayed is False
        got = [(e.id, e.type) for e in run]
    assert got == [("1-0", "run.created"), ("2-0", "run.interrupted"),
                   ("3-0", "run.completed")]
    assert server.last_event_ids == [None, "1-0"]
    assert len(server.keys) == 2 and server.keys[0] == server.keys[1] is not None


def test_a_server_that_answers_a_start_with_the_run_is_followed_for_its_events(
        server: Scripted) -> None:
    server.streamed_starts = False
    server.streams = [[frame("1-0", "run.created", 1), frame("2-0", "run.completed", 2)]]
    with Client(server.url, api_key="k") as client, \
            client.stream("demo.trivia", input="Quiz me") as run:
        assert run.id == "run_a"
        assert [e.type for e in run] == ["run.created", "run.completed"]
    assert server.last_event_ids == [None]


# AsyncClient's transports: httpx's own (the default) and aiohttp's (`aiohttp_transport`).
TRANSPORTS: dict[str, Callable[[], httpx.AsyncBaseTransport | None]] = {
    "httpx": lambda: None, "aiohttp": aiohttp_transport}


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_the_async_client_resumes_a_dropped_stream_after_the_last_whole_event(
        server: Scripted, transport: str) -> None:
    cut = frame("3-0", "run.resuming", 3)
    server.streams = [
        [frame("1-0", "run.created", 1), frame("2-0", "run.started", 1), cut[:30], None],
        [cut, frame("4-0", "run.completed", 4)],
    ]

    async def follow() -> list[tuple[str | None, str]]:
        async with AsyncClient(server.url, api_key="k",
                               transport=TRANSPORTS[transport]()) as client:
            return [(e.id, e.type) async for e in client.events("run_a")]

    assert asyncio.run(follow()) == [("1-0", "run.created"), ("2-0", "run.started"),
                                     ("3-0", "run.resuming"), ("4-0", "run.completed")]
    assert server.last_event_ids == [None, "2-0"]


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_the_async_client_retries_a_503_and_a_started_stream_that_drops(
        server: Scripted, transport: str) -> None:
    server.unavailable = 1
    cut = frame("2-0", "run.interrupted", 2)
    server.streams = [[frame("1-0", "run.created", 1), cut[:25], None],
                      [cut, frame("3-0", "run.completed", 3)]]

    async def drive() -> list[tuple[str | None, str]]:
        async with AsyncClient(server.url, api_key="k",
                               transport=TRANSPORTS[transport]()) as client:
            async with client.stream("demo.trivia", input="Quiz me") as run:
                got = [(e.id, e.type) async for e in run]
            server.unavailable = 1
            assert (await client.answer("run_a", "int_1", payload="Jaws")).resumed is True
            return got

    assert asyncio.run(drive()) == [("1-0", "run.created"), ("2-0", "run.interrupted"),
                                    ("3-0", "run.completed")]
    assert server.last_event_ids == [None, "1-0"]
    # Each retry carried the same key as its first try: the server takes it as the same.
    assert len(server.keys) == 4
    assert server.keys[0] == server.keys[1] != server.keys[2] == server.keys[3]


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_the_async_clients_wait_keeps_its_timeout_through_keep_alives(
        server: Scripted, transport: str) -> None:
    server.streams = [[b": keep-alive\n\n"] * 200]
    server.pause_s = 0.05

    async def wait() -> None:
        async with AsyncClient(server.url, api_key="k",
                               transport=TRANSPORTS[transport]()) as client:
            await client.wait("run_a", until="completed", timeout=1.0)

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        asyncio.run(wait())
    assert time.monotonic() - started < 3


def test_the_aiohttp_transport_without_its_extra_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "httpx_aiohttp", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'layby\[aiohttp\]'"):
        aiohttp_transport()
