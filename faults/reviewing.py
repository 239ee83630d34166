"""What the reviewer scenarios share: a reviewed layby system of their own with every
process at DEBUG (an SMTP server asking for a login, the inbound-mail webhook behind a
secret, a webhook reviewer), runs parked on their approval, and each way one is answered
(the API, the answer page, the inbound-mail webhook, an SMTP reply, a callback carrying
Alice's or hookbot's token, a callback signed by hookbot, Alice's Slack answer modal, signed
as Slack signs it, against a local server speaking Slack's Web API, Alice's inbox, signed in
by the link mailed to her), each reporting what it was told."""

from __future__ import annotations

import html
import json
import logging
import re
import smtplib
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path

import httpx

from layby.http.inbox import COOKIE
from layby.ops.embedded import EmbeddedRedis
from tests.answering.test_reviewer_answers import (
    ALICE,
    callback_body,
    compose,
    hook_token,
    notification,
    post_callback,
    reply_address,
    signature_headers,
    smtp_refusal,
    smtp_send,
    token_of,
)
from tests.support import slack
from tests.support.harness import wait_until
from tests.support.reviewers import (
    ReviewedSystem,
    SmtpServer,
    WebhookReceiver,
    link_in,
    own_reviewed,
)

SMTP_LOGIN = ("layby-mailer", "smtp-pass-Rq47-never-logged")
INBOUND_SECRET = "inbound-secret-Vt93-never-logged"
# The keys file's keys (LAYBY_KEYS_FILE), beside LAYBY_API_KEYS' (every right, `default`):
# a service that starts transfers, a second key of its tenant that approves them, a key
# that only reads, and another tenant's.
KEYS = {"shop": "lby_shop-Kx81-never-logged", "checker": "lby_checker-Pz27-never-logged",
        "reader": "lby_reader-Wd56-never-logged", "rival": "lby_rival-Hm33-never-logged"}
KEYS_FILE = f'''
[keys.shop]
secret = "{KEYS["shop"]}"
tenant = "acme"

[keys.checker]
secret = "{KEYS["checker"]}"
tenant = "acme"
can = ["read", "approve"]

[keys.reader]
secret = "{KEYS["reader"]}"
tenant = "acme"
can = ["read"]

[keys.rival]
secret = "{KEYS["rival"]}"
tenant = "rival"
'''


@contextmanager
def reviewed(folder: Path) -> Iterator[ReviewedSystem]:
    """A started reviewed system on a Valkey of its own, every process at DEBUG (the most
    a log can say), stopped with its SMTP server and webhook receiver afterwards."""
    # aiosmtpd warns of its own deprecated attribute at each login: noise in the report.
    logging.getLogger("mail.log").setLevel(logging.ERROR)
    server = EmbeddedRedis(folder / "valkey").start()
    api = slack.SlackApi().start()
    hooks = WebhookReceiver().start()
    directory = folder / "slack-reviewers.toml"
    directory.write_text(slack.directory_toml(hooks.url))
    keys = folder / "keys.toml"
    keys.write_text(KEYS_FILE)
    try:
        with own_reviewed(server, folder, 0, SmtpServer(login=SMTP_LOGIN).start(),
                          hooks, log_level="DEBUG",
                          LAYBY_SMTP_USERNAME=SMTP_LOGIN[0],
                          LAYBY_SMTP_PASSWORD=SMTP_LOGIN[1],
                          LAYBY_INBOUND_MAIL_SECRET=INBOUND_SECRET,
                          LAYBY_REVIEWERS_FILE=str(directory),
                          LAYBY_KEYS_FILE=str(keys),
                          LAYBY_SLACK_BOT_TOKEN=slack.BOT_TOKEN,
                          LAYBY_SLACK_SIGNING_SECRET=slack.SIGNING_SECRET,
                          LAYBY_SLACK_API_URL=api.url) as running:
            yield running
    finally:
        api.stop()
        server.stop()


@dataclass(frozen=True)
class Session:
    """A reviewer signed in to the inbox: the session cookie, and the CSRF token every form
    of their inbox carries."""

    cookie: str
    csrf: str


