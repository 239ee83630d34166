"""A local server that speaks Slack's Web API (real HTTP on loopback): it checks the bot
token, records every call, and answers as Slack does (`ok`, a `ts` and `channel` for posts,
`{"ok": false, "error": …}` for an unknown user or channel, or a bad token); and Slack's
side of an interaction: payloads signed with the app's signing secret, as Slack sends them
to `/slack/interactions`."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse

import httpx
import redis
from slack_sdk.signature import SignatureVerifier

from layby.ops.embedded import EmbeddedRedis, free_port
from tests.support.harness import LaybySystem, wait_until
from tests.support.reviewers import (
    ReviewedSystem,
    SmtpServer,
    WebhookReceiver,
    reviewed_system,
    serve_on_loopback,
    stop_serving,
)
from tests.support.reviewers import directory_toml as reviewers_directory

BOT_TOKEN = "xoxb-test-bot-token-never-logged"
SIGNING_SECRET = "slack-signing-secret-never-logged-0123"
ALICE, BOB, MALLORY, STRANGER = "U0ALICE001", "U0BOB00001", "U0MALLORY1", "U0STRANGER"
OPS_CHANNEL = "C0OPS00001"


def directory_toml(hook_url: str) -> str:
    """The reviewer tests' directory (`tests.support.reviewers.directory_toml`), with Slack ids;
    `ops` posts to a channel."""
    text = reviewers_directory(hook_url)
    for who, slack_id in (("alice", ALICE), ("bob", BOB), ("mallory", MALLORY)):
        head = f"[reviewers.{who}]\n"
        at = text.index("\n\n", text.index(head))  # the end of that reviewer's table
        text = f'{text[:at]}\nslack_id = "{slack_id}"{text[at:]}'
    return f'{text}\n[groups.ops]\nmembers = ["bob"]\nslack_channel = "{OPS_CHANNEL}"\n'


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    token: str


@dataclass
class SlackApi:
    """Slack's Web API on loopback, for the users in `users`."""

    users: set[str] = field(default_factory=lambda: {ALICE, BOB, MALLORY, STRANGER})
    channels: set[str] = field(default_factory=lambda: {OPS_CHANNEL})
    token: str = BOT_TOKEN
    port: int = field(default_factory=free_port)
    calls: list[Call] = field(default_factory=list)
    # Answer this many posts with Slack's `internal_error` (a failure worth a retry).
    fail_next: int = 0
    server: ThreadingHTTPServer | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    _ts: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    def start(self) -> SlackApi:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer(parse_qs(urlparse(self.path).query))

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                if "json" in (self.headers.get("content-type") or ""):
                    self._answer(json.loads(raw or b"{}"), parsed=True)
                else:
                    self._answer(parse_qs(raw.decode()))

            def _answer(self, params: Any, parsed: bool = False) -> None:
                if not parsed:
                    params = {k: v[0] for k, v in params.items()}
                    for name in ("blocks", "view"):
                        if isinstance(params.get(name), str):
                            params[name] = json.loads(params[name])
                method = urlparse(self.path).path.rsplit("/", 1)[-1]
                token = (self.headers.get("authorization") or "").removeprefix("Bearer ")
                body = api.reply(method, params, token)
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json; charset=utf-8")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = serve_on_loopback(self.port, Handler)
        return self

    def stop(self) -> None:
        if self.server is not None:
            stop_serving(self.server)
            self.server = None

    def reply(self, method: str, params: dict[str, Any], token: str) -> dict[str, Any]:
        with self.lock:
            self.calls.append(Call(method, params, token))
            if token != self.token:
                return {"ok": False, "error": "invalid_auth"}
            match method:
                case "auth.test":
                    return {"ok": True, "url": "https://layby-test.slack.com/",
                            "team": "layby test", "user": "layby", "team_id": "T0TEST0001",
                            "user_id": "U0LAYBYBOT", "bot_id": "B0LAYBYBOT"}
                case "users.info":
                    if params.get("user") not in self.users:
                        return {"ok": False, "error": "user_not_found"}
                    return {"ok": True, "user": {"id": params["user"], "deleted": False}}
                case "conversations.open":
                    user = str(params.get("users") or "")
                    if user not in self.users:
                        return {"ok": False, "error": "user_not_found"}
                    return {"ok": True, "channel": {"id": "D" + user[1:]}}
                case "chat.postMessage" | "chat.update" | "chat.postEphemeral":
                    if self.fail_next > 0:
                        self.fail_next -= 1
                        return {"ok": False, "error": "internal_error"}
                    channel = str(params.get("channel") or "")
                    if channel not in self.channels and not channel.startswith("D"):
                        return {"ok": False, "error": "channel_not_found"}
                    ts = params.get("ts") or f"{int(time.time())}.{next(self._ts):06d}"
                    if method == "chat.postEphemeral":
                        return {"ok": True, "message_ts": ts}
                    return {"ok": True, "channel": channel, "ts": ts,
                            "message": {"text": params.get("text"), "ts": ts}}
                case "views.open":
                    return {"ok": True, "view": {**params.get("view", {}), "id": "V0VIEW0001"}}
            return {"ok": False, "error": "unknown_method"}

    def of(self, method: str, **match: Any) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.method == method and all(
                c.params.get(k) == v for k, v in match.items())]


