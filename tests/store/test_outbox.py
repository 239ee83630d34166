"""claim_outbox.lua and ack_outbox.lua: the outbox of task messages a transition could not
push itself (the broker elsewhere). Overdue entries are handed out once, each pushed back
by a retry delay so that two sweepers do not publish one twice; an acked entry is gone."""

from __future__ import annotations

import pytest

from tests.store.conftest import MESSAGES, World

pytestmark = pytest.mark.store


def _create(world: World, *run_ids: str, grace_ms: int = -1_000) -> None:
    store = world.store_with(outbox_grace_ms=grace_ms)
    for run_id in run_ids:
        assert store.runs.create_run(run_id, "demo.agent", input="hi", messages=MESSAGES,
                                     metadata={}, idempotency_key=None).ok


def test_overdue_entries_are_handed_out_once_and_pushed_back_by_the_retry_delay(
        world: World) -> None:
    _create(world, "run_1", "run_2")
    _create(world, "run_3", grace_ms=600_000)
    now = world.now()
    claimed = world.store.outbox.claim_outbox(retry_ms=30_000)
    assert [(e.id, e.task, e.queue, e.args) for e in claimed] == [
        ("run_1:turn:1", "layby.run_turn", "layby.turns", ["run_1", 1]),
        ("run_2:turn:1", "layby.run_turn", "layby.turns", ["run_2", 1])]
    due = world.zset(world.shard.outbox)
    assert all(now + 30_000 <= due[f"run_{i}:turn:1"] <= world.now() + 30_000 for i in (1, 2))
    assert due["run_3:turn:1"] > now + 500_000
    assert world.store.outbox.overdue_outbox() == []
    # Another sweeper right after: nothing to publish.
    before = world.snapshot()
    assert world.store.outbox.claim_outbox() == []
    assert world.snapshot() == before


def test_at_most_the_limit_is_handed_out(world: World) -> None:
    _create(world, "run_1", "run_2", "run_3")
    assert len(world.store.outbox.claim_outbox(limit=2)) == 2
    assert [e.id for e in world.store.outbox.claim_outbox(limit=2)] == ["run_3:turn:1"]


def test_an_entry_whose_record_is_gone_is_dropped_not_handed_out(world: World) -> None:
    _create(world, "run_1", "run_2")
    world.client.hdel(world.shard.outbox_entries, "run_1:turn:1")
    assert [e.id for e in world.store.outbox.claim_outbox()] == ["run_2:turn:1"]
    assert list(world.zset(world.shard.outbox)) == ["run_2:turn:1"]


def test_an_acked_entry_is_gone_for_good(world: World) -> None:
    _create(world, "run_1", "run_2")
    world.store.outbox.ack_outbox([("run_1", "run_1:turn:1")])
    assert list(world.outbox()) == ["run_2:turn:1"]
    assert [e.id for e in world.store.outbox.claim_outbox()] == ["run_2:turn:1"]


def test_acking_twice_or_acking_an_unknown_entry_changes_nothing_else(world: World) -> None:
    _create(world, "run_1", "run_2")
    keys = [world.shard.outbox, world.shard.outbox_entries]
    assert world.store.call("ack_outbox", keys, ids=["run_1:turn:1", "run_x:turn:9"]) == 2
    before = world.snapshot()
    assert world.store.call("ack_outbox", keys, ids=["run_1:turn:1"]) == 1
    assert world.snapshot() == before
    assert list(world.outbox()) == ["run_2:turn:1"]


def test_every_shards_outbox_is_claimed_even_after_the_server_lost_its_scripts(
        sharded: World) -> None:
    """One round trip claims every shard's overdue entries; a server that lost its scripts
    has them loaded, and nothing is left behind."""
    store = sharded.store_with(outbox_grace_ms=-1_000)
    run_ids = [f"run_{i}" for i in range(12)]
    for run_id in run_ids:
        assert store.runs.create_run(run_id, "demo.agent", input="hi", messages=MESSAGES,
                                     metadata={}, idempotency_key=None).ok
    held = {sharded.keys.shard_of(run_id).base for run_id in run_ids}
    assert len(held) > 1  # spread over several shards
    sharded.client.script_flush()
    claimed = sharded.store.outbox.claim_outbox(retry_ms=30_000)
    assert sorted(e.id for e in claimed) == sorted(f"{r}:turn:1" for r in run_ids)
    assert sharded.store.outbox.claim_outbox() == []
