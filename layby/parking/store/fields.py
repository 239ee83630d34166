"""How a run's hash is written and read back: its interrupts' and notifications' fields
(`INTERRUPT`, `NOTE`: scanned for, not read with its history), its reviews, and the JSON
the scripts take."""

from __future__ import annotations

import json
import re
from typing import Any, cast

from layby.generation.interrupts import Interrupt
from layby.generation.messages import Message
from layby.parking import codecs
from layby.parking.clock import iso
from layby.parking.keys import Keys
from layby.wire import Answer, Delegation, Escalated, Notification, RetryWait, Review

# The fields of a run's hash that hold its interrupts and its notifications
# (lua/_prelude.lua), and how many a scan for them asks for at once.
INTERRUPT, NOTE = "i:", "n:"
SCAN_COUNT = 1000


# A W3C traceparent as OpenTelemetry writes it: version 00, trace id, span id, flags.
_TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def traceparent(value: str | None) -> str:
    """A trace context as the scripts store it: a well-formed traceparent, or '' (the
    scripts put it into task messages' JSON as it is: nothing else may get there)."""
    return value if value and _TRACEPARENT.fullmatch(value) else ""


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def first_scan(client: Any, keys: Keys, run_id: str, prefix: str) -> Any:
    """The first HSCAN of the run's `prefix` fields (queued, on a pipeline)."""
    return client.hscan(keys.run(run_id), 0, match=prefix + "*", count=SCAN_COUNT)


def scanned_fields(redis: Any, keys: Keys, run_id: str, prefix: str,
                   scanned: tuple[int, dict[str, str]]) -> dict[str, str]:
    """Id → JSON of the run's `prefix` fields, from a first HSCAN reply on (a large hash
    can take more than one)."""
    cursor, found = int(scanned[0]), scanned[1]
    # A cluster's MULTI hands HSCAN's reply back raw: its fields and values in a list.
    fields = found if isinstance(found, dict) else dict(zip(found[::2], found[1::2],
                                                           strict=True))
    while cursor:
        cursor, more = cast("tuple[int, dict[str, str]]", redis.hscan(
            keys.run(run_id), cursor, match=prefix + "*", count=SCAN_COUNT))
        fields.update(more)
    return {name[len(prefix):]: value for name, value in fields.items()}


def one_field(redis: Any, keys: Keys, run_id: str, prefix: str, item_id: str) -> str | None:
    """One interrupt's or notification's JSON (None when the run has no such one)."""
    return cast("str | None", redis.hget(keys.run(run_id), prefix + item_id))




def event_args(event: dict[str, Any]) -> tuple[str, str]:
    """A step's event (its data as readers get it) as the scripts take it: its data, and
    its `messages` (the step's, JSON; '' without) apart, for the stream entry holds them in
    a field of their own (parking.events puts them back)."""
    data = dict(event)
    added = data.pop("messages", None)
    return dumps(data), "" if added is None else dumps(added)


def first_text(messages: list[Message]) -> str | None:
    """The text of a history's first message when it is a user's text alone (as a run
    started from an input string begins), else None."""
    if not messages or messages[0].role != "user" or len(messages[0].content) != 1:
        return None
    part = messages[0].content[0]
    return part.text if part.text is not None and part.wire() == {"text": part.text} else None


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def stored_note(note: Notification) -> dict[str, Any]:
    """A notification as stored: its wire form (no nulls: Lua reads them as truthy values)
    and its token, which the wire form leaves out; level 0 (the first reviewers asked, most
    notifications) is left out too, as Lua and the reader take a missing level for it."""
    stored = {**note.wire(), "token": note.token}
    if not stored.get("level"):
        stored.pop("level", None)
    return stored


def prefixed(run: dict[str, str], prefix: str) -> dict[str, str]:
    """Id → JSON of the `prefix` fields of a run's hash as read whole."""
    return {k[len(prefix):]: v for k, v in run.items() if k.startswith(prefix)}


def retry_of(field: str | None) -> RetryWait | None:
    """What a run's step waits for to try failed tool calls again (its `retry` field)."""
    return RetryWait.model_validate_json(field) if field else None


def open_of(field: str | None) -> set[str]:
    """The run's open interrupts, from its `open` field (ids, space-separated)."""
    return set((field or "").split())


def interrupts_of(specs: dict[str, str], answers: dict[str, str], open_ids: set[str]
                  ) -> tuple[list[Interrupt], dict[str, Answer], set[str]]:
    found = sorted((codecs.interrupt(k, v) for k, v in specs.items()),
                   key=lambda i: (i.created_at or "", i.id))
    return (found, {k: Answer.model_validate_json(v) for k, v in answers.items()},
            set(open_ids))


def reviews_of(raw: dict[str, str]) -> dict[str, Review]:
    """The review hash (parking.keys) read per interrupt, each list in time order."""
    found: dict[str, Review] = {}
    for name, value in raw.items():
        kind, _, rest = name.partition(":")
        interrupt_id, _, tail = rest.partition(":")
        review = found.setdefault(interrupt_id, Review())
        if kind == "approval":
            review.approvals.append(Answer.model_validate_json(value))
        elif kind == "delegated":
            review.delegations.append(Delegation.model_validate_json(value))
        elif kind == "escalated":
            review.escalations.append(Escalated(level=int(tail), at=iso(value)))
    for review in found.values():
        review.approvals.sort(key=lambda a: a.answered_at)
        review.delegations.sort(key=lambda d: d.at)
        review.escalations.sort(key=lambda e: e.level)
    return found


def notifications_of(raw: dict[str, str]) -> list[Notification]:
    """Notification id → the record as stored, as `Notification`s in the order they were
    planned."""
    return sorted((notification_of(k, v) for k, v in raw.items()),
                  key=lambda n: (n.created_at or "", n.interrupt_id, n.reviewer, n.channel,
                                 n.kind))


def notification_of(notification_id: str, raw: str) -> Notification:
    data = codecs.note(notification_id, raw)
    due = data.pop("due", None)  # the record's own schedule, shown while one is pending
    if due is not None and data.get("state") in ("pending", "retrying"):
        data["nextAttemptAt"] = iso(due)
    for field_name in ("createdAt", "sentAt"):
        if isinstance(data.get(field_name), int):
            data[field_name] = iso(data[field_name])
    return Notification.model_validate(data)
