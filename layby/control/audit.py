"""The audit trail: what every caller did, and what it was refused, with the time, the
caller, the tenant, the action, the run, the interrupt, the channel, the outcome and the
source address. Kept in the store (`layby.parking.audit`): an action that changes a run is
recorded by the transition itself (its entries given to the transition's script), a
refusal or a run token on its own.

Where a request came from (its address) and by which way in (its channel) are the edge's to
know: it sets them for the request (`from_request`), and the commands read them here. No
entry holds a secret, a token or a reviewer's link: callers are names (`api:<name>`,
`reviewer:<id>`), never keys.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import TypeAdapter, ValidationError

from layby.control.runtime import Runtime
from layby.errors import Invalid
from layby.wire import AuditEntry, AuditPage

_SOURCE: ContextVar[str | None] = ContextVar("layby_audit_source", default=None)
_CHANNEL: ContextVar[str | None] = ContextVar("layby_audit_channel", default=None)


@contextmanager
def from_request(source: str | None, channel: str) -> Iterator[None]:
    """For the block (a request): where calls come from, and by which way in."""
    tokens = _SOURCE.set(source), _CHANNEL.set(channel)
    try:
        yield
    finally:
        _SOURCE.reset(tokens[0])
        _CHANNEL.reset(tokens[1])


def channel(default: str = "internal") -> str:
    """The way in of the request being served (`default` outside one: the command line, a
    task)."""
    return _CHANNEL.get() or default


@dataclass(frozen=True)
class Entry:
    caller: str
    tenant: str
    action: str  # start, answer, approve, decline, cancel, token.mint, token.revoke, read…
    run: str | None = None
    interrupt: str | None = None
    channel: str | None = None
    outcome: str = "ok"  # ok, or the refusal's code (forbidden, self_approval, notfound…)
    source: str | None = None
    subject: str | None = None  # whom it was about, when not a run (inbox.revoke: a reviewer)

    def dumps(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None},
                          separators=(",", ":"), ensure_ascii=False)


def entry(caller: str, tenant: str, action: str, *, run: str | None = None,
          interrupt: str | None = None, outcome: str = "ok",
          via: str | None = None, subject: str | None = None) -> str:
    """One entry, as the store keeps it, of the request being served."""
    return Entry(caller, tenant, action, run, interrupt, via or channel(), outcome,
                 _SOURCE.get(), subject).dumps()


def refused(rt: Runtime, caller: str, tenant: str, action: str, outcome: str, *,
            run: str | None = None, interrupt: str | None = None) -> None:
    """Keep a refusal (it changes no run): in the run's shard, or the caller's."""
    rt.store.audit.record([entry(caller, tenant, action, run=run, interrupt=interrupt,
                                 outcome=outcome)], of=run or caller)


_SINCE = re.compile(r"^(\d{1,6})([smhd])$")
_NUMBER = re.compile(r"^[\d.eE+-]*$")
_MOMENT = TypeAdapter(datetime)


def since_ms(text: str | None, *, relative: bool = True) -> int | None:
    """An RFC 3339 time, or (with `relative`) `45s`, `30m`, `1h`, `2d` ago; in epoch ms."""
    if text is None:
        return None
    found = _SINCE.match(text) if relative else None
    if found:
        unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[found.group(2)]
        moment = datetime.now(UTC) - timedelta(**{unit: int(found.group(1))})
        return int(moment.timestamp() * 1000)
    try:
        if _NUMBER.match(text):  # a time is written as one, not as seconds since 1970
            raise ValueError(text)
        moment = _MOMENT.validate_python(text)
    except (ValueError, ValidationError):
        ago = "a time ago (45s, 30m, 1h, 2d) nor " if relative else ""
        raise Invalid(f"since {text[:40]!r} is neither {ago}an RFC 3339 time "
                      "(2026-11-29T12:00:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def read_page(rt: Runtime, *, run: str | None, caller: str | None, tenant: str | None,
              since: str | None, cursor: str | None, limit: int,
              relative: bool = True) -> AuditPage:
    def keep(e: dict[str, Any]) -> bool:
        return (caller is None or e.get("caller") == caller) and (
            tenant is None or e.get("tenant") == tenant)

    found, after = rt.store.audit.page(run=run, keep=keep,
                                       since_ms=since_ms(since, relative=relative),
                                       cursor=cursor, limit=limit)
    return AuditPage(entries=[AuditEntry.of(e) for e in found], next_cursor=after)
