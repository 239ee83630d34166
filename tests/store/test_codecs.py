"""The short names a run's hash stores its interrupts and notifications under are one table,
Python's (layby.parking.codecs), which parking.scripts writes into the Lua that reads and
writes them too (lua/_notes.lua for notifications; lua/_folding.lua, which reads an
interrupt's reason). docs/stored-format.md writes the format down; these tests check that
both sides read and write it alike.

The Lua is evaluated as parking.scripts assembles it (lua/_notes.lua first, then
lua/_folding.lua, codecs' names written in; not the argument reader, lua/_args.lua,
which they do not use), with a line of the test's own after it that returns what it looks
at, reading its own ARGV; nothing is loaded or changed in the scripts themselves."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import pytest
import redis

from layby.generation.interrupts import (
    BACKGROUND_JOB,
    CONFIRMATION,
    INPUT_REQUIRED,
    TOOL_CALL,
    Escalation,
    ExpiryAction,
    Interrupt,
    OnExpire,
    ResumeMode,
)
from layby.parking import codecs, migrations
from layby.parking.clock import iso
from layby.parking.scripts import shared_source
from layby.wire import Status

from .conftest import OWNER, World

pytestmark = pytest.mark.store

T0 = 1_700_000_000_000


def _file(name: str) -> str:
    """A Lua file as it is, before parking.scripts writes anything in."""
    return (resources.files("layby.parking") / "lua" / f"{name}.lua").read_text()


def _notes_eval(client: redis.Redis, tail: str, *args: str) -> Any:
    """`tail` run after lua/_notes.lua, its reply JSON (cjson) read back."""
    return json.loads(client.eval(shared_source("_notes") + "\n" + tail, 0,  # type: ignore[arg-type]
                                  *args))


# A notification with every field set, none of them at its implied value, and one with
# those left out (a request, sent, at its first attempt).
FULL_NOTE = {"id": "n_full", "kind": "escalation", "token": "tok/é", "interruptId": "int_a",
             "state": "retrying", "attempts": 3, "channel": "webhook",
             "sentAt": T0 + 1_500, "reviewer": "bob", "createdAt": T0, "due": T0 + 60_000,
             "level": 2, "lastError": "503 from the hook"}
IMPLIED_NOTE = {"id": "n_implied", "kind": "request", "token": "tok", "interruptId": "int_a",
                "state": "sent", "attempts": 1, "channel": "email", "sentAt": T0 + 250,
                "reviewer": "alice", "createdAt": T0}
NOTES = pytest.mark.parametrize("rec", [FULL_NOTE, IMPLIED_NOTE], ids=["full", "implied"])


def test_the_note_names_are_the_codecs_both_ways(store_client: redis.Redis) -> None:
    got = _notes_eval(store_client, "return cjson.encode({names = NOTE_NAMES, wire = NOTE_WIRE,"
                                    " implied = NOTE_IMPLIED})")
    assert got["names"] == codecs.NOTE_NAMES
    assert got["wire"] == {short: name for name, short in codecs.NOTE_NAMES.items()}
    assert got["implied"] == codecs.NOTE_IMPLIED
    assert len(set(codecs.NOTE_NAMES.values())) == len(codecs.NOTE_NAMES)
    # Written in by parking.scripts: the file itself spells out no name.
    assert "__NOTE_NAMES__" in _file("_notes") and "interruptId" not in _file("_notes")


def test_the_implied_note_values_are_the_codecs(store_client: redis.Redis) -> None:
    implied = {codecs._NOTE_WIRE[k]: v for k, v in codecs.NOTE_IMPLIED.items()}
    # What an empty record reads as, on both sides.
    assert _notes_eval(store_client, "return cjson.encode(decode_note('{}'))") == implied
    assert codecs.note("n_1", "{}") == {"id": "n_1", **implied}
    # Those values are left out by the Lua encoder, and any other value is written.
    encode = "return encode_note(cjson.decode(ARGV[1]))"
    assert _notes_eval(store_client, encode, json.dumps(implied)) == {}
    others = {"kind": "reminder", "state": "pending", "attempts": 2}
    assert set(others) == set(implied)
    assert _notes_eval(store_client, encode, json.dumps(others)) == {
        codecs.NOTE_NAMES[k]: v for k, v in others.items()}


@NOTES
def test_a_note_goes_round_python_and_lua(store_client: redis.Redis, rec: dict[str, Any]
                                          ) -> None:
    """Python's record (codecs.stored_note: migration 1 writes it) is what Lua's
    encode_note writes of the same notification, and each side reads the other's."""
    if rec is FULL_NOTE:
        assert set(rec) - {"id"} == set(codecs.NOTE_NAMES), "every field is set"
    stored = codecs.stored_note(rec)
    if rec is IMPLIED_NOTE:
        assert not {"k", "s", "a"} & set(json.loads(stored)), "the implied ones left out"
    assert codecs.note(rec["id"], stored) == rec
    # Lua reads the record codecs' tables wrote as Python does…
    without_id = {k: v for k, v in rec.items() if k != "id"}
    assert _notes_eval(store_client, "return cjson.encode(decode_note(ARGV[1]))",
                       stored) == without_id
    # …writes it back the same…
    again = _notes_eval(store_client, "return encode_note(decode_note(ARGV[1]))", stored)
    assert again == json.loads(stored)
    # …and writes the long-name record the store hands it (parking.store.fields.stored_note,
    # with its id, as record_plan is given it) the same, which Python reads back whole.
    written = _notes_eval(store_client, "return encode_note(cjson.decode(ARGV[1]))",
                          json.dumps(rec))
    assert written == json.loads(stored)
    assert codecs.note(rec["id"], json.dumps(written)) == rec


