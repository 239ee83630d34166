"""claim_due_notifications.lua: notifications whose send is due, each pushed back so that
nobody queues it again meanwhile: with the broker on the server its delivery is pushed and
it is due again only if that message is lost; otherwise the caller dispatches it and it is
due again after a retry delay."""

from __future__ import annotations

import pytest

from tests.store.conftest import World

pytestmark = pytest.mark.store


def _due(world: World, **members: int) -> None:
    world.client.zadd(world.shard.notify_due, members)


def test_due_notifications_are_handed_out_once_and_pushed_back_by_the_retry_delay(
        world: World) -> None:
    now = world.now()
    _due(world, **{"run_1 ntf_1": now - 2_000, "run_2 ntf_2": now - 1_000,
                   "run_3 ntf_3": now + 600_000})
    found = world.store.outbox.claim_due_notifications(retry_ms=10_000)
    assert found == [("run_1", "ntf_1"), ("run_2", "ntf_2")]
    due = world.zset(world.shard.notify_due)
    assert due["run_3 ntf_3"] == now + 600_000
    assert all(now + 10_000 <= due[m] <= world.now() + 10_000
               for m in ("run_1 ntf_1", "run_2 ntf_2"))
    # A second sweeper right after finds nothing to queue again.
    before = world.snapshot()
    assert world.store.outbox.claim_due_notifications() == []
    assert world.snapshot() == before


def test_at_most_the_limit_is_handed_out_the_oldest_first(world: World) -> None:
    now = world.now()
    _due(world, **{f"run_{i} ntf_{i}": now - 10_000 + i for i in range(5)})
    assert world.store.outbox.claim_due_notifications(limit=2) == [("run_0", "ntf_0"),
                                                                   ("run_1", "ntf_1")]
    assert world.store.outbox.claim_due_notifications(limit=10) == [
        ("run_2", "ntf_2"), ("run_3", "ntf_3"), ("run_4", "ntf_4")]


def test_with_the_broker_on_the_server_their_deliveries_are_pushed(world: World) -> None:
    store = world.store_with(pushing=True, lost_message_ms=300_000)
    now = world.now()
    _due(world, **{"run_1 ntf_1": now - 1_000, "run_2 ntf_2": now + 600_000})
    assert store.outbox.claim_due_notifications() == []
    assert world.queue("layby.notify") == [("layby.notify.deliver", ["run_1", "ntf_1"],
                                            "ntf_1")]
    due = world.zset(world.shard.notify_due)
    assert due["run_1 ntf_1"] >= now + 300_000 and due["run_2 ntf_2"] == now + 600_000


def test_with_nothing_due_nothing_changes(world: World) -> None:
    _due(world, **{"run_1 ntf_1": world.now() + 600_000})
    before = world.snapshot()
    assert world.store_with(pushing=True).outbox.claim_due_notifications() == []
    assert world.snapshot() == before


def test_every_shards_due_notifications_are_claimed_even_after_the_server_lost_its_scripts(
        sharded: World) -> None:
    """The sweeper claims every shard's due notifications in one round trip; a server that
    lost its scripts (a restart, a failover, a flush) gets them loaded, and the claims go
    again, none lost."""
    now = sharded.now()
    shards = sharded.keys.shards
    for i, shard in enumerate(shards):
        sharded.client.zadd(shard.notify_due, {f"run_{i} ntf_{i}": now - 1_000 - i})
    sharded.client.script_flush()
    found = sharded.store.outbox.claim_due_notifications(retry_ms=10_000)
    assert sorted(found) == [(f"run_{i}", f"ntf_{i}") for i in range(len(shards))]
    for i, shard in enumerate(shards):
        assert sharded.zset(shard.notify_due)[f"run_{i} ntf_{i}"] >= now + 10_000
    assert sharded.store.outbox.claim_due_notifications() == []
