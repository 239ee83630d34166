"""How a run's hash writes its interrupts ("i:<id>") and notifications ("n:<id>"): under
short names, without their id (the field's name says it), values most of them have left
out, times as epoch ms (a notification's sending as ms after its creation). A parked run
holds them for as long as it waits; reading gives the wire shapes back. Notifications are
written by the scripts (lua/_notes.lua names their fields the same); interrupts only here.
docs/stored-format.md writes the format down."""

from __future__ import annotations

import json
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


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


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
