"""Email over SMTP: composing a notification (plain text and HTML, signed links, a reply
address that carries the token), a reply to a reply that could not be read, and sending."""

from __future__ import annotations

import functools
import json
import smtplib
import ssl
from email.message import EmailMessage
from email.utils import formataddr, formatdate, make_msgid
from typing import TYPE_CHECKING

from layby.broker_config import Settings
from layby.generation.interrupts import Interrupt
from layby.reviewers.directory import Reviewer
from layby.reviewers.schemas import how_to_answer, is_confirmation
from layby.wire import Notification, RunView

if TYPE_CHECKING:
    import jinja2


@functools.cache
def _templates() -> jinja2.Environment:
    # Built by the first mail, not at import: jinja2 costs every worker about 15 ms at its
    # start, and a worker that sends no mail never needs it.
    import jinja2

    return jinja2.Environment(loader=jinja2.PackageLoader("layby.notifier", "templates"),
                              autoescape=jinja2.select_autoescape(["html"]),
                              keep_trailing_newline=True)


LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


class PermanentFailure(Exception):
    """A send that will fail the same way every time: do not retry it."""


def page_url(settings: Settings, token: str) -> str:
    return f"{settings.public_url.rstrip('/')}/review/{token}"


def inbox_url(settings: Settings, path: str = "") -> str:
    return f"{settings.public_url.rstrip('/')}/inbox{path}"


def reply_address(settings: Settings, token: str) -> str:
    return f"reply+{token}@{settings.inbound_domain}"


def _shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def notification_mail(settings: Settings, run: RunView, interrupt: Interrupt,
                      reviewer: Reviewer, note: Notification) -> EmailMessage:
    assert note.token is not None
    confirmation = is_confirmation(interrupt)
    asks = "asks for your approval" if confirmation else "asks you"
    message = interrupt.message or f"{interrupt.tool_name} needs an answer"
    reminder = note.kind == "reminder"
    escalated = note.kind == "escalation"
    subject = ("Reminder: " if reminder else "Escalated: " if escalated else "") + \
        f"[layby] {run.agent} {asks}: {_shorten(message, 90)}"
    handed = next((d for d in getattr(interrupt, "delegations", []) if d.to == reviewer.id),
                  None)
    page = page_url(settings, note.token)
    context = {
        "subject": subject, "reminder": reminder, "agent": run.agent, "asks": asks,
        "escalated": escalated, "handed_by": handed.reviewer if handed else None,
        "handed_note": handed.note if handed else None,
        "message": message, "tool_name": interrupt.tool_name,
        "tool_input": json.dumps(interrupt.tool_input, indent=2, ensure_ascii=False)
        if interrupt.tool_input not in (None, {}) else "",
        "confirmation": confirmation, "page_url": page,
        "approve_url": f"{page}?decision=approve", "decline_url": f"{page}?decision=decline",
        "how_to": how_to_answer(interrupt), "expires_at": interrupt.expires_at,
        "run_id": run.id, "interrupt_id": interrupt.id, "reviewer": reviewer.label,
        "inbox_url": inbox_url(settings),
    }
    mail = EmailMessage()
    mail["Subject"] = subject
    mail["From"] = settings.mail_from
    mail["To"] = formataddr((reviewer.name or "", reviewer.email or ""))
    mail["Reply-To"] = reply_address(settings, note.token)
    mail["Date"] = formatdate(localtime=False)
    # The same notification sent twice (a crash after the send) carries the same id, so
    # mail clients show it once.
    mail["Message-ID"] = f"<{note.id}@{settings.inbound_domain}>"
    # RFC 3834: out-of-office robots must not answer this message.
    mail["Auto-Submitted"] = "auto-generated"
    mail["X-Auto-Response-Suppress"] = "All"
    mail["X-Layby-Run"] = run.id
    mail["X-Layby-Interrupt"] = interrupt.id
    mail.set_content(_templates().get_template("email.txt").render(context))
    mail.add_alternative(_templates().get_template("email.html").render(context), subtype="html")
    return mail


