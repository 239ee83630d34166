"""Reviewers answering runs the way they really do, end to end over real parts: a reply to
the notification mail sent to layby's SMTP reply listener, the same reply POSTed by a mail
provider to the inbound-mail webhook (raw MIME, or a SendGrid-style form), and a signed
webhook callback from a reviewer's system. Then the refusals: forged, unknown, expired and
reused tokens, the wrong sender, bad signatures, replays, malformed and unreadable mail;
each says why, records nothing, and leaves the run answerable.

What is checked is what a user sees: the run's status and result, the answer recorded on
the interrupt (who, which channel, when), the run's event stream, and mail coming back.
"""

from __future__ import annotations

import html
import json
import re
import smtplib
import time
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from email.utils import formatdate, make_msgid, parseaddr
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook

from layby.ops.embedded import EmbeddedRedis
from tests.support.harness import wait_until
from tests.support.reviewers import (
    HOOK_SECRET,
    INBOUND_DOMAIN,
    ReviewedSystem,
    SmtpServer,
    WebhookReceiver,
    link_in,
    own_reviewed,
    wait_gone,
)
from tests.support.sse import history

ALICE = "alice@example.com"
MALLORY = "mallory@example.com"
EXPIRY_DB = 9  # the expiry test's own system, on the reviewer tests' Valkey server


# -- reading what layby sent ---------------------------------------------------------------


def parked(reviewed: ReviewedSystem, run_id: str) -> dict[str, Any]:
    return reviewed.system.wait_status(run_id, "interrupted", timeout=60)


def open_ids(reviewed: ReviewedSystem, run_id: str) -> list[str]:
    return [i["id"] for i in reviewed.system.open_interrupts(parked(reviewed, run_id))]


def notification(reviewed: ReviewedSystem, run_id: str, interrupt_id: str | None = None,
                 to: str = ALICE) -> EmailMessage:
    """The mail `to` received about the run's interrupt (its only open one by default)."""
    if interrupt_id is None:
        (interrupt_id,) = open_ids(reviewed, run_id)
    return wait_until(lambda: next((m for m in reviewed.smtp.mails_to(to, run_id)
                                    if m["X-Layby-Interrupt"] == interrupt_id), None),
                      60, what=f"the mail to {to} about {interrupt_id}")


def text_of(mail: EmailMessage) -> str:
    return mail.get_body(preferencelist=("plain",)).get_content()  # type: ignore[union-attr]


def reply_address(mail: EmailMessage) -> str:
    return parseaddr(str(mail["Reply-To"]))[1]


def token_of(mail: EmailMessage) -> str:
    local = reply_address(mail).partition("@")[0]
    assert local.startswith("reply+"), local
    return local.removeprefix("reply+")


def forged(token: str) -> str:
    """The token with one character of its signature changed."""
    kid, ref, signature = token.split("-")
    return f"{kid}-{ref}-{signature[:-1]}{'a' if signature[-1] != 'a' else 'b'}"


def unknown_ref(token: str) -> str:
    """A well-formed token naming a grant layby never issued."""
    kid, _, signature = token.split("-")
    return f"{kid}-{'a' * 16}-{signature}"


def hook_token(reviewed: ReviewedSystem, run_id: str) -> str:
    """The token in hookbot's webhook notification for the run."""
    return reviewed.hooks.wait_for(run_id, timeout=60)[0].json["data"]["answer"]["token"]


def mail_back(reviewed: ReviewedSystem, reply_id: str, to: str = ALICE) -> EmailMessage:
    """layby's answer to the reply with Message-ID `reply_id` (sent through its SMTP server)."""
    return wait_until(lambda: next((m for m in reviewed.smtp.mails_to(to)
                                    if m["In-Reply-To"] == reply_id), None),
                      60, what=f"a mail back to {to} about {reply_id}")


# -- replying as a mail client does --------------------------------------------------------


def compose(mail: EmailMessage, text: str, *, sender: str | None = None,
            to: str | None = None, style: str = "gmail") -> EmailMessage:
    """A reply to `mail` with `text` on top and the original quoted below it, as Gmail
    ("On …, … wrote:" and "> " lines) or Outlook (a rule and a From/Sent/To header block)
    write one. From the mail's recipient unless `sender`, to its Reply-To unless `to`."""
    original = text_of(mail)
    message = EmailMessage()
    message["From"] = sender or str(mail["To"])
    message["To"] = to or str(mail["Reply-To"])
    message["Subject"] = f"Re: {mail['Subject']}"
    message["Date"] = formatdate(localtime=False)
    message["Message-ID"] = make_msgid(domain="mail.example.com")
    message["In-Reply-To"] = mail["Message-ID"]
    message["References"] = mail["Message-ID"]
    if style == "gmail":
        quoted = "\n".join(f"> {line}".rstrip() for line in original.splitlines())
        body = (f"{text}\n\nOn {mail['Date']}, {mail['From']} wrote:\n\n{quoted}\n")
    else:
        body = (f"{text}\n\n{'_' * 32}\nFrom: {mail['From']}\nSent: {mail['Date']}\n"
                f"To: {mail['To']}\nSubject: {mail['Subject']}\n\n{original}\n")
    message.set_content(body)
    return message


def smtp_send(port: int, raw: bytes, sender: str, recipient: str) -> str:
    """One SMTP conversation with the reply listener; the server's final reply, or the
    exceptions `smtplib.sendmail` raises for a refused recipient or message. Lines end in
    CRLF on the wire, as mail clients send them."""
    raw = re.sub(rb"\r?\n", b"\r\n", raw)
    with smtplib.SMTP("127.0.0.1", port, timeout=60) as smtp:
        smtp.ehlo("mail.example.com")
        smtp.mail(sender)
        code, why = smtp.rcpt(recipient)
        if code not in (250, 251):
            smtp.rset()
            raise smtplib.SMTPRecipientsRefused({recipient: (code, why)})
        code, why = smtp.data(raw)
        if code != 250:
            smtp.rset()
            raise smtplib.SMTPDataError(code, why)
        return f"{code} {why.decode()}"


