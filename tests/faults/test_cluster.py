"""layby served on a Valkey Cluster (3 primaries, 3 replicas) with the broker beside it:
LAYBY_REDIS_URL=redis+cluster://<one node> (the client finds the others) and
LAYBY_BROKER_URL a Valkey server of its own. The store is made in the sharded layout
(LAYBY_STORE_SHARDS, recorded in its format key), each transition in one slot; the core
scenarios run as they run on one server (the same tests, given this module's `system`).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from layby.ops.embedded import EmbeddedCluster, EmbeddedRedis

# The same scenarios as on one server (collected here, they get this module's `system`).
from tests.support.core_scenarios import *  # noqa: F403
from tests.support.core_scenarios import on_a_cluster
from tests.support.harness import LAYBY, ROOT, LaybySystem

pytestmark = pytest.mark.integration


@dataclass
class OnCluster:
    cluster: EmbeddedCluster
    broker: EmbeddedRedis
    system: LaybySystem


@pytest.fixture(scope="module")
def on_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OnCluster]:
    root = tmp_path_factory.mktemp("on-cluster")
    broker = EmbeddedRedis(root / "broker").start()
    try:
        with on_a_cluster(root, broker.url) as (cluster, system):
            yield OnCluster(cluster, broker, system)
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def system(on_cluster: OnCluster) -> LaybySystem:
    return on_cluster.system


def _doctor(system: LaybySystem, **env: str) -> tuple[int, dict[str, str]]:
    done = subprocess.run([LAYBY, "doctor"], env={**system.env, **env}, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    lines = {}
    for line in done.stdout.splitlines():
        verdict, _, rest = line.partition(" ")
        name, _, message = rest.strip().partition(": ")
        lines[name] = f"{verdict} {message}"
    return done.returncode, lines


def test_doctor_checks_the_cluster(on_cluster: OnCluster) -> None:
    _, found = _doctor(on_cluster.system)
    for name in ("cluster nodes", "cluster slots", "cluster replicas", "store shards",
                 "broker apart", "redis maxmemory-policy", "store format"):
        assert found[name].startswith("OK"), (name, found)
    assert found["cluster slots"] == "OK all 16384 served"
    assert found["store shards"] == "OK 48 (LAYBY_STORE_SHARDS)"
    assert "on all 6 nodes" in found["redis maxmemory-policy"]
    # Another shard count than the store's, and a broker on one of the cluster's nodes.
    node = on_cluster.cluster.members[1].address
    code, found = _doctor(on_cluster.system, LAYBY_STORE_SHARDS="16",
                          LAYBY_BROKER_URL=f"redis://{node}/0")
    assert code == 1
    assert found["store shards"].startswith("PROBLEM the store was made with 48 shards")
    assert found["broker apart"].startswith(f"PROBLEM LAYBY_BROKER_URL names {node}")


def test_a_process_set_for_another_shard_count_refuses_to_start(on_cluster: OnCluster
                                                                 ) -> None:
    done = subprocess.run([LAYBY, "runs", "ls"], env={**on_cluster.system.env,
                                                        "LAYBY_STORE_SHARDS": "16"},
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert "made with 48 shards" in done.stderr and "LAYBY_STORE_SHARDS=48" in done.stderr
