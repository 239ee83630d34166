"""The SMTP reply listener (aiosmtpd): takes replies to `reply+<token>@…` addresses and
answers with them through `notifier.inbox`. What cannot be taken is refused in the SMTP
conversation with a reason the sending server passes back to the reviewer; when Redis is
away the refusal is temporary (4xx), so the sending server tries again and nothing is lost.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from typing import Any

import redis
from aiosmtpd.controller import Controller

from layby.answering import replies as inbox
from layby.answering.mime import MailTooLarge, MalformedMail, token_from_address
from layby.answering.reading import Unreadable
from layby.control import Runtime
from layby.errors import ConfigError, Conflict, LaybyError, NotFound

log = logging.getLogger(__name__)


def _one_line(text: str) -> str:
    # An SMTP reply line is ASCII and short; the reason must survive relaying.
    flat = " ".join(text.split()).encode("ascii", "replace").decode()
    return flat[:400]


def smtp_reply(exc: LaybyError) -> str:
    if isinstance(exc, MailTooLarge):  # RFC 3463: message too big for system
        return f"552 5.3.4 {_one_line(exc.message)}"
    if isinstance(exc, MalformedMail):
        return f"550 5.6.0 {_one_line(exc.message)}"
    if isinstance(exc, NotFound):
        return f"550 5.1.1 {_one_line(exc.message)}"
    if isinstance(exc, Conflict):
        return f"550 5.7.1 {_one_line(exc.message)}"
    return f"550 5.7.1 {_one_line(exc.message)}"


class ReplyHandler:
    """aiosmtpd's handler: one reply per DATA, answered through `rt`."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str,
                          rcpt_options: list[str]) -> str:
        token = token_from_address(address)
        if token is None:
            return (f"550 5.1.1 <{_one_line(address)}>: this server takes only replies to "
                    "layby notifications (reply+<token>@ addresses)")
        # The token is checked now, before any data is sent: a forged, unknown, spent or
        # handed-on one costs the sender one round trip, not the reading of a whole mail.
        refused = await asyncio.get_running_loop().run_in_executor(
            None, self._refusal_of, token, envelope.mail_from)
        if refused is not None:
            return refused
        envelope.rcpt_tos.append(address)
        return "250 2.1.5 OK"

    def _refusal_of(self, token: str, sender: str | None) -> str | None:
        """The SMTP refusal for a recipient whose token answers nothing (any more), or
        None: a token that opens an open request (the mail itself is checked at DATA)."""
        try:
            inbox.check_recipient(self.rt, token, sender)
        except ConfigError:
            log.exception("reply from %s not taken now", sender)
            return ("451 4.3.5 layby cannot take replies right now (a configuration "
                    "problem on its side); try again later")
        except LaybyError as exc:
            log.info("reply from %s refused at RCPT: %s", sender, exc.message)
            return smtp_reply(exc)
        except (redis.RedisError, OSError):
            log.exception("reply from %s not taken now", sender)
            return "451 4.3.0 layby cannot take replies right now; try again later"
        return None

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        loop = asyncio.get_running_loop()
        raw = envelope.original_content or envelope.content
        try:
            got = await loop.run_in_executor(None, inbox.receive, self.rt, raw,
                                             list(envelope.rcpt_tos))
        except Unreadable:
            return ("250 2.0.0 Received, but the answer could not be read; nothing was "
                    "recorded and instructions were mailed back")
        except inbox.AutomaticReply:
            return "250 2.0.0 Automatic reply received and ignored; nothing was recorded"
        except ConfigError:
            # layby's own configuration (the reviewer directory, the token keys) is broken,
            # maybe for a moment while an operator edits it: defer, so the sending server
            # tries again later instead of bouncing the reply for good.
            log.exception("reply from %s not taken now", envelope.mail_from)
            return ("451 4.3.5 layby cannot take replies right now (a configuration "
                    "problem on its side); try again later")
        except LaybyError as exc:
            log.info("reply from %s refused: %s", envelope.mail_from, exc.message)
            return smtp_reply(exc)
        except (redis.RedisError, OSError):
            log.exception("reply from %s not taken now", envelope.mail_from)
            return "451 4.3.0 layby cannot take replies right now; try again later"
        except Exception:
            log.exception("reply from %s failed", envelope.mail_from)
            return "451 4.3.0 layby could not take this reply; try again later"
        if got.delegated_to:
            return f"250 2.0.0 Request of run {got.run_id} handed to {got.delegated_to}"
        log.info("reply from %s answered interrupt %s of run %s", envelope.mail_from,
                 got.interrupt_id, got.run_id,
                 extra={"run_id": got.run_id, "interrupt_id": got.interrupt_id})
        return f"250 2.0.0 Answer recorded for run {got.run_id}"


def serve(host: str, port: int, handler: Any, what: str, max_bytes: int) -> None:
    """Run an SMTP server until SIGTERM or SIGINT, taking mails up to `max_bytes` (aiosmtpd
    answers 552 past it, and 500 to a line past RFC 5321's 1,000 octets)."""
    # aiosmtpd logs every connection at INFO, including its own start-up self-test.
    logging.getLogger("mail.log").setLevel(logging.WARNING)
    controller = Controller(handler, hostname=host, port=port,
                            data_size_limit=max_bytes, server_hostname="layby")
    controller.start()
    log.info("%s listening on smtp://%s:%d", what, host, port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        stop.wait()
    finally:
        controller.stop()