def reply(reviewed: ReviewedSystem, mail: EmailMessage, text: str, *,
          sender: str | None = None, to: str | None = None, style: str = "gmail") -> str:
    """Reply to `mail` by SMTP to layby's reply listener; returns the server's reply."""
    message = compose(mail, text, sender=sender, to=to, style=style)
    envelope_from = parseaddr(str(message["From"]))[1]
    envelope_to = parseaddr(str(message["To"]))[1]
    return smtp_send(reviewed.reply_port, message.as_bytes(), envelope_from, envelope_to)


def smtp_refusal(exc: smtplib.SMTPException) -> tuple[int, str]:
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        code, why = next(iter(exc.recipients.values()))
        return code, why.decode()
    assert isinstance(exc, smtplib.SMTPResponseException)
    return exc.smtp_code, exc.smtp_error.decode()


def inbound(reviewed: ReviewedSystem, raw: bytes, to: str | None) -> httpx.Response:
    """A mail provider POSTing a received reply as raw MIME to /inbound/email."""
    return httpx.post(f"{reviewed.system.base_url}/inbound/email", content=raw,
                      params={"to": to} if to else None,
                      headers={"Content-Type": "message/rfc822"}, timeout=60)


# -- webhook callbacks ---------------------------------------------------------------------


def callback_body(run_id: str, interrupt_id: str, payload: Any, *, status: str = "resolved",
                  reviewer: str | None = "hookbot", token: str | None = None) -> str:
    body: dict[str, Any] = {"runId": run_id, "interruptId": interrupt_id, "status": status,
                            "payload": payload}
    if reviewer is not None:
        body["reviewer"] = reviewer
    if token is not None:
        body["token"] = token
    return json.dumps(body)


def signature_headers(body: str, *, secret: str = HOOK_SECRET, webhook_id: str | None = None,
                      at: datetime | None = None) -> dict[str, str]:
    """Standard Webhooks headers for `body`, signed with `secret`."""
    webhook_id = webhook_id or f"msg_{time.time_ns()}"
    at = at or datetime.now(UTC)
    return {"webhook-id": webhook_id, "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": Webhook(secret).sign(webhook_id, at, body)}


