"""A tenant's runs in the store: each run in its own tenant's indexes alone (`default`'s are
the shards' own), moved there by every transition, listed by the tenant's own pages (one
read of its sets, however many runs others have), and found by the scans of every run (the
sweeper's, the gauges, an admin's list)."""

from __future__ import annotations

import pytest

from layby.parking import gauges
from layby.parking.store import Store
from layby.wire import Status
from tests.store.conftest import MESSAGES, OWNER, World, answer, interrupt, park_event

pytestmark = pytest.mark.store


def _start(store: Store, run_id: str, tenant: str = "default",
           by: str | None = None) -> None:
    assert store.runs.create_run(run_id, "demo.agent", input="hi", messages=MESSAGES, metadata={},
                                 idempotency_key=None, tenant=tenant, started_by=by).ok


def test_a_tenants_run_lives_in_its_tenants_indexes_through_its_life(sharded: World) -> None:
    store, keys = sharded.store, sharded.keys
    _start(store, "run_a", "acme", by="api:billing")
    shard = keys.shard_of("run_a")
    mine = shard.of_tenant("acme")
    assert sharded.client.smembers(shard.tenants) == {"acme"}
    assert sharded.zset(mine.index(Status.QUEUED)).keys() == {"run_a"}
    assert sharded.zset(shard.index(Status.QUEUED)) == {}
    assert store.runs.claim("run_a", 1, OWNER).ok
    intrs = [interrupt("int_a")]
    assert store.runs.park("run_a", 1, OWNER, World.history(2), intrs, park_event(intrs)).ok
    assert store.answers.answer("run_a", [answer("int_a")]).resumed
    for status in Status:
        assert sharded.zset(shard.index(status)) == {}, status
    assert sharded.zset(mine.index(Status.RESUMING)).keys() == {"run_a"}
    assert store.runs.cancel("run_a", "api:billing", None).ok
    assert sharded.zset(mine.index(Status.CANCELLED)).keys() == {"run_a"}
    assert sum(len(sharded.zset(mine.index(s))) for s in Status) == 1
    view = store.runs.view("run_a")
    assert view is not None and (view.tenant, view.started_by) == ("acme", "api:billing")
    whose = store.runs.whose("run_a")
    assert (whose.exists, whose.tenant, whose.started_by, whose.status) == (
        True, "acme", "api:billing", Status.CANCELLED)
    assert not store.runs.whose("run_x").exists


def test_each_tenant_lists_its_own_runs_and_every_run_is_scanned(sharded: World) -> None:
    store = sharded.store
    for i in range(30):
        _start(store, f"run_d{i:02}")
        _start(store, f"run_a{i:02}", "acme")
        if i % 3 == 0:
            _start(store, f"run_b{i:02}", "bolt")
        sharded.next_ms()
    acme = [s.id for s in _every_page(store, "acme")]
    assert acme == [f"run_a{i:02}" for i in reversed(range(30))]
    assert {s.tenant for s in store.lists.list_page(tenant="acme", limit=500)[0]} == {"acme"}
    assert [s.id for s in _every_page(store, "default")] == [
        f"run_d{i:02}" for i in reversed(range(30))]
    assert len(_every_page(store, None)) == 70  # an admin's: every tenant's
    # The scans of every run (the sweeper's, the gauges) read the tenants' indexes too.
    assert store.all_runs.count(Status.QUEUED) == 70
    assert len(store.deadlines.waiting(store.now_ms() + 1, limit=500)) == 70
    counted = gauges.read(sharded.client, store.layout, (60,))
    assert counted.runs[Status.QUEUED] == 70


def test_a_tenants_page_reads_its_own_sets_alone(sharded: World) -> None:
    store = sharded.store
    for i in range(40):
        _start(store, f"run_d{i:02}")
    _start(store, "run_a", "acme")
    store.tenants()  # known, as a gateway that listed before knows them
    before = _calls(sharded, "zrevrangebyscore")
    page, _ = store.lists.list_page(Status.QUEUED, tenant="acme", limit=10)
    assert [s.id for s in page] == ["run_a"]
    # One read of each of the tenant's 3 shards' sets: none of default's.
    assert _calls(sharded, "zrevrangebyscore") - before == 3


def _every_page(store: Store, tenant: str | None) -> list:  # type: ignore[type-arg]
    found, cursor = [], None
    while True:
        page, cursor = store.lists.list_page(tenant=tenant, limit=7, cursor=cursor)
        found += page
        if cursor is None:
            return found


def _calls(world: World, command: str) -> int:
    stats = world.client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))
