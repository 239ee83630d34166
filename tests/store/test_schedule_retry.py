"""schedule_retry.lua: running → retrying, the step's failed tool calls waiting to be tried
again: the claim released, what the step kept in memory saved beside its checkpoints, the
run in the retries registry until its next try is due; then requeue_run.lua queues the step
again at the same version (the sweeper when due, an operator at once), and the claim hands
the step everything it saved. A wait is cancelled like any unfinished run."""

from __future__ import annotations

import json

import pytest

from layby.parking import Verdict
from layby.parking.clock import iso
from layby.wire import RetryWait, Status, ToolRetry
from tests.store.conftest import OWNER, World

pytestmark = pytest.mark.store


FIRST_AT = iso(1_764_000_000_000)


def _wait(world: World, due_ms: int) -> RetryWait:
    return RetryWait(calls=[ToolRetry(tool_call_id="call_1", tool_name="pay", attempt=2,
                                      max_attempts=5, last_error="ConnectionError: reset",
                                      first_attempt_at=FIRST_AT)],
                     next_attempt_at=iso(due_ms))


def _schedule(world: World, due_ms: int, **kept: object) -> RetryWait:
    wait = _wait(world, due_ms)
    done = world.store.runs.schedule_retry(
        "run_1", 1, OWNER, wait, due_ms, wait.wire(),
        checkpoints={"tool:call_2": {"kind": "output", "output": 2}, **kept,
                     "try:call_1": {"failed": 1, "firstAt": FIRST_AT,
                                    "error": "ConnectionError: reset"}},
        tools=["pay"])
    assert done.verdict is Verdict.OK and done.version == 1 and done.at == due_ms, done
    return wait


def test_a_step_waits_to_retry_holding_no_claim_and_its_results_saved(world: World) -> None:
    world.make("running")
    world.store.runs.save_checkpoint("run_1", 1, OWNER, "model", {"text": "pay twice"})
    due = world.now() + 60_000
    wait = _schedule(world, due)
    run = world.run_hash("run_1")
    assert (run["status"], run["version"], run["attempts"]) == ("retrying", "1", "0")
    assert "lease_owner" not in run and world.zset(world.shard.leases) == {}
    assert json.loads(run["retry"]) == wait.wire() and run["retry_at"] == str(due)
    assert world.zset(world.shard.retries) == {"run_1": due}
    assert world.indexes_of("run_1") == {"retrying": int(run["updated_at"])}
    # What was saved before, and what the step held in memory, are both kept.
    assert world.store.runs.checkpoints("run_1", 1) == {
        "model": {"text": "pay twice"}, "tool:call_2": {"kind": "output", "output": 2},
        "try:call_1": {"failed": 1, "firstAt": FIRST_AT, "error": "ConnectionError: reset"}}
    assert world.events("run_1")[-1] == ("run.retrying", 1, wait.wire())
    assert world.stats()["tool_retries:pay"] == 1
    view = world.store.runs.view("run_1")
    assert view is not None and view.status is Status.RETRYING and view.retry == wait
    (summary,) = world.store.lists.list_runs(Status.RETRYING)
    assert summary.retry == wait


def test_a_wait_not_due_is_not_requeued_and_a_step_message_finds_it_stale(
        world: World) -> None:
    world.make("running")
    _schedule(world, world.now() + 60_000)
    before = world.snapshot()
    assert world.store.deadlines.due_retries() == []
    assert world.store.runs.requeue("run_1").verdict is Verdict.LATER
    # A copy of the step's message (a redelivery) changes nothing either.
    assert world.store.runs.claim("run_1", 1, "worker-2").verdict is Verdict.STALE
    assert world.snapshot() == before


def test_a_due_wait_is_queued_again_at_the_same_version_with_its_checkpoints(
        world: World) -> None:
    world.make("running")
    wait = _schedule(world, world.now() - 1)
    assert world.store.deadlines.due_retries() == ["run_1"]
    done = world.store.runs.requeue("run_1")
    assert done.ok and [e.id for e in done.entries] == ["run_1:turn:1"]
    run = world.run_hash("run_1")
    assert (run["status"], run["version"]) == ("queued", "1")
    assert world.zset(world.shard.retries) == {} and world.store.deadlines.due_retries() == []
    assert world.events("run_1")[-1] == ("run.requeued", 1, {"retry": "due"})
    claim = world.store.runs.claim("run_1", 1, "worker-2")
    assert claim.ok and claim.attempt == 1 and claim.record is not None
    assert set(claim.record.checkpoints) == {"tool:call_2", "try:call_1"}
    # Until the step commits, the run says what it is trying again.
    view = world.store.runs.view("run_1")
    assert view is not None and view.status is Status.RUNNING and view.retry == wait
    assert world.store.runs.complete("run_1", 1, "worker-2", world.history(3), "paid",
                                     {"from": 1, "historyTo": 3}, exhausted=["pay"]).ok
    run = world.run_hash("run_1")
    assert "retry" not in run and "retry_at" not in run
    assert world.stats()["tool_retries_exhausted:pay"] == 1


def test_an_operator_tries_a_waiting_run_again_at_once(world: World) -> None:
    world.make("running")
    _schedule(world, world.now() + 3_600_000)
    assert world.store.runs.requeue("run_1", owner="*").ok
    assert world.run_hash("run_1")["status"] == "queued"
    assert world.events("run_1")[-1] == ("run.requeued", 1, {"retry": "now"})


def test_a_waiting_run_is_cancelled_and_its_try_never_comes(world: World) -> None:
    world.make("running")
    _schedule(world, world.now() - 1)
    done = world.store.runs.cancel("run_1", "api:ops", "wrong payee")
    assert done.ok and done.version == 2
    run = world.run_hash("run_1")
    assert run["status"] == "cancelled" and "retry" not in run
    assert world.zset(world.shard.retries) == {} and world.store.deadlines.due_retries() == []
    assert world.indexes_of("run_1") == {"cancelled": int(run["updated_at"])}
    assert world.store.runs.checkpoints("run_1", 1) == {}
    assert world.store.runs.requeue("run_1").verdict is Verdict.SKIPPED


def test_only_the_claim_holder_waits_and_a_stale_one_changes_nothing(world: World) -> None:
    world.make("running")
    before = world.snapshot()
    wait = _wait(world, world.now())
    refused = world.store.runs.schedule_retry("run_1", 1, "worker-2", wait, world.now(),
                                              wait.wire(), checkpoints={}, tools=["pay"])
    assert refused.verdict is Verdict.STALE
    assert world.snapshot() == before


def test_a_wait_in_the_sharded_layout_is_in_its_runs_shard(sharded: World) -> None:
    sharded.make("running")
    _schedule(sharded, sharded.now() - 1)
    shard = sharded.keys.shard_of("run_1")
    assert sharded.zset(shard.retries) == {"run_1": int(sharded.run_hash("run_1")["retry_at"])}
    assert sharded.store.deadlines.due_retries() == ["run_1"]
    assert sharded.store.runs.requeue("run_1").ok
