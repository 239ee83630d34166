"""save_checkpoint.lua: one result of the current version kept, under the claim, the lease
renewed with it; a caller without the claim is refused and nothing is written."""

from __future__ import annotations

import json

import pytest

from tests.store.conftest import OWNER, World

pytestmark = pytest.mark.store


def test_a_checkpoint_is_kept_with_its_version_and_renews_the_lease(world: World) -> None:
    world.make("running", store=world.store_with(lease_ms=-1_000))
    before = world.now()
    assert world.store.runs.save_checkpoint("run_1", 1, OWNER, "tool:call_1", {"rows": [1, 2]})
    assert world.client.hgetall(world.keys.checkpoints("run_1")) == {
        "v": "1", "tool:call_1": json.dumps({"rows": [1, 2]}, separators=(",", ":"))}
    assert world.store.runs.checkpoints("run_1", 1) == {"tool:call_1": {"rows": [1, 2]}}
    run = world.run_hash("run_1")
    assert run["checkpointed"] == "1"
    assert int(run["lease_until"]) >= before + 6_000
    assert world.zset(world.shard.leases) == {"run_1": int(run["lease_until"])}


def test_a_second_checkpoint_of_the_same_name_replaces_the_first(world: World) -> None:
    world.make("running")
    world.store.runs.save_checkpoint("run_1", 1, OWNER, "model", {"text": "a"})
    world.store.runs.save_checkpoint("run_1", 1, OWNER, "model", {"text": "b"})
    world.store.runs.save_checkpoint("run_1", 1, OWNER, "tool:call_1", 3)
    assert world.store.runs.checkpoints("run_1", 1) == {"model": {"text": "b"}, "tool:call_1": 3}


def test_a_checkpoint_from_a_worker_without_the_claim_is_refused_and_writes_nothing(
        world: World) -> None:
    world.make("running")
    before = world.snapshot()
    assert world.store.runs.save_checkpoint("run_1", 1, "worker-2", "model", {"text": "a"}) is False
    assert world.store.run_script("save_checkpoint", "run_1", version=1, owner="worker-2",
                                  field="model", value="{}", lease_ms=6_000) == [
        "stale", "running", "1", OWNER]
    assert world.snapshot() == before


def test_a_checkpoint_at_an_old_version_is_refused(world: World) -> None:
    world.make("running")
    assert world.store.runs.advance("run_1", 1, OWNER, world.history(2), {}, inline=True).ok
    before = world.snapshot()
    assert world.store.runs.save_checkpoint("run_1", 1, OWNER, "model", {"text": "a"}) is False
    assert world.snapshot() == before


def test_a_checkpoint_for_a_missing_run_writes_nothing(world: World) -> None:
    assert world.store.run_script("save_checkpoint", "run_x", version=1, owner=OWNER, field="model",
                                  value="{}", lease_ms=6_000) == ["missing"]
    assert world.snapshot() == {}
