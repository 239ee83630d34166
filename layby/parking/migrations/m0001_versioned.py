"""Migration 1: a store of layby 0.1.0 (no format version) in format 1.

layby 0.1.0 read besides what it wrote the records of its unreleased predecessors, in 29
places. Those records are rewritten here once, and nothing reads them any more:

- a run whose hash has an `id` field kept its interrupts, notifications and open
  interrupts in keys of their own (`:interrupts`, `:notifications`, `:open`): they move
  into the run's hash (`i:<id>`, `n:<id>`, `open`), the `id` field goes;
- interrupts and notifications stored under their wire names are stored under the short
  names (`parking.codecs`);
- a run parked before layby recorded what a park waited on gets its `waiting` field from
  the history (the interrupts of its last model message): answered (queued, running or
  resuming), or still parked when that differs from its open interrupts (one answered
  before the park: the resume must still see it);
- a reviewer token's grant stored as JSON is stored as its values (`Grant.stored`).

And what 0.1.0 wrote itself, which format 1 holds otherwise: a step's event (`turn.committed`,
`run.interrupted`, `run.completed`) kept its messages inside its data, where format 1 keeps
them in a field of their own beside it (`parking.events`). Each stream is written again
with them there, its entries' ids and its lifetime kept; a folded event of a parked run
(the run's field `events`: `lua/_folding.lua`) has no room for them, and is written
without them when its data says where they are in the history (`from`, `historyTo`),
as a park drops them (the history holds them; readers fill them in from there).

Event entries that also carry their time in an `at` field (the entry id's time, always
the same) are left as they are: readers take the time from the id.
"""

from __future__ import annotations

import json
import re
from typing import Any, cast

from redis import Redis, WatchError

from layby.generation.interrupts import Interrupt
from layby.generation.messages import load_messages
from layby.parking import codecs
from layby.parking.events import STEP_EVENTS
from layby.parking.keys import Keys
from layby.parking.migrations.registry import Migration, register

INTERRUPT, NOTE = "i:", "n:"
# How 0.1.0 told a record under its wire names: a name every interrupt has (toolCallId is
# required) and one every notification had (the short names leave `kind` out or write `k`).
WIRE_INTERRUPT, WIRE_NOTE = "toolCallId", "kind"
UNFINISHED = {"queued", "running", "interrupted", "resuming"}


# A folded event kept as it was stored (`_folding.lua:fold_line`): its time and sequence,
# its version, its type, its data.
FOLDED_AS_STORED = re.compile(r"(-?\d+-\d+) = (\S+) (\S+) (.*)")


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def old_keys(keys: Keys, run_id: str) -> tuple[str, str, str]:
    """The keys a run of 0.1.0's predecessors kept its interrupts, notifications and open
    interrupts in (a hash, a hash, a set): named here alone, as this migration moves them
    into the run's hash and nothing else reads them."""
    return (f"{keys.prefix}:{{{run_id}}}:interrupts", f"{keys.prefix}:{{{run_id}}}:notifications",
            f"{keys.prefix}:{{{run_id}}}:open")


def _run_id(key: str) -> str:
    return key[key.index("{") + 1:key.rindex("}")]


def _fields_of_run(raw: dict[str, str], older: dict[str, dict[str, str]] | None,
                   open_set: set[str] | None) -> tuple[dict[str, str], list[str]]:
    """The fields to write (in format 1), and those to delete, for a run hash `raw`."""
    write: dict[str, str] = {}
    drop: list[str] = []
    interrupts = {k[2:]: v for k, v in raw.items() if k.startswith(INTERRUPT)}
    notes = {k[2:]: v for k, v in raw.items() if k.startswith(NOTE)}
    if older is not None:  # the run's copy wins, as 0.1.0 read it
        interrupts = {**older["interrupts"], **interrupts}
        notes = {**older["notifications"], **notes}
        drop.append("id")
        if "open" not in raw:
            write["open"] = " ".join(sorted(open_set or ()))
    for iid, rec in interrupts.items():
        data = json.loads(rec)
        if older is not None or WIRE_INTERRUPT in data:
            new = codecs.stored_interrupt(_interrupt(iid, data))
            if new != raw.get(INTERRUPT + iid):
                write[INTERRUPT + iid] = new
    for nid, rec in notes.items():
        data = json.loads(rec)
        if older is not None or WIRE_NOTE in data:
            new = codecs.stored_note({"id": nid, **data} if WIRE_NOTE in data
                                      else codecs.note(nid, rec))
            if new != raw.get(NOTE + nid):
                write[NOTE + nid] = new
    status = raw.get("status")
    if "waiting" not in raw and status in UNFINISHED:
        waited = _waited_on(raw.get("messages"))
        # A parked run without the field waits on its open interrupts (format 1's meaning
        # of its absence); one whose history says otherwise is given it.
        opened = set(write.get("open", raw.get("open") or "").split())
        if waited and (status != "interrupted" or set(waited) != opened):
            write["waiting"] = " ".join(waited)
    folded = _folded_without_messages(raw.get("events"))
    if folded != raw.get("events"):
        write["events"] = cast("str", folded)
    return write, drop


def _step_data(kind: str, data: str) -> dict[str, Any] | None:
    """A step's event data holding its messages, read (None: any other)."""
    if kind not in STEP_EVENTS:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) and "messages" in value else None