def test_a_note_sent_without_its_creation_time_is_written_and_read_alike(
        store_client: redis.Redis) -> None:
    """With no creation time to count from, when it was sent stays under its long name, as
    ms: on both sides."""
    rec = {"id": "n_1", "kind": "request", "interruptId": "int_a", "state": "sent",
           "attempts": 1, "channel": "email", "sentAt": T0}
    stored = codecs.stored_note(rec)
    assert json.loads(stored) == {"i": "int_a", "c": "email", "sentAt": T0}
    assert _notes_eval(store_client, "return encode_note(cjson.decode(ARGV[1]))",
                       json.dumps(rec)) == json.loads(stored)
    assert codecs.note("n_1", stored) == rec
    assert _notes_eval(store_client, "return cjson.encode(decode_note(ARGV[1]))",
                       stored) == {k: v for k, v in rec.items() if k != "id"}


@NOTES
def test_a_long_name_note_is_migrated_to_what_lua_writes(world: World, rec: dict[str, Any]
                                                          ) -> None:
    """0.1.0's predecessors stored a notification under its long names, all of them.
    Migration 1 (codecs.stored_note) writes it as lua/_notes.lua's encode_note writes the
    same record, and both sides read it back whole."""
    world.make("interrupted")
    field = f"n:{rec['id']}"
    world.client.hset(world.keys.run("run_1"), field,
                      json.dumps({k: v for k, v in rec.items() if k != "id"}))
    migrations.migrate(world.client, world.keys, until=1)
    stored = world.run_hash("run_1")[field]
    assert json.loads(stored) == _notes_eval(
        world.client, "return encode_note(cjson.decode(ARGV[1]))", json.dumps(rec))
    assert json.loads(codecs.stored_note(rec)) == json.loads(stored)
    assert codecs.note(rec["id"], stored) == rec
    assert _notes_eval(world.client, "return cjson.encode(decode_note(ARGV[1]))",
                       stored) == {k: v for k, v in rec.items() if k != "id"}


# -- interrupts: Python writes them (codecs.stored_interrupt), Lua keeps the bytes and
# reads only the reason (the folded park event), Python reads them back.

def _full_interrupt(iid: str = "int_a", reason: str = CONFIRMATION) -> Interrupt:
    """Every field set, none at its default (nor at a value the codec leaves out)."""
    return Interrupt(
        id=iid, reason=reason, message="ship it?", tool_call_id=f"call_{iid}",
        response_schema={"type": "boolean"}, expires_at=iso(T0 + 86_400_000),
        metadata={"ticket": 7}, tool_name="ship", tool_input={"order": "o_1"},
        input_schema={"type": "object"}, mode=ResumeMode.RESTART,
        on_expire=OnExpire(action=ExpiryAction.RESOLVE, payload=False),
        reviewers=["alice", "bob"], created_at=iso(T0), turn=3,
        response_type="shop.models:Decision", required_approvals=2,
        escalation=[Escalation(after_s=3600, reviewers=["carol"])], remind_every_s=600,
        rule="big-orders")


