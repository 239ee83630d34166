"""A flaky bank on loopback, for tools that try again: a real HTTP server that drops the
connections it is told to drop (accepted, then closed without a reply: the client sees a
reset or a disconnect), then answers. `POST /charge` with an `Idempotency-Key` charges once
per key, as a payment provider does, and every charge it made is listed."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from layby.ops.embedded import free_port


@dataclass
class Ledger:
    drop: int = 0  # connections still to drop
    dropped: int = 0
    requests: int = 0
    charges: dict[str, int] = field(default_factory=dict)  # idempotency key → amount
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self, drop: int = 0) -> None:
        with self.lock:
            self.drop, self.dropped, self.requests = drop, 0, 0
            self.charges.clear()

    def down(self) -> None:
        """Drop every connection from now on, until `up`: a test sees a run wait to try
        again for as long as it takes to look, however slow the machine."""
        with self.lock:
            self.drop = 1_000_000

    def up(self) -> None:
        """Answer every connection from now on."""
        with self.lock:
            self.drop = 0


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    ledger: Ledger

    def verify_request(self, request: Any, client_address: Any) -> bool:
        with self.ledger.lock:
            if self.ledger.drop > 0:
                self.ledger.drop -= 1
                self.ledger.dropped += 1
                return False  # closed at once, nothing read or written
        return True


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        ledger = self.server.ledger
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        key = self.headers.get("Idempotency-Key", "")
        with ledger.lock:
            ledger.requests += 1
            first = key not in ledger.charges
            ledger.charges.setdefault(key, int(body.get("amount", 0)))
        reply = json.dumps({"charged": ledger.charges[key], "key": key,
                            "repeat": not first}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def flaky_bank() -> Iterator[tuple[str, Ledger]]:
    """The bank's URL and its ledger, for as long as the block lasts."""
    server = _Server(("127.0.0.1", free_port()), _Handler)
    server.ledger = Ledger()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.ledger
    finally:
        server.shutdown()
        server.server_close()
