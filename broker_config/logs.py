"""How every layby process logs: plain text or JSON lines (`LAYBY_LOG_FORMAT`), each line
carrying the ids of what it is about (run, interrupt, notification, task).

The ids come from a context variable that the code handling one run sets with `about(...)`
(Celery's task signals do it for every task, see tasks/context.py), so log calls deep in a
model adapter or a mail sender need not pass them along. In JSON every line is one object
with `time`, `level`, `logger`, `message` and the ids as their own fields, which log
pipelines index without parsing messages; in text the ids follow the message in brackets.

Every line is scrubbed before it is written, whichever library wrote it: reviewer tokens
(in `/review/<token>` and `/inbox/sign-in/<link>` paths, `reply+<token>@` addresses,
URL-encoded or not) and the values
of the secret settings (API keys, token keys, passwords) come out as `<token>` and
`<secret>`, tracebacks included. Other secrets (reviewers' webhook secrets) are added with
`keep_out`.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TextIO

from pythonjsonlogger.json import JsonFormatter

from layby.broker_config.settings import Settings

# The fields a line may carry, in the order text lines show them.
IDS = ("run_id", "interrupt_id", "notification_id", "task_id", "task_name")

# The default is never mutated: each change sets a new dict.
_about: ContextVar[dict[str, str]] = ContextVar("layby_log_about", default={})  # noqa: B039

# Libraries that set up handlers of their own: their lines go through layby's instead, so
# a process writes one format.
_OWN_HANDLERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "celery", "flower",
                 "tornado.access")


# What follows these is a reviewer token, up to the next character no token holds.
_TOKENS = re.compile(
    r"(/review/|reply\+|reply%2B)[A-Za-z0-9_-]+|(/inbox/sign-in/)[A-Za-z0-9_.-]+", re.IGNORECASE)
# Shorter values would blank out ordinary words.
_MIN_SECRET_CHARS = 8
_secrets: set[str] = set()


def keep_out(*secrets: str | None) -> None:
    """Never write these values in a log line of this process."""
    _secrets.update(s for s in secrets if s and len(s) >= _MIN_SECRET_CHARS)


def scrub(text: str) -> str:
    """`text` without reviewer tokens or the secrets this process knows."""
    text = _TOKENS.sub(lambda m: f"{m.group(1) or m.group(2)}<token>", text)
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, "<secret>")
    return text


def _secrets_of(settings: Settings) -> list[str | None]:
    def value(secret: Any) -> str | None:
        return secret.get_secret_value() if secret is not None else None

    keys = value(settings.token_keys) or ""
    auth = value(settings.flower_basic_auth) or ""
    url_password = re.findall(r"//[^:/@;]*:([^@/;]+)@", settings.redis_url or "")
    return [*settings.bearer_keys, value(settings.smtp_password),
            value(settings.inbound_mail_secret), value(settings.redis_sentinel_password),
            value(settings.slack_bot_token), value(settings.slack_signing_secret),
            *(pair.partition(":")[2] for pair in keys.split(",")),
            *(pair.partition(":")[2] for pair in auth.split(",")), *url_password]


class _Scrub(logging.Filter):
    """The message, before a formatter escapes it (JSON would hide a secret's quotes)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001  (a broken call is the formatter's to report)
            return True
        clean = scrub(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


class _Scrubbed(logging.Formatter):
    """The whole line as written: tracebacks and stack traces too."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        return scrub(self.inner.format(record))


@contextmanager
def about(**ids: object) -> Iterator[None]:
    """Log lines written inside carry these ids (None values are left out)."""
    token = _about.set({**_about.get(), **{k: str(v) for k, v in ids.items() if v}})
    try:
        yield
    finally:
        _about.reset(token)


def set_about(**ids: object) -> None:
    """Like `about`, for code that cannot wrap a block (Celery's prerun/postrun signals)."""
    _about.set({k: str(v) for k, v in ids.items() if v})


class _WithIds(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _about.get().items():
            if not hasattr(record, key):  # an explicit `extra=` wins
                setattr(record, key, value)
        return True


class _TextWithIds(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = " ".join(f"{k.removesuffix('_id')}={getattr(record, k)}" for k in IDS
                       if getattr(record, k, None))
        return f"{line} [{ids}]" if ids else line


def formatter(log_format: str) -> logging.Formatter:
    if log_format == "json":
        # `time`: ISO 8601 in UTC with microseconds.
        return JsonFormatter("{levelname}{name}{message}", style="{", timestamp="time",
                             rename_fields={"levelname": "level", "name": "logger"},
                             json_ensure_ascii=False)
    return _TextWithIds("%(asctime)s %(levelname)s %(name)s %(message)s")


def configure(settings: Settings, stream: TextIO | None = None,
              level: str | int | None = None) -> None:
    """Send every logger's lines to one handler on stderr, in the configured format."""
    handler = logging.StreamHandler(stream or sys.stderr)
    keep_out(*_secrets_of(settings))
    handler.addFilter(_Scrub())
    handler.addFilter(_WithIds())
    handler.setFormatter(_Scrubbed(formatter(settings.log_format)))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level or settings.log_level.upper())
    logging.captureWarnings(True)  # Python's warnings too, or they break the JSON stream
    for name in _OWN_HANDLERS:
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.propagate = True