def _folded_without_messages(text: str | None) -> str | None:
    """A run's folded events, those of its steps that held their messages without them
    (where the history tells where they are)."""
    if not text:
        return text
    lines = text.split("\n")
    for n, line in enumerate(lines):
        found = FOLDED_AS_STORED.fullmatch(line)
        data = found and _step_data(found[3], found[4])
        if found and data is not None and "from" in data and "historyTo" in data:
            del data["messages"]
            lines[n] = f"{found[1]} = {found[2]} {found[3]} {_dumps(data)}"
    return "\n".join(lines)


def _interrupt(interrupt_id: str, data: dict[str, Any]) -> Interrupt:
    """An interrupt's record as 0.1.0 read it: its wire form, or format 1's."""
    if WIRE_INTERRUPT in data:
        return Interrupt.model_validate({"id": interrupt_id, **data})
    return codecs.interrupt(interrupt_id, json.dumps(data))


def _waited_on(messages: str | None) -> list[str]:
    """The interrupts of the history's last message, when it is the model's (a park's)."""
    history = load_messages(json.loads(messages or "[]"))
    last = history[-1] if history else None
    if last is None or last.role != "model":
        return []
    return [p.meta("interrupt", {}).get("id") for p in last.tool_requests
            if p.meta("interrupt") is not None]


def rewrite_run(client: Redis, keys: Keys, key: str, dry: bool) -> bool:
    run_id = _run_id(key)
    legacy = old_keys(keys, run_id)
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                # The run and its old keys as one moment: a transition that changes them
                # meanwhile wins, and the run is read again.
                pipe.watch(key, *legacy)  # type: ignore[no-untyped-call]
                raw = cast("dict[str, str]", pipe.hgetall(key))
                if not raw:
                    return False
                older = None
                open_set = None
                if "id" in raw:
                    older = {"interrupts": cast("dict[str, str]", pipe.hgetall(legacy[0])),
                             "notifications": cast("dict[str, str]",
                                                   pipe.hgetall(legacy[1]))}
                    open_set = cast("set[str]", pipe.smembers(legacy[2]))
                write, drop = _fields_of_run(raw, older, open_set)
                if not (write or drop):
                    return False
                if dry:
                    return True
                pipe.multi()
                if write:
                    pipe.hset(key, mapping=write)  # type: ignore[arg-type]
                if drop:
                    pipe.hdel(key, *drop)
                    pipe.delete(*legacy)
                pipe.execute()
                return True
            except WatchError:
                continue


def _messages_apart(fields: dict[str, str]) -> dict[str, str] | None:
    """A stream entry whose step's messages are inside its data, with them in a field of
    their own right after it instead (None: an entry that holds none there)."""
    data = None if "messages" in fields else _step_data(fields.get("type", ""),
                                                       fields.get("data", ""))
    if data is None:
        return None
    messages = data.pop("messages")
    out: dict[str, str] = {}
    for name, value in fields.items():
        out[name] = _dumps(data) if name == "data" else value
        if name == "data":
            out["messages"] = _dumps(messages)
    return out


def rewrite_events(client: Redis, keys: Keys, key: str, dry: bool) -> bool:
    """A run's stream, its steps' messages apart from their data: written again whole,
    each entry under its own id (a stream entry cannot be changed in place)."""
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                # The stream as one moment: an event appended meanwhile wins, and the
                # stream is read again.
                pipe.watch(key)  # type: ignore[no-untyped-call]
                entries = cast("list[tuple[str, dict[str, str]]]", pipe.xrange(key))
                apart = [_messages_apart(fields) for _, fields in entries]
                if not any(apart):
                    return False
                if dry:
                    return True
                ttl = pipe.pttl(key)  # a finished run's: what is left of its retention
                pipe.multi()
                pipe.delete(key)
                for (entry_id, fields), moved in zip(entries, apart, strict=True):
                    pipe.xadd(key, moved or fields, id=entry_id)  # type: ignore[arg-type]
                if ttl > 0:
                    pipe.pexpire(key, ttl)
                pipe.execute()
                return True
            except WatchError:
                continue


# A grant's fields in the order of `layby.reviewers.tokens.Grant` (a JSON array held them
# so), and the order `Grant.stored` writes them in (the reviewer last: it may hold spaces).
GRANT_FIELDS = ("run_id", "interrupt_id", "reviewer", "version", "expires")
STORED_ORDER = ("run_id", "interrupt_id", "version", "expires", "reviewer")


def _grant_values(value: Any) -> str:
    named = value if isinstance(value, dict) else dict(zip(GRANT_FIELDS, value, strict=True))
    return " ".join(str(named[name]) for name in STORED_ORDER)


def rewrite_grant(client: Redis, keys: Keys, key: str, dry: bool) -> bool:
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(key)  # type: ignore[no-untyped-call]
                raw = cast("str | None", pipe.get(key))
                if raw is None or not raw.startswith(("[", "{")):
                    return False
                if dry:
                    return True
                pipe.multi()
                pipe.set(key, _grant_values(json.loads(raw)), keepttl=True, xx=True)
                pipe.execute()
                return True
            except WatchError:
                continue


def _rewrite(client: Redis, keys: Keys, key: str, dry: bool) -> bool:
    # Grants written before formats were: the legacy shard's, the only one there was.
    if key.startswith(keys.legacy.grant("")):
        return rewrite_grant(client, keys, key, dry)
    if key.endswith(":events"):
        return rewrite_events(client, keys, key, dry)
    return rewrite_run(client, keys, key, dry)


MIGRATION = register(Migration(
    1, "layby 0.1.0's store, versioned: the records of its predecessors in format 1",
    ("{*}:run", "{*}:events", "grant:*"), _rewrite))
