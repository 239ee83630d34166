"""beat_worker.lua, reap_workers.lua and switch_format.lua: a process says it is alive
(its entry in `workers` pushed to now + lease) and what it is (kind, newest format, release:
`workers:about`), and learns which format the store writes; processes whose beat lapsed
are removed once each, with their last beat, so two sweepers do not both act on one death;
the store switches to the next format only once no live process is older than it."""

from __future__ import annotations

import pytest

from tests.store.conftest import World

pytestmark = pytest.mark.store

WORKER = "worker 1 0.2.0"


def test_a_beat_pushes_the_workers_lease_on(world: World) -> None:
    def beat(worker: str, lease_ms: int) -> list[str]:
        return [str(r) for r in world.store.call(
            "beat_worker", [world.keys.workers, world.keys.workers_about, world.keys.format],
            worker=worker, lease_ms=lease_ms, about=WORKER)]

    before = world.now()
    until, version, written, now, *format = beat("celery@a", 6_000)
    assert before + 6_000 <= int(until) <= world.now() + 6_000
    assert int(now) == int(until) - 6_000
    assert (version, written) == ("", "")  # a store without a format yet
    assert format == ["", "", "", "", ""]
    assert world.zset(world.keys.workers) == {"celery@a": int(until)}
    assert world.client.hgetall(world.keys.workers_about) == {"celery@a": WORKER}
    world.client.hset(world.keys.format, mapping={"version": 1, "writing": 2, "shards": 3,
                                                  "sharded_at": 7})
    later, version, written, _, *format = beat("celery@a", 60_000)
    assert int(later) > int(until) and world.zset(world.keys.workers) == {"celery@a":
                                                                           int(later)}
    assert (version, written) == ("1", "2")
    # The format key's fields as parking.formats.FIELDS names them: the layout comes too.
    assert format == ["1", "2", "", "3", "7"]


def test_a_beat_brings_the_format_the_store_writes(world: World) -> None:
    world.client.hset(world.keys.format, "version", 1)
    world.store.processes.beat_worker("celery@a", WORKER)
    assert world.store.writing == 1
    world.client.hset(world.keys.format, "writing", 2)
    world.store.processes.beat_worker("celery@a", WORKER)
    assert world.store.writing == 2


def test_a_worker_whose_beat_lapsed_is_reaped_once_with_its_last_beat(world: World) -> None:
    lapsing = world.store_with(lease_ms=-1_000)  # its beats lapse as they are made
    before = world.now()
    lapsing.processes.beat_worker("celery@dead", WORKER)
    world.store.processes.beat_worker("celery@alive", WORKER)
    reaped = lapsing.processes.reap_workers()
    assert [(name, told) for name, _, told in reaped] == [("celery@dead", WORKER)]
    assert before <= reaped[0][1] <= world.now()
    assert list(world.zset(world.keys.workers)) == ["celery@alive"]
    assert list(world.client.hgetall(world.keys.workers_about)) == ["celery@alive"]
    snapshot = world.snapshot()
    assert lapsing.processes.reap_workers() == []
    assert world.snapshot() == snapshot


def test_a_worker_that_beats_again_is_not_reaped(world: World) -> None:
    world.store_with(lease_ms=-1_000).processes.beat_worker("celery@a", WORKER)
    world.store.processes.beat_worker("celery@a", WORKER)
    assert world.store.processes.reap_workers() == []
    assert list(world.zset(world.keys.workers)) == ["celery@a"]


def test_a_reap_takes_at_most_a_hundred_at_once(world: World) -> None:
    lapsing = world.store_with(lease_ms=-1_000)
    for i in range(101):
        lapsing.processes.beat_worker(f"celery@{i}", WORKER)
    assert len(lapsing.processes.reap_workers()) == 100
    assert len(lapsing.processes.reap_workers()) == 1
    assert world.zset(world.keys.workers) == {}
    assert world.client.hgetall(world.keys.workers_about) == {}


def test_a_process_that_stops_takes_itself_out(world: World) -> None:
    world.store.processes.beat_worker("gateway h:1", "gateway 1 0.2.0")
    world.store.processes.forget_worker("gateway h:1")
    assert world.zset(world.keys.workers) == {}
    assert world.client.hgetall(world.keys.workers_about) == {}


def test_the_switch_waits_for_the_last_older_process(world: World) -> None:
    world.client.hset(world.keys.format, "version", 1)
    world.store.processes.beat_worker("celery@old", WORKER)  # its code knows format 1 only
    world.store.processes.beat_worker("gateway h:2", "gateway 2 0.3.0")
    before = world.snapshot()
    assert world.store.processes.switch_format(2) == ["older", "celery@old", WORKER]
    assert world.snapshot() == before
    # A process of a release before formats were announced counts as older too.
    world.store.processes.forget_worker("celery@old")
    world.store.processes.beat_worker("celery@ancient", "")
    assert world.store.processes.switch_format(2)[:2] == ["older", "celery@ancient"]
    world.store.processes.forget_worker("celery@ancient")
    assert world.store.processes.switch_format(2) == ["switched"]
    before = world.now()
    format = world.client.hgetall(world.keys.format)
    assert (format["version"], format["writing"]) == ("1", "2")
    assert before - 1_000 <= int(format["switched_at"]) <= world.now()
    assert world.store.writing == 2
    assert world.store.processes.switch_format(2) == ["already", "2"]
    assert world.store.processes.switch_format(4) == ["not_next", "2"]


def test_a_lapsed_older_process_does_not_hold_the_switch_and_force_does_not_wait(
        world: World) -> None:
    world.client.hset(world.keys.format, "version", 1)
    world.store_with(lease_ms=-1_000).processes.beat_worker("celery@gone", WORKER)
    assert world.store.processes.switch_format(2) == ["switched"]
    world.client.hset(world.keys.format, mapping={"version": 1, "writing": 1})
    world.store.processes.beat_worker("celery@old", WORKER)
    assert world.store.processes.switch_format(2, force=True) == ["switched"]


def test_a_store_without_a_format_does_not_switch(world: World) -> None:
    assert world.store.processes.switch_format(2) == ["unversioned"]
    assert world.client.exists(world.keys.format) == 0
