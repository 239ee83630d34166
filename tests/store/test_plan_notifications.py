"""plan_notifications.lua: the announcements of a parked run's open interrupts recorded,
each once (planning again after a crash sends nothing twice), with their grants and the
hand-overs of reviewers away; requests due now delivered. A run that no longer waits gets
nothing."""

from __future__ import annotations

import json

import pytest

from layby.parking import Announcements
from tests.store.conftest import World, answer, handover, interrupt, note

pytestmark = pytest.mark.store


def _plan(world: World) -> Announcements:
    return Announcements(notes=[(note("ntf_1", "int_a", token="t1"), None),
                                (note("ntf_2", "int_a", reviewer="bob", token="t2"),
                                 world.now() + 600_000)],
                         grants=[("ref_1", "grant one", 60_000), ("ref_2", "grant two", 60_000)])


def test_a_plan_is_recorded_and_what_is_due_now_is_dispatched(world: World) -> None:
    run = world.make("interrupted")
    assert world.run_hash(run.id)["noted"] == "0"
    before = world.now()
    plan = _plan(world)
    planned, dispatch = world.store.outbox.plan_notifications(run.id, plan)
    assert (planned, dispatch) == (["ntf_1", "ntf_2"], ["ntf_1"])
    notes = world.notes(run.id)
    assert {n.id: (n.reviewer, n.state, n.attempts) for n in notes.values()} == {
        "ntf_1": ("alice", "pending", 0), "ntf_2": ("bob", "pending", 0)}
    assert world.raw_note(run.id, "ntf_2")["d"] == plan.notes[1][1]
    assert "noted" not in world.run_hash(run.id)
    due = world.zset(world.shard.notify_due)
    assert due["run_1 ntf_2"] == plan.notes[1][1]
    assert before + 10_000 <= due["run_1 ntf_1"] <= world.now() + 10_000
    assert (world.store.answers.grant("ref_1"), world.store.answers.grant("ref_2")) == ("grant one",
                                                                                        "grant two")
    assert world.events(run.id)[-1] == ("notifications.planned", 2,
                                        {"ids": ["ntf_1", "ntf_2"]})


def test_planning_the_same_notifications_again_changes_nothing(world: World) -> None:
    run = world.make("interrupted")
    world.store.outbox.plan_notifications(run.id, _plan(world))
    before = world.snapshot()
    again = Announcements(notes=[(note("ntf_1", "int_a", token="other"), None)],
                          grants=[("ref_1", "another grant", 60_000)])
    assert world.store.outbox.plan_notifications(run.id, again) == ([], [])
    assert world.snapshot() == before


def test_a_grant_already_stored_is_not_replaced_by_a_later_plan(world: World) -> None:
    run = world.make("interrupted")
    world.store.outbox.plan_notifications(run.id, _plan(world))
    later = Announcements(notes=[(note("ntf_3", "int_a", reviewer="carol"), None)],
                          grants=[("ref_1", "another grant", 60_000),
                                  ("ref_3", "grant three", 60_000)])
    assert world.store.outbox.plan_notifications(run.id, later) == (["ntf_3"], ["ntf_3"])
    grant = world.store.answers.grant
    assert (grant("ref_1"), grant("ref_3")) == ("grant one", "grant three")


def test_a_plan_for_a_run_that_no_longer_waits_is_not_recorded(world: World) -> None:
    run = world.make("resuming")
    before = world.snapshot()
    assert world.store.outbox.plan_notifications(run.id, _plan(world)) == ([], [])
    assert world.snapshot() == before


def test_a_reviewer_away_is_handed_over_once_per_open_interrupt(world: World) -> None:
    run = world.make("interrupted", interrupts=[interrupt("int_a"), interrupt("int_b")])
    world.store.answers.answer(run.id, [answer("int_b")])
    away = handover("alice", "bob")
    plan = Announcements(notes=[(note("ntf_1", "int_a", reviewer="bob"), None)],
                         handovers=[("int_a", away), ("int_b", away)])
    assert world.store.outbox.plan_notifications(run.id, plan)[0] == ["ntf_1"]
    review = world.client.hgetall(world.keys.review(run.id))
    assert review == {"delegated:int_a:alice": json.dumps(away.wire(), separators=(",", ":"))}
    assert [d for t, _, d in world.events(run.id) if t == "interrupt.delegated"] == [away.wire()]
    # Planned again: the hand-over is not recorded twice.
    again = Announcements(handovers=[("int_a", handover("alice", "carol"))])
    before = world.snapshot()
    assert world.store.outbox.plan_notifications(run.id, again) == ([], [])
    assert world.snapshot() == before


def test_with_the_broker_on_the_server_a_request_due_now_is_pushed(world: World) -> None:
    store = world.store_with(pushing=True)
    run = world.make("interrupted", store=store)
    planned, dispatch = store.outbox.plan_notifications(run.id, _plan(world))
    assert (planned, dispatch) == (["ntf_1", "ntf_2"], [])
    assert world.queue("layby.notify") == [("layby.notify.deliver", ["run_1", "ntf_1"],
                                            "ntf_1")]
    assert world.zset(world.shard.notify_due)["run_1 ntf_1"] >= world.now() + 290_000
