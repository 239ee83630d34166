"""Real parts for the reviewer tests: an SMTP server that receives layby's notifications, a
webhook receiver on loopback that verifies their Standard Webhooks signatures, a reviewer
directory, and a layby system wired to them with its reply listener running."""

from __future__ import annotations

import base64
import email
import email.policy
import json
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import redis
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult
from standardwebhooks import Webhook, WebhookVerificationError

from layby.ops.embedded import EmbeddedRedis, free_port
from tests.support.harness import LaybySystem, wait_until

TOKEN_KEYS = "t2:test-token-key-two-0123456789,t1:test-token-key-one-0123456789"
HOOK_SECRET = "whsec_" + base64.b64encode(b"hookbot-secret-32-bytes-long-xyz").decode()
INBOUND_DOMAIN = "replies.layby.test"


def directory_toml(hook_url: str) -> str:
    return f'''\
default_group = "approvers"

[reviewers.alice]
name = "Alice Martin"
email = "alice@example.com"

[reviewers.bob]
name = "Bob Stone"
email = "bob@example.com"

[reviewers.hookbot]
webhook = {{ url = "{hook_url}", secret = "{HOOK_SECRET}" }}

[reviewers.mallory]
email = "mallory@example.com"

[groups]
approvers = ["alice", "hookbot"]
everyone = ["alice", "bob", "hookbot"]
'''


