"""cancel_run.lua: any unfinished state → cancelled: the claim, deadlines and unsent
notifications dropped, the run's keys counting down; a worker mid-turn then finds its
claim gone. Cancelling a finished run changes nothing."""

from __future__ import annotations

import json

import pytest

from layby.parking import Announcements, Verdict
from layby.wire import Status
from tests.store.conftest import OWNER, World, interrupt, note

pytestmark = pytest.mark.store

RETENTION_S = 7 * 24 * 3600


def test_a_queued_run_is_cancelled_with_who_cancelled_it_and_why(world: World) -> None:
    world.make("queued")
    done = world.store.runs.cancel("run_1", "api:ops", "wrong input")
    assert done.verdict is Verdict.OK and done.version == 2 and done.entries == ()
    run = world.run_hash("run_1")
    reason = {"code": "cancelled", "message": "wrong input", "by": "api:ops"}
    assert (run["status"], run["version"], json.loads(run["error"])) == ("cancelled", "2",
                                                                         reason)
    assert world.indexes_of("run_1") == {"cancelled": int(run["updated_at"])}
    assert world.events("run_1")[-1] == ("run.cancelled", 2, reason)
    assert RETENTION_S - 5 <= world.client.ttl(world.keys.run("run_1")) <= RETENTION_S
    # The turn already queued finds nothing to claim.
    assert world.store.runs.claim("run_1", 1, OWNER).verdict is Verdict.STALE


def test_a_running_run_is_cancelled_under_its_worker_whose_commit_is_then_refused(
        world: World) -> None:
    world.make("running")
    world.store.runs.save_checkpoint("run_1", 1, OWNER, "model", {"text": "x"})
    assert world.store.runs.cancel("run_1", "api:ops", None).ok
    run = world.run_hash("run_1")
    assert "lease_owner" not in run and world.zset(world.shard.leases) == {}
    assert not world.client.exists(world.keys.checkpoints("run_1"))
    assert json.loads(run["error"])["message"] == "cancelled"
    late = world.store.runs.advance("run_1", 1, OWNER, world.history(2), {}, inline=False)
    assert late.verdict is Verdict.STALE and late.status is Status.CANCELLED
    assert world.store.runs.renew("run_1", 1, OWNER) is False


def test_a_parked_run_cancelled_drops_its_deadlines_and_unsent_notifications(
        world: World) -> None:
    later = world.now() + 600_000
    run = world.make("interrupted", interrupts=[interrupt("int_a", expires_ms=later)],
                     plan=Announcements(notes=[(note("ntf_1", "int_a"), later)]))
    done = world.store.runs.cancel(run.id, "api:ops", None)
    assert done.ok and done.version == 3
    assert world.run_hash(run.id)["open"] == ""
    assert world.zset(world.shard.deadlines) == {} and world.zset(world.shard.notify_due) == {}
    assert world.notes(run.id)["ntf_1"].state == "skipped"
    assert world.indexes_of(run.id).keys() == {"cancelled"}
    view = world.store.runs.view(run.id)
    assert view is not None and view.interrupts[0].state == "cancelled"


def test_a_resuming_run_cancelled_is_not_resumed(world: World) -> None:
    run = world.make("resuming")
    assert world.store.runs.cancel(run.id, "api:ops", None).version == 4
    assert world.store.runs.claim(run.id, run.version, OWNER).verdict is Verdict.STALE


@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
def test_cancelling_a_finished_run_changes_nothing(world: World, status: str) -> None:
    run = world.make(status)
    before = world.snapshot()
    refused = world.store.runs.cancel(run.id, "api:ops", None)
    assert refused.verdict is Verdict.FINISHED and refused.status is Status(status)
    assert world.snapshot() == before


def test_cancelling_a_missing_run_writes_nothing(world: World) -> None:
    assert world.store.runs.cancel("run_x", "api:ops", None).verdict is Verdict.MISSING
    assert world.snapshot() == {}
