"""A Valkey Cluster's failover under load: layby's store on 3 primaries with a replica each
(LAYBY_REDIS_URL=redis+cluster://…), its broker a Valkey server beside them, and
LAYBY_REDIS_MIN_REPLICAS_ACK=1. While runs of demo.transfer go through their approvals, a
primary is SIGKILLed; its replica is promoted, and the killed node is started again, as an
orchestrator would, to follow it (until then the promoted primary has no replica to
confirm writes). Then a slot of runs is moved to another primary while runs go on (ASK,
then MOVED). Figures: runs, completed, lost, duplicate transfers, how long the promotion
took and how long after it every run finished, and what the API answered meanwhile."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from faults.common import (
    AS_SHIPPED,
    Approver,
    Outcome,
    Size,
    answered,
    run_figures,
    start_runs,
)
from layby.ops.embedded import ClusterMember, EmbeddedCluster, EmbeddedRedis
from layby.parking.keys import Keys
from layby.parking.shards import DEFAULT_COUNT, slot_of, tags
from tests.support.harness import LaybySystem

NAME = "cluster failover"
AFTER_PROMOTION_S = 30  # every run finished this soon after the replica took over


def run(size: Size, folder: Path) -> Outcome:
    count = size.pick(60, 200)
    cluster = EmbeddedCluster(folder / "cluster").start()
    broker = EmbeddedRedis(folder / "broker").start()
    try:
        layby = LaybySystem(f"redis+cluster://{cluster.members[0].address}",
                            folder / "system", worker_count=4, env_overrides={
                                **AS_SHIPPED, "LAYBY_BROKER_URL": broker.url,
                                "LAYBY_REDIS_MIN_REPLICAS_ACK": "1"})
        try:
            figures = _under_load(layby.start(), cluster, count)
        finally:
            layby.stop()
    finally:
        broker.stop()
        cluster.stop()
    return Outcome(NAME, figures, _targets(figures, count))


def _targets(f: dict[str, Any], count: int) -> dict[str, bool]:
    return {
        "all completed": f["completed"] == count, "0 lost": f["lost"] == 0,
        "0 duplicate side effects": f["duplicate side effects"] == 0,
        f"every run finished within {AFTER_PROMOTION_S} s of the promotion":
            isinstance(f["promotion to every run finished (s)"], float)
            and f["promotion to every run finished (s)"] <= AFTER_PROMOTION_S,
        "the API answered 200 or 503 meanwhile, never a 500":
            set(f["API answers meanwhile"]) <= {"200", "503"},
        "a slot moved under load: every API call answered 200":
            set(f["API answers while a slot moved"]) == {"200"}}


def _victim(cluster: EmbeddedCluster) -> ClusterMember:
    """A primary with a replica, not the one of the demo ledger's slot: the ledger stands
    for the outside world, which a failover of the store does not touch."""
    return next(p for p in cluster.primaries()
                if cluster.replicas_of(p) and not p.myself().owns(slot_of("transfers")))


def _under_load(layby: LaybySystem, cluster: EmbeddedCluster, count: int) -> dict[str, Any]:
    runs = start_runs(layby, count)
    approver = Approver(layby, runs)
    approver.start()
    _until_completed(layby, count // 3)
    victim = _victim(cluster)
    seen: Counter[str] = Counter()
    cluster.kill(victim)
    killed_at = time.monotonic()
    with layby.api() as api:
        api.timeout = httpx.Timeout(5)
        while True:  # the API asked every 0.2 s or so until the replica took over
            answered(api, "/v1/runs?limit=1", seen)
            try:
                failover = cluster.wait_for_failover(victim, timeout=0.2)
                break
            except TimeoutError:
                if time.monotonic() - killed_at > 60:
                    raise
        promoted_at = time.monotonic()
    cluster.restart(victim)
    moving: Counter[str] = Counter()
    moved = _move_a_slot(layby, cluster, runs, moving)
    finished = approver.wait(180)
    last = max((at for _, at in approver.finished.values()), default=promoted_at)
    return {**run_figures(runs, approver, layby),
            "kill to promotion (s)": round(failover.seconds, 1),
            "promotion to every run finished (s)":
                round(max(0.0, last - promoted_at), 1) if finished else "never",
            "API answers meanwhile": dict(seen),
            "keys moved with the slot": moved,
            "API answers while a slot moved": dict(moving),
            "kill to end (s)": round(time.monotonic() - killed_at, 1)}


def _until_completed(layby: LaybySystem, done: int, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    with layby.api() as api:
        while time.monotonic() < deadline:
            if len(api.get("/v1/runs", params={"status": "completed", "limit": 500}
                           ).json()["runs"]) >= done:
                return
            time.sleep(0.05)


def _move_a_slot(layby: LaybySystem, cluster: EmbeddedCluster, runs: list[str],
                 seen: Counter[str]) -> int:
    """Start more runs while the slot of the first run's shard moves to another primary,
    half its keys first (ASK) and then the rest with the slot (MOVED); what the API
    answered meanwhile goes into `seen`."""
    keys = Keys("layby", DEFAULT_COUNT)
    slot = slot_of(tags(DEFAULT_COUNT)[keys.shard_number(runs[0])])
    source = cluster.owner(slot)
    target = next(p for p in cluster.primaries() if p.node_id != source.node_id)
    migration = cluster.begin_migration(slot, target)
    with source.client() as node:
        half = max(1, int(node.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)) // 2)
    moved = migration.move(half)
    with layby.api() as api:
        for i in range(10):
            answered(api, "/v1/runs?limit=5", seen)
            _started(api, f"moving-{i}", seen)
        moved += migration.move()
        migration.finish()
        for i in range(10, 20):
            answered(api, "/v1/runs?limit=5", seen)
            _started(api, f"moving-{i}", seen)
    return moved


def _started(api: httpx.Client, key: str, seen: Counter[str]) -> None:
    try:
        status = str(api.post("/v1/runs", json={"agent": "demo.trivia", "input": "quiz me"},
                              headers={"Idempotency-Key": key}).status_code)
    except httpx.HTTPError as exc:
        status = type(exc).__name__
    seen["200" if status == "202" else status] += 1

