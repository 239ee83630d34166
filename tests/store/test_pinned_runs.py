"""Runs pinned to the version of their agent they started on: create_run.lua records the
version (and the pin), every step of a pinned run is queued on `layby.turns@<version>`
(pushed, or in the outbox), claim_run.lua refuses one to a claimer that does not host that
version without writing anything, and the sweeper's lost-message check leaves pinned runs
alone while their version's queue still holds messages."""

from __future__ import annotations

import json

import pytest

from layby.parking import Verdict
from layby.parking.gauges import VersionCount, live_hosting, runs_by_version
from layby.wire import Status
from tests.store.conftest import MESSAGES, OWNER, World, answer, interrupt, park_event

pytestmark = pytest.mark.store

PINNED = "layby.turns@v1"


def pinned_run(world: World, run_id: str = "run_1", *, pushing: bool = True,
               pinned: bool = True) -> None:
    store = world.store_with(pushing=pushing)
    made = store.runs.create_run(run_id, "demo.agent", input="hi", messages=MESSAGES, metadata={},
                                 idempotency_key=None, agent_version="v1", pinned=pinned)
    assert made.ok, made


def test_a_run_records_the_version_it_started_on_and_a_pin(world: World) -> None:
    pinned_run(world, "run_1")
    pinned_run(world, "run_2", pinned=False)
    assert world.run_hash("run_1")["agent_version"] == "v1"
    assert world.run_hash("run_1")["pinned"] == "1"
    assert world.run_hash("run_2")["agent_version"] == "v1"
    assert "pinned" not in world.run_hash("run_2")
    # A run created without a version (an older caller) has neither.
    world.store.runs.create_run("run_3", "demo.agent", input="hi", messages=MESSAGES, metadata={},
                                idempotency_key=None, pinned=True)
    assert not {"agent_version", "pinned"} & set(world.run_hash("run_3"))
    view = world.store.runs.view("run_1")
    assert view is not None and (view.agent_version, view.pinned) == ("v1", True)
    assert [(s.id, s.agent_version) for s in world.store.lists.list_runs()] == [
        ("run_3", None), ("run_2", "v1"), ("run_1", "v1")]


def test_a_pinned_runs_steps_go_to_its_versions_queue_with_that_routing_key(
        world: World) -> None:
    pinned_run(world)
    pinned_run(world, "run_2", pinned=False)
    assert world.queue(PINNED) == [("layby.run_turn", ["run_1", 1], "run_1:turn:1")]
    assert world.queue("layby.turns") == [("layby.run_turn", ["run_2", 1], "run_2:turn:1")]
    raw = json.loads(world.client.lindex(f"{world.prefix}:broker:{PINNED}", 0))
    # kombu gives a message back to the queue its routing key names (a worker lost).
    assert raw["properties"]["delivery_info"]["routing_key"] == PINNED
    store = world.store_with(pushing=True)
    # Parked, answered: the resume goes to the same queue.
    assert store.runs.claim("run_1", 1, OWNER, ["demo.agent@v1"]).ok
    intrs = [interrupt("int_a")]
    assert store.runs.park("run_1", 1, OWNER, world.history(2), intrs, park_event(intrs)).ok
    assert store.answers.answer("run_1", [answer("int_a")]).resumed
    assert [t for t, _, _ in world.queue(PINNED)] == ["layby.run_turn", "layby.resume_run"]


def test_with_the_broker_elsewhere_the_outbox_entry_names_the_pinned_queue(
        world: World) -> None:
    pinned_run(world, pushing=False)
    [(entry, _)] = world.outbox().values()
    assert entry["queue"] == PINNED and entry["args"] == ["run_1", 1]


@pytest.mark.parametrize("hosted", [[], ["demo.agent@v2"], ["other.agent@v1"]])
def test_a_claimer_that_does_not_host_the_version_is_refused_and_nothing_changes(
        world: World, hosted: list[str]) -> None:
    pinned_run(world)
    before = world.snapshot()
    claimed = world.store.runs.claim("run_1", 1, OWNER, hosted)
    assert claimed.verdict is Verdict.ELSEWHERE and claimed.agent_version == "v1"
    assert world.snapshot() == before  # no attempt counted, no event, no lease


def test_a_claimer_that_hosts_the_version_claims_it_and_reads_its_version(
        world: World) -> None:
    pinned_run(world)
    claimed = world.store.runs.claim("run_1", 1, OWNER, ["demo.agent@v0", "demo.agent@v1"])
    assert claimed.ok and claimed.record is not None
    assert (claimed.record.agent_version, claimed.record.pinned) == ("v1", True)
    # An unpinned run is anyone's.
    pinned_run(world, "run_2", pinned=False)
    claimed = world.store.runs.claim("run_2", 1, OWNER)
    assert claimed.ok and claimed.record is not None
    assert (claimed.record.agent_version, claimed.record.pinned) == ("v1", False)


