"""The mail catcher's pages (`/mail`), on one machine only: what layby sent, and a reply box
that answers as the reviewer's mail client would (over SMTP, to the reply listener). On
only with LAYBY_MAIL_CATCHER_DIR, which `layby up` sets, and only for loopback clients."""

from __future__ import annotations

import smtplib
from email.message import EmailMessage
from email.utils import formatdate, make_msgid, parseaddr
from pathlib import Path
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from layby.answering import catcher
from layby.answering.pages import render_mailbox
from layby.broker_config import Settings
from layby.errors import Forbidden, NotFound
from layby.http.deps import Rt
from layby.notifier.mail import LOOPBACK

router = APIRouter(include_in_schema=False)


def _private(html: str) -> HTMLResponse:
    return HTMLResponse(html, headers={"Cache-Control": "no-store",
                                       "Referrer-Policy": "no-referrer"})


def _catcher_folder(settings: Settings, request: Request) -> Path:
    folder = settings.mail_catcher_dir
    if folder is None:
        raise NotFound("the mail catcher is off: `layby up` turns it on "
                       "(LAYBY_MAIL_CATCHER_DIR)")
    # Every caught mail holds a reviewer's token: only this machine may read them.
    if request.client is None or request.client.host not in LOOPBACK:
        raise Forbidden("the mail catcher's pages are served to this machine only")
    return folder


@router.get("/mail", response_class=HTMLResponse)
def mailbox(request: Request, rt: Rt) -> HTMLResponse:
    folder = _catcher_folder(rt.settings, request)
    return _private(render_mailbox(catcher.listing(folder), None))


@router.get("/mail/{name}", response_class=HTMLResponse)
def mail_message(name: str, request: Request, rt: Rt, reply: str | None = None
                 ) -> HTMLResponse:
    folder = _catcher_folder(rt.settings, request)
    caught = catcher.load(folder, name)
    if caught is None:
        raise NotFound(f"no caught mail {name!r}")
    return _private(render_mailbox(catcher.listing(folder), caught, reply))


@router.post("/mail/{name}/reply")
def mail_reply(name: str, request: Request, rt: Rt,
               text: Annotated[str, Form(max_length=20_000)]) -> RedirectResponse:
    """Reply as the mail's recipient would from a mail client: a real SMTP message to the
    reply listener, which answers the interrupt (or mails back why it could not)."""
    settings = rt.settings
    caught = catcher.load(_catcher_folder(settings, request), name)
    if caught is None:
        raise NotFound(f"no caught mail {name!r}")
    reply = EmailMessage()
    reply["From"] = caught.to
    reply["To"] = caught.reply_to
    reply["Subject"] = f"Re: {caught.subject}"
    reply["Date"] = formatdate(localtime=False)
    reply["Message-ID"] = make_msgid(domain="mail-catcher.localhost")
    if caught.message.get("Message-ID"):
        reply["In-Reply-To"] = caught.message["Message-ID"]
    quoted = "\n".join(f"> {line}" for line in caught.text.splitlines())
    reply.set_content(f"{text.strip()}\n\nOn {caught.message.get('Date')}, "
                      f"{parseaddr(str(caught.message.get('From')))[1]} wrote:\n{quoted}\n")
    try:
        with smtplib.SMTP(settings.reply_listener_host, settings.reply_listener_port,
                          timeout=20) as smtp:
            smtp.send_message(reply)
        outcome = "sent"
    except smtplib.SMTPResponseException as exc:
        why = exc.smtp_error  # the server's bytes, or smtplib's own text
        why_text = why.decode(errors="replace") if isinstance(why, bytes) else why
        outcome = f"refused: {exc.smtp_code} {why_text}"
    except smtplib.SMTPRecipientsRefused as exc:
        code, why = next(iter(exc.recipients.values()))
        outcome = f"refused: {code} {why.decode(errors='replace')}"
    except OSError as exc:
        outcome = f"the reply listener is not reachable: {exc}"
    return RedirectResponse(f"/mail/{name}?{urlencode({'reply': outcome})}", status_code=303)