def post_callback(reviewed: ReviewedSystem, body: str,
                  headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(f"{reviewed.system.base_url}/callbacks/answers", content=body,
                      headers={"Content-Type": "application/json", **(headers or {})},
                      timeout=60)


def signed_callback(reviewed: ReviewedSystem, run_id: str, interrupt_id: str, payload: Any,
                    **sign: Any) -> httpx.Response:
    """hookbot's system answering, signed with its webhook secret."""
    body = callback_body(run_id, interrupt_id, payload)
    return post_callback(reviewed, body, signature_headers(body, **sign))


def error_of(response: httpx.Response) -> str:
    return response.json()["error"]["message"]


# -- what the user checks ------------------------------------------------------------------


def finished(reviewed: ReviewedSystem, run_id: str) -> dict[str, Any]:
    return reviewed.system.wait_status(run_id, "completed", "failed", "cancelled", timeout=60)


def interrupt_of(run: dict[str, Any], interrupt_id: str) -> dict[str, Any]:
    return next(i for i in run["interrupts"] if i["id"] == interrupt_id)


def answered_events(reviewed: ReviewedSystem, run_id: str) -> list[dict[str, Any]]:
    return [e["data"]["data"] for e in history(reviewed.system, run_id)
            if e["event"] == "interrupt.answered"]


def assert_answered(reviewed: ReviewedSystem, run_id: str, interrupt_id: str, *,
                    by: str = "reviewer:alice", channel: str = "email") -> dict[str, Any]:
    """The interrupt's recorded answer says who gave it, how and when, and the event stream
    says the same; returns the answer."""
    answer = interrupt_of(reviewed.system.run(run_id), interrupt_id)["answer"]
    assert (answer["answeredBy"], answer["channel"]) == (by, channel), answer
    answered_at = datetime.fromisoformat(answer["answeredAt"].replace("Z", "+00:00"))
    assert abs((datetime.now(UTC) - answered_at).total_seconds()) < 300
    events = [e for e in answered_events(reviewed, run_id) if e["interruptId"] == interrupt_id]
    assert len(events) == 1, events
    assert (events[0]["answeredBy"], events[0]["channel"], events[0]["answeredAt"]) == \
        (by, channel, answer["answeredAt"])
    return answer


def assert_untouched(reviewed: ReviewedSystem, run_id: str) -> None:
    """Nothing was recorded: the run still waits, every interrupt open and unanswered, and
    no interrupt.answered event."""
    run = reviewed.system.run(run_id)
    assert run["status"] == "interrupted", run
    assert all(i["state"] == "open" and "answer" not in i for i in run["interrupts"])
    assert answered_events(reviewed, run_id) == []


def expiry_of(reviewed: ReviewedSystem, run_id: str) -> datetime:
    (intr,) = reviewed.system.open_interrupts(parked(reviewed, run_id))
    return datetime.fromisoformat(intr["expiresAt"].replace("Z", "+00:00"))


def transfers_of(reviewed: ReviewedSystem, run_id: str) -> list[dict[str, Any]]:
    return [t for t in reviewed.system.ledger().get("transfers", []) if t.get("run") == run_id]


def start(reviewed: ReviewedSystem, agent: str, text: str = "go") -> str:
    run_id = reviewed.start_run(agent, text)["id"]
    parked(reviewed, run_id)
    return run_id


# == A. every demo agent answered by email reply ==========================================


def test_trivia_answered_by_replying_with_the_answer(reviewed: ReviewedSystem) -> None:
    """Alice replies "Jaws" above the quoted question; the run says she was right and the
    answer is recorded as hers, by email, in the run and in its events."""
    run_id = start(reviewed, "demo.trivia")
    mail = notification(reviewed, run_id)
    assert "1. Jaws" in text_of(mail)  # the mail says how to answer by reply
    assert reply_address(mail).endswith(f"@{INBOUND_DOMAIN}")
    assert reviewed.smtp.mails_to("bob@example.com", run_id) == []  # not in "approvers"

    assert reply(reviewed, mail, "Jaws").startswith(f"250 2.0.0 Answer recorded for run {run_id}")

    done = finished(reviewed, run_id)
    assert (done["status"], done["result"]) == ("completed", "Right! It was Jaws (1975).")
    answer = assert_answered(reviewed, run_id, mail["X-Layby-Interrupt"])
    assert answer["payload"] == "Jaws"


def test_trivia_answered_with_a_choice_number_from_outlook(reviewed: ReviewedSystem) -> None:
    """The mail numbers the choices; replying "1" (from Outlook, original below a rule)
    picks Jaws."""
    run_id = start(reviewed, "demo.trivia")
    mail = notification(reviewed, run_id)

    reply(reviewed, mail, "1", style="outlook")

    done = finished(reviewed, run_id)
    assert done["result"] == "Right! It was Jaws (1975)."
    assert assert_answered(reviewed, run_id, mail["X-Layby-Interrupt"])["payload"] == "Jaws"


def test_transfer_approved_by_reply_sends_the_money_with_the_note(
        reviewed: ReviewedSystem) -> None:
    """"approve, looks fine" approves the transfer, the money moves once, and the rest of
    the line is kept as the note."""
    run_id = start(reviewed, "demo.transfer", "Send 250 to Bob")
    mail = notification(reviewed, run_id)
    assert "approve" in text_of(mail)

    reply(reviewed, mail, "approve, looks fine")

    done = finished(reviewed, run_id)
    assert (done["status"], done["result"]) == ("completed", "Sent 250 to Bob.")
    answer = assert_answered(reviewed, run_id, mail["X-Layby-Interrupt"])
    assert answer["payload"] == {"approved": True, "note": "looks fine"}
    assert [(t["to"], t["amount"]) for t in transfers_of(reviewed, run_id)] == [("Bob", 250)]


def test_transfer_declined_by_reply_sends_nothing(reviewed: ReviewedSystem) -> None:
    """"decline: too much" declines: the run ends saying no money was sent, and none was."""
    run_id = start(reviewed, "demo.transfer", "Send 900 to Bob")
    mail = notification(reviewed, run_id)

    reply(reviewed, mail, "decline: too much")

    done = finished(reviewed, run_id)
    assert done["status"] == "completed"
    assert "no money was sent" in done["result"]
    answer = assert_answered(reviewed, run_id, mail["X-Layby-Interrupt"])
    assert answer["payload"] == {"approved": False, "note": "too much"}
    assert transfers_of(reviewed, run_id) == []


def test_parallel_two_mails_both_answered_by_reply(reviewed: ReviewedSystem) -> None:
    """One turn asks a question and a confirmation: Alice gets a mail for each, and the run
    resumes only once she has replied to both."""
    run_id = start(reviewed, "demo.parallel")
    # Both come from one turn: their order in the run says nothing, their reasons do.
    by_reason = {i["reason"]: i["id"]
                 for i in reviewed.system.open_interrupts(parked(reviewed, run_id))}
    question_id, confirmation_id = by_reason["input_required"], by_reason["confirmation"]
    question = notification(reviewed, run_id, question_id)
    confirmation = notification(reviewed, run_id, confirmation_id)
    assert question["Reply-To"] != confirmation["Reply-To"]

    reply(reviewed, question, "savings")
    assert_answered(reviewed, run_id, question_id)
    run = reviewed.system.run(run_id)
    assert run["status"] == "interrupted"
    assert interrupt_of(run, confirmation_id)["state"] == "open"

    reply(reviewed, confirmation, "yes")

    done = finished(reviewed, run_id)
    assert done["result"] == "Paying from savings; transfer sent; balance was 1000."
    assert_answered(reviewed, run_id, confirmation_id)


def test_bbq_three_questions_each_mailed_and_answered_by_reply(
        reviewed: ReviewedSystem) -> None:
    """Each question the agent asks after a reply comes as a new mail; three replies later
    the plan uses all three answers."""
    run_id = start(reviewed, "demo.bbq")
    asked = []
    for answer in ("12", "vegan", "gas"):
        (interrupt_id,) = wait_until(lambda: reviewed.system.run(run_id)["status"] ==
                                     "interrupted" and [i for i in open_ids(reviewed, run_id)
                                                        if i not in asked],
                                     60, what="the next question")
        mail = notification(reviewed, run_id, interrupt_id)
        asked.append(interrupt_id)
        reply(reviewed, mail, answer)

    done = finished(reviewed, run_id)
    assert done["result"].startswith("BBQ plan: 12 guests, vegan menu, on a gas grill")
    assert len(reviewed.smtp.mails_to(ALICE, run_id)) == 3
    for interrupt_id in asked:
        assert_answered(reviewed, run_id, interrupt_id)


def test_expiring_approval_replied_before_it_expires(reviewed: ReviewedSystem) -> None:
    """The mail says when the request expires; approving by reply before then deploys."""
    run_id = start(reviewed, "demo.expiring")
    mail = notification(reviewed, run_id)
    assert "This request expires at" in text_of(mail)

    reply(reviewed, mail, "Approve")

    done = finished(reviewed, run_id)
    assert (done["status"], done["result"]) == ("completed", "Deployed v2.0.")
    assert_answered(reviewed, run_id, mail["X-Layby-Interrupt"])


def test_background_report_mails_nobody_and_completes_by_itself(
        reviewed: ReviewedSystem) -> None:
    """A background job is not a question for a reviewer: no mail, no webhook, and the run
    completes when the job is done."""
    run_id = reviewed.start_run("demo.report", "quarterly churn")["id"]
    done = finished(reviewed, run_id)
    assert done["status"] == "completed"
    assert done["result"].startswith("Report on quarterly churn")
    wait_gone(lambda: bool([m for m in reviewed.smtp.messages
                            if m["X-Layby-Run"] == run_id] or reviewed.hooks.for_run(run_id)),
              2)
    assert done.get("notifications", []) == []


def test_an_html_only_reply_with_an_accented_note(reviewed: ReviewedSystem) -> None:
    """Gmail's HTML reply (no text part; the original in a blockquote) with a non-ASCII
    note: the approval is read and the note kept as written."""
    run_id = start(reviewed, "demo.transfer", "Send 30 to Zoë")
    mail = notification(reviewed, run_id)
    message = compose(mail, "")
    original = "<br>".join(html.escape(line) for line in text_of(mail).splitlines())
    message.set_content(
        '<div dir="ltr">Approve — très bien, merci</div><br><div class="gmail_quote">'
        f'<div dir="ltr" class="gmail_attr">On {html.escape(str(mail["Date"]))}, '
        f'{html.escape(str(mail["From"]))} wrote:<br></div><blockquote class="gmail_quote">'
        f"{original}</blockquote></div>", subtype="html")

    smtp_send(reviewed.reply_port, message.as_bytes(), ALICE, reply_address(mail))

    assert finished(reviewed, run_id)["status"] == "completed"
    answer = assert_answered(reviewed, run_id, mail["X-Layby-Interrupt"])
    assert answer["payload"] == {"approved": True, "note": "très bien, merci"}


# == B. the same replies through the inbound-mail webhook =================================


def test_transfer_approved_through_the_inbound_mail_webhook(reviewed: ReviewedSystem) -> None:
    """A provider POSTs the raw reply (message/rfc822, recipient in ?to=): the answer is
    recorded as Alice's email reply and the transfer goes through."""
    run_id = start(reviewed, "demo.transfer", "Send 250 to Bob")
    mail = notification(reviewed, run_id)

    got = inbound(reviewed, compose(mail, "approve").as_bytes(), reply_address(mail))

    assert got.status_code == 200, got.text
    assert got.json() == {"runId": run_id, "interruptId": mail["X-Layby-Interrupt"],
                          "reviewer": "alice", "resumed": True}
    assert finished(reviewed, run_id)["result"] == "Sent 250 to Bob."
    assert_answered(reviewed, run_id, mail["X-Layby-Interrupt"])


def test_trivia_answered_through_the_inbound_mail_webhook(reviewed: ReviewedSystem) -> None:
    """A wrong answer by inbound mail is still an answer: the run says what Alice said."""
    run_id = start(reviewed, "demo.trivia")
    mail = notification(reviewed, run_id)

    got = inbound(reviewed, compose(mail, "Alien", style="outlook").as_bytes(),
                  reply_address(mail))

    assert got.status_code == 200, got.text
    done = finished(reviewed, run_id)
    assert "you said Alien" in done["result"]
    assert assert_answered(reviewed, run_id, mail["X-Layby-Interrupt"])["payload"] == "Alien"


def test_sendgrid_style_form_answers(reviewed: ReviewedSystem) -> None:
    """SendGrid's Inbound Parse with "POST the raw, full MIME message": a multipart form
    with the mail in `email` and the recipients in the `envelope` JSON."""
    run_id = start(reviewed, "demo.trivia")
    mail = notification(reviewed, run_id)
    raw = compose(mail, "Jaws").as_string()
    envelope = json.dumps({"to": [reply_address(mail)], "from": ALICE})

    got = httpx.post(f"{reviewed.system.base_url}/inbound/email",
                     data={"envelope": envelope, "from": ALICE, "subject": "Re: trivia",
                           "charsets": json.dumps({"to": "UTF-8"})},
                     files={"email": (None, raw)}, timeout=60)

    assert got.status_code == 200, got.text
    assert finished(reviewed, run_id)["result"] == "Right! It was Jaws (1975)."
    assert_answered(reviewed, run_id, mail["X-Layby-Interrupt"])


# == C. webhook callbacks =================================================================


def test_hookbot_approves_a_transfer_with_a_signed_callback(reviewed: ReviewedSystem) -> None:
    """hookbot's system gets a signed notification and answers with a callback signed with
    the same secret: the transfer goes through, recorded as hookbot's, by webhook."""
    run_id = start(reviewed, "demo.transfer", "Send 250 to Bob")
    delivery = reviewed.hooks.wait_for(run_id, timeout=60)[0]
    assert delivery.verified, delivery.error
    interrupt_id = delivery.json["data"]["interrupt"]["id"]

    got = signed_callback(reviewed, run_id, interrupt_id, {"approved": True, "note": "bot ok"})

    assert got.status_code == 200, got.text
    # The reviewer's system hears of its own answer, not of the run's history.
    assert got.json()["resumed"] is True
    assert (got.json()["runId"], got.json()["interruptId"]) == (run_id, interrupt_id)
    assert got.json()["answer"]["answeredBy"] == "reviewer:hookbot"
    assert "messages" not in got.text and "Send 250 to Bob" not in got.text
    done = finished(reviewed, run_id)
    assert (done["status"], done["result"]) == ("completed", "Sent 250 to Bob.")
    answer = assert_answered(reviewed, run_id, interrupt_id, by="reviewer:hookbot",
                             channel="webhook")
    assert answer["payload"] == {"approved": True, "note": "bot ok"}


def test_callback_with_the_notification_token_instead_of_a_signature(
        reviewed: ReviewedSystem) -> None:
    """A system that cannot sign sends back the token from the notification's body."""
    run_id = start(reviewed, "demo.transfer", "Send 75 to Dan")
    (interrupt_id,) = open_ids(reviewed, run_id)
    body = callback_body(run_id, interrupt_id, {"approved": True}, reviewer=None,
                         token=hook_token(reviewed, run_id))

    got = post_callback(reviewed, body)

    assert got.status_code == 200, got.text
    assert finished(reviewed, run_id)["result"] == "Sent 75 to Dan."
    assert_answered(reviewed, run_id, interrupt_id, by="reviewer:hookbot", channel="webhook")


def test_trivia_answered_by_callback(reviewed: ReviewedSystem) -> None:
    run_id = start(reviewed, "demo.trivia")
    (interrupt_id,) = open_ids(reviewed, run_id)
    reviewed.hooks.wait_for(run_id, timeout=60)

    got = signed_callback(reviewed, run_id, interrupt_id, "Star Wars")

    assert got.status_code == 200, got.text
    assert "you said Star Wars" in finished(reviewed, run_id)["result"]
    assert_answered(reviewed, run_id, interrupt_id, by="reviewer:hookbot", channel="webhook")


# == D. refusals ==========================================================================


def test_forged_token_in_the_reply_address_is_refused(reviewed: ReviewedSystem) -> None:
    """A reply to an address whose token signature was changed is refused at RCPT, before
    any data is sent (550, saying the token was altered); a reply to the real address then
    works."""
    run_id = start(reviewed, "demo.transfer", "Send 250 to Bob")
    mail = notification(reviewed, run_id)
    fake = f"reply+{forged(token_of(mail))}@{INBOUND_DOMAIN}"

    with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
        reply(reviewed, mail, "approve", to=fake)

    code, why = smtp_refusal(refused.value)
    assert code == 550 and "altered or forged" in why, why
    assert_untouched(reviewed, run_id)
    reply(reviewed, mail, "approve")
    assert finished(reviewed, run_id)["result"] == "Sent 250 to Bob."


def test_forged_token_in_the_page_url_is_refused(reviewed: ReviewedSystem) -> None:
    """The answer page of a forged link shows why and takes no answer (403)."""
    run_id = start(reviewed, "demo.trivia")
    mail = notification(reviewed, run_id)
    page = link_in(mail, "/review/")
    fake = page.replace(token_of(mail), forged(token_of(mail)))
    assert fake != page

    shown = httpx.get(fake, timeout=60)
    posted = httpx.post(fake, data={"payload": "Jaws"}, timeout=60)

    for response in (shown, posted):
        assert response.status_code == 403
        assert "altered or forged" in response.text
    assert_untouched(reviewed, run_id)
    assert httpx.get(page, timeout=60).status_code == 200  # the real link still works


def test_forged_token_in_a_callback_is_refused(reviewed: ReviewedSystem) -> None:
    run_id = start(reviewed, "demo.transfer", "Send 250 to Bob")
    (interrupt_id,) = open_ids(reviewed, run_id)
    body = callback_body(run_id, interrupt_id, {"approved": True}, reviewer=None,
                         token=forged(hook_token(reviewed, run_id)))

    got = post_callback(reviewed, body)

    assert got.status_code == 403
    assert "altered or forged" in error_of(got)
    assert_untouched(reviewed, run_id)


def test_unknown_token_is_refused_by_reply_and_by_inbound_mail(
        reviewed: ReviewedSystem) -> None:
    """A well-formed token that layby never issued: "unknown or has expired"."""
    run_id = start(reviewed, "demo.trivia")
    mail = notification(reviewed, run_id)
    fake = f"reply+{unknown_ref(token_of(mail))}@{INBOUND_DOMAIN}"

    with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
        reply(reviewed, mail, "Jaws", to=fake)
    got = inbound(reviewed, compose(mail, "Jaws", to=fake).as_bytes(), fake)

    assert "unknown or has expired" in smtp_refusal(refused.value)[1]
    assert got.status_code == 403 and "unknown or has expired" in error_of(got)
    assert_untouched(reviewed, run_id)


def test_garbage_reply_addresses_are_refused(reviewed: ReviewedSystem) -> None:
    """`reply+nothing@…` holds no token (550 at RCPT); an address that is not a reply
    address at all is refused at RCPT."""
    run_id = start(reviewed, "demo.trivia")
    mail = notification(reviewed, run_id)

    with pytest.raises(smtplib.SMTPRecipientsRefused) as no_token:
        reply(reviewed, mail, "Jaws", to=f"reply+nothing@{INBOUND_DOMAIN}")
    with pytest.raises(smtplib.SMTPRecipientsRefused) as not_reply:
        reply(reviewed, mail, "Jaws", to=f"layby@{INBOUND_DOMAIN}")

    code, why = smtp_refusal(no_token.value)
    assert code == 550 and "does not hold a valid layby token" in why, why
    code, why = smtp_refusal(not_reply.value)
    assert code == 550 and "only replies to layby notifications" in why, why
    assert_untouched(reviewed, run_id)


def test_a_token_for_another_interrupt_is_refused_in_a_callback(
        reviewed: ReviewedSystem) -> None:
    """Run A's token cannot answer run B: 403 naming the interrupt it was issued for."""
    run_a = start(reviewed, "demo.transfer", "Send 10 to Ann")
    run_b = start(reviewed, "demo.transfer", "Send 20 to Ben")
    (interrupt_b,) = open_ids(reviewed, run_b)
    body = callback_body(run_b, interrupt_b, {"approved": True}, reviewer=None,
                         token=hook_token(reviewed, run_a))

    got = post_callback(reviewed, body)

    assert got.status_code == 403
    assert "issued for another interrupt" in error_of(got) and run_a in error_of(got)
    assert_untouched(reviewed, run_a)
    assert_untouched(reviewed, run_b)
    assert signed_callback(reviewed, run_b, interrupt_b, {"approved": False}).status_code == 200
    assert "not approved" in finished(reviewed, run_b)["result"]


@pytest.mark.integration
def test_a_reply_after_expiry_is_refused_and_the_expiry_policy_applies(
        reviewer_redis: EmbeddedRedis, tmp_path: Path) -> None:
    """With approvals expiring after 4 s, Alice replies "approve" once the request has
    expired: the reply is refused as expired, nothing is deployed, and the interrupt ends
    by its expiry policy."""
    with own_reviewed(reviewer_redis, tmp_path, EXPIRY_DB, SmtpServer().start(),
                      WebhookReceiver().start(), LAYBY_DEMO_EXPIRY_S="4") as own:
        run_id = start(own, "demo.expiring")
        mail = notification(own, run_id)
        expires_at = expiry_of(own, run_id)
        wait_until(lambda: datetime.now(UTC) > expires_at + timedelta(seconds=0.5), 30,
                   what="the request to expire")

        with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
            reply(own, mail, "approve")

        code, why = smtp_refusal(refused.value)
        assert code == 550 and "expired" in why, why
        done = finished(own, run_id)
        assert "not approved in time" in done["result"]
        intr = interrupt_of(done, mail["X-Layby-Interrupt"])
        assert intr["state"] == "expired"
        assert intr["answer"]["channel"] != "email"
        assert [e["channel"] for e in answered_events(own, run_id)] != ["email"]


def test_a_token_answers_once_page_then_reply(reviewed: ReviewedSystem) -> None:
    """Alice approves on the page, then replies to the mail too: the reply is refused
    (550) naming who answered first, how and when; the page answer stands."""
    run_id = start(reviewed, "demo.transfer", "Send 250 to Bob")
    mail = notification(reviewed, run_id)
    page = link_in(mail, "decision=approve").split("?")[0]

    assert httpx.post(page, data={"decision": "approve", "note": "from the page"},
                      timeout=60).status_code == 200
    with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
        reply(reviewed, mail, "decline")

    code, why = smtp_refusal(refused.value)
    assert code == 550
    assert "already resolved by reviewer:alice via page at" in why, why
    # Anyone else holding the reply address (a forward, a list) learns only that it takes
    # no reply: who answered, and when, is for the reviewer.
    with pytest.raises(smtplib.SMTPRecipientsRefused) as stranger:
        reply(reviewed, mail, "decline", sender="mallory@example.net")
    code, why = smtp_refusal(stranger.value)
    assert code == 550 and "takes no reply any more" in why, why
    assert "alice" not in why and "page" not in why, why
    assert finished(reviewed, run_id)["result"] == "Sent 250 to Bob."
    answer = assert_answered(reviewed, run_id, mail["X-Layby-Interrupt"], channel="page")
    assert answer["payload"] == {"approved": True, "note": "from the page"}
    assert len(transfers_of(reviewed, run_id)) == 1


def test_a_token_answers_once_reply_then_reply_and_inbound(reviewed: ReviewedSystem) -> None:
    """A second reply with the same token is refused (550) and so is the same reply through
    the inbound-mail webhook (409), both saying Alice answered by email already."""
    run_id = start(reviewed, "demo.transfer", "Send 250 to Bob")
    mail = notification(reviewed, run_id)
    reply(reviewed, mail, "approve")
    answered_at = assert_answered(reviewed, run_id, mail["X-Layby-Interrupt"])["answeredAt"]

    with pytest.raises(smtplib.SMTPRecipientsRefused) as again:
        reply(reviewed, mail, "decline")
    got = inbound(reviewed, compose(mail, "decline").as_bytes(), reply_address(mail))

    expected = f"already resolved by reviewer:alice via email at {answered_at}"
    assert smtp_refusal(again.value)[0] == 550
    assert expected in smtp_refusal(again.value)[1]
    assert got.status_code == 409 and expected in error_of(got)
    assert finished(reviewed, run_id)["result"] == "Sent 250 to Bob."
    assert_answered(reviewed, run_id, mail["X-Layby-Interrupt"])


def test_a_reply_from_the_wrong_sender_is_refused(reviewed: ReviewedSystem) -> None:
    """Mallory replies to Alice's reply address: 550 by SMTP and 403 by inbound webhook,
    saying the reply came from the wrong person; Alice can still answer."""
    run_id = start(reviewed, "demo.transfer", "Send 250 to Bob")
    mail = notification(reviewed, run_id)

    with pytest.raises(smtplib.SMTPDataError) as refused:
        reply(reviewed, mail, "approve", sender=f"Mallory <{MALLORY}>")
    got = inbound(reviewed, compose(mail, "approve", sender=MALLORY).as_bytes(),
                  reply_address(mail))

    code, why = smtp_refusal(refused.value)
    assert code == 550
    assert f"this reply came from {MALLORY}" in why and "Alice Martin" in why, why
    assert got.status_code == 403 and f"came from {MALLORY}" in error_of(got)
    assert_untouched(reviewed, run_id)
    reply(reviewed, mail, "approve")
    assert finished(reviewed, run_id)["result"] == "Sent 250 to Bob."


def test_callbacks_without_a_valid_signature_are_refused(reviewed: ReviewedSystem) -> None:
    """401 for a callback signed with the wrong secret, one signed "as" bob (who has no
    webhook), and one with neither signature nor token; each says what to do."""
    run_id = start(reviewed, "demo.transfer", "Send 250 to Bob")
    (interrupt_id,) = open_ids(reviewed, run_id)
    wrong_secret = "whsec_" + "d3Jvbmctc2VjcmV0LXdyb25nLXNlY3JldC14eXo="

    wrong = signed_callback(reviewed, run_id, interrupt_id, {"approved": True},
                            secret=wrong_secret)
    as_bob = callback_body(run_id, interrupt_id, {"approved": True}, reviewer="bob")
    bob = post_callback(reviewed, as_bob, signature_headers(as_bob))
    unsigned = post_callback(reviewed, callback_body(run_id, interrupt_id, {"approved": True},
                                                     reviewer=None))

    assert wrong.status_code == 401 and "signature does not verify" in error_of(wrong)
    # Refused in the same words as a wrong signature: the directory is not disclosed.
    assert bob.status_code == 401 and "does not verify for reviewer 'bob'" in error_of(bob)
    assert "directory" not in error_of(bob)
    assert unsigned.status_code == 401 and "sign the callback" in error_of(unsigned)
    assert_untouched(reviewed, run_id)


def test_a_callback_sent_again_gets_the_first_result(reviewed: ReviewedSystem) -> None:
    """The same signed callback POSTed again as is (a replay), then re-signed with a new
    timestamp and the same webhook-id (a sender's retry, per Standard Webhooks): each gets
    the first one's reply, and the answer is recorded once."""
    run_id = start(reviewed, "demo.transfer", "Send 250 to Bob")
    (interrupt_id,) = open_ids(reviewed, run_id)
    body = callback_body(run_id, interrupt_id, {"approved": True})
    headers = signature_headers(body, webhook_id="msg_retry_1")

    first = post_callback(reviewed, body, headers)
    replay = post_callback(reviewed, body, headers)
    finished(reviewed, run_id)
    retry = post_callback(reviewed, body, signature_headers(body, webhook_id="msg_retry_1"))
    other = post_callback(reviewed, body, signature_headers(body))

    assert first.status_code == 200, first.text
    assert replay.status_code == retry.status_code == 200, (replay.text, retry.text)
    assert replay.json() == retry.json() == first.json()
    assert first.json()["answer"]["answeredBy"] == "reviewer:hookbot"
    # A new webhook-id is a new answer: refused, the interrupt being answered already.
    assert other.status_code == 409 and "already resolved by reviewer:hookbot" in \
        error_of(other)
    assert finished(reviewed, run_id)["result"] == "Sent 250 to Bob."
    assert_answered(reviewed, run_id, interrupt_id, by="reviewer:hookbot", channel="webhook")
    assert len(transfers_of(reviewed, run_id)) == 1


def test_a_token_callback_retried_with_its_idempotency_key_gets_the_first_result(
        reviewed: ReviewedSystem) -> None:
    """A callback carrying the mail's token and an Idempotency-Key, sent twice: one answer,
    the same reply twice; the key reused with another answer is a 409 that says so."""
    run_id = start(reviewed, "demo.transfer", "Send 250 to Bob")
    mail = notification(reviewed, run_id)
    interrupt_id = mail["X-Layby-Interrupt"]
    body = callback_body(run_id, interrupt_id, {"approved": True}, reviewer=None,
                         token=token_of(mail))
    key = {"Idempotency-Key": "alice-retry-7"}

    first = post_callback(reviewed, body, key)
    again = post_callback(reviewed, body, key)
    other = post_callback(reviewed, callback_body(run_id, interrupt_id, {"approved": False},
                                                  reviewer=None, token=token_of(mail)), key)

    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert again.json() == first.json()
    assert other.status_code == 409 and "idempotency key" in error_of(other)
    assert finished(reviewed, run_id)["result"] == "Sent 250 to Bob."
    assert_answered(reviewed, run_id, interrupt_id, by="reviewer:alice", channel="webhook")
    assert len(transfers_of(reviewed, run_id)) == 1


def test_a_tampered_callback_body_is_refused(reviewed: ReviewedSystem) -> None:
    """The payload changed after signing: 401, nothing recorded; the genuine one works."""
    run_id = start(reviewed, "demo.transfer", "Send 250 to Bob")
    (interrupt_id,) = open_ids(reviewed, run_id)
    body = callback_body(run_id, interrupt_id, {"approved": False})
    headers = signature_headers(body)
    tampered = body.replace('"approved": false', '"approved": true')
    assert tampered != body

    got = post_callback(reviewed, tampered, headers)

    assert got.status_code == 401 and "signature does not verify" in error_of(got)
    assert_untouched(reviewed, run_id)
    assert post_callback(reviewed, body, headers).status_code == 200
    assert "not approved" in finished(reviewed, run_id)["result"]


def test_a_callback_signed_too_long_ago_is_refused(reviewed: ReviewedSystem) -> None:
    """Signed with a timestamp 10 minutes old: 401 naming the webhook-timestamp."""
    run_id = start(reviewed, "demo.transfer", "Send 250 to Bob")
    (interrupt_id,) = open_ids(reviewed, run_id)

    got = signed_callback(reviewed, run_id, interrupt_id, {"approved": True},
                          at=datetime.now(UTC) - timedelta(minutes=10))

    assert got.status_code == 401 and "webhook-timestamp" in error_of(got)
    assert_untouched(reviewed, run_id)


def test_malformed_mail_is_refused_with_a_reason(reviewed: ReviewedSystem) -> None:
    """Bytes that are not a mail, and a mail without a From header: 400 from the inbound
    webhook, 550 from the reply listener, each saying what is wrong."""
    run_id = start(reviewed, "demo.trivia")
    mail = notification(reviewed, run_id)
    to = reply_address(mail)
    garbage = b"\x00\x01\x02 this is not a mail \xff\xfe\n\x89PNG\r\n"
    no_from = compose(mail, "Jaws")
    del no_from["From"]

    not_mail = inbound(reviewed, garbage, to)
    senderless = inbound(reviewed, no_from.as_bytes(), to)
    with pytest.raises(smtplib.SMTPDataError) as by_smtp:
        smtp_send(reviewed.reply_port, no_from.as_bytes(), ALICE, to)

    assert not_mail.status_code == 400 and "no headers" in error_of(not_mail)
    assert senderless.status_code == 400 and "no From: header" in error_of(senderless)
    code, why = smtp_refusal(by_smtp.value)
    assert code == 550 and "no From: header" in why, why
    assert_untouched(reviewed, run_id)


def test_an_unreadable_confirmation_reply_is_mailed_back(reviewed: ReviewedSystem) -> None:
    """"maybe later?" is no approval: the SMTP server takes the mail (250), records nothing,
    and layby mails Alice back how to answer; her next reply works."""
    run_id = start(reviewed, "demo.transfer", "Send 250 to Bob")
    mail = notification(reviewed, run_id)
    message = compose(mail, "maybe later?")

    said = smtp_send(reviewed.reply_port, message.as_bytes(), ALICE, reply_address(mail))

    assert said.startswith("250") and "could not be read" in said, said
    back = mail_back(reviewed, message["Message-ID"])
    text = text_of(back)
    assert "could not read your reply" in text
    assert '"approve" or "decline"' in text
    assert back["Subject"].startswith("Re: ")
    assert_untouched(reviewed, run_id)
    reply(reviewed, mail, "approve")
    assert finished(reviewed, run_id)["result"] == "Sent 250 to Bob."


def test_an_answer_outside_the_choices_is_mailed_back(reviewed: ReviewedSystem) -> None:
    """"Titanic" is not one of the choices: 250 and a mail back listing them by number;
    through the inbound webhook the same reply gets 422 and a mail back too."""
    run_id = start(reviewed, "demo.trivia")
    mail = notification(reviewed, run_id)
    by_smtp, by_webhook = compose(mail, "Titanic"), compose(mail, "Titanic")

    said = smtp_send(reviewed.reply_port, by_smtp.as_bytes(), ALICE, reply_address(mail))
    got = inbound(reviewed, by_webhook.as_bytes(), reply_address(mail))

    assert said.startswith("250"), said
    assert got.status_code == 422 and '"Titanic" is not one of the choices' in error_of(got)
    for message in (by_smtp, by_webhook):
        text = text_of(mail_back(reviewed, message["Message-ID"]))
        assert '"Titanic" is not one of the choices' in text
        assert "1. Jaws" in text and "4. Close Encounters of the Third Kind" in text
    assert_untouched(reviewed, run_id)
    reply(reviewed, mail, "2")
    assert "you said Alien" in finished(reviewed, run_id)["result"]


def test_an_unreadable_reply_to_an_answered_request_is_refused_as_answered(
        reviewed: ReviewedSystem) -> None:
    """hookbot approved first; Alice's late "maybe later?" must not be told the request is
    still open: it is refused (550) saying who answered, and no mail comes back."""
    run_id = start(reviewed, "demo.transfer", "Send 250 to Bob")
    mail = notification(reviewed, run_id)
    assert signed_callback(reviewed, run_id, mail["X-Layby-Interrupt"],
                           {"approved": True}).status_code == 200
    finished(reviewed, run_id)
    late = compose(mail, "maybe later?")

    with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
        smtp_send(reviewed.reply_port, late.as_bytes(), ALICE, reply_address(mail))
    got = inbound(reviewed, compose(mail, "maybe later?").as_bytes(), reply_address(mail))

    assert "already resolved by reviewer:hookbot via webhook" in smtp_refusal(refused.value)[1]
    assert got.status_code == 409 and "already resolved by reviewer:hookbot" in error_of(got)
    wait_gone(lambda: bool([m for m in reviewed.smtp.mails_to(ALICE)
                            if m["In-Reply-To"] == late["Message-ID"]]), 2)


def test_a_callback_refused_for_its_payload_is_not_taken_for_a_replay(
        reviewed: ReviewedSystem) -> None:
    """A signed callback whose payload does not fit is refused (422) and nothing is
    recorded; sent again as is (a retry keeps its webhook-id), it must be refused for the
    same reason, not as "already received", which would tell the sender it was taken."""
    run_id = start(reviewed, "demo.transfer", "Send 250 to Bob")
    (interrupt_id,) = open_ids(reviewed, run_id)
    body = callback_body(run_id, interrupt_id, {"approved": "maybe"})
    headers = signature_headers(body)

    first = post_callback(reviewed, body, headers)
    retry = post_callback(reviewed, body, headers)

    assert first.status_code == 422, first.text
    assert retry.status_code == 422, retry.text
    assert_untouched(reviewed, run_id)


def test_a_callback_payload_redis_could_not_store_is_refused(reviewed: ReviewedSystem) -> None:
    """What parses but JSON has no room for (NaN) or is too large: refused with what is
    wrong, as /v1 refuses it, and nothing half-written."""
    run_id = start(reviewed, "demo.transfer", "Send 250 to Bob")
    (interrupt_id,) = open_ids(reviewed, run_id)
    nan = callback_body(run_id, interrupt_id, {"approved": True, "score": float("nan")})
    huge = callback_body(run_id, interrupt_id, {"approved": True, "note": "x" * 300_000})

    refused = post_callback(reviewed, nan, signature_headers(nan))
    too_large = post_callback(reviewed, huge, signature_headers(huge))

    assert refused.status_code == 422, refused.text
    assert "NaN or Infinity" in refused.json()["error"]["message"]
    assert too_large.status_code == 413, too_large.text
    assert "262144" in too_large.json()["error"]["message"]  # the limit, said
    assert_untouched(reviewed, run_id)


def test_a_broken_reviewer_directory_defers_replies_instead_of_bouncing_them(
        reviewed: ReviewedSystem) -> None:
    """The operator saves a broken reviewers.toml (it is re-read on change) just as a reply
    comes in: layby's own problem must not lose the reply. The reply listener defers it
    (4xx: the sending server tries again later) and the inbound webhook answers 503 (the
    provider retries); once the file is fixed, the retried reply answers."""
    run_id = start(reviewed, "demo.transfer", "Send 250 to Bob")
    mail = notification(reviewed, run_id)
    directory = Path(reviewed.system.env_overrides["LAYBY_REVIEWERS_FILE"])
    good = directory.read_text()
    try:
        directory.write_text(good + "\n[reviewers.broken\n")
        with pytest.raises(smtplib.SMTPRecipientsRefused) as deferred:
            reply(reviewed, mail, "approve")
        got = inbound(reviewed, compose(mail, "approve").as_bytes(), reply_address(mail))
    finally:
        directory.write_text(good)

    code, why = smtp_refusal(deferred.value)
    assert 400 <= code < 500, (code, why)
    assert got.status_code == 503, got.text
    assert_untouched(reviewed, run_id)
    reply(reviewed, mail, "approve")
    assert finished(reviewed, run_id)["result"] == "Sent 250 to Bob."


def test_an_out_of_office_reply_is_taken_and_ignored(reviewed: ReviewedSystem) -> None:
    """An auto-responder writes from Alice's own address to the reply address: its mail is
    taken (so the robot does not retry), nothing is recorded, nothing is mailed back."""
    run_id = start(reviewed, "demo.bbq", "Plan a BBQ")
    mail = notification(reviewed, run_id)
    message = compose(mail, "I am out of the office until Monday.")
    message["Auto-Submitted"] = "auto-replied"

    said = smtp_send(reviewed.reply_port, message.as_bytes(), ALICE, reply_address(mail))
    posted = inbound(reviewed, message.as_bytes(), reply_address(mail))

    assert said.startswith("250") and "Automatic reply" in said, said
    assert posted.status_code == 200 and posted.json()["ignored"] is True, posted.text
    assert_untouched(reviewed, run_id)
    assert not [m for m in reviewed.smtp.mails_to(ALICE)
                if m["In-Reply-To"] == message["Message-ID"]]


def test_a_reviewer_cannot_change_the_tools_input(reviewed: ReviewedSystem) -> None:
    """Reviewers approve or decline what the agent asked for: a callback that would also
    rewrite the transfer (replaceInput) is refused, nothing recorded."""
    run_id = start(reviewed, "demo.transfer", "Send 250 to Bob")
    (interrupt_id,) = open_ids(reviewed, run_id)
    body = json.dumps({"runId": run_id, "interruptId": interrupt_id, "status": "resolved",
                       "payload": {"approved": True}, "reviewer": "hookbot",
                       "metadata": {"replaceInput": {"to": "Mallory", "amount": 99999}}})

    got = post_callback(reviewed, body, signature_headers(body))

    assert got.status_code == 422, got.text
    assert "cannot change the tool's input" in error_of(got)
    assert_untouched(reviewed, run_id)
