"""The codecs of the records in a run's hash, one per record, and the versions of each.

Interrupts ("i:<id>") and notifications ("n:<id>") are written under short names, without
their id (the field's name says it), values most of them have left out, times as epoch ms
(a notification's sending as ms after its creation): a parked run holds them for as long as
it waits; reading gives the wire shapes back. Notifications are also written by the
scripts: `parking.scripts` writes these very tables into lua/_notes.lua and
lua/_folding.lua, so Lua and Python cannot drift (tests/store/test_codecs.py).

A record's encoding changes only with a new format (a numbered migration,
`layby.parking.migrations`). While a deployment rolls, processes of the newer release
write the older format (`layby.parking.formats`: the store's `writing`), and read both;
so a format's new encoding must be told from the one before by a tag of its own (a
prefix a value of the earlier format never has), never guessed from what it holds. A
value without a tag is in format 1 (`Codec`; a run's metadata goes through one).

The records kept elsewhere: a reviewer token's grant (`layby.reviewers.tokens:Grant.stored`,
a room this one may not import) and the task messages the scripts push
(`layby.broker_config.messages`). docs/stored-format.md writes every one of them down.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from layby.generation.interrupts import Interrupt
from layby.parking.clock import iso

# Wire name → stored name. A name not here is stored as it is.
INTERRUPT_NAMES = {"reason": "r", "message": "m", "toolCallId": "c", "responseSchema": "s",
                   "toolName": "n", "toolInput": "in", "mode": "md", "reviewers": "rv",
                   "createdAt": "t", "expiresAt": "x", "inputSchema": "is", "turn": "tu",
                   "responseType": "rt", "metadata": "me", "onExpire": "oe",
                   "agentVersion": "av"}
# Values most interrupts have, written only when they differ. (lua/_folding.lua reads a
# record's reason by the short name and the value here: parking.scripts writes them in.)
INTERRUPT_IMPLIED = {"r": "input_required", "md": "respond"}
# A notification's long name → its short name, and the values left out (a request, sent, at
# the first attempt: what a parked run's notifications most often are). lua/_notes.lua
# writes and reads by these very tables (parking.scripts writes them into its source).
NOTE_NAMES = {"kind": "k", "token": "t", "interruptId": "i", "state": "s", "attempts": "a",
              "channel": "c", "sentAt": "sa", "reviewer": "r", "createdAt": "ca", "due": "d",
              "level": "l", "lastError": "e"}
NOTE_IMPLIED: dict[str, str | int] = {"k": "request", "s": "sent", "a": 1}

_INTERRUPT_WIRE = {v: k for k, v in INTERRUPT_NAMES.items()}
_NOTE_WIRE = {v: k for k, v in NOTE_NAMES.items()}
# When a notification was sent is stored as ms after it was created.
_SENT, _CREATED = NOTE_NAMES["sentAt"], NOTE_NAMES["createdAt"]


def _ms(moment: str) -> int | str:
    """An RFC 3339 time as epoch ms, when it reads back the same; else as it is."""
    try:
        ms = round(datetime.fromisoformat(moment.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return moment
    return ms if iso(ms) == moment else moment


def stored_interrupt(intr: Interrupt) -> str:
    wire = intr.model_dump(mode="json", by_alias=True, exclude_none=True,
                           exclude_defaults=True)
    wire.pop("id", None)
    stored: dict[str, Any] = {}
    for name, value in wire.items():
        short = INTERRUPT_NAMES.get(name, name)
        if short == "t" and isinstance(value, str):
            value = _ms(value)
        stored[short] = value
    for short, value in INTERRUPT_IMPLIED.items():
        if stored.get(short) == value:
            del stored[short]
        elif short not in stored:
            raise ValueError(f"an interrupt without its {_INTERRUPT_WIRE[short]}")
    return _dumps(stored)


def interrupt(interrupt_id: str, raw: str) -> Interrupt:
    wire: dict[str, Any] = {"id": interrupt_id}
    for short, value in {**INTERRUPT_IMPLIED, **json.loads(raw)}.items():
        wire[_INTERRUPT_WIRE.get(short, short)] = value
    if isinstance(wire.get("createdAt"), int):
        wire["createdAt"] = iso(wire["createdAt"])
    return Interrupt.model_validate(wire)


def stored_note(wire: dict[str, Any]) -> str:
    """A notification's record (wire names, times as epoch ms) as lua/_notes.lua's
    `encode_note` writes it."""
    stored: dict[str, Any] = {}
    for name, value in wire.items():
        short = NOTE_NAMES.get(name, name)
        if name != "id" and not (short in NOTE_IMPLIED and NOTE_IMPLIED[short] == value):
            stored[short] = value
    if isinstance(stored.get(_SENT), int) and isinstance(stored.get(_CREATED), int):
        stored[_SENT] -= stored[_CREATED]
    elif _SENT in stored:  # no creation time to count from: as it is, under its long name
        stored["sentAt"] = stored.pop(_SENT)
    return _dumps(stored)


def note(notification_id: str, raw: str) -> dict[str, Any]:
    """A notification's record in its wire names (times still as stored)."""
    data = json.loads(raw)
    wire: dict[str, Any] = {"id": notification_id}
    for short, value in {**NOTE_IMPLIED, **data}.items():
        wire[_NOTE_WIRE.get(short, short)] = value
    if _SENT in data and _CREATED in data:  # ms after it was created
        wire["sentAt"] = data[_CREATED] + data[_SENT]
    return wire


@dataclass(frozen=True)
class Encoding:
    format: int
    encode: Callable[[Any], str]
    decode: Callable[[str], Any]
    tagged: Callable[[str], bool]  # whether a stored value is in this encoding


@dataclass
class Codec:
    name: str
    first: Encoding  # format 1's, which has no tag
    later: list[Encoding] = field(default_factory=list)

    def add(self, encoding: Encoding) -> Encoding:
        """The encoding of a later format (a migration's)."""
        if encoding.format <= max(e.format for e in [self.first, *self.later]):
            raise ValueError(f"{self.name}: format {encoding.format} is not after the "
                             "encodings it has")
        self.later.append(encoding)
        return encoding

    def encode(self, value: Any, format: int) -> str:
        """`value` as format `format` writes it (the newest encoding not after it)."""
        chosen = self.first
        for encoding in self.later:
            if encoding.format <= format:
                chosen = encoding
        return chosen.encode(value)

    def decode(self, raw: str) -> Any:
        for encoding in reversed(self.later):
            if encoding.tagged(raw):
                return encoding.decode(raw)
        return self.first.decode(raw)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# A run's metadata (the hash's `metadata` field), written only when the run has some.
RUN_METADATA = Codec("run metadata", Encoding(1, _dumps, json.loads, lambda raw: False))


def metadata(raw: str | None) -> dict[str, Any]:
    """A run's metadata as stored (none: `{}`)."""
    return RUN_METADATA.decode(raw) if raw else {}
