"""The store's format version and migration 1, straight on a real Valkey: a store of layby
0.1.0 (no version) is refused until `migrate` has run; the records 0.1.0 still read from its
unreleased predecessors come out of migration 1 as format 1 writes them; a dry run counts
and writes nothing; a second run changes nothing; a run stopped mid-way goes on. (Each test
here runs migration 1 alone, `until=1`: migration 2, the sharded layout, has its own,
tests/store/test_migration_2.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest

from layby.generation.messages import Message, Part, ToolRequest, dump_messages
from layby.parking import Announcements, Keys, codecs, formats, migrations
from layby.parking.formats import FormatError
from layby.parking.migrations.m0001_versioned import old_keys
from layby.reviewers.tokens import Grant
from layby.wire import Status
from tests.store.conftest import OWNER, World, answer, interrupt, note

pytestmark = pytest.mark.store


def _aged(world: World, run_id: str) -> dict[str, str]:
    """The run as layby's predecessors of 0.1.0 kept it (and 0.1.0 still read): its id in
    its hash, its interrupts, notifications and open ids in keys of their own, under their
    wire names. Returns the run's hash as format 1 has it, to compare."""
    key, before = world.keys.run(run_id), world.run_hash(run_id)
    old_interrupts, old_notes = {}, {}
    for name, value in before.items():
        if name.startswith("i:"):
            spec = world.store.answers.interrupt(run_id, name[2:])
            assert spec is not None
            old_interrupts[name[2:]] = spec.model_dump_json(by_alias=True, exclude_none=True)
        elif name.startswith("n:"):
            old_notes[name[2:]] = json.dumps(codecs.note(name[2:], value))
    interrupts, notifications, open_ids = old_keys(world.keys, run_id)
    pipe = world.client.pipeline()
    pipe.hdel(key, *[n for n in before if n[:2] in ("i:", "n:")], "open")
    pipe.hset(key, "id", run_id)
    if old_interrupts:
        pipe.hset(interrupts, mapping=old_interrupts)
    if old_notes:
        pipe.hset(notifications, mapping=old_notes)
    if before.get("open"):
        pipe.sadd(open_ids, *before["open"].split())
    pipe.execute()
    return before


def _decoded(run: dict[str, str]) -> dict[str, Any]:
    """A run's hash with its records decoded (JSON's order of keys is not the format's)."""
    return {k: json.loads(v) if k[:2] in ("i:", "n:") else v for k, v in run.items()}


def _parked_with_a_note(world: World, run_id: str) -> None:
    world.make("interrupted", run_id, interrupts=[interrupt("int_a"), interrupt("int_b")],
               plan=Announcements(notes=[(note("ntf_1", "int_a", token="tok"), None)]))


def test_an_empty_store_is_stamped_with_the_newest_format(world: World) -> None:
    assert formats.read(world.client, world.keys).version is None
    state = formats.check(world.client, world.keys, migrations.newest(), stamp_shards=16)
    assert (state.version, state.shards) == (migrations.newest(), 16) == (2, 16)
    assert migrations.pending(state) == []
    # The sharded layout from the start: nothing to move, ever.
    assert formats.layout(state, world.prefix, world.now()) == formats.Layout(
        Keys(world.prefix, 16))


def test_a_store_of_0_1_0_is_refused_until_it_is_migrated(world: World) -> None:
    world.make("interrupted")
    with pytest.raises(FormatError) as refused:
        formats.check(world.client, world.keys, migrations.newest())
    assert "no format version" in refused.value.message
    assert "reads formats 1–2" in refused.value.message
    assert "`layby migrate`" in refused.value.message
    assert formats.read(world.client, world.keys).version is None  # nothing stamped
    [report] = migrations.migrate(world.client, world.keys, until=1)
    assert (report.number, report.finished) == (1, True)
    assert formats.check(world.client, world.keys, migrations.newest()).version == 1
    # Migrated on (migration 2): the store moves to the sharded layout it is given.
    [report] = migrations.migrate(world.client, world.keys, shards=4)
    assert (report.number, report.finished) == (2, True)
    state = formats.check(world.client, world.keys, migrations.newest())
    assert (state.version, state.shards) == (2, 4)