def _implied_interrupt(iid: str = "int_b") -> Interrupt:
    return Interrupt(id=iid, reason=INPUT_REQUIRED, message="which size?",
                     tool_call_id=f"call_{iid}", tool_name="ask", mode=ResumeMode.RESPOND,
                     created_at=iso(T0))


def test_every_interrupt_field_has_its_short_name_or_its_own() -> None:
    intr = _full_interrupt()
    wire = intr.model_dump(mode="json", by_alias=True, exclude_none=True,
                           exclude_defaults=True)
    stored = json.loads(codecs.stored_interrupt(intr))
    assert set(wire) - {"id"} == {codecs._INTERRUPT_WIRE.get(k, k) for k in stored}
    assert stored["t"] == T0  # createdAt in ms
    assert len(set(codecs.INTERRUPT_NAMES.values())) == len(codecs.INTERRUPT_NAMES)
    implied = json.loads(codecs.stored_interrupt(_implied_interrupt()))
    assert not set(codecs.INTERRUPT_IMPLIED) & set(implied)


def test_an_interrupt_goes_round_the_scripts(world: World) -> None:
    """Python's record, stored by park_run as given, handed back by claim_run, read by
    Python: the same interrupt (every field, and one with the implied ones left out)."""
    intrs = [_full_interrupt(), _implied_interrupt()]
    run = world.make("resuming", interrupts=intrs)
    held = world.run_hash(run.id)
    for intr in intrs:
        assert held[f"i:{intr.id}"] == codecs.stored_interrupt(intr)
    claimed = world.store.runs.claim(run.id, run.version, OWNER)
    assert claimed.ok, claimed
    assert claimed.record is not None
    assert claimed.record.parked_on == intrs


REASONS = [INPUT_REQUIRED, TOOL_CALL, CONFIRMATION, BACKGROUND_JOB, "acme:sign_off"]


def test_lua_gets_an_interrupts_reason_name_from_compact(store_client: redis.Redis) -> None:
    got = json.loads(store_client.eval(  # type: ignore[arg-type]
        shared_source("_notes") + "\n" + shared_source("_folding") + "\n"
        + "return cjson.encode({REASON, REASON_IMPLIED})", 0))
    assert got == [codecs.INTERRUPT_NAMES["reason"], codecs.INTERRUPT_IMPLIED["r"]]
    assert INPUT_REQUIRED not in _file("_folding")


@pytest.mark.parametrize("migrated", [False, True], ids=["compact", "migrated"])
@pytest.mark.parametrize("reason", REASONS)
def test_lua_reads_an_interrupts_reason_as_compact_does(world: World, reason: str,
                                                        migrated: bool) -> None:
    """_folding.lua rebuilds a folded park event from each interrupt's reason, read off its
    record (`r`, implied when left out). A record 0.1.0's predecessors stored in the
    interrupt's wire form reads the same once migration 1 rewrote it."""
    intrs = [_full_interrupt("int_a", reason), _implied_interrupt("int_b")]
    if reason != INPUT_REQUIRED:
        intrs[1] = intrs[1].model_copy(update={"reason": reason})
    run_key, events_key = world.keys.run("run_r"), world.keys.events("run_r")
    raws = {}
    for intr in intrs:
        raws[intr.id] = (json.dumps(intr.model_dump(mode="json", by_alias=True,
                                                    exclude_none=True, exclude={"id"}))
                         if migrated else codecs.stored_interrupt(intr))
        world.client.hset(run_key, f"i:{intr.id}", raws[intr.id])
    if migrated:
        world.client.hset(run_key, mapping={"status": "interrupted", "version": 2})
        world.client.zadd(world.shard.index(Status.INTERRUPTED), {"run_r": 1})
        migrations.migrate(world.client, world.keys, until=1)
        raws = {iid: world.client.hget(run_key, f"i:{iid}") for iid in raws}
        assert raws == {intr.id: codecs.stored_interrupt(intr) for intr in intrs}
    source = (shared_source("_notes") + "\n" + shared_source("_folding") + "\n"
              + "return REBUILD.i({'1', '2', ARGV[1], ARGV[2]})")
    got = json.loads(world.client.eval(source, 2, run_key, events_key,  # type: ignore[arg-type]
                                       *raws))
    assert got["interrupts"] == [
        {"id": iid, "reason": codecs.interrupt(iid, raw).reason} for iid, raw in raws.items()]
    assert [i["reason"] for i in got["interrupts"]] == [i.reason for i in intrs]
