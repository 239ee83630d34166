"""delegate_interrupt.lua: a reviewer hands an open interrupt to another: recorded once per
reviewer and interrupt, what was still to be sent to the one handing it on skipped, the new
reviewer's request recorded and delivered in the same step (or the announcement task
queued). 'again', 'conflict' and 'missing' change nothing."""

from __future__ import annotations

import json

import pytest

from layby.parking import Announcements, Verdict
from layby.wire import Status
from tests.store.conftest import World, answer, handover, interrupt, note

pytestmark = pytest.mark.store


def _parked(world: World, store=None) -> None:  # type: ignore[no-untyped-def]
    later = world.now() + 600_000
    world.make("interrupted", store=store, interrupts=[interrupt("int_a"), interrupt("int_b")],
               plan=Announcements(notes=[(note("ntf_a1", "int_a"), later),
                                         (note("ntf_a2", "int_a", reviewer="carol"), later),
                                         (note("ntf_b1", "int_b"), later)]))


def _to_bob() -> Announcements:
    return Announcements(notes=[(note("ntf_bob", "int_a", reviewer="bob"), None)],
                         grants=[("ref_bob", "bob's grant", 60_000)])


def test_a_hand_over_is_recorded_and_the_new_reviewer_asked_at_once(world: World) -> None:
    _parked(world)
    away = handover("alice", "bob")
    done = world.store.answers.delegate("run_1", "int_a", away, _to_bob())
    assert done.verdict is Verdict.OK and done.version == 2
    assert (done.planned, done.dispatch, done.entries) == (("ntf_bob",), ("ntf_bob",), ())
    review = world.client.hgetall(world.keys.review("run_1"))
    assert json.loads(review["delegated:int_a:alice"]) == away.wire()
    states = {n.id: n.state for n in world.notes("run_1").values()}
    # Alice's request for int_a is not sent; carol's, and alice's for int_b, still are.
    assert states == {"ntf_a1": "skipped", "ntf_a2": "pending", "ntf_b1": "pending",
                      "ntf_bob": "pending"}
    assert "run_1 ntf_a1" not in world.zset(world.shard.notify_due)
    assert world.store.answers.grant("ref_bob") == "bob's grant"
    assert world.event_types("run_1")[-2:] == ["interrupt.delegated", "notifications.planned"]
    assert world.events("run_1")[-2][2] == away.wire()
    view = world.store.runs.view("run_1")
    assert view.interrupts[0].delegations == [away]
    assert (world.run_hash("run_1")["status"], world.run_hash("run_1")["version"]) == (
        "interrupted", "2")


def test_a_hand_over_without_a_plan_queues_the_announcement_task(world: World) -> None:
    _parked(world)
    done = world.store.answers.delegate("run_1", "int_a", handover("alice", "bob"), None)
    (entry,) = done.entries
    assert (entry.id, entry.task, entry.args) == ("run_1:notify:2", "layby.notify.interrupts",
                                                  ["run_1", 2])


def test_with_the_broker_on_the_server_the_new_request_is_pushed(world: World) -> None:
    store = world.store_with(pushing=True)
    _parked(world, store=store)
    done = store.answers.delegate("run_1", "int_a", handover("alice", "bob"), _to_bob())
    assert done.planned == ("ntf_bob",) and done.dispatch == ()
    assert world.queue("layby.notify")[-1] == ("layby.notify.deliver", ["run_1", "ntf_bob"],
                                               "ntf_bob")


def test_handing_the_same_interrupt_on_twice_is_refused_and_changes_nothing(
        world: World) -> None:
    _parked(world)
    world.store.answers.delegate("run_1", "int_a", handover("alice", "bob"), _to_bob())
    before = world.snapshot()
    again = world.store.answers.delegate("run_1", "int_a", handover("alice", "dave"), Announcements(
        notes=[(note("ntf_dave", "int_a", reviewer="dave"), None)]))
    assert again.verdict is Verdict.AGAIN and again.interrupt_id == "int_a"
    assert world.snapshot() == before


def test_handing_on_an_answered_interrupt_is_a_conflict_with_its_answer(world: World) -> None:
    _parked(world)
    first = answer("int_a", by="carol")
    world.store.answers.answer("run_1", [first])
    before = world.snapshot()
    refused = world.store.answers.delegate("run_1", "int_a", handover("alice", "bob"), _to_bob())
    assert refused.verdict is Verdict.CONFLICT and refused.first == first
    assert refused.status is Status.INTERRUPTED
    assert world.snapshot() == before


def test_handing_on_for_a_run_that_no_longer_waits_is_a_conflict(world: World) -> None:
    run = world.make("resuming")
    before = world.snapshot()
    refused = world.store.answers.delegate(run.id, "int_a", handover("alice", "bob"), _to_bob())
    assert refused.verdict is Verdict.CONFLICT and refused.status is Status.RESUMING
    assert world.snapshot() == before


def test_handing_on_for_a_missing_run_writes_nothing(world: World) -> None:
    refused = world.store.answers.delegate("run_x", "int_a", handover("alice", "bob"), _to_bob())
    assert refused.verdict is Verdict.MISSING
    assert world.snapshot() == {}