def sign_in(reviewed: ReviewedSystem, address: str = ALICE) -> Session:
    """Sign in to the inbox as a reviewer does: ask for a link, take it from the mail, press
    Sign in (a POST to the link), then read the CSRF token from the inbox page."""
    base = reviewed.system.base_url

    def links() -> list[EmailMessage]:
        return [m for m in reviewed.smtp.mails_to(address) if "sign-in" in m["Subject"]]

    before = len(links())
    asked = httpx.post(f"{base}/inbox/sign-in", data={"email": address}, timeout=60)
    asked.raise_for_status()
    mail = wait_until(lambda: len(found := links()) > before and found[-1], 60,
                      what=f"the inbox sign-in link mailed to {address}")
    signed = httpx.post(link_in(mail, "/inbox/sign-in/"), timeout=60)
    cookie = signed.cookies.get(COOKIE)
    if signed.status_code != 303 or not cookie:
        raise RuntimeError(f"the inbox sign-in link did not sign {address} in: "
                           f"{signed.status_code} {_reason(signed)}")
    page = httpx.get(f"{base}/inbox", cookies={COOKIE: cookie}, timeout=60)
    csrf = re.search(r'name="_csrf" value="([^"]+)"', page.text)
    if csrf is None:
        raise RuntimeError(f"no inbox for {address}: {page.status_code} {_reason(page)}")
    return Session(cookie, csrf.group(1))


@dataclass(frozen=True)
class Parked:
    """A run waiting on its one approval, with what its reviewers were sent: Alice's mail
    (its token in the reply address and the page link) and hookbot's webhook token; and
    Alice's inbox session, where she was signed in."""

    run_id: str
    interrupt_id: str
    mail: EmailMessage
    hook_token: str
    inbox: Session | None = None

    @property
    def page(self) -> str:
        return link_in(self.mail, "/review/").split("?")[0]


def park(reviewed: ReviewedSystem, count: int, first: int = 1,
         inbox: Session | None = None) -> list[Parked]:
    """`count` demo.transfer runs, each parked on its approval and notified; `inbox`, to
    answer them in the inbox too."""
    ids = [reviewed.start_run("demo.transfer", f"Send {first + i} to Bob")["id"]
           for i in range(count)]
    parked = []
    for run_id in ids:
        reviewed.system.wait_status(run_id, "interrupted", timeout=60)
        mail = notification(reviewed, run_id)
        parked.append(Parked(run_id, mail["X-Layby-Interrupt"], mail,
                             hook_token(reviewed, run_id), inbox))
    return parked


# -- answering ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """One answer sent and what came back. `note` is in the answer's payload, so the
    recorded answer says whose it is; `code` is the HTTP status or the SMTP reply code
    (0: no reply at all); `taken` whether the reply says the answer was recorded."""

    channel: str
    note: str
    code: int
    said: str
    taken: bool


def approve(reviewed: ReviewedSystem, run: Parked, channel: str, note: str) -> Attempt:
    """Approve `run` through `channel`, with `note`."""
    return SENDERS[channel](reviewed, run, note)


def _by_api(reviewed: ReviewedSystem, run: Parked, note: str) -> Attempt:
    return _http("api", note, lambda: reviewed.system.answer(
        run.run_id, run.interrupt_id, payload={"approved": True, "note": note}))


def _by_page(reviewed: ReviewedSystem, run: Parked, note: str) -> Attempt:
    return _http("page", note, lambda: httpx.post(
        run.page, data={"decision": "approve", "note": note}, timeout=60))


def _by_inbound(reviewed: ReviewedSystem, run: Parked, note: str) -> Attempt:
    raw = compose(run.mail, f"approve, {note}").as_bytes()
    return _http("inbound", note, lambda: httpx.post(
        f"{reviewed.system.base_url}/inbound/email", content=raw,
        params={"to": reply_address(run.mail)}, timeout=60,
        headers={"Content-Type": "message/rfc822",
                 "Authorization": f"Bearer {INBOUND_SECRET}"}))


def _by_token_callback(token_of_run: Callable[[Parked], str], name: str
                       ) -> Callable[[ReviewedSystem, Parked, str], Attempt]:
    """A reviewer's system that cannot sign, sending back the token it was given."""
    def send(reviewed: ReviewedSystem, run: Parked, note: str) -> Attempt:
        body = callback_body(run.run_id, run.interrupt_id, {"approved": True, "note": note},
                             reviewer=None, token=token_of_run(run))
        return _http(name, note, lambda: post_callback(reviewed, body))
    return send


def _by_signed_callback(reviewed: ReviewedSystem, run: Parked, note: str) -> Attempt:
    # A webhook-id of its own (not one from the clock, which two threads may read alike):
    # another answer, not a retry of someone else's.
    body = callback_body(run.run_id, run.interrupt_id, {"approved": True, "note": note})
    headers = signature_headers(body, webhook_id=f"msg_{uuid.uuid4().hex}")
    return _http("signed callback", note, lambda: post_callback(reviewed, body, headers))