def serve_on_loopback(port: int, handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """An HTTP server of `handler` on 127.0.0.1:`port`, serving from a thread of its own."""
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop_serving(server: ThreadingHTTPServer) -> None:
    server.shutdown()
    server.server_close()


class _Inbox:
    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []
        self.lock = threading.Lock()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        message = email.message_from_bytes(envelope.original_content or envelope.content,
                                           policy=email.policy.default)
        message["X-Envelope-To"] = ", ".join(envelope.rcpt_tos)
        with self.lock:
            self.messages.append(message)  # type: ignore[arg-type]
        return "250 OK"


@dataclass
class SmtpServer:
    """A real SMTP server (aiosmtpd) that keeps what it receives; it can be stopped and
    started again on the same port, like a mail server going down for a while."""

    port: int = field(default_factory=free_port)
    inbox: _Inbox = field(default_factory=_Inbox)
    controller: Controller | None = None
    # (username, password): the server offers AUTH (in clear, on loopback) and counts the
    # logins that succeeded.
    login: tuple[str, str] | None = None
    logins: int = 0

    def start(self) -> SmtpServer:
        auth: dict[str, Any] = {}
        if self.login is not None:
            auth = {"authenticator": self._check_login, "auth_require_tls": False}
        self.controller = Controller(self.inbox, hostname="127.0.0.1", port=self.port,
                                     **auth)
        self.controller.start()
        return self

    def _check_login(self, server: Any, session: Any, envelope: Any, mechanism: str,
                     auth_data: Any) -> AuthResult:
        given = (auth_data.login.decode(), auth_data.password.decode())
        self.logins += given == self.login
        return AuthResult(success=given == self.login)

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()
            self.controller = None

    @property
    def messages(self) -> list[EmailMessage]:
        with self.inbox.lock:
            return list(self.inbox.messages)

    def mails_to(self, address: str, run_id: str | None = None) -> list[EmailMessage]:
        return [m for m in self.messages if address in m.get("X-Envelope-To", "")
                and (run_id is None or m.get("X-Layby-Run") == run_id)]

    def wait_mail(self, address: str, run_id: str, count: int = 1,
                  timeout: float = 30) -> list[EmailMessage]:
        return wait_until(lambda: len(found := self.mails_to(address, run_id)) >= count
                          and found, timeout, what=f"{count} mail(s) to {address} for {run_id}")


@dataclass
class Delivery:
    headers: dict[str, str]
    body: bytes
    verified: bool
    error: str | None

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class WebhookReceiver:
    """A loopback HTTP server that checks each POST's Standard Webhooks signature with the
    reviewer's secret and records it. `fail_next` makes it answer 503 that many times."""

    secret: str = HOOK_SECRET
    port: int = field(default_factory=free_port)
    deliveries: list[Delivery] = field(default_factory=list)
    fail_next: int = 0
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/layby"

    def start(self) -> WebhookReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    Webhook(receiver.secret).verify(body, headers)
                    verified, error = True, None
                except WebhookVerificationError as exc:
                    verified, error = False, str(exc)
                if receiver.fail_next > 0:
                    receiver.fail_next -= 1
                    self.send_response(503)
                    self.end_headers()
                    return
                receiver.deliveries.append(Delivery(headers, body, verified, error))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = serve_on_loopback(self.port, Handler)
        return self

    def stop(self) -> None:
        if self.server is not None:
            stop_serving(self.server)
            self.server = None

    def for_run(self, run_id: str) -> list[Delivery]:
        return [d for d in self.deliveries if d.json["data"]["run"]["id"] == run_id]

    def wait_for(self, run_id: str, count: int = 1, timeout: float = 30) -> list[Delivery]:
        return wait_until(lambda: len(found := self.for_run(run_id)) >= count and found,
                          timeout, what=f"{count} webhook(s) for {run_id}")


@dataclass
class ReviewedSystem:
    """A layby system with a reviewer directory, sending mail to `smtp` and webhooks to
    `hooks`, its reply listener on `reply_port`."""

    system: LaybySystem
    smtp: SmtpServer
    hooks: WebhookReceiver
    reply_port: int

    def start_run(self, agent: str, text: str, **extra: Any) -> dict[str, Any]:
        return self.system.start_run(agent, text, **extra)

    def parked(self, run_id: str) -> dict[str, Any]:
        return self.system.wait_status(run_id, "interrupted")


def reviewed_system(system: LaybySystem, tmp: Path, smtp: SmtpServer,
                    hooks: WebhookReceiver, **env: str) -> ReviewedSystem:
    """Configure `system` (not started) for reviewers, start it and its reply listener."""
    tmp.mkdir(parents=True, exist_ok=True)
    directory = tmp / "reviewers.toml"
    directory.write_text(directory_toml(hooks.url))
    system.port = system.port or free_port()
    reply_port = free_port()
    system.env_overrides.update({
        "LAYBY_REVIEWERS_FILE": str(directory),
        "LAYBY_TOKEN_KEYS": TOKEN_KEYS,
        "LAYBY_PUBLIC_URL": f"http://127.0.0.1:{system.port}",
        "LAYBY_SMTP_HOST": "127.0.0.1",
        "LAYBY_SMTP_PORT": str(smtp.port),
        "LAYBY_SMTP_TIMEOUT_S": "5",
        "LAYBY_INBOUND_DOMAIN": INBOUND_DOMAIN,
        "LAYBY_REPLY_LISTENER_PORT": str(reply_port),
        "LAYBY_NOTIFY_BACKOFF_S": "0.5",
        "LAYBY_NOTIFY_BACKOFF_MAX_S": "2",
        "LAYBY_WEBHOOK_TIMEOUT_S": "3",
        **env,
    })
    system.start()
    listener = system._start("replies", [sys.executable, "-m", "layby.ops.cli",
                                         "reply-listener"])
    wait_until(lambda: "listening" in listener.output(), 30, what="the reply listener")
    return ReviewedSystem(system, smtp, hooks, reply_port)


def link_in(message: EmailMessage, word: str) -> str:
    """The first link in the mail's text that contains `word`."""
    text = message.get_body(preferencelist=("plain",)).get_content()  # type: ignore[union-attr]
    for token in text.split():
        if token.startswith("http") and word in token:
            return token
    raise AssertionError(f"no link with {word!r} in:\n{text}")


def wait_gone(check: Callable[[], bool], seconds: float) -> None:
    """Assert `check` stays false for `seconds` (nothing more arrives)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert not check()
        time.sleep(0.1)


@contextmanager
def own_reviewed(server: EmbeddedRedis, tmp: Path, db: int, smtp: SmtpServer,
                 hooks: WebhookReceiver, log_level: str | None = None,
                 **env: str) -> Iterator[ReviewedSystem]:
    """A reviewed system of its own on database `db`, stopped (with its SMTP server and
    webhook receiver) and flushed afterwards."""
    store = redis.Redis(port=server.port, db=db)
    store.flushdb()
    system = LaybySystem(f"redis://127.0.0.1:{server.port}/{db}", tmp / f"db{db}",
                         log_level=log_level)
    try:
        yield reviewed_system(system, tmp / f"db{db}", smtp, hooks, **env)
    finally:
        system.stop()
        smtp.stop()
        hooks.stop()
        store.flushdb()
        store.close()


def issued_tokens(system: ReviewedSystem) -> set[str]:
    """Every token layby sent out: in its mails' reply addresses and page links, and in
    its webhook notifications."""
    found: set[str] = set()
    for mail in system.smtp.messages:
        text = mail.as_string()
        found |= set(re.findall(r"reply\+([a-z0-9-]+)@", text))
        found |= set(re.findall(r"/review/([A-Za-z0-9_-]+)", text))
    for delivery in system.hooks.deliveries:
        body = json.dumps(delivery.json)
        found |= set(re.findall(r'"token": "([^"]+)"', body))
        found |= set(re.findall(r"/review/([A-Za-z0-9_-]+)", body))
    return found
