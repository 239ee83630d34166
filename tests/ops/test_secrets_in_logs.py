"""No secret in any log: a layby system with every process at DEBUG (the worker, the
sweeper, the gateway with uvicorn's access log, the reply listener) goes through a reviewer
round trip on every channel (an email reply by SMTP, the inbound-mail webhook, the answer
page, a signed webhook callback, a callback with the mail's token, the API), plus the
refusals that log what they refuse; then every log is searched for every secret it was
given and every reviewer token it issued (the answer page links hold them too)."""

from __future__ import annotations

import base64
import smtplib
from pathlib import Path
from typing import Any

import httpx
import pytest

from layby.ops.embedded import EmbeddedRedis
from tests.answering.test_reviewer_answers import (
    callback_body,
    compose,
    finished,
    hook_token,
    inbound,
    notification,
    post_callback,
    reply,
    reply_address,
    signature_headers,
    token_of,
)
from tests.support.harness import API_KEY, wait_until
from tests.support.reviewers import (
    HOOK_SECRET,
    TOKEN_KEYS,
    ReviewedSystem,
    SmtpServer,
    WebhookReceiver,
    issued_tokens,
    link_in,
    own_reviewed,
)

DB = 14  # the reviewer tests' Valkey server, a database of this module's own
SMTP_LOGIN = ("layby-mailer", "smtp-pass-Zq81-never-logged")
INBOUND_SECRET = "inbound-secret-Hk22-never-logged"


@pytest.fixture
def chatty(reviewer_redis: EmbeddedRedis, tmp_path: Path) -> Any:
    with own_reviewed(reviewer_redis, tmp_path, DB, SmtpServer(login=SMTP_LOGIN).start(),
                      WebhookReceiver().start(), log_level="DEBUG",
                      LAYBY_SMTP_USERNAME=SMTP_LOGIN[0], LAYBY_SMTP_PASSWORD=SMTP_LOGIN[1],
                      LAYBY_INBOUND_MAIL_SECRET=INBOUND_SECRET) as running:
        yield running


def _transfer(reviewed: ReviewedSystem, amount: int) -> tuple[str, Any]:
    run_id = reviewed.start_run("demo.transfer", f"Send {amount} to Bob")["id"]
    reviewed.system.wait_status(run_id, "interrupted", timeout=60)
    # Both reviewers' notifications, before any answer: one answered first would not be
    # sent, and its token would be missing from the search below.
    hook_token(reviewed, run_id)
    return run_id, notification(reviewed, run_id)


def test_no_secret_or_token_in_any_log_at_debug(chatty: ReviewedSystem) -> None:
    reviewed, system = chatty, chatty.system
    base = system.base_url

    # Email reply, by SMTP to the reply listener; then one refused (already answered).
    run_id, mail = _transfer(reviewed, 101)
    reply(reviewed, mail, "approve")
    finished(reviewed, run_id)
    with pytest.raises(smtplib.SMTPRecipientsRefused):
        reply(reviewed, mail, "decline")

    # The inbound-mail webhook, with the provider's secret; and one without it.
    run_id, mail = _transfer(reviewed, 102)
    raw = compose(mail, "approve").as_bytes()
    assert httpx.post(f"{base}/inbound/email", content=raw,
                      params={"to": reply_address(mail)}, timeout=60,
                      headers={"Content-Type": "message/rfc822",
                               "Authorization": f"Bearer {INBOUND_SECRET}"}
                      ).status_code == 200
    assert inbound(reviewed, raw, reply_address(mail)).status_code == 401
    finished(reviewed, run_id)

    # The answer page: opened, answered, opened again; a forged link.
    run_id, mail = _transfer(reviewed, 103)
    page = link_in(mail, "/review/").split("?")[0]
    assert httpx.get(page, timeout=60).status_code == 200
    assert httpx.post(page, data={"decision": "approve"}, timeout=60).status_code == 200
    assert httpx.get(page, timeout=60).status_code == 200
    assert httpx.get(page[:-3] + "xyz", timeout=60).status_code == 403
    finished(reviewed, run_id)

    # A signed webhook callback from hookbot, and its replay.
    run_id, mail = _transfer(reviewed, 104)
    body = callback_body(run_id, mail["X-Layby-Interrupt"], {"approved": True})
    headers = signature_headers(body)
    assert post_callback(reviewed, body, headers).status_code == 200
    assert post_callback(reviewed, body, headers).status_code == 200
    finished(reviewed, run_id)

    # A callback carrying the mail's token; one with the token of another interrupt.
    run_id, mail = _transfer(reviewed, 105)
    body = callback_body(run_id, mail["X-Layby-Interrupt"], {"approved": True},
                         reviewer=None, token=token_of(mail))
    assert post_callback(reviewed, body).status_code == 200
    finished(reviewed, run_id)

    # The API, with its key.
    run_id, mail = _transfer(reviewed, 106)
    assert system.answer(run_id, mail["X-Layby-Interrupt"],
                         payload={"approved": True}).status_code == 200
    finished(reviewed, run_id)

    assert reviewed.smtp.logins >= 6  # the worker logged in to send each notification
    tokens = issued_tokens(reviewed)
    assert len(tokens) >= 12, tokens  # two reviewers (mail, webhook) for six runs
    secrets = {
        "the API key": API_KEY,
        "the SMTP password": SMTP_LOGIN[1],
        "the inbound-mail secret": INBOUND_SECRET,
        "hookbot's webhook secret": HOOK_SECRET,
        "hookbot's webhook key": base64.b64decode(HOOK_SECRET.removeprefix("whsec_")).decode(),
        **{f"token key {kid}": secret for kid, _, secret in
           (pair.partition(":") for pair in TOKEN_KEYS.split(","))},
        **{f"reviewer token {t[:6]}…": t for t in tokens},
    }
    # Every process logged at DEBUG, the gateway's access log on: there is something to
    # search, and the answer page's path is there without its token.
    wait_until(lambda: "/review/<token>" in system.procs["gateway"].output(), 10,
               what="the gateway's access line for the answer page")
    for name in ("worker", "gateway", "replies"):
        assert "DEBUG" in system.procs[name].output(), name
    leaks = [f"{what} in the {name} log: "
             f"{next(line for line in proc.output().splitlines() if secret in line)[:300]}"
             for name, proc in system.procs.items()
             for what, secret in secrets.items() if secret in proc.output()]
    assert not leaks, "\n".join(leaks)
