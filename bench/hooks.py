"""The reviewer of the bench's parked runs (`--parked`): a webhook receiver on loopback that
takes every notification (200) and counts them by their Standard Webhooks id, and the
reviewer directory that names it. With it, a park plans an announcement and its delivery
is a task on the notify queue: the bench checks that a burst of parks queues each once."""

from __future__ import annotations

import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.agents import HOOK_REVIEWER

SECRET = "whsec_YmVuY2gtaG9vay1zZWNyZXQtMzItYnl0ZXMtbG9uZy14eXo="


class Sink:
    """Takes webhook POSTs; `ids` counts them by `webhook-id`."""

    def __init__(self) -> None:
        self.ids: Counter[str] = Counter()
        lock = threading.Lock()
        ids = self.ids

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                with lock:
                    ids[self.headers.get("webhook-id") or "?"] += 1
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def directory(folder: Path, url: str) -> Path:
    """A reviewer directory with the sink as its one reviewer (no default group: runs of
    other agents ask nobody)."""
    path = folder / "reviewers.toml"
    path.write_text(f'[reviewers.{HOOK_REVIEWER}]\n'
                    f'webhook = {{ url = "{url}", secret = "{SECRET}" }}\n')
    return path
