"""The reads the reviewers' inbox makes over many runs: `open_interrupts` (the open requests
of waiting runs, their reviews, no histories), `soonest_deadlines` (the runs whose requests
expire first, however old), and the reviewers' request index (`asking`: the waiting runs
that ask a name), kept by the transitions in the sharded layout, and read by the inbox
whatever the number of runs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from layby.generation.interrupts import Escalation
from layby.inbox import waiting
from layby.parking import Announcements, formats
from layby.reviewers.directory import Directory
from layby.wire import InterruptState
from tests.store.conftest import World, answer, handover, interrupt

pytestmark = pytest.mark.store


def test_open_interrupts_are_those_still_open_of_runs_that_wait(world: World) -> None:
    at = world.now()
    world.make("interrupted", "run_1", interrupts=[interrupt("int_a", expires_ms=at + 60_000),
                                                   interrupt("int_b")])
    world.make("interrupted", "run_2")
    world.make("completed", "run_3")
    found = world.store.inbox.open_interrupts(["run_1", "run_2", "run_3", "run_gone"])
    assert [(run_id, agent, sorted(i.id for i in intrs)) for run_id, agent, intrs in found] \
        == [("run_1", "demo.agent", ["int_a", "int_b"]), ("run_2", "demo.agent", ["int_a"])]
    assert all(i.state is InterruptState.OPEN for _, _, intrs in found for i in intrs)
    # What a view says of the same requests.
    view = world.store.runs.view("run_1")
    assert view is not None
    assert {i.id: i for i in found[0][2]} == {i.id: i for i in view.interrupts}


def test_the_soonest_deadlines_come_first_whatever_the_run(world: World) -> None:
    at = world.now()
    for run_id, due in (("run_late", 3_600_000), ("run_past", -5_000), ("run_soon", 60_000)):
        world.make("interrupted", run_id, interrupts=[interrupt("int_a", expires_ms=at + due)])
    world.make("interrupted", "run_never")  # no expiry: no deadline
    assert world.store.deadlines.soonest_deadlines(2) == ["run_past", "run_soon"]
    assert world.store.deadlines.soonest_deadlines() == ["run_past", "run_soon", "run_late"]


def _asking(world: World, *names: str, limit: int = 100) -> list[str]:
    found, more = world.store.inbox.asking(list(names), limit)
    assert not more
    return found


def test_a_parked_run_is_under_every_name_its_open_interrupts_ask(sharded: World) -> None:
    escalating = interrupt("int_b", reviewers=["alice"]).model_copy(update={
        "escalation": [Escalation(after_s=3600, reviewers=["boss", "ops"])]})
    sharded.make("interrupted", "run_1", interrupts=[interrupt("int_a", reviewers=["ops"]),
                                                     escalating])
    sharded.next_ms()  # asked later, not in the same millisecond: the order below is known
    sharded.make("interrupted", "run_2")  # names nobody: the default group
    assert _asking(sharded, "ops") == _asking(sharded, "alice") == ["run_1"]
    assert _asking(sharded, "boss") == ["run_1"]
    assert _asking(sharded, "*") == ["run_2"]
    assert _asking(sharded, "carol") == []
    # The most recently asked first, from every name given, each run once.
    assert _asking(sharded, "*", "alice", "ops") == ["run_2", "run_1"]


def test_a_run_leaves_the_index_when_it_stops_waiting(sharded: World) -> None:
    two = [interrupt("int_a", reviewers=["alice"]), interrupt("int_b", reviewers=["bob"])]
    sharded.make("interrupted", "run_answered", interrupts=two)
    sharded.make("interrupted", "run_cancelled",
                 interrupts=[interrupt("int_a", reviewers=["alice"])])
    store = sharded.store
    # One of two answered: it still waits, under both names (the inbox reads what is open).
    assert store.answers.answer("run_answered", [answer("int_a")]).ok
    assert _asking(sharded, "bob") == ["run_answered"]
    assert store.answers.answer("run_answered", [answer("int_b")]).resumed
    assert store.runs.cancel("run_cancelled", "api:ops", "no longer needed").ok
    assert _asking(sharded, "alice", "bob") == []
    for run_id in ("run_answered", "run_cancelled"):
        assert "asks" not in sharded.run_hash(run_id)
    assert not [key for key in sharded.snapshot() if ":asks:" in key]  # nothing left behind


def test_a_request_handed_on_is_under_its_new_reviewer(sharded: World) -> None:
    sharded.make("interrupted", "run_1", interrupts=[interrupt("int_a", reviewers=["alice"])])
    assert sharded.store.answers.delegate("run_1", "int_a", handover("alice", "bob"),
                                          Announcements()).ok
    assert _asking(sharded, "bob") == ["run_1"]
    # A hand-over of a reviewer away, recorded with a plan, as the notifier does.
    sharded.store.outbox.plan_notifications("run_1", Announcements(
        handovers=[("int_a", handover("bob", "carol"))]))
    assert _asking(sharded, "carol") == ["run_1"]
    assert sharded.store.answers.answer("run_1", [answer("int_a")]).resumed
    assert _asking(sharded, "alice", "bob", "carol") == []


def test_the_index_says_when_a_name_asks_more_than_was_read(sharded: World) -> None:
    for n in range(3):
        sharded.make("interrupted", f"run_{n}", interrupts=[interrupt("int_a", reviewers=["ops"])])
        sharded.next_ms()
    assert sharded.store.inbox.asking(["ops"], 2) == (["run_2", "run_1"], True)
    assert sharded.store.inbox.asking(["ops"], 3) == (["run_2", "run_1", "run_0"], False)


def test_the_legacy_layout_keeps_no_index(world: World) -> None:
    """A store of format 1 (layby 0.2.0's layout) holds what 0.2.0 writes, nothing more:
    migration 2 indexes its waiting runs once they moved (tests/store/test_migration_2.py)."""
    world.make("interrupted", "run_1", interrupts=[interrupt("int_a", reviewers=["alice"])])
    assert "asks" not in world.run_hash("run_1")
    assert not [key for key in world.snapshot() if ":asks:" in key]


DIRECTORY = Directory.model_validate({
    "default_group": "ops",
    "reviewers": {"alice": {"email": "alice@example.com"}, "bob": {"email": "bob@example.com"}},
    "groups": {"ops": ["alice"], "finance": ["bob"]}})


def _inbox_of(store: Any, reviewer: str) -> waiting.Listing:
    rt = SimpleNamespace(store=store, reviewers=SimpleNamespace(directory=lambda: DIRECTORY))
    return waiting.waiting_for(rt, DIRECTORY.reviewers[reviewer])  # type: ignore[arg-type]


def test_the_inbox_finds_a_reviewers_request_among_any_number_of_newer_runs(
        sharded: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The inbox reads `SCAN` waiting runs at most: here 2, and alice's one request is older
    than three of bob's. Through the index, hers are all it reads."""
    monkeypatch.setattr(waiting, "SCAN", 2)
    sharded.make("interrupted", "run_alice", interrupts=[interrupt("int_a")])  # the default group
    for n in range(3):
        sharded.next_ms()
        sharded.make("interrupted", f"run_bob_{n}",
                     interrupts=[interrupt("int_a", reviewers=["finance"])])
    formats.stamp(sharded.client, sharded.keys, formats.SHARDED, 3)
    store = sharded.store_with()
    assert store.version == formats.SHARDED
    assert waiting.names_of(DIRECTORY, DIRECTORY.reviewers["alice"]) == ["alice", "ops", "*"]
    mine = _inbox_of(store, "alice")
    assert [(w.run.id, w.why) for w in mine.items] == [
        ("run_alice", ["asked of group ops"])]
    assert not mine.truncated
    # Bob's three are more than it reads: the two most recently asked, and it says so.
    bobs = _inbox_of(store, "bob")
    assert sorted(w.run.id for w in bobs.items) == ["run_bob_1", "run_bob_2"]
    assert bobs.truncated and bobs.total == 2
    # A store still moving from 0.2.0's layout (before migration 2) reads the newest waiting
    # runs of all, as before: alice's is not among them.
    sharded.client.hset(sharded.keys.format, "version", formats.FIRST)
    older = sharded.store_with()
    assert [w.run.id for w in _inbox_of(older, "alice").items] == []
    assert _inbox_of(older, "alice").truncated
