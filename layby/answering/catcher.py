"""A local mail catcher for trying layby on one machine: an SMTP server that keeps every
mail it receives as a `.eml` file in a folder, prints a line for it, and lets the gateway
show it (`/mail`) and answer it like a mail client would. Not for production."""

from __future__ import annotations

import email
import email.policy
import logging
import time
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

NAME_DIGITS = 20


@dataclass(frozen=True)
class Caught:
    name: str
    message: EmailMessage

    @property
    def subject(self) -> str:
        return str(self.message.get("Subject", ""))

    @property
    def to(self) -> str:
        return str(self.message.get("To", ""))

    @property
    def reply_to(self) -> str:
        return str(self.message.get("Reply-To") or self.message.get("From", ""))

    @property
    def text(self) -> str:
        part = self.message.get_body(preferencelist=("plain",))
        return part.get_content() if part is not None else ""

    @property
    def html(self) -> str | None:
        part = self.message.get_body(preferencelist=("html",))
        return part.get_content() if part is not None else None


class CatcherHandler:
    def __init__(self, folder: Path, public_url: str) -> None:
        self.folder = folder
        self.public_url = public_url.rstrip("/")
        folder.mkdir(parents=True, exist_ok=True)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        name = f"{time.time_ns():0{NAME_DIGITS}d}"
        (self.folder / f"{name}.eml").write_bytes(envelope.original_content or envelope.content)
        caught = load(self.folder, name)
        subject = caught.subject if caught else "?"
        log.info("mail to %s: %s; read it at %s/mail/%s", ", ".join(envelope.rcpt_tos),
                 subject, self.public_url, name)
        return "250 2.0.0 caught"


def listing(folder: Path, limit: int = 100) -> list[Caught]:
    names = sorted((p.stem for p in folder.glob("*.eml")), reverse=True)[:limit]
    return [c for c in (load(folder, n) for n in names) if c is not None]


def load(folder: Path, name: str) -> Caught | None:
    if not name.isdigit():
        return None
    try:
        raw = (folder / f"{name}.eml").read_bytes()
    except OSError:
        return None
    message = email.message_from_bytes(raw, policy=email.policy.default)
    return Caught(name, message)
