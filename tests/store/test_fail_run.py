"""fail_run.lua: any unfinished state → failed with an error, by the worker holding the
claim or by anyone else (no claim); what the run waited on is dropped; a finished run, a
stale version or a lost claim is refused and nothing changes."""

from __future__ import annotations

import json

import pytest

from layby.parking import Announcements, Verdict
from layby.wire import Status
from tests.store.conftest import OWNER, World, interrupt, note

pytestmark = pytest.mark.store

RETENTION_S = 7 * 24 * 3600
ERROR = {"code": "model_error", "message": "the model refused"}


def test_the_worker_holding_the_claim_fails_the_run_with_its_error(world: World) -> None:
    world.make("running")
    world.store.runs.save_checkpoint("run_1", 1, OWNER, "model", {"text": "x"})
    failed = world.store.runs.fail("run_1", ERROR, version=1, owner=OWNER,
                                   messages=world.history(3))
    assert failed.verdict is Verdict.OK and failed.version == 2
    run = world.run_hash("run_1")
    assert (run["status"], run["version"], run["attempts"]) == ("failed", "2", "0")
    assert json.loads(run["error"]) == ERROR
    assert json.loads(run["messages"]) == [m.wire() for m in world.history(3)]
    assert "lease_owner" not in run and "lease_until" not in run
    assert world.zset(world.shard.leases) == {}
    assert not world.client.exists(world.keys.checkpoints("run_1"))
    assert world.indexes_of("run_1") == {"failed": int(run["updated_at"])}
    assert world.events("run_1")[-1] == ("run.failed", 2, ERROR)
    assert RETENTION_S - 5 <= world.client.ttl(world.keys.run("run_1")) <= RETENTION_S
    assert RETENTION_S - 5 <= world.client.ttl(world.keys.events("run_1")) <= RETENTION_S


def test_a_parked_run_failed_from_outside_drops_its_deadlines_and_unsent_notifications(
        world: World) -> None:
    later = world.now() + 600_000
    run = world.make("interrupted",
                     interrupts=[interrupt("int_a", expires_ms=later), interrupt("int_b")],
                     plan=Announcements(notes=[(note("ntf_1", "int_a"), later),
                                               (note("ntf_2", "int_b"), later)]))
    messages = world.run_hash(run.id)["messages"]
    failed = world.store.runs.fail(run.id, ERROR)
    assert failed.ok and failed.version == 3
    hash_ = world.run_hash(run.id)
    assert (hash_["status"], hash_["open"], hash_["messages"]) == ("failed", "", messages)
    assert world.zset(world.shard.deadlines) == {}
    assert world.zset(world.shard.notify_due) == {}
    assert {n.state for n in world.notes(run.id).values()} == {"skipped"}
    assert world.indexes_of(run.id).keys() == {"failed"}


def test_a_queued_run_is_failed_by_an_operator_at_its_version(world: World) -> None:
    world.make("queued")
    failed = world.store.runs.fail("run_1", ERROR, version=1)
    assert failed.ok and failed.version == 2
    assert world.indexes_of("run_1").keys() == {"failed"}


def test_a_failure_at_a_version_the_run_left_is_stale_and_changes_nothing(
        world: World) -> None:
    run = world.make("interrupted")
    before = world.snapshot()
    stale = world.store.runs.fail(run.id, ERROR, version=1)
    assert stale.verdict is Verdict.STALE and stale.status is Status.INTERRUPTED
    assert world.snapshot() == before


def test_a_failure_by_a_worker_whose_claim_was_taken_over_is_stale(world: World) -> None:
    world.make("running", store=world.store_with(lease_ms=-1_000))
    assert world.store.runs.claim("run_1", 1, "worker-2").ok
    before = world.snapshot()
    stale = world.store.runs.fail("run_1", ERROR, version=1, owner=OWNER)
    assert stale.verdict is Verdict.STALE and stale.status is Status.RUNNING
    assert world.snapshot() == before


@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
def test_a_finished_run_cannot_fail_and_is_left_as_it_is(world: World, status: str) -> None:
    run = world.make(status)
    before = world.snapshot()
    refused = world.store.runs.fail(run.id, ERROR)
    assert refused.verdict is Verdict.FINISHED and refused.status is Status(status)
    assert world.snapshot() == before


def test_failing_a_missing_run_writes_nothing(world: World) -> None:
    assert world.store.runs.fail("run_x", ERROR).verdict is Verdict.MISSING
    assert world.snapshot() == {}