def posts(api: SlackApi, run_id: str) -> list[Call]:
    """The request messages posted of a run (not the thread replies)."""
    return [c for c in api.of("chat.postMessage") if "thread_ts" not in c.params
            and run_id in json.dumps(c.params.get("blocks"))]


def wait_post(api: SlackApi, run_id: str, channel: str, timeout: float = 60) -> Call:
    return wait_until(lambda: next((c for c in posts(api, run_id)
                                    if c.params["channel"] == channel), None),
                      timeout, what=f"the Slack message of {run_id} in {channel}")


def signed(body: str, *, secret: str = SIGNING_SECRET, at: float | None = None
           ) -> dict[str, str]:
    """The headers Slack sends with `body`, signed with the app's signing secret."""
    stamp = str(int(time.time() if at is None else at))
    signature = SignatureVerifier(secret).generate_signature(timestamp=stamp, body=body)
    return {"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": signature,
            "Content-Type": "application/x-www-form-urlencoded"}


def interaction(base_url: str, payload: dict[str, Any], *, secret: str = SIGNING_SECRET,
                at: float | None = None, headers: dict[str, str] | None = None
                ) -> httpx.Response:
    """POST `payload` as Slack does, signed (or with the `headers` given)."""
    body = urlencode({"payload": json.dumps(payload)})
    return httpx.post(f"{base_url}/slack/interactions", content=body.encode(),
                      headers=headers or signed(body, secret=secret, at=at), timeout=30)


def click(user: str, action_id: str, run_id: str, interrupt_id: str, *,
          channel: str = "", ts: str = "1.000001") -> dict[str, Any]:
    """A block_actions payload: `user` pressed a button of the request's message."""
    channel = channel or "D" + user[1:]
    return {"type": "block_actions", "user": {"id": user, "username": user.lower()},
            "api_app_id": "A0LAYBY001", "trigger_id": f"trig.{time.monotonic_ns()}",
            "container": {"type": "message", "message_ts": ts, "channel_id": channel},
            "channel": {"id": channel}, "response_url": "https://hooks.slack.invalid/x",
            "actions": [{"type": "button", "action_id": action_id, "block_id": "layby_answer",
                         "value": f"{run_id} {interrupt_id}",
                         "action_ts": f"{time.time():.6f}"}]}


def submission(user: str, view: dict[str, Any], values: dict[str, dict[str, Any]]
               ) -> dict[str, Any]:
    """A view_submission payload: `user` sent the modal `view` with `values` (block id →
    the element's state)."""
    return {"type": "view_submission", "user": {"id": user},
            "view": {"id": "V0VIEW0001", **view, "hash": "h1",
                     "state": {"values": {block: {"value": state}
                                          for block, state in values.items()}}}}


@contextmanager
def slack_reviewed(server: EmbeddedRedis, tmp: Path, db: int, api: SlackApi,
                   **env: str) -> Iterator[ReviewedSystem]:
    """A reviewed system with Slack configured (the Web API at `api`), its directory
    giving reviewers Slack ids, on database `db`; stopped and flushed afterwards."""
    store = redis.Redis(port=server.port, db=db)
    store.flushdb()
    smtp, hooks = SmtpServer().start(), WebhookReceiver().start()
    folder = tmp / f"db{db}"
    system = LaybySystem(f"redis://127.0.0.1:{server.port}/{db}", folder)
    env = {"LAYBY_SLACK_BOT_TOKEN": BOT_TOKEN, "LAYBY_SLACK_SIGNING_SECRET": SIGNING_SECRET,
           "LAYBY_SLACK_API_URL": api.url, "LAYBY_SLACK_TIMEOUT_S": "5", **env}
    folder.mkdir(parents=True, exist_ok=True)
    directory = folder / "slack-reviewers.toml"
    directory.write_text(directory_toml(hooks.url))
    env["LAYBY_REVIEWERS_FILE"] = str(directory)
    try:
        yield reviewed_system(system, folder, smtp, hooks, **env)
    finally:
        system.stop()
        smtp.stop()
        hooks.stop()
        store.flushdb()
        store.close()