def test_a_store_of_a_newer_format_is_refused(world: World) -> None:
    world.make("queued")
    world.client.hset(world.keys.format, "version", 3)
    with pytest.raises(FormatError, match=r"format 3 \(written by a newer layby\)"):
        formats.check(world.client, world.keys, 1)


def test_migration_1_gives_back_the_runs_format_1_writes(world: World) -> None:
    _parked_with_a_note(world, "run_1")
    world.make("completed", "run_2")
    expected = _aged(world, "run_1")
    grant = world.shard.grant("ref_1")
    world.client.set(grant, json.dumps({"run_id": "run_1", "interrupt_id": "int_a",
                                        "reviewer": "Alice Smith", "version": 2,
                                        "expires": 1900000000}), ex=3600)

    counted = migrations.dry_run(world.client, world.keys, until=1)
    assert [(r.number, r.changed) for r in counted] == [(1, 2)]  # run_1 and the grant

    [report] = migrations.migrate(world.client, world.keys, until=1)
    assert report.changed == 2 and report.seen == 5  # two runs, their streams, one grant
    assert _decoded(world.run_hash("run_1")) == _decoded(expected)
    assert not world.client.exists(*old_keys(world.keys, "run_1"))
    assert world.client.get(grant) == "run_1 int_a 2 1900000000 Alice Smith"
    assert 0 < world.client.ttl(grant) <= 3600
    # Read as format 1 reads it: both interrupts open, the request planned.
    view = world.store.runs.view("run_1")
    assert view is not None
    assert [(i.id, i.state) for i in view.interrupts] == [("int_a", "open"), ("int_b", "open")]
    assert [(n.id, n.state) for n in view.notifications] == [("ntf_1", "pending")]


def test_a_dry_run_changes_nothing(world: World) -> None:
    _parked_with_a_note(world, "run_1")
    _aged(world, "run_1")
    before = world.snapshot()
    [report] = migrations.dry_run(world.client, world.keys, until=1)
    assert report.changed == 1 and not report.finished
    assert world.snapshot() == before


def test_migrating_twice_changes_nothing_the_second_time(world: World) -> None:
    _parked_with_a_note(world, "run_1")
    _aged(world, "run_1")
    migrations.migrate(world.client, world.keys, until=1)
    after = world.snapshot()
    assert migrations.migrate(world.client, world.keys, until=1) == []  # nothing pending
    # And the migration's own rewrite, asked again of every key, finds nothing to do.
    first = migrations.registered()[0]
    visited = [key for key in world.client.scan_iter(match=f"{world.prefix}:*")
               if first.rewrites(world.keys, key)]
    assert len(visited) == 2  # the run, its stream
    assert not any(first.rewrite(world.client, world.keys, key, False) for key in visited)
    assert world.snapshot() == after


def test_a_migration_stopped_mid_way_goes_on_where_it_stopped(world: World) -> None:
    for n in range(30):
        _parked_with_a_note(world, f"run_{n:02}")
        _aged(world, f"run_{n:02}")

    class Killed(Exception):
        pass

    seen = []

    def die_after_three_batches(count: int) -> None:
        seen.append(count)
        if len(seen) == 3:
            raise Killed

    with pytest.raises(Killed):
        migrations.migrate(world.client, world.keys, batch=5,
                           progress=die_after_three_batches, until=1)
    state = formats.read(world.client, world.keys)
    assert state.version is None and state.migrating == 1
    cursor = world.client.hget(world.keys.format, "m1:cursor")
    assert cursor not in (None, "0", "done")
    [report] = migrations.migrate(world.client, world.keys, batch=5, until=1)
    assert report.finished and formats.read(world.client, world.keys).version == 1
    for n in range(30):
        assert not world.client.exists(old_keys(world.keys, f"run_{n:02}")[0])
        assert "id" not in world.run_hash(f"run_{n:02}")
    assert report.changed == 30


def test_one_migration_at_a_time(world: World) -> None:
    world.make("queued")
    world.client.set(world.keys.migrate_lock, "elsewhere:1", px=10_000)
    with pytest.raises(migrations.MigrationBusy, match="elsewhere:1"):
        migrations.migrate(world.client, world.keys, until=1)
    assert formats.read(world.client, world.keys).version is None


