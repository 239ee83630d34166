"""requeue_run.lua: a running run whose lease lapsed (its worker died) → queued at the same
version, its turn queued again; operators may take a live lease over ('*'), and requeue a
run that waits for a lost message. 'busy', 'skipped' and 'missing' change nothing."""

from __future__ import annotations

import pytest

from layby.parking import Verdict
from layby.wire import Status
from tests.store.conftest import OWNER, World

pytestmark = pytest.mark.store


def test_a_run_whose_lease_lapsed_is_queued_again_at_the_same_version(world: World) -> None:
    world.make("running", store=world.store_with(lease_ms=-1_000))
    assert world.store.deadlines.lapsed_leases() == ["run_1"]
    done = world.store.runs.requeue("run_1")
    assert done.verdict is Verdict.OK
    run = world.run_hash("run_1")
    assert (run["status"], run["version"]) == ("queued", "1")
    assert "lease_owner" not in run and "lease_until" not in run
    assert world.zset(world.shard.leases) == {}
    assert world.indexes_of("run_1") == {"queued": int(run["updated_at"])}
    assert world.events("run_1")[-1] == ("run.requeued", 1, {})
    (entry,) = done.entries
    assert (entry.id, entry.args) == ("run_1:turn:1", ["run_1", 1])
    # The turn is claimed again, counted as its second attempt.
    assert world.store.runs.claim("run_1", 1, "worker-2").attempt == 2


def test_a_run_whose_lease_is_live_is_busy_and_changes_nothing(world: World) -> None:
    world.make("running")
    before = world.snapshot()
    assert world.store.runs.requeue("run_1").verdict is Verdict.BUSY
    assert world.store.runs.requeue("run_1", owner="worker-2").verdict is Verdict.BUSY
    assert world.snapshot() == before


@pytest.mark.parametrize("taker", ["*", OWNER])
def test_an_operator_or_the_lease_holder_requeues_a_live_lease_at_once(
        world: World, taker: str) -> None:
    world.make("running")
    assert world.store.runs.requeue("run_1", owner=taker).ok
    assert world.run_hash("run_1")["status"] == Status.QUEUED
    assert world.zset(world.shard.leases) == {}


def test_a_queued_run_whose_message_was_lost_is_queued_again(world: World) -> None:
    world.make("queued")
    created = world.indexes_of("run_1")["queued"]
    outbox = world.outbox()
    done = world.store.runs.requeue("run_1")
    assert done.ok and [e.id for e in done.entries] == ["run_1:turn:1"]
    # Its place in the index moves on, so the scan for lost messages finds it again only
    # after another full wait; the outbox keeps one entry for the turn.
    assert world.indexes_of("run_1")["queued"] >= created
    assert world.outbox().keys() == outbox.keys()
    assert world.events("run_1")[-1] == ("run.requeued", 1, {})


def test_a_resuming_run_is_requeued_with_its_resume(world: World) -> None:
    store = world.store_with(pushing=True)
    run = world.make("resuming", store=store)
    assert store.runs.requeue(run.id).ok
    assert world.queue("layby.turns")[-2:] == [
        ("layby.resume_run", ["run_1", 3], "run_1:resume:3"),
        ("layby.resume_run", ["run_1", 3], "run_1:resume:3")]


@pytest.mark.parametrize("status", ["interrupted", "completed", "cancelled"])
def test_a_run_waiting_for_no_worker_is_skipped_and_left_as_it_is(world: World,
                                                                  status: str) -> None:
    run = world.make(status)
    before = world.snapshot()
    skipped = world.store.runs.requeue(run.id, owner="*")
    assert skipped.verdict is Verdict.SKIPPED and skipped.status is Status(status)
    assert world.snapshot() == before


def test_a_missing_run_is_dropped_from_the_leases(world: World) -> None:
    world.client.zadd(world.shard.leases, {"run_x": world.now() - 1_000})
    assert world.store.runs.requeue("run_x").verdict is Verdict.MISSING
    assert world.snapshot() == {}
