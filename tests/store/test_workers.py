"""beat_worker.lua and reap_workers.lua: a worker process says it is alive (its entry in
`workers` pushed to now + lease); workers whose beat lapsed are removed once each, with
their last beat, so two sweepers do not both act on one death."""

from __future__ import annotations

import pytest

from tests.store.conftest import World

pytestmark = pytest.mark.store


def test_a_beat_pushes_the_workers_lease_on(world: World) -> None:
    def beat(worker: str, lease_ms: int) -> int:
        return int(world.store._call("beat_worker", [world.keys.workers], worker=worker,
                                     lease_ms=lease_ms))

    before = world.now()
    until = beat("celery@a", 6_000)
    assert before + 6_000 <= until <= world.now() + 6_000
    assert world.zset(world.keys.workers) == {"celery@a": until}
    later = beat("celery@a", 60_000)
    assert later > until and world.zset(world.keys.workers) == {"celery@a": later}


def test_a_worker_whose_beat_lapsed_is_reaped_once_with_its_last_beat(world: World) -> None:
    lapsing = world.store_with(lease_ms=-1_000)  # its beats lapse as they are made
    before = world.now()
    lapsing.beat_worker("celery@dead")
    world.store.beat_worker("celery@alive")
    reaped = lapsing.reap_workers()
    assert [name for name, _ in reaped] == ["celery@dead"]
    assert before <= reaped[0][1] <= world.now()
    assert list(world.zset(world.keys.workers)) == ["celery@alive"]
    snapshot = world.snapshot()
    assert lapsing.reap_workers() == []
    assert world.snapshot() == snapshot


def test_a_worker_that_beats_again_is_not_reaped(world: World) -> None:
    world.store_with(lease_ms=-1_000).beat_worker("celery@a")
    world.store.beat_worker("celery@a")
    assert world.store.reap_workers() == []
    assert list(world.zset(world.keys.workers)) == ["celery@a"]


def test_a_reap_takes_at_most_a_hundred_at_once(world: World) -> None:
    lapsing = world.store_with(lease_ms=-1_000)
    for i in range(101):
        lapsing.beat_worker(f"celery@{i}")
    assert len(lapsing.reap_workers()) == 100
    assert len(lapsing.reap_workers()) == 1
    assert world.zset(world.keys.workers) == {}