def test_a_resumed_run_without_waiting_gets_it_from_its_history(world: World) -> None:
    """0.1.0's predecessors did not record what a park waited on: migration 1 takes it
    from the last model message, as the step used to."""
    world.make("resuming")
    parked = Message(role="model", content=[
        Part(tool_request=ToolRequest(name="ask", ref="c1", input={}),
             metadata={"interrupt": {"id": "int_a"}})])
    world.client.hset(world.keys.run("run_1"), "messages",
                      json.dumps(dump_messages([*world.history(1), parked])))
    world.client.hdel(world.keys.run("run_1"), "waiting")
    migrations.migrate(world.client, world.keys, until=1)
    assert world.run_hash("run_1")["waiting"] == "int_a"
    assert world.client.zscore(world.shard.index(Status.RESUMING), "run_1") is not None


@pytest.mark.parametrize("form", ["object", "array"])
def test_a_grant_stored_as_json_reads_back_the_same_once_migrated(world: World,
                                                                   form: str) -> None:
    """0.1.0's predecessors stored a grant as JSON: an object of `Grant`'s fields, or
    before it an array in their order. Migration 1 stores its values (`Grant.stored`), its
    lifetime kept, and it reads back as the grant it was."""
    world.make("interrupted")
    given = Grant("run_1", "int_a", "Ops team (EU) <ops@example.com>", 4, 1_900_000_000)
    stored = given.dumps() if form == "object" else json.dumps(
        [given.run_id, given.interrupt_id, given.reviewer, given.version, given.expires])
    key = world.shard.grant("ref_1")
    world.client.set(key, stored, ex=3600)
    migrations.migrate(world.client, world.keys, until=1)
    assert world.client.get(key) == given.stored()
    assert Grant.loads(world.client.get(key)) == given
    assert 0 < world.client.ttl(key) <= 3600


def _waiting_on(world: World, run_id: str, *iids: str) -> None:
    """The run's last message: the model's, parked on `iids`."""
    parked = Message(role="model", content=[
        Part(tool_request=ToolRequest(name="ask", ref=f"call_{iid}", input={}),
             metadata={"interrupt": {"id": iid}}) for iid in iids])
    world.client.hset(world.keys.run(run_id), "messages",
                      json.dumps(dump_messages([*world.history(1), parked])))


def test_a_parked_run_without_waiting_gets_it_when_its_open_interrupts_say_less(
        world: World) -> None:
    """A park of 0.1.0's predecessors recorded no `waiting`; in format 1 its absence means
    "the open interrupts". One answered before the park (a background job's) is not open:
    migration 1 takes what the park waited on from the last model message, and the resume
    is handed both. A run whose open interrupts are what it waited on is left as it is."""
    for run_id in ("run_1", "run_2"):
        world.make("interrupted", run_id, interrupts=[interrupt("int_a"), interrupt("int_b")])
        _waiting_on(world, run_id, "int_a", "int_b")
        assert "waiting" not in world.run_hash(run_id)
    world.client.hset(world.keys.run("run_1"), "open", "int_a")
    world.client.hset(world.keys.answers("run_1"), "int_b",
                      json.dumps(answer("int_b", by="job").wire()))
    migrations.migrate(world.client, world.keys, until=1)
    assert world.run_hash("run_1")["waiting"] == "int_a int_b"
    assert "waiting" not in world.run_hash("run_2")
    done = world.store.answers.answer("run_1", [answer("int_a")])
    assert done.resumed and done.version is not None
    claimed = world.store.runs.claim("run_1", done.version, OWNER)
    assert claimed.record is not None
    assert [i.id for i in claimed.record.parked_on] == ["int_a", "int_b"]
    assert claimed.record.answers["int_b"].answered_by == "job"


