"""How every layby process logs: plain text or JSON lines (`LAYBY_LOG_FORMAT`), each line
carrying the ids of what it is about (run, interrupt, notification, task).

The ids come from a context variable that the code handling one run sets with `about(...)`
(Celery's task signals do it for every task, see tasks/context.py), so log calls deep in a
model adapter or a mail sender need not pass them along. In JSON every line is one object
with `time`, `level`, `logger`, `message` and the ids as their own fields, which log
pipelines index without parsing messages; in text the ids follow the message in brackets.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TextIO

from pythonjsonlogger.json import JsonFormatter

from layby.broker_config.settings import Settings

# The fields a line may carry, in the order text lines show them.
IDS = ("run_id", "interrupt_id", "notification_id", "task_id", "task_name")

_about: ContextVar[dict[str, str]] = ContextVar("layby_log_about", default={})

# Libraries that set up handlers of their own: their lines go through layby's instead, so
# a process writes one format.
_OWN_HANDLERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "celery", "flower",
                 "tornado.access")


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
    handler.addFilter(_WithIds())
    handler.setFormatter(formatter(settings.log_format))
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
