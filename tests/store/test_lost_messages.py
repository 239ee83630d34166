"""The lost-message check (`store.deadlines.waiting_too_long`, `.maybe_reserved`): a step's task
message takes the next number of its queue, and claims note the highest number they took.
A run whose number a claim passed, or whose queue is empty, no longer has its message in
the queue; one that waits behind others is left alone, however old (a burst's backlog is
not copied). Runs queued by a layby before 0.3.0 have no number and are judged as then."""

from __future__ import annotations

import pytest

from layby.parking import Store
from tests.store.conftest import MESSAGES, OWNER, World

pytestmark = pytest.mark.store


def _queued(world: World, store: Store, *ids: str) -> None:
    for run_id in ids:
        made = store.runs.create_run(run_id, "demo.agent", input="hi", messages=MESSAGES,
                                     metadata={}, idempotency_key=None)
        assert made.ok
    world.next_ms()


def _take(world: World, store: Store, n: int) -> None:
    """A worker takes the next `n` messages off layby.turns (as kombu's BRPOP does)."""
    for _ in range(n):
        assert world.client.rpop(f"{world.prefix}:broker:layby.turns") is not None


def test_runs_behind_others_in_their_queue_are_never_taken_for_lost(world: World) -> None:
    store = world.store_with(pushing=True)
    _queued(world, store, "run_1", "run_2", "run_3", "run_4")
    assert [world.run_hash(r)["sent"] for r in ("run_1", "run_4")] == [
        "layby.turns 1", "layby.turns 4"]
    # However long they waited: all four messages are in the queue.
    assert store.deadlines.waiting_too_long(0) == []
    # A worker takes three; run_2's task fails before its claim (its message is gone).
    _take(world, store, 3)
    assert store.runs.claim("run_1", 1, OWNER).ok
    assert store.deadlines.waiting_too_long(0) == []  # run_2 and run_3 may still be claimed
    assert store.runs.claim("run_3", 1, OWNER).ok
    assert world.client.hget(world.shard.queues, "layby.turns:taken") == "3"
    assert store.deadlines.waiting_too_long(0) == ["run_2"]
    # Requeued, it takes a new number, behind run_4: in the queue again, not lost.
    assert store.runs.requeue("run_2").ok
    assert world.run_hash("run_2")["sent"] == "layby.turns 5"
    assert store.deadlines.waiting_too_long(0) == []


def test_a_run_that_waits_for_no_message_keeps_no_number(world: World) -> None:
    # A parked run may wait for days: the number would only take room in its hash.
    store = world.store_with(pushing=True)
    world.stepped_then_parked_unplanned("run_1")
    assert "sent" not in world.run_hash("run_1")
    _queued(world, store, "run_2")
    assert store.runs.cancel("run_2", by="alice", reason=None).ok
    assert "sent" not in world.run_hash("run_2")


def test_every_run_of_an_empty_queue_is_taken_for_lost(world: World) -> None:
    store = world.store_with(pushing=True)
    _queued(world, store, "run_1", "run_2")
    world.client.delete(f"{world.prefix}:broker:layby.turns")  # purged
    assert sorted(store.deadlines.waiting_too_long(0)) == ["run_1", "run_2"]
    # Not before they waited LAYBY_LOST_MESSAGE_S (a worker may hold one, not claimed yet).
    assert store.deadlines.waiting_too_long(60_000) == []


def test_with_the_broker_elsewhere_the_runtime_says_how_long_the_queue_is(
        world: World) -> None:
    store = world.store_with(pushing=False)
    _queued(world, store, "run_1", "run_2")
    assert store.deadlines.waiting_too_long(0) == []  # the queue's length is not known: in it
    lengths = {"layby.turns": 2}
    store.length_of_queue = lengths.get
    assert store.deadlines.waiting_too_long(0) == []
    lengths["layby.turns"] = 0
    assert sorted(store.deadlines.waiting_too_long(0)) == ["run_1", "run_2"]


def test_after_a_worker_died_what_it_may_have_reserved_is_sought_not_the_backlog(
        world: World) -> None:
    store = world.store_with(pushing=True)
    _queued(world, store, "run_1", "run_2", "run_3", "run_4")
    _take(world, store, 2)
    assert store.runs.claim("run_1", 1, OWNER).ok
    # run_2 was reserved by a worker that died; run_3 and run_4 wait in the queue.
    assert store.deadlines.gone_from_queue(["run_2", "run_3", "run_4"], headroom=1) == ["run_2"]
    assert store.deadlines.maybe_reserved() == ["run_2", "run_3", "run_4"]  # RESERVED_HEADROOM: 100


def test_a_run_queued_by_an_older_layby_is_judged_by_the_oldest_message(
        world: World) -> None:
    store = world.store_with(pushing=True)
    _queued(world, store, "run_1")
    world.client.hdel(world.keys.run("run_1"), "sent")  # as 0.2.0 queued it
    _queued(world, store, "run_2")
    # run_1's message is older than the oldest in the queue (run_2's): gone.
    _take(world, store, 1)
    assert store.deadlines.waiting_too_long(0) == ["run_1"]
