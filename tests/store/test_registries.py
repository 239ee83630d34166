"""The registries read over several shards (parking.registries): runs spread over three
shards are paged, listed and found waiting in the order, and with the cursors, of the same
runs in one shard; due members merge by score. A store of format 1 has one shard, the
legacy one; these are the reads a store of several will make."""

from __future__ import annotations

import random

import pytest

from layby.parking.keys import ShardKeys
from layby.parking.registries import Registry, RunIndex, due_in
from layby.parking.shards import shard_of
from layby.parking.store import generated_run_id
from layby.wire import Status
from tests.store.conftest import World, pages

pytestmark = pytest.mark.store

STATES = (Status.INTERRUPTED, Status.QUEUED, Status.COMPLETED)


def _spread(world: World) -> tuple[RunIndex, RunIndex]:
    """Sixty runs in three states, many changed in the same millisecond, each written to
    one of three shards and to one shard alone: the index over the three, and over one."""
    shards = [ShardKeys(f"{world.prefix}:s{k}") for k in range(3)]
    whole = ShardKeys(f"{world.prefix}:whole")
    rng = random.Random(7)
    for i in range(60):
        run_id, status, score = f"run_{i:02}", rng.choice(STATES), 1000 + rng.randrange(8)
        world.client.zadd(rng.choice(shards).index(status), {run_id: score})
        world.client.zadd(whole.index(status), {run_id: score})
    return RunIndex(world.client, *shards), RunIndex(world.client, whole)


def test_pages_over_several_shards_are_those_of_one(world: World) -> None:
    sharded, one = _spread(world)
    assert [sharded.count(s) for s in Status] == [one.count(s) for s in Status]
    for status in (None, *STATES):
        for size in (1, 3, 7, 100):
            assert pages(sharded, status, size) == pages(one, status, size), (status, size)
        for offset in (0, 5, 17):
            assert sharded.newest(status, 6, offset) == one.newest(status, 6, offset)


def test_waiting_and_finished_runs_over_several_shards_are_those_of_one(
        world: World) -> None:
    sharded, one = _spread(world)
    for cutoff, limit in ((1003, 4), (1010, 100)):
        waiting = (Status.QUEUED, Status.INTERRUPTED)
        assert sharded.waiting_since_before(waiting, cutoff, limit) == \
            one.waiting_since_before(waiting, cutoff, limit)
    assert sharded.finished_before(1004) == one.finished_before(1004)
    assert sharded.prune_finished_before(1004) == one.prune_finished_before(1004)
    assert sharded.count(Status.COMPLETED) == one.count(Status.COMPLETED) > 0


def test_due_members_of_several_shards_merge_by_score(world: World) -> None:
    keys = [f"{world.prefix}:due:{k}" for k in range(3)]
    world.client.zadd(keys[0], {"b": 10, "d": 30, "late": 99})
    world.client.zadd(keys[1], {"a": 10, "c": 20})
    registries = [Registry(world.client, key) for key in keys]
    assert due_in(registries, 50, 10) == [("a", 10), ("b", 10), ("c", 20), ("d", 30)]
    assert due_in(registries, 50, 2) == [("a", 10), ("b", 10)]
    assert due_in(registries[:1], 50, 10) == [("b", 10), ("d", 30)]
    assert due_in([], 50, 10) == []


def test_a_store_of_the_legacy_layout_reads_and_writes_one_shard(world: World) -> None:
    store = world.store
    assert [shard.keys for shard in store.shards] == [store.keys.legacy]
    assert store.shard_of("run_1") is store.shards[0]
    assert store.all_runs.sets == {s: (store.keys.legacy.index(s),) for s in Status}


def test_pages_over_many_shards_spread_unevenly_are_those_of_one(world: World) -> None:
    """48 shards, half the runs in one of them and ties in every millisecond: a merge that
    first reads a few of each shard reads further where the page needs it, and pages,
    cursors and offsets are still those of one shard."""
    shards = [ShardKeys(f"{world.prefix}:m{k}") for k in range(48)]
    whole = ShardKeys(f"{world.prefix}:mwhole")
    rng = random.Random(11)
    for i in range(400):
        run_id, status, score = f"run_{i:03}", rng.choice(STATES), 1000 + rng.randrange(40)
        shard = shards[0] if rng.random() < 0.5 else rng.choice(shards)
        world.client.zadd(shard.index(status), {run_id: score})
        world.client.zadd(whole.index(status), {run_id: score})
    sharded, one = RunIndex(world.client, *shards), RunIndex(world.client, whole)
    for status in (None, Status.INTERRUPTED):
        for size in (1, 5, 50, 101):
            assert pages(sharded, status, size) == pages(one, status, size), (status, size)
        for offset in (0, 30, 150):
            assert sharded.newest(status, 60, offset) == one.newest(status, 60, offset)


def test_pages_through_a_crowded_millisecond_are_those_of_one(world: World) -> None:
    """Hundreds of runs changed in one millisecond, most in one of 48 shards: a page after
    a cursor inside that millisecond starts each shard's read with runs pages before gave,
    reads past as many as it must, and still gives the pages of one shard."""
    shards = [ShardKeys(f"{world.prefix}:t{k}") for k in range(48)]
    whole = ShardKeys(f"{world.prefix}:twhole")
    rng = random.Random(5)
    for i in range(600):
        run_id = f"run_{i:03}"
        score = 2000 if i < 500 else 1990 + rng.randrange(20)
        shard = shards[0] if i < 450 else rng.choice(shards)
        world.client.zadd(shard.index(Status.INTERRUPTED), {run_id: score})
        world.client.zadd(whole.index(Status.INTERRUPTED), {run_id: score})
    sharded, one = RunIndex(world.client, *shards), RunIndex(world.client, whole)
    for size in (1, 7, 50, 120):
        assert pages(sharded, Status.INTERRUPTED, size) == \
            pages(one, Status.INTERRUPTED, size), size


def test_a_page_reads_each_of_48_shards_once_at_any_depth(world: World) -> None:
    """4,800 runs spread over 48 shards as the store spreads them (by id), a few changed in
    each millisecond: every page of 50, the first and each after a cursor, reads each shard
    once, in one round trip (a shard read again is a second): within one re-read in all."""
    shards = [ShardKeys(f"{world.prefix}:e{k}") for k in range(48)]
    rng = random.Random(23)
    pipe = world.client.pipeline(transaction=False)
    for i in range(4800):
        run_id = generated_run_id()
        pipe.zadd(shards[shard_of(run_id, 48)].index(Status.INTERRUPTED),
                  {run_id: 5000 + i // 3 + rng.randrange(2)})
    pipe.execute()
    runs = RunIndex(world.client, *shards)

    def reads() -> int:
        stats = world.client.info("commandstats").get("cmdstat_zrevrangebyscore", {})
        return int(stats.get("calls", 0))

    before = reads()
    found = pages(runs, Status.INTERRUPTED, 50)
    assert len(found) == 96 and sum(len(page) for page in found) == 4800
    assert reads() - before <= 48 * len(found) + 1