def _as_0_1_0_wrote_it(world: World, run_id: str) -> None:
    """The run's stream as 0.1.0 wrote it: a step's messages inside its event's data, its
    last member, not in a field of their own; the entries' ids and the stream's lifetime
    as they were."""
    key = world.keys.events(run_id)
    entries = world.client.xrange(key)
    ttl = world.client.pttl(key)
    pipe = world.client.pipeline()
    pipe.delete(key)
    for entry_id, fields in entries:
        if "messages" in fields:
            messages = fields.pop("messages")
            fields["data"] = fields["data"][:-1] + ',"messages":' + messages + "}"
        pipe.xadd(key, fields, id=entry_id)
    if ttl > 0:
        pipe.pexpire(key, ttl)
    pipe.execute()


def test_a_stream_of_0_1_0_holds_its_steps_messages_apart_once_migrated(
        world: World) -> None:
    """0.1.0 kept a step's messages inside its event's data; format 1 keeps them in a field
    of their own. Migration 1 writes the stream again so: the same entries, under the same
    ids, its lifetime kept, and every event reads as the step wrote it (its messages the
    event's, not the history's)."""
    world.make("running")
    told = [{"role": "model", "content": [{"text": "as the step wrote it"}]}]
    assert world.store.runs.advance("run_1", 1, OWNER, world.history(2),
                                    {"from": 1, "historyTo": 2, "messages": told}, inline=True).ok
    assert world.store.runs.complete("run_1", 2, OWNER, world.history(3), "done",
                                     {"from": 2, "historyTo": 3, "result": "done",
                                      "messages": told}).ok
    key = world.keys.events("run_1")
    # An entry of 0.1.0's predecessors too: its time in `at` (read by nothing).
    world.client.xadd(key, {"type": "custom", "version": 3, "data": "{}", "at": 1})
    stream, events = world.client.xrange(key), world.store.runs.events("run_1")
    assert [e.data["messages"] for e in events if "messages" in e.data] == [told, told]
    _as_0_1_0_wrote_it(world, "run_1")
    assert not [f for _, f in world.client.xrange(key) if "messages" in f]

    [report] = migrations.migrate(world.client, world.keys, until=1)
    assert report.changed == 1  # the stream (the run's hash has nothing to change)
    assert world.client.xrange(key) == stream
    assert world.store.runs.events("run_1") == events
    assert 0 < world.client.pttl(key) <= world.store.config.retention_s * 1000


def test_a_parked_runs_folded_steps_of_0_1_0_lose_the_messages_the_history_holds(
        world: World) -> None:
    """A run 0.1.0 parked without a plan, then folded, kept a step's messages in its
    folded line (the fold keeps an event it cannot rebuild as it was stored). Migration 1
    drops them, as a fold does now: readers take them from the history, as before."""
    added = world.stepped_then_parked_unplanned()
    _as_0_1_0_wrote_it(world, "run_1")
    world.next_ms()
    assert world.store_with(fold_after_ms=0).lists.fold_parked() == 1
    folded = world.run_hash("run_1")["events"]
    assert folded.count('"messages"') == 1
    events = world.store.runs.events("run_1")
    assert [e.data["messages"] for e in events if e.type == "turn.committed"] == [added]

    migrations.migrate(world.client, world.keys, until=1)
    now = world.run_hash("run_1")["events"]
    assert '"messages"' not in now and now.count("\n") == folded.count("\n")
    assert now == folded.replace(',"messages":' + json.dumps(added, separators=(",", ":")),
                                 "")
    assert world.store.runs.events("run_1") == events


def test_a_cursor_saved_on_another_server_starts_the_scan_again(world: World) -> None:
    """A SCAN cursor means something only to the server that made it: after a restart or
    a failover mid-way, the migration scans from the start (and finds done what it did)."""
    for n in range(12):
        _parked_with_a_note(world, f"run_{n:02}")
        _aged(world, f"run_{n:02}")
    world.client.hset(world.keys.format, mapping={
        "migrating": 1, "m1:cursor": "done", "m1:server": "a-server-gone-since"})
    [report] = migrations.migrate(world.client, world.keys, batch=5, until=1)
    assert report.finished and report.changed == 12
    assert not any(world.client.exists(old_keys(world.keys, f"run_{n:02}")[0])
               for n in range(12))
    assert set(world.client.hgetall(world.keys.format)) == {"version", "m1:done", "m1:seen",
                                                            "m1:changed"}
