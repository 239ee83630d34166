"""Email replies in: one reply mail (from the SMTP listener or the inbound-mail webhook)
becomes one answer, or a refusal that says why. The token comes from the recipient
address, the sender must be the reviewer the token was issued to, and the answer is read
from the reply's first lines; `delegate bob` there hands the request to another reviewer
instead. A reply that cannot be read gets an email back."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from layby.answering import answers
from layby.answering.mime import (
    Mail,
    MalformedMail,
    check_shape,
    parse_mail,
    reply_text,
    token_from_address,
)
from layby.answering.reading import Unreadable, read_answer, read_handover
from layby.control import Runtime
from layby.errors import Conflict, Invalid, LaybyError
from layby.notifier import mail
from layby.reviewers.schemas import how_to_answer
from layby.reviewers.tokens import BadToken

log = logging.getLogger(__name__)


class AutomaticReply(LaybyError):
    """A robot's reply: taken and dropped (refusing it would only make the robot retry)."""


class WrongSender(BadToken):
    """The reply did not come from the reviewer the token was issued to."""


@dataclass(frozen=True)
class Received:
    run_id: str
    interrupt_id: str
    reviewer: str
    resumed: bool
    delegated_to: str | None = None


def token_of(message: Mail, envelope_recipients: list[str] | None) -> str:
    """The reply token: from the SMTP envelope first (what the mail was delivered to), then
    from the headers (forwarders keep the original address there)."""
    for address in [*(envelope_recipients or []), *message.recipients]:
        token = token_from_address(address)
        if token:
            return token
    raise BadToken("this mail is not addressed to a reply+<token>@ address: reply to the "
                   "notification itself, keeping its Reply-To address")


def check_envelope(rt: Runtime, envelope_recipients: list[str]) -> None:
    """Refuse, before the mail is even read, one whose envelope names a reply token that
    opens nothing (forged, unknown, expired: BadToken). A mail whose envelope holds no
    token may still hold one in its headers, so it passes."""
    token = next((t for t in map(token_from_address, envelope_recipients) if t), None)
    if token is not None:
        answers.verify_token(rt, token)


def check_recipient(rt: Runtime, token: str, sender: str | None) -> None:
    """Refuse, before the mail is sent at all (SMTP's RCPT), a token that answers nothing:
    forged, unknown or expired (BadToken), handed on or its reviewer gone (NotAllowed),
    its request already answered or closed (Conflict).

    Why a handed-on or closed request is refused (who took it, who answered first) is for
    its reviewer: told only when the envelope's sender is theirs, as the mail's From must
    be at DATA. Anyone else holding the address (a forward, a list) learns only that the
    request takes no reply."""
    grant = answers.verify_token(rt, token)
    reviewer = rt.reviewers.get(grant.reviewer)
    theirs = reviewer is not None and bool(sender) and \
        (sender or "").lower() == (reviewer.email or "").lower()
    try:
        answers.refuse_if_closed(answers.open_grant(rt, grant))
    except (answers.NotAllowed, Conflict) as exc:
        if theirs:
            raise
        refused = type(exc)("this request takes no reply any more (handed on, answered or "
                            "closed); nothing was recorded", run_id=exc.run_id)
        raise refused from None


def receive(rt: Runtime, raw: bytes, envelope_recipients: list[str] | None = None
            ) -> Received:
    """Answer with a reply mail. Raises MailTooLarge, MalformedMail, BadToken/WrongSender,
    Conflict (already answered, or expired) or Unreadable (after mailing the sender why and
    how to answer)."""
    check_shape(raw, rt.settings.max_mail_bytes)
    # The header says who sent it and which token it answers: a robot's reply or a bad
    # token is refused before the body is parsed at all.
    head = parse_mail(raw, headers_only=True)
    if head.automatic:
        raise AutomaticReply(f"an automatic reply from {head.sender or 'a robot'} (out of "
                             "office, vacation) is not an answer; nothing was recorded")
    opened = answers.open_token(rt, token_of(head, envelope_recipients))
    message = parse_mail(raw)
    # The From header, not the envelope sender: providers rewrite the envelope (bounce
    # addresses, SRS), and From is what the sender's domain signs (DKIM).
    if message.sender != (opened.reviewer.email or "").lower():
        raise WrongSender(f"this reply came from {message.sender}, but the request was sent "
                          f"to {opened.reviewer.label}; only they can answer it by email",
                          run_id=opened.run.id)
    answers.refuse_if_closed(opened)  # before reading: an unreadable late reply is late
    text = reply_text(message.text)
    handover = read_handover(text)
    if handover is not None:
        return _hand_on(rt, opened, message, *handover)
    try:
        entry = read_answer(opened.interrupt, text)
        result = answers.answer(rt, opened, entry, channel="email")
    except (Unreadable, Invalid) as exc:
        # Invalid: read, but refused by the tool's own rules; to the reviewer, the same.
        reason = exc.message if isinstance(exc, Unreadable) else \
            f"{exc.message}\n\n{how_to_answer(opened.interrupt)}"
        _mail_back(rt, message, reason)
        raise Unreadable(reason, run_id=opened.run.id, detail=exc.detail) from None
    return Received(opened.run.id, opened.interrupt.id, opened.reviewer.id,
                    result.resumed)


def _hand_on(rt: Runtime, opened: answers.Opened, message: Mail, name: str,
             note: str | None) -> Received:
    """`delegate <reviewer>`: the request goes to that reviewer (by id or email address)."""
    by_mail = rt.reviewers.directory().by_email(name) if "@" in name else None
    to = by_mail.id if by_mail else name
    try:
        answers.delegate(rt, opened, to, channel="email", note=note)
    except Invalid as exc:
        reason = (f"{exc.message}\n\nTo hand a request on, reply with \"delegate\" and a "
                  "reviewer's id or email address on the first line, for example "
                  "\"delegate bob\".")
        _mail_back(rt, message, reason)
        raise Unreadable(reason, run_id=opened.run.id) from None
    return Received(opened.run.id, opened.interrupt.id, opened.reviewer.id, False,
                    delegated_to=to)


def _mail_back(rt: Runtime, message: Mail, reason: str) -> None:
    """Tell the sender why their reply was not taken, once per reply: mail providers POST
    a refused reply again and again, and each must not mail the reviewer again. Marked only
    as sent, so a send that failed is tried again with the provider's next attempt."""
    settings, store = rt.settings, rt.store
    mark = f"mailed-back:{message.message_id or message.sender + message.subject}"
    # Taken before sending (one round trip, and two retries arriving together send one),
    # given back if the send fails.
    if not store.marks.first_sight(mark, 3 * 24 * 3600):
        return
    try:
        mail.send(settings, mail.unreadable_reply(settings, message.sender, message.subject,
                                                  message.message_id, reason))
    except Exception:  # the refusal stands whether or not the mail goes out
        log.exception("could not tell %s that their reply was unreadable", message.sender)
        store.marks.forget_sight(mark)


__all__ = ["AutomaticReply", "MalformedMail", "Received", "Unreadable", "WrongSender", "receive"]