def _by_smtp(reviewed: ReviewedSystem, run: Parked, note: str) -> Attempt:
    raw = compose(run.mail, f"approve, {note}").as_bytes()
    try:
        said = smtp_send(reviewed.reply_port, raw, ALICE, reply_address(run.mail))
    except (smtplib.SMTPRecipientsRefused, smtplib.SMTPResponseException) as exc:
        code, why = smtp_refusal(exc)
        return Attempt("smtp", note, code, why, False)
    except (smtplib.SMTPException, OSError) as exc:
        return Attempt("smtp", note, 0, repr(exc), False)
    return Attempt("smtp", note, int(said[:3]), said, said.startswith("250 2.0.0 Answer "
                                                                       "recorded"))


def _by_slack_modal(reviewed: ReviewedSystem, run: Parked, note: str) -> Attempt:
    """Alice's Slack answer modal sent with Approve and `note`, signed as Slack signs it.
    Slack's reply is a 200 either way: the modal closes (`clear`), or shows why not."""
    view = {"id": f"V{uuid.uuid4().hex[:10].upper()}",  # a modal of its own, as each is
            "private_metadata": json.dumps({"run": run.run_id, "interrupt": run.interrupt_id}),
            "blocks": [{"type": "input", "block_id": "decision"},
                       {"type": "input", "block_id": "note"}]}
    payload = slack.submission(slack.ALICE, view, {
        "decision": {"type": "radio_buttons", "selected_option": {"value": "approve"}},
        "note": {"type": "plain_text_input", "value": note}})
    try:
        reply = slack.interaction(reviewed.system.base_url, payload)
        shown = reply.json()
    except (httpx.HTTPError, ValueError) as exc:
        return Attempt(SLACK_MODAL, note, 0, repr(exc), False)
    said = "; ".join((shown.get("errors") or {}).values()) or json.dumps(shown)
    return Attempt(SLACK_MODAL, note, reply.status_code, said,
                   reply.status_code == 200 and shown == {"response_action": "clear"})


def _by_inbox(reviewed: ReviewedSystem, run: Parked, note: str) -> Attempt:
    """Alice presses Approve on the request in her inbox, with `note`: her session's cookie
    and the CSRF token of her inbox's forms, as her browser sends them."""
    session = run.inbox
    if session is None:
        raise ValueError("the run was parked without an inbox session: "
                         "park(..., inbox=sign_in(system))")
    form = {"_ref": f"{run.run_id}/{run.interrupt_id}", "_csrf": session.csrf,
            "decision": "approve", "note": note}

    def send() -> httpx.Response:
        # An answer taken redirects to the inbox, which says what was done (the browser
        # follows, the session's cookie with it); one refused is the inbox saying why.
        with httpx.Client(cookies={COOKIE: session.cookie}, timeout=60,
                          follow_redirects=True) as browser:
            return browser.post(f"{reviewed.system.base_url}/inbox/answer", data=form)
    return _http(INBOX, note, send)


SLACK_MODAL, INBOX = "slack modal", "inbox"
SENDERS: dict[str, Callable[[ReviewedSystem, Parked, str], Attempt]] = {
    "api": _by_api, "page": _by_page, "inbound": _by_inbound, "smtp": _by_smtp,
    "mail token callback": _by_token_callback(lambda run: token_of(run.mail),
                                              "mail token callback"),
    "hook token callback": _by_token_callback(lambda run: run.hook_token,
                                              "hook token callback"),
    "signed callback": _by_signed_callback, SLACK_MODAL: _by_slack_modal, INBOX: _by_inbox}
# The ways a reviewer (or their system) answers with an HTTP refusal or an SMTP one, and the
# run's owner through the API; then Slack, whose replies are 200s that say so, and the
# inbox, which needs a reviewer signed in first (`sign_in`).
CHANNELS = tuple(c for c in SENDERS if c not in (SLACK_MODAL, INBOX))
RACING = (*CHANNELS, SLACK_MODAL, INBOX)


def _http(channel: str, note: str, send: Callable[[], httpx.Response]) -> Attempt:
    try:
        reply = send()
    except httpx.HTTPError as exc:
        return Attempt(channel, note, 0, repr(exc), False)
    return Attempt(channel, note, reply.status_code, _reason(reply),
                   200 <= reply.status_code < 300 and not _ignored(reply))


def _ignored(reply: httpx.Response) -> bool:
    """A mail taken and dropped (an automatic reply): a 200 that recorded nothing."""
    try:
        return reply.json().get("ignored") is True  # type: ignore[no-any-return]
    except (ValueError, AttributeError):
        return False


def _reason(reply: httpx.Response) -> str:
    """What a reply says, in one line: a JSON error's message, the answer page's status
    paragraph, the inbox's notice, or the start of the body."""
    try:
        return str(reply.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        pass
    status = re.search(r'<p class="(?:status|ok|errors)"(?: role="\w+")?>(.*?)</p>',
                       reply.text, re.DOTALL)
    text = status.group(1) if status else reply.text
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text)).split())[:300]
