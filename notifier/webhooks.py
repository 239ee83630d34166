"""Webhooks out, per the Standard Webhooks specification: the notification layby POSTs to a
reviewer's system (answers coming back are `layby.answering.callbacks`').

Each notification is sent with its notification id as `webhook-id` (the same on every
retry, so the receiver can drop duplicates), the send time as `webhook-timestamp`, and
`webhook-signature` made with the reviewer's secret.
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from standardwebhooks import Webhook

from layby.broker_config import Settings
from layby.generation.interrupts import Interrupt
from layby.notifier.mail import PermanentFailure, page_url
from layby.reviewers.directory import Reviewer
from layby.wire import Notification, RunView

if TYPE_CHECKING:
    import httpx

USER_AGENT = "layby-webhooks/0.1"


def callback_url(settings: Settings) -> str:
    return f"{settings.public_url.rstrip('/')}/callbacks/answers"


def notification_body(settings: Settings, run: RunView, interrupt: Interrupt,
                      reviewer: Reviewer, note: Notification) -> dict[str, Any]:
    assert note.token is not None
    return {
        "type": {"reminder": "interrupt.reminder", "escalation": "interrupt.escalated"}
        .get(note.kind, "interrupt.requested"),
        "timestamp": datetime.now(UTC).isoformat(timespec="milliseconds")
        .replace("+00:00", "Z"),
        "data": {
            "notificationId": note.id,
            "reviewer": reviewer.id,
            "run": {"id": run.id, "agent": run.agent, "status": run.status.value,
                    "version": run.version},
            "interrupt": Interrupt(**{k: getattr(interrupt, k)
                                      for k in Interrupt.model_fields}).wire(),
            "answer": {
                "callbackUrl": callback_url(settings),
                "token": note.token,
                "pageUrl": page_url(settings, note.token),
                "expiresAt": interrupt.expires_at,
                "how": "POST {runId, interruptId, status: resolved|cancelled, payload, "
                       "metadata} to callbackUrl (or {runId, interruptId, delegateTo} to "
                       "hand the request to another reviewer), signed with your webhook "
                       "secret per Standard Webhooks and with \"reviewer\" set to your id, "
                       "or carrying \"token\".",
            },
        },
    }


def sign(secret: str, webhook_id: str, body: str, at: float | None = None) -> dict[str, str]:
    """The three Standard Webhooks headers for `body`."""
    moment = datetime.fromtimestamp(time.time() if at is None else at, tz=UTC)
    return {"webhook-id": webhook_id,
            "webhook-timestamp": str(int(moment.timestamp())),
            "webhook-signature": Webhook(secret).sign(webhook_id, moment, body)}


def where(url: str) -> str:
    """A webhook URL as errors and logs show it: its path may be a secret (Slack-style)."""
    # httpx here and below, not at the top: with the command-line client it loads when
    # installed (rich, pygments), it cost every worker's start about 70 ms.
    import httpx

    parts = httpx.URL(url)
    return f"{parts.scheme}://{parts.host}" + (f":{parts.port}" if parts.port else "")


_clients: dict[int, httpx.Client] = {}


def _http() -> httpx.Client:
    """The process's HTTP client: connections to receivers are kept and reused (a client a
    send would build a TLS context and open a connection every time). A forked child
    makes its own."""
    import httpx

    found = _clients.get(os.getpid())
    if found is None:
        found = _clients[os.getpid()] = httpx.Client(follow_redirects=False)
    return found


def send(settings: Settings, reviewer: Reviewer, note: Notification,
         body: dict[str, Any]) -> None:
    """POST the notification; any 2xx is delivered. 410 Gone is final; any other failure
    is worth another try (the caller backs off)."""
    assert reviewer.webhook is not None
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    headers = {"content-type": "application/json", "user-agent": USER_AGENT,
               **sign(reviewer.webhook.secret, note.id, text)}
    import httpx

    try:
        reply = _http().post(reviewer.webhook.url, content=text.encode(), headers=headers,
                             timeout=settings.webhook_timeout_s)
    except httpx.HTTPError as exc:
        raise ConnectionError(f"POST to {where(reviewer.webhook.url)} failed: "
                              f"{type(exc).__name__}: {exc}") from exc
    if reply.status_code == 410:
        raise PermanentFailure(f"{where(reviewer.webhook.url)} answered 410 Gone: the receiver "
                               "asks not to be sent to again")
    if not 200 <= reply.status_code < 300:
        raise ConnectionError(f"{where(reviewer.webhook.url)} answered {reply.status_code}: "
                              f"{reply.text[:200]}")
