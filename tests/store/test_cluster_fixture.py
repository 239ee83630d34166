"""The Valkey Cluster the tests of a store on a cluster will run against (`EmbeddedCluster`,
the `valkey_cluster` fixture): it forms, redis-py's cluster client uses it, a killed
primary's replica takes over with the writes it acknowledged, and a slot moves while a
client keeps reading it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from layby.ops.embedded import CLUSTER_SLOTS, EmbeddedCluster, cluster_info, wait_until

pytestmark = pytest.mark.integration


def tag_in(slot: int) -> str:
    """A hash tag whose keys land in `slot`."""
    return next(t for i in range(1_000_000) if key_slot((t := f"t{i}").encode()) == slot)


def test_the_cluster_forms(valkey_cluster: EmbeddedCluster) -> None:
    for member in valkey_cluster.members:
        info = cluster_info(member)
        assert info["cluster_state"] == "ok", member
        assert info["cluster_known_nodes"] == "6", member
        assert info["cluster_slots_assigned"] == str(CLUSTER_SLOTS), member
    primaries = valkey_cluster.primaries()
    assert len(primaries) == 3
    served = sorted(slot for p in primaries for first, last in p.myself().slots
                    for slot in range(first, last + 1))
    assert served == list(range(CLUSTER_SLOTS)), "every slot served once"
    replicas = valkey_cluster.replicas()
    assert len(replicas) == 3
    followed = {r.myself().primary_id for r in replicas}
    assert followed == {p.node_id for p in primaries}, "each replica follows its own primary"


def test_redis_cluster_writes_and_reads_across_slots(valkey_cluster: EmbeddedCluster) -> None:
    keys = [f"spread:{i}" for i in range(300)]
    with valkey_cluster.client() as client:
        for key in keys:
            client.set(key, key)
        assert [client.get(key) for key in keys] == keys
        held = {}
        for primary in valkey_cluster.primaries():
            with primary.client() as node:
                held[primary.address] = sum(1 for _ in node.scan_iter("spread:*"))
        assert sum(held.values()) == len(keys)
        assert all(held.values()), f"every primary holds some keys: {held}"
        client.delete(*keys)


def test_hash_tagged_keys_share_a_slot(valkey_cluster: EmbeddedCluster) -> None:
    # A script of layby's touches several keys of a run: one slot, by the run's hash tag.
    group = [f"{{run:42}}:{part}" for part in ("state", "events", "interrupts")]
    with valkey_cluster.client() as client:
        slots = {client.cluster_keyslot(key) for key in group}
        assert len(slots) == 1
        assert client.mset(dict.fromkeys(group, "x"))
        touched = client.eval("return redis.call('EXISTS', unpack(KEYS))", len(group), *group)
        assert touched == len(group)
        client.delete(*group)
    owner = valkey_cluster.owner(key_slot(b"plain:a"))
    assert key_slot(b"plain:a") != key_slot(b"plain:b")
    with pytest.raises(redis.exceptions.ClusterCrossSlotError):
        owner.command("MSET", "plain:a", 1, "plain:b", 1)


def test_a_slot_moves_while_redis_cluster_reads_it(valkey_cluster: EmbeddedCluster) -> None:
    slot = 1000
    tag = tag_in(slot)
    keys = [f"{{{tag}}}:{i}" for i in range(10)]
    source = valkey_cluster.owner(slot)
    target = next(p for p in valkey_cluster.primaries() if p.node_id != source.node_id)
    with valkey_cluster.client() as client:
        for key in keys:
            client.set(key, key)

        migration = valkey_cluster.begin_migration(slot, target)
        assert migration.move(5) == 5
        asked = 0
        with source.client() as node:
            for key in keys:
                try:
                    node.get(key)
                except redis.exceptions.AskError:
                    asked += 1
        assert asked == 5, "the keys moved are asked for at the target"
        assert [client.get(key) for key in keys] == keys
        # A key that is not at the source is the target's while the slot migrates.
        client.set(f"{{{tag}}}:new", "new")

        migration.finish()
        assert valkey_cluster.owner(slot).node_id == target.node_id
        with source.client() as node, pytest.raises(redis.exceptions.MovedError):
            node.get(keys[0])
        assert [client.get(key) for key in keys] == keys
        assert client.get(f"{{{tag}}}:new") == "new"

        valkey_cluster.migrate_slot(slot, source)  # the shared cluster as it was
        assert valkey_cluster.owner(slot).node_id == source.node_id
        assert [client.get(key) for key in keys] == keys
        client.delete(*keys, f"{{{tag}}}:new")


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[EmbeddedCluster]:
    cluster = EmbeddedCluster(tmp_path / "cluster").start()
    yield cluster
    cluster.stop()


def test_a_killed_primarys_replica_takes_over_with_its_writes(
        own_cluster: EmbeddedCluster) -> None:
    victim = own_cluster.primaries()[0]
    replicas = {r.node_id for r in own_cluster.replicas_of(victim)}
    first, last = victim.myself().slots[0]
    keys = [k for i in range(5000) if first <= key_slot((k := f"kept:{i}").encode()) <= last]
    assert len(keys) > 100
    with victim.client() as node:
        for key in keys:
            node.set(key, key)
        # WAIT counts the replicas that have this connection's writes.
        assert node.execute_command("WAIT", 1, 5000) == 1
    client = own_cluster.client()  # made before the kill: it has to find the new primary
    assert client.get(keys[0]) == keys[0]

    own_cluster.kill(victim)
    failover = own_cluster.wait_for_failover(victim)
    print(f"failover in {failover.seconds:.2f} s")
    assert failover.new_primary.node_id in replicas
    assert [client.get(key) for key in keys] == keys
    client.close()

    # Back on its port with its nodes.conf, the old primary follows the one that replaced it.
    own_cluster.restart(victim)

    def following() -> str | None:
        with victim.client() as node:
            info = node.info("replication")
        if victim.myself().primary_id != failover.new_primary.node_id:
            return f"{victim} does not follow {failover.new_primary}"
        return None if info.get("master_link_status") == "up" else f"{victim}'s link is down"

    rejoined = wait_until("the old primary rejoining as a replica", following, 30)
    print(f"rejoined as a replica in {rejoined:.2f} s")
    with victim.client(single_connection_client=True) as node:
        node.execute_command("READONLY")  # a replica answers reads only when asked so
        assert node.get(keys[-1]) == keys[-1]


def test_a_wait_that_times_out_names_what_did_not_happen() -> None:
    with pytest.raises(TimeoutError, match=r"^a failover of node x did not happen within "
                                           r"0\.1 s: no replica has become primary$"):
        wait_until("a failover of node x", lambda: "no replica has become primary", 0.1)
