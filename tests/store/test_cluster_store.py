"""The store's transitions on a real Valkey Cluster (3 primaries, 3 replicas: the
`valkey_cluster` fixture), in the sharded layout (`Keys(prefix, shard_count)`): each
transition's keys are in one slot, so its script runs there; runs live their whole life,
list pages merge the shards across the primaries, deadlines and lost messages are found in
every shard, the runs' keys spread over the primaries, and a follower waits for a run's
events on the run's node (without asking for XREAD's keys first). The store alone, through
redis-py's RedisCluster: layby's processes on a cluster are in tests/ops and tests/faults."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from dataclasses import replace

import pytest
import redis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from layby.control.runtime import TASK_NAMES
from layby.ops.embedded import EmbeddedCluster
from layby.parking import Announcements, Keys, Store, StoreConfig, events, formats, migrations
from layby.parking.scripts import standalone
from layby.parking.shards import slot_of, tags
from layby.wire import Status
from tests.store.conftest import (
    MESSAGES,
    OWNER,
    World,
    answer,
    answered_to_the_end,
    interrupt,
    pages,
    park_event,
)

pytestmark = pytest.mark.integration

_prefixes = itertools.count()


@pytest.fixture
def store(valkey_cluster: EmbeddedCluster) -> Store:
    return Store(valkey_cluster.client(),
                 StoreConfig(TASK_NAMES, prefix=f"cl{next(_prefixes)}", shards=48))


def _parked(store: Store, run_id: str, *, expires_ms: int | None = None) -> None:
    assert store.runs.create_run(run_id, "demo.agent", input="hi", messages=MESSAGES, metadata={},
                                 idempotency_key=None).ok
    assert store.runs.claim(run_id, 1, OWNER).ok
    intrs = [interrupt("int_a", expires_ms=expires_ms)]
    assert store.runs.park(run_id, 1, OWNER, World.history(2), intrs, park_event(intrs),
                           plan=Announcements()).ok


def test_runs_live_their_whole_life_on_the_cluster(store: Store) -> None:
    runs = [f"run_{uuid.uuid4().hex}" for _ in range(30)]
    for run_id in runs:
        _parked(store, run_id)
    assert len({store.keys.shard_number(r) for r in runs}) > 10
    # The parked list, newest first, page by page across shards on three primaries.
    seen = [run_id for page in pages(store.all_runs, Status.INTERRUPTED, 7)
            for run_id, _ in page]
    assert sorted(seen) == sorted(runs) and len(seen) == len(runs)
    for run_id in runs[:10]:
        answered_to_the_end(store, run_id)
    completed = {run_id for run_id, _ in store.all_runs.page(Status.COMPLETED, 50)[0]}
    assert completed == set(runs[:10])
    assert store.runs.status_of(runs[0])[0] is Status.COMPLETED


def test_deadlines_and_lost_messages_are_found_across_the_cluster(store: Store) -> None:
    expiring = [f"run_{uuid.uuid4().hex}" for _ in range(8)]
    for run_id in expiring:
        _parked(store, run_id, expires_ms=1)
    assert sorted(store.deadlines.due_deadlines()) == sorted((r, "int_a") for r in expiring)
    # Where they are due, asked a slot at a time (a script each, in one pipeline).
    due = store.deadlines.find_due()
    assert set(due.deadlines) == {store.shard_of(r) for r in expiring}
    assert (due.retries, due.leases, due.notifications, due.lost) == ((), (), (), False)
    assert sorted(store.deadlines.due_deadlines(shards=due.deadlines)) == sorted(
        (r, "int_a") for r in expiring)
    # Queued runs whose queue is empty (the broker says so): lost, in every shard.
    queued = [f"run_{uuid.uuid4().hex}" for _ in range(8)]
    for run_id in queued:
        assert store.runs.create_run(run_id, "demo.agent", input="hi", messages=MESSAGES,
                                     metadata={}, idempotency_key=None).ok
    store.length_of_queue = {"layby.turns": 0}.get
    assert sorted(store.deadlines.waiting_too_long(0)) == sorted(queued)
    lost = Store(store.redis, replace(store.config, lost_message_ms=0))
    assert lost.deadlines.find_due().lost and not store.deadlines.find_due().lost


def test_the_runs_keys_spread_over_the_primaries(store: Store,
                                                 valkey_cluster: EmbeddedCluster) -> None:
    for _ in range(3000):
        assert store.runs.create_run(f"run_{uuid.uuid4().hex}", "demo.agent", input="hi",
                                     messages=MESSAGES, metadata={}, idempotency_key=None).ok
    held = {}
    for primary in valkey_cluster.primaries():
        with primary.client() as node:
            held[primary.address] = sum(
                1 for _ in node.scan_iter(f"{store.keys.prefix}:{{*}}:run_*:run", count=1000))
    assert sum(held.values()) == 3000
    assert all(abs(n - 1000) <= 150 for n in held.values()), held  # within 15%


def test_the_cluster_refuses_a_script_given_keys_of_two_slots(
        store: Store, valkey_cluster: EmbeddedCluster) -> None:
    # Keys of two slots, both on one primary (so that no redirection stops them first):
    # the server refuses the script, rather than let a transition be split over slots that
    # a resharding may part. (Every script also says `#!lua`, so that one reaching a key of
    # another slot than those it was given is refused as well.)
    primary = valkey_cluster.primaries()[0]
    served = [range(first, last + 1) for first, last in primary.myself().slots]
    mine = [tag for tag in tags(48) if any(slot_of(tag) in r for r in served)]
    runs = {}
    for _ in range(10_000):
        run_id = f"run_{uuid.uuid4().hex}"
        tag = tags(48)[store.keys.shard_number(run_id)]
        if tag in mine[:2]:
            runs.setdefault(tag, run_id)
        if len(runs) == 2:
            break
    keys = [store.keys.run(run_id) for run_id in runs.values()]
    with primary.client() as node:
        count = standalone(node, "count_versions")
        assert count(keys=keys[:1]) == []  # one slot: it runs (no such run: nothing counted)
        with pytest.raises(redis.ResponseError, match="hash to the same slot"):
            count(keys=keys)


def test_a_store_of_format_1_made_on_the_cluster_is_taken_to_format_2_without_a_scan(
        store: Store) -> None:
    """A store made on a cluster before format 2 (version 1 and a shard count, as this
    layby's processes stamped it then) is in the sharded layout already: the switch keeps
    its shard count and gives it no layout instant, and `layby migrate` (migration 2) scans
    no key, on any primary, and sets the version."""
    keys = Keys(store.keys.prefix)
    formats.stamp(store.redis, keys, 1, 48)
    runs = [f"run_{uuid.uuid4().hex}" for _ in range(6)]
    for run_id in runs:
        _parked(store, run_id)
    before = {run_id: store.runs.view(run_id) for run_id in runs}
    assert store.processes.switch_format(2, shards=16) == ["switched"]
    state = formats.read(store.redis, keys)
    assert (state.shards, state.sharded_at, state.written) == (48, None, 2)
    assert store.layout == formats.Layout(Keys(keys.prefix, 48))
    formats.settle_after_switch(store.redis, keys)
    scanned: list[int] = []
    [report] = migrations.migrate(store.redis, keys, progress=scanned.append)
    # Its six waiting runs looked at for the reviewers' request index: in it already.
    assert (report.number, report.seen, report.changed, scanned) == (2, 6, 0, [])
    assert formats.read(store.redis, keys).version == 2
    again = Store(store.redis, StoreConfig(TASK_NAMES, prefix=keys.prefix, shards=48))
    assert {run_id: again.runs.view(run_id) for run_id in runs} == before
    assert again.answers.answer(runs[0], [answer("int_a")]).resumed


def _keys_asked(valkey_cluster: EmbeddedCluster) -> int:
    """How many times the primaries were asked a command's keys (`COMMAND GETKEYS`)."""
    asked = 0
    for primary in valkey_cluster.primaries():
        with primary.client() as node:
            asked += node.info("commandstats").get("cmdstat_command|getkeys", {}).get("calls", 0)
    return asked


def test_a_follower_waits_on_the_runs_node_without_asking_for_the_reads_keys(
        store: Store, valkey_cluster: EmbeddedCluster) -> None:
    run_id = f"run_{uuid.uuid4().hex}"
    _parked(store, run_id)
    client = store.redis
    key = store.keys.events(run_id)
    expected = client.xread({key: "0-0"}, count=10, block=100)
    before = _keys_asked(valkey_cluster)
    assert events.wait(client, key, "0-0", count=10, block_ms=100) == expected
    last = expected[0][1][-1][0]
    assert events.wait(client, key, last, count=10, block_ms=50) == []  # nothing newer
    assert [e.type for e in events.read(client, key, last, block_ms=50)] == []
    assert _keys_asked(valkey_cluster) == before


def test_a_follower_with_a_stale_map_reads_again_the_usual_way(
        store: Store, valkey_cluster: EmbeddedCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slot moved since the client read the map: the node it names answers MOVED, and
    the read goes again as redis-py sends it (which learns the new map)."""
    run_id = f"run_{uuid.uuid4().hex}"
    _parked(store, run_id)
    client = store.redis
    key = store.keys.events(run_id)
    holder = client.get_node_from_key(key)
    elsewhere = next(n for n in client.get_primaries() if n.name != holder.name)
    monkeypatch.setattr(client, "get_node_from_key", lambda *_, **__: elsewhere)
    before = _keys_asked(valkey_cluster)
    got = events.wait(client, key, "0-0", count=10, block_ms=100)
    assert [fields["type"] for _, fields in got[0][1]] == ["run.created", "run.started",
                                                           "run.interrupted"]
    assert _keys_asked(valkey_cluster) == before + 1  # the usual way asks for the keys


def test_an_async_follower_waits_on_the_runs_node_too_and_reads_again_with_a_stale_map(
        store: Store, valkey_cluster: EmbeddedCluster) -> None:
    run_id = f"run_{uuid.uuid4().hex}"
    _parked(store, run_id)
    key = store.keys.events(run_id)

    async def follow() -> list[str]:
        client = AsyncRedisCluster(host=valkey_cluster.members[0].host,
                                   port=valkey_cluster.members[0].port, decode_responses=True)
        try:
            seen = []
            async for batch in events.follow_raw(client, key, "0-0"):
                assert batch is not None
                seen += [fields["type"] for _, fields in batch]
                if len(seen) >= 3:
                    got = await events.wait_async(client, key, batch[-1][0], count=10,
                                                  block_ms=50)
                    assert got == []
                    return seen
            return seen
        finally:
            await client.aclose()

    async def stale() -> list[str]:
        client = AsyncRedisCluster(host=valkey_cluster.members[0].host,
                                   port=valkey_cluster.members[0].port, decode_responses=True)
        try:
            await client.initialize()
            holder = client.get_node_from_key(key)
            elsewhere = next(n for n in client.get_primaries() if n.name != holder.name)
            client.get_node_from_key = lambda *_, **__: elsewhere  # type: ignore[method-assign]
            got = await events.wait_async(client, key, "0-0", count=10, block_ms=50)
            return [fields["type"] for _, fields in got[0][1]]
        finally:
            await client.aclose()

    before = _keys_asked(valkey_cluster)
    assert asyncio.run(follow()) == ["run.created", "run.started", "run.interrupted"]
    assert _keys_asked(valkey_cluster) == before
    # With a stale map, the read goes again the usual way (which asks for its keys).
    assert asyncio.run(stale()) == ["run.created", "run.started", "run.interrupted"]
    assert _keys_asked(valkey_cluster) == before + 1
