"""renew_lease.lua: the heartbeat of the worker holding a claim pushes its lease on; any
other caller is told 'stale' (it must not commit) or 'missing', and nothing changes."""

from __future__ import annotations

import pytest

from layby.parking import Verdict
from tests.store.conftest import OWNER, World

pytestmark = pytest.mark.store


def _renew(world: World, version: int, owner: str, run_id: str = "run_1",
           lease_ms: int = 6_000) -> list:
    return world.store.run_script("renew_lease", run_id, version=version, owner=owner,
                                  lease_ms=lease_ms)


def test_a_heartbeat_pushes_the_lease_on(world: World) -> None:
    world.make("running", store=world.store_with(lease_ms=-1_000))
    assert int(world.run_hash("run_1")["lease_until"]) < world.now()
    before = world.now()
    assert world.store.runs.renew("run_1", 1, OWNER) is True
    until = int(world.run_hash("run_1")["lease_until"])
    assert before + 6_000 <= until <= world.now() + 6_000
    assert world.zset(world.shard.leases) == {"run_1": until}


def test_a_heartbeat_returns_the_new_lease_end(world: World) -> None:
    world.make("running")
    verdict, until = _renew(world, 1, OWNER, lease_ms=60_000)
    assert verdict == "ok"
    assert int(until) == int(world.run_hash("run_1")["lease_until"])
    assert int(until) > world.now() + 50_000


def test_a_heartbeat_of_a_worker_whose_claim_was_taken_over_is_stale_and_changes_nothing(
        world: World) -> None:
    world.make("running", store=world.store_with(lease_ms=-1_000))
    assert world.store.runs.claim("run_1", 1, "worker-2").ok
    before = world.snapshot()
    assert _renew(world, 1, OWNER) == ["stale", "running", "1", "worker-2"]
    assert world.store.runs.renew("run_1", 1, OWNER) is False
    assert world.snapshot() == before


def test_a_heartbeat_at_a_version_committed_since_is_stale(world: World) -> None:
    world.make("running")
    assert world.store.runs.advance("run_1", 1, OWNER, world.history(2), {}, inline=False).ok
    before = world.snapshot()
    assert _renew(world, 1, OWNER)[0] == Verdict.STALE
    assert world.snapshot() == before


def test_a_heartbeat_for_a_run_no_longer_running_is_stale(world: World) -> None:
    run = world.make("interrupted")
    before = world.snapshot()
    assert _renew(world, run.version, OWNER) == ["stale", "interrupted", "2", ""]
    assert world.snapshot() == before


def test_a_heartbeat_for_a_missing_run_writes_nothing(world: World) -> None:
    assert _renew(world, 1, OWNER) == ["missing"]
    assert world.snapshot() == {}