def test_a_step_handed_back_is_queued_again_on_its_own_queue(world: World) -> None:
    pinned_run(world)
    store = world.store_with(pushing=True)
    assert store.runs.claim("run_1", 1, OWNER, []).verdict is Verdict.ELSEWHERE
    assert store.runs.requeue("run_1").ok
    assert [args for _, args, _ in world.queue(PINNED)] == [["run_1", 1], ["run_1", 1]]
    assert world.queue("layby.turns") == []


def test_pinned_runs_whose_queue_holds_messages_are_not_taken_for_lost(world: World) -> None:
    pinned_run(world, "run_1")
    pinned_run(world, "run_2", pinned=False)
    store = world.store_with(pushing=True, lost_message_ms=0)
    world.next_ms()
    # run_2's message left layby.turns (taken, then lost): it is sought again; run_1's
    # waits in its version's queue, which nobody may read for days.
    world.client.delete(f"{world.prefix}:broker:layby.turns")
    assert store.deadlines.waiting_too_long(0) == ["run_2"]
    world.client.delete(f"{world.prefix}:broker:{PINNED}")
    assert sorted(store.deadlines.waiting_too_long(0)) == ["run_1", "run_2"]
    assert world.indexes_of("run_1").keys() == {Status.QUEUED.value}


def test_a_worker_tells_the_versions_it_hosts_with_its_beat_and_takes_them_out(
        world: World) -> None:
    world.store.processes.beat_worker("w1", "worker 1 0.2.0", hosting=["demo.agent@v1"])
    world.store.processes.beat_worker("w2", "worker 1 0.2.0")
    assert world.client.hgetall(world.keys.hosting) == {"w1": '["demo.agent@v1"]'}
    world.store.processes.forget_worker("w1")
    assert world.client.hgetall(world.keys.hosting) == {}
    world.store_with(lease_ms=-1_000).processes.beat_worker("w3", "worker 1 0.2.0",
                                                            hosting=["demo.agent@v2"])
    assert [name for name, _, _ in world.store.processes.reap_workers()] == ["w3"]
    assert world.client.hgetall(world.keys.hosting) == {}


def test_runs_are_counted_by_agent_version_and_the_live_workers_hosting_read(
        world: World) -> None:
    store = world.store_with(pushing=True)
    for run_id, version, pinned in (("run_1", "v1", True), ("run_2", "v1", True),
                                    ("run_3", "v2", False), ("run_4", None, False)):
        assert store.runs.create_run(run_id, "demo.agent", input="hi", messages=MESSAGES,
                                     metadata={}, idempotency_key=None, agent_version=version,
                                     pinned=pinned).ok
        assert store.runs.claim(run_id, 1, OWNER, ["demo.agent@v1"]).ok
        intrs = [interrupt(f"int_{run_id}")]
        assert store.runs.park(run_id, 1, OWNER, world.history(2), intrs, park_event(intrs)).ok
    pinned_run(world, "run_5")  # queued
    counted = runs_by_version(world.client, world.store.layout, [Status.INTERRUPTED])
    assert counted == {VersionCount("demo.agent", "v1", True): 2,
                       VersionCount("demo.agent", "v2", False): 1,
                       VersionCount("demo.agent", None, False): 1}
    assert runs_by_version(world.client, world.store.layout, [Status.QUEUED]) == {
        VersionCount("demo.agent", "v1", True): 1}

    world.store.processes.beat_worker("w1", "worker 1 0.2.0", hosting=["demo.agent@v1"])
    world.store.processes.beat_worker("w2", "worker 1 0.2.0", hosting=[])
    world.store_with(lease_ms=-1_000).processes.beat_worker("w3", "worker 1 0.2.0",
                                                            hosting=["demo.agent@v2"])
    assert live_hosting(world.client, world.store.layout) == {"w1": ["demo.agent@v1"], "w2": []}


def test_runs_are_listed_by_the_version_they_started_on_a_bounded_stretch_a_page(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(8):
        world.next_ms()
        assert world.store.runs.create_run(f"run_{i}", "demo.agent", input="hi", messages=MESSAGES,
                                           metadata={}, idempotency_key=None,
                                           agent_version="v1" if i % 2 else "v2").ok
    store = world.store
    page, after = store.lists.list_page(limit=2, agent_version="v1")
    assert [r.id for r in page] == ["run_7", "run_5"] and after is not None
    page, after = store.lists.list_page(limit=5, cursor=after, agent_version="v1")
    assert [r.id for r in page] == ["run_3", "run_1"] and after is None
    page, _ = store.lists.list_page(Status.QUEUED, limit=2, offset=1, agent_version="v1")
    assert [r.id for r in page] == ["run_5", "run_3"]
    assert store.lists.list_page(agent_version="v9") == ([], None)
    # A page reads at most VERSION_SCAN runs of the index: fewer found, and a cursor on.
    monkeypatch.setattr("layby.parking.pinning.VERSION_SCAN", 1)
    seen, cursor, pages = [], None, 0
    while True:
        page, cursor = store.lists.list_page(limit=3, cursor=cursor, agent_version="v2")
        seen += [r.id for r in page]
        pages += 1
        if cursor is None:
            break
    assert seen == ["run_6", "run_4", "run_2", "run_0"] and pages == 8