def sign_in_mail(settings: Settings, reviewer: Reviewer, link: str) -> EmailMessage:
    """The inbox's sign-in link, to the reviewer's address in the directory."""
    minutes = max(1, settings.inbox_link_ttl_s // 60)
    mail = EmailMessage()
    mail["Subject"] = "[layby] Your sign-in link for the reviewers' inbox"
    mail["From"] = settings.mail_from
    mail["To"] = formataddr((reviewer.name or "", reviewer.email or ""))
    mail["Date"] = formatdate(localtime=False)
    mail["Message-ID"] = make_msgid(domain=settings.inbound_domain)
    mail["Auto-Submitted"] = "auto-generated"
    mail["X-Auto-Response-Suppress"] = "All"
    url = inbox_url(settings, f"/sign-in/{link}")
    mail.set_content(
        f"Hello {reviewer.label},\n\n"
        f"Open this link to sign in to the reviewers' inbox:\n\n{url}\n\n"
        f"It works once, within {minutes} minutes. If you did not ask to sign in, ignore "
        "this mail: nobody can sign in without the link.\n")
    return mail


def unreadable_reply(settings: Settings, to: str, subject: str, in_reply_to: str | None,
                     reason: str) -> EmailMessage:
    mail = EmailMessage()
    mail["Subject"] = subject if subject.lower().startswith("re:") else f"Re: {subject}"
    mail["From"] = settings.mail_from
    mail["To"] = to
    mail["Date"] = formatdate(localtime=False)
    mail["Message-ID"] = make_msgid(domain=settings.inbound_domain)
    mail["Auto-Submitted"] = "auto-replied"
    if in_reply_to:
        mail["In-Reply-To"] = in_reply_to
        mail["References"] = in_reply_to
    mail.set_content("layby could not read your reply, so nothing was recorded and the "
                     "request is still open.\n\n" + reason + "\n")
    return mail


def send(settings: Settings, mail: EmailMessage) -> None:
    """Hand `mail` to the SMTP server of the settings. Refused recipients are permanent;
    anything else (server away, busy, timing out) is worth another try."""
    if not settings.smtp_host:
        raise PermanentFailure("no SMTP server is configured: set LAYBY_SMTP_HOST (and "
                               "LAYBY_SMTP_PORT, LAYBY_SMTP_SECURITY, LAYBY_SMTP_USERNAME)")
    if settings.smtp_username and settings.smtp_security == "none" \
            and settings.smtp_host not in LOOPBACK:
        raise PermanentFailure("refusing to send the SMTP password in clear text: set "
                               "LAYBY_SMTP_SECURITY to starttls or tls")
    secure = ssl.create_default_context()  # verifies the certificate and the host name
    try:
        if settings.smtp_security == "tls":
            session: smtplib.SMTP = smtplib.SMTP_SSL(settings.smtp_host, settings.smtp_port,
                                       timeout=settings.smtp_timeout_s, context=secure)
        else:
            session = smtplib.SMTP(settings.smtp_host, settings.smtp_port,
                                   timeout=settings.smtp_timeout_s)
        with session as smtp:
            if settings.smtp_security == "starttls":
                smtp.starttls(context=secure)
            if settings.smtp_username:
                password = settings.smtp_password.get_secret_value() \
                    if settings.smtp_password else ""
                smtp.login(settings.smtp_username, password)
            smtp.send_message(mail)
    except smtplib.SMTPRecipientsRefused as exc:
        codes = {code for code, _ in exc.recipients.values()}
        if all(500 <= code < 600 for code in codes):
            raise PermanentFailure(f"the SMTP server refused the recipient: "
                                   f"{_smtp_reasons(exc.recipients)}") from exc
        raise
    except smtplib.SMTPResponseException as exc:
        # 5xx (a refused sender, a refused message, bad credentials) will not change by
        # itself; 4xx is the server asking to try again later.
        if 500 <= exc.smtp_code < 600:
            reason = exc.smtp_error.decode(errors="replace") \
                if isinstance(exc.smtp_error, bytes) else str(exc.smtp_error)
            raise PermanentFailure(f"the SMTP server refused: {exc.smtp_code} {reason}") \
                from exc
        raise


def _smtp_reasons(refused: dict[str, tuple[int, bytes]]) -> str:
    return "; ".join(f"{addr}: {code} {msg.decode(errors='replace')}"
                     for addr, (code, msg) in refused.items())
