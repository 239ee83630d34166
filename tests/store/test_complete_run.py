"""complete_run.lua: running → completed with the final text, the claim released and the
run's keys counting down to retention; a duplicate or unclaimed commit changes nothing."""

from __future__ import annotations

import json

import pytest

from layby.parking import Verdict
from layby.wire import Status
from tests.store.conftest import OWNER, World

pytestmark = pytest.mark.store

RETENTION_S = 7 * 24 * 3600
EVENT = {"from": 1, "historyTo": 2, "result": "done",
         "messages": [{"role": "model", "content": [{"text": "message 1"}]}]}


def test_a_completed_run_keeps_its_result_until_retention(world: World) -> None:
    world.make("running")
    world.store.runs.save_checkpoint("run_1", 1, OWNER, "model", {"text": "done"})
    done = world.store.runs.complete("run_1", 1, OWNER, world.history(2), "done", EVENT)
    assert done.verdict is Verdict.OK and done.version == 2 and done.entries == ()
    run = world.run_hash("run_1")
    assert (run["status"], run["version"], run["result"], run["open"]) == (
        "completed", "2", "done", "")
    assert json.loads(run["messages"]) == [m.wire() for m in world.history(2)]
    assert (run["lease_owner"], run["lease_until"], run["attempts"]) == ("", "0", "0")
    assert world.zset(world.shard.leases) == {}
    assert not world.client.exists(world.keys.checkpoints("run_1"))
    assert world.indexes_of("run_1") == {"completed": int(run["updated_at"])}
    assert world.events("run_1")[-1] == ("run.completed", 2, EVENT)
    for key in (world.keys.run("run_1"), world.keys.events("run_1")):
        assert RETENTION_S - 5 <= world.client.ttl(key) <= RETENTION_S


def test_a_run_that_was_parked_completes_with_its_answers_counting_down_too(
        world: World) -> None:
    run = world.make("resuming")
    assert world.store.runs.claim(run.id, run.version, OWNER).ok
    done = world.store.runs.complete(run.id, run.version, OWNER, world.history(4), "done", EVENT)
    assert done.ok and done.version == 4
    assert world.client.ttl(world.keys.answers(run.id)) > RETENTION_S - 5
    assert world.store.runs.view(run.id).interrupts[0].answer is not None


def test_a_second_completion_of_the_same_step_is_stale_and_changes_nothing(
        world: World) -> None:
    world.make("running")
    assert world.store.runs.complete("run_1", 1, OWNER, world.history(2), "done", EVENT).ok
    before = world.snapshot()
    again = world.store.runs.complete("run_1", 1, OWNER, world.history(2), "other", EVENT)
    assert again.verdict is Verdict.STALE and again.status is Status.COMPLETED
    assert world.snapshot() == before


def test_a_completion_by_a_worker_without_the_claim_is_stale(world: World) -> None:
    world.make("running")
    before = world.snapshot()
    late = world.store.runs.complete("run_1", 1, "worker-2", world.history(2), "done", EVENT)
    assert late.verdict is Verdict.STALE and late.status is Status.RUNNING
    assert world.snapshot() == before


def test_a_completion_of_a_missing_run_writes_nothing(world: World) -> None:
    assert world.store.runs.complete("run_x", 1, OWNER, world.history(2), "done",
                                     EVENT).verdict is Verdict.MISSING
    assert world.snapshot() == {}
