"""The store's shards (`layby.parking.shards`): each shard's hash tag lands in its own equal
range of the slots, so on a real Valkey cluster (3 primaries, the `valkey_cluster` fixture)
shards, and the runs in them, spread over the primaries within ±15%."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from layby.ops.embedded import EmbeddedCluster
from layby.parking.shards import DEFAULT_COUNT, SLOTS, shard_of, slot_of, tags

pytestmark = pytest.mark.integration


def test_each_shard_tag_lands_in_its_own_range_of_slots() -> None:
    for count in (1, 3, DEFAULT_COUNT, 64, 1024):
        found = tags(count)
        assert len(set(found)) == count
        for k, tag in enumerate(found):
            assert k * SLOTS // count <= slot_of(tag) < (k + 1) * SLOTS // count
    # Part of the stored format: the same tags every time.
    assert tags(4) == ("0.1", "1.3", "2.1", "3.3")
    with pytest.raises(ValueError, match="1 to 1024 shards"):
        tags(0)


def test_runs_spread_over_the_shards_evenly() -> None:
    per_shard = Counter(shard_of(f"run_{uuid.uuid4().hex}", DEFAULT_COUNT)
                        for _ in range(96_000))
    assert len(per_shard) == DEFAULT_COUNT
    assert max(per_shard.values()) <= 1.1 * 2000 and min(per_shard.values()) >= 0.9 * 2000


@pytest.mark.parametrize("count", [DEFAULT_COUNT, 64])
def test_shards_and_their_runs_spread_over_the_primaries_within_15_percent(
        valkey_cluster: EmbeddedCluster, count: int) -> None:
    runs = [f"run_{uuid.uuid4().hex}" for _ in range(3000)]
    tagged = [f"layby:{{{tags(count)[shard_of(r, count)]}}}:{r}:run" for r in runs]
    with valkey_cluster.client() as client:
        pipe = client.pipeline()
        for key in tagged:
            pipe.set(key, "1")
        pipe.execute()
        held = {}
        for primary in valkey_cluster.primaries():
            with primary.client() as node:
                held[primary.address] = sum(1 for _ in node.scan_iter("layby:{*", count=1000))
        client.delete(*tagged)
    assert sum(held.values()) == len(runs)
    mean = len(runs) / len(held)
    assert all(abs(n - mean) <= 0.15 * mean for n in held.values()), held
