"""claim_run.lua: queued | resuming | running (lease lapsed) → running under a lease, with
everything the step needs; refused as 'stale', 'busy', 'exhausted' or 'missing'."""

from __future__ import annotations

import json

import pytest

from layby.parking import Verdict
from layby.wire import Status
from tests.store.conftest import MESSAGES, OWNER, World, answer, interrupt

pytestmark = pytest.mark.store


def test_claiming_a_queued_run_starts_it_under_a_lease(world: World) -> None:
    world.store.runs.create_run("run_1", "demo.agent", input="hi", messages=MESSAGES,
                                metadata={"team": "ops"}, idempotency_key=None)
    before = world.now()
    claimed = world.store.runs.claim("run_1", 1, OWNER)
    assert claimed.verdict is Verdict.OK and claimed.attempt == 1
    assert claimed.claimed_from is Status.QUEUED
    record = claimed.record
    assert record is not None
    assert (record.agent, record.version, record.messages, record.metadata) == (
        "demo.agent", 1, MESSAGES, {"team": "ops"})
    assert record.checkpoints == {} and record.parked_on == []
    run = world.run_hash("run_1")
    assert run["status"] == "running" and run["lease_owner"] == OWNER
    assert run["attempts"] == "1" and run["version"] == "1"
    lease_until = int(run["lease_until"])
    assert before + 6_000 <= lease_until <= world.now() + 6_000
    assert world.zset(world.shard.leases) == {"run_1": lease_until}
    assert world.indexes_of("run_1") == {"running": int(run["updated_at"])}
    assert world.events("run_1")[-1] == ("run.started", 1, {"from": "queued"})


def test_claiming_a_resuming_run_hands_over_what_it_parked_on_and_its_answers(
        world: World) -> None:
    run = world.make("resuming", interrupts=[interrupt("int_a"), interrupt("int_b")])
    claimed = world.store.runs.claim(run.id, run.version, OWNER)
    assert claimed.ok and claimed.claimed_from is Status.RESUMING
    record = claimed.record
    assert record is not None and record.parked_on is not None
    assert [i.id for i in record.parked_on] == ["int_a", "int_b"]
    assert record.parked_on[0].message == "question int_a"
    assert record.answers == {"int_a": answer("int_a"), "int_b": answer("int_b")}
    assert world.indexes_of(run.id).keys() == {"running"}
    assert world.events(run.id)[-1] == ("run.started", 3, {"from": "resuming"})
    # How long the continuation waited for a worker, for /metrics.
    stats = world.stats()
    assert stats["resume_latency_count"] == 1
    assert sum(v for k, v in stats.items() if k.startswith("resume_latency_le:")) == 1


def test_a_claim_at_another_version_is_stale_and_changes_nothing(world: World) -> None:
    world.make("queued")
    before = world.snapshot()
    claimed = world.store.runs.claim("run_1", 2, OWNER)
    assert claimed.verdict is Verdict.STALE and claimed.status is Status.QUEUED
    assert world.snapshot() == before


@pytest.mark.parametrize("status", ["interrupted", "completed", "failed", "cancelled"])
def test_a_claim_of_a_run_that_waits_for_nothing_a_worker_gives_is_stale(
        world: World, status: str) -> None:
    run = world.make(status)
    before = world.snapshot()
    claimed = world.store.runs.claim(run.id, run.version, "worker-2")
    assert claimed.verdict is Verdict.STALE and claimed.status is Status(status)
    assert world.snapshot() == before


def test_a_claim_of_a_missing_run_writes_nothing(world: World) -> None:
    claimed = world.store.runs.claim("run_x", 1, OWNER)
    assert claimed.verdict is Verdict.MISSING
    assert world.snapshot() == {}


def test_a_claim_while_another_workers_lease_is_live_is_busy_and_changes_nothing(
        world: World) -> None:
    world.make("running")
    before = world.snapshot()
    claimed = world.store.runs.claim("run_1", 1, "worker-2")
    assert claimed.verdict is Verdict.BUSY and claimed.owner == OWNER
    assert world.snapshot() == before


def test_a_lapsed_lease_is_taken_over_by_the_next_claim_as_a_second_attempt(
        world: World) -> None:
    world.make("running", store=world.store_with(lease_ms=-1_000))
    events = world.events("run_1")
    claimed = world.store.runs.claim("run_1", 1, "worker-2")
    assert claimed.ok and claimed.attempt == 2 and claimed.claimed_from is Status.RUNNING
    run = world.run_hash("run_1")
    assert run["lease_owner"] == "worker-2" and run["attempts"] == "2"
    assert world.zset(world.shard.leases) == {"run_1": int(run["lease_until"])}
    assert int(run["lease_until"]) > world.now()
    # Still the same step: no second `run.started`.
    assert world.events("run_1") == events


def test_a_redelivery_to_the_worker_holding_the_lease_claims_again(world: World) -> None:
    world.make("running")
    claimed = world.store.runs.claim("run_1", 1, OWNER)
    assert claimed.ok and claimed.attempt == 2


def test_a_step_claimed_too_often_is_exhausted_and_only_its_count_moves(world: World) -> None:
    store = world.store_with(lease_ms=-1_000, max_attempts=2)
    world.make("running", store=store)
    assert store.runs.claim("run_1", 1, "worker-2").attempt == 2
    before = world.snapshot()
    claimed = store.runs.claim("run_1", 1, "worker-3")
    assert claimed.verdict is Verdict.EXHAUSTED and claimed.attempt == 2
    after = world.snapshot()
    run_key = world.keys.run("run_1")
    assert after[run_key][1] == {**before[run_key][1], "attempts": "3"}
    assert {k: v for k, v in after.items() if k != run_key} == {
        k: v for k, v in before.items() if k != run_key}
    assert world.run_hash("run_1")["lease_owner"] == "worker-2"


def test_a_second_attempt_gets_the_checkpoints_the_first_saved(world: World) -> None:
    world.make("running", store=world.store_with(lease_ms=-1_000))
    assert world.store.runs.save_checkpoint("run_1", 1, OWNER, "tool:call_1", {"rows": 3})
    # The first attempt's worker died: its lease lapsed (saved again with a lapsed lease).
    assert world.store_with(lease_ms=-1_000).runs.save_checkpoint("run_1", 1, OWNER, "model",
                                                                  {"text": "ok"})
    claimed = world.store.runs.claim("run_1", 1, "worker-2")
    assert claimed.ok and claimed.record is not None
    assert claimed.record.checkpoints == {"tool:call_1": {"rows": 3}, "model": {"text": "ok"}}


def test_checkpoints_of_a_version_that_never_committed_are_dropped_at_the_claim(
        world: World) -> None:
    world.make("running", store=world.store_with(lease_ms=-1_000))
    # Left by a step at another version.
    world.client.hset(world.keys.checkpoints("run_1"),
                      mapping={"v": "7", "tool:call_1": json.dumps({"rows": 3})})
    claimed = world.store.runs.claim("run_1", 1, "worker-2")
    assert claimed.ok and claimed.record is not None and claimed.record.checkpoints == {}
    assert not world.client.exists(world.keys.checkpoints("run_1"))
    assert world.run_hash("run_1")["checkpointed"] == ""
