"""A cluster's faults under load, with layby served on it (3 primaries, 3 replicas; the
broker a Valkey server beside it; LAYBY_REDIS_MIN_REPLICAS_ACK=1, so that what a caller
was told is on a replica too):

- a primary SIGKILLed while 200 transfers are started, parked and approved: its replica
  takes over, and every run completes, its transfer made once, within 30 s of the
  promotion;
- slots moved while runs are started and answered, half their keys moved first (clients
  sent on with ASK) and then the rest with the slot (MOVED): no call of the API fails;
- the primary of a run that waits to try a tool call again SIGKILLed during the wait: the
  scheduled try is on its replica, and comes when due.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from layby.ops.embedded import ClusterMember, EmbeddedCluster, EmbeddedRedis
from layby.parking.keys import Keys
from layby.parking.shards import slot_of, tags
from tests.support.harness import API_KEY, LaybySystem, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RUNS = 200
SHARDS = 48


@dataclass
class Loaded:
    cluster: EmbeddedCluster
    system: LaybySystem


@pytest.fixture
def loaded(tmp_path: Path) -> Iterator[Loaded]:
    cluster = EmbeddedCluster(tmp_path / "cluster").start()
    broker = EmbeddedRedis(tmp_path / "broker").start()
    system = LaybySystem(f"redis+cluster://{cluster.members[0].address}", tmp_path / "system",
                         env_overrides={"LAYBY_BROKER_URL": broker.url,
                                        "LAYBY_REDIS_MIN_REPLICAS_ACK": "1",
                                        "LAYBY_LOST_MESSAGE_S": "5"}, worker_count=4)
    try:
        yield Loaded(cluster, system.start())
    finally:
        system.stop()
        broker.stop()
        cluster.stop()


@dataclass
class Caller:
    """A service calling the API as a careful one would: the same Idempotency-Key when it
    starts a run again, and (with `patient`) another try after a 503 or a connection lost,
    which a failover may cause. What it was answered otherwise is kept in `failures`."""

    base_url: str
    patient: bool
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, method: str, path: str, ok: tuple[int, ...], **kwargs: Any
             ) -> httpx.Response:
        deadline = time.monotonic() + 60
        with httpx.Client(base_url=self.base_url, timeout=30,
                          headers={"Authorization": f"Bearer {API_KEY}"}) as api:
            while True:
                try:
                    reply = api.request(method, path, **kwargs)
                    if reply.status_code in ok:
                        return reply
                    problem = f"{method} {path}: {reply.status_code} {reply.text[:300]}"
                except httpx.TransportError as exc:
                    problem = f"{method} {path}: {exc!r}"
                if not self.patient or time.monotonic() > deadline:
                    with self.lock:
                        self.failures.append(problem)
                    raise AssertionError(problem)
                time.sleep(0.2)

    def transfer(self, n: int, tag: str) -> str:
        """A transfer started, parked, approved; returns its run id."""
        run_id: str = self.call("POST", "/v1/runs", (202,), json={
            "agent": "demo.transfer", "input": f"Send {n} to Ann"},
            headers={"Idempotency-Key": f"{tag}-{n}"}).json()["id"]

        def parked() -> dict[str, Any] | None:
            run = self.call("GET", f"/v1/runs/{run_id}", (200,)).json()
            return run if run["status"] == "interrupted" else None

        run = wait_until(parked, 60, every=0.2, what=f"run {run_id} to park")
        (waiting,) = [i for i in run["interrupts"] if i["state"] == "open"]
        # 409: an earlier try, whose reply was lost, recorded it.
        self.call("POST", f"/v1/runs/{run_id}/interrupts/{waiting['id']}", (200, 409),
                  json={"status": "resolved", "payload": {"approved": True}})
        return run_id


def _all_completed(system: LaybySystem, run_ids: list[str]) -> dict[str, str] | None:
    """Each run's result, once every one has completed (None before)."""
    with system.api() as api:
        found = {r: api.get(f"/v1/runs/{r}").json() for r in run_ids}
    if any(run.get("status") != "completed" for run in found.values()):
        return None
    return {r: run["result"] for r, run in found.items()}


def _victim(cluster: EmbeddedCluster) -> ClusterMember:
    """A primary with a replica, not the one of the demo ledger's slot: the ledger stands for
    the outside world, which a failover of the store does not touch."""
    ledger_slot = slot_of("transfers")
    return next(p for p in cluster.primaries()
                if cluster.replicas_of(p) and not p.myself().owns(ledger_slot))


def test_a_primary_killed_under_200_runs_loses_and_repeats_none(loaded: Loaded) -> None:
    cluster, system = loaded.cluster, loaded.system
    caller = Caller(system.base_url, patient=True)
    victim = _victim(cluster)
    started: list[str] = []
    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(caller.transfer, n, "failover") for n in range(1, RUNS + 1)]
        wait_until(lambda: sum(f.done() for f in futures) >= RUNS // 4, 120,
                   what="a quarter of the runs to be approved")
        cluster.kill(victim)
        failover = cluster.wait_for_failover(victim)
        promoted = time.monotonic()
        # Started again, as an orchestrator would, it follows its replacement: until then
        # the promoted primary has no replica to confirm writes (LAYBY_REDIS_MIN_REPLICAS_ACK).
        cluster.restart(victim)
        print(f"failover in {failover.seconds:.2f} s")
        started = [f.result() for f in futures]
    assert not caller.failures
    done = wait_until(lambda: _all_completed(system, started),
                      max(1.0, promoted + 30 - time.monotonic()), every=0.5,
                      what=f"all {RUNS} runs to complete within 30 s of the promotion")
    print(f"all {RUNS} completed {time.monotonic() - promoted:.1f} s after the promotion")
    assert sorted(done.values()) == sorted(f"Sent {n} to Ann." for n in range(1, RUNS + 1))
    # Each transfer made once: one ledger entry per run, of its amount.
    transfers = [t for t in system.ledger()["transfers"] if t["run"] in done]
    assert len(transfers) == RUNS and {t["run"] for t in transfers} == set(started)


def test_slots_moved_under_load_reach_no_caller(loaded: Loaded) -> None:
    cluster, system = loaded.cluster, loaded.system
    caller = Caller(system.base_url, patient=False)
    stop = threading.Event()
    finished: list[str] = []

    def load(worker: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            finished.append(caller.transfer(worker * 10_000 + n, "moving"))

    keys = Keys("layby", SHARDS)
    with ThreadPoolExecutor(4) as pool:
        running = [pool.submit(load, w) for w in range(4)]
        wait_until(lambda: len(finished) >= 20, 60, what="runs under way")
        # The slots of the shards with runs in them, each to another primary.
        moved = 0
        for shard in sorted({keys.shard_number(r) for r in finished})[:3]:
            slot = slot_of(tags(SHARDS)[shard])
            source = cluster.owner(slot)
            target = next(p for p in cluster.primaries() if p.node_id != source.node_id)
            migration = cluster.begin_migration(slot, target)
            half = max(1, _keys_in(source, slot) // 2)
            moved += migration.move(half)
            time.sleep(1.0)  # ASK for the keys moved, the rest where they were
            migration.finish()
            time.sleep(1.0)  # MOVED
        stop.set()
        for future in running:
            future.result()
    assert moved > 0
    assert not caller.failures
    done = wait_until(lambda: _all_completed(system, finished), 60, every=0.5,
                      what="every run to complete")
    assert len(done) == len(finished) >= 20


def test_a_wait_to_retry_outlives_a_failover_of_its_primary(loaded: Loaded) -> None:
    cluster, system = loaded.cluster, loaded.system
    # Waits long enough to outlast the failover on a loaded machine: the wait is looked at
    # after it, while it still waits.
    run_id = system.start_run("test.exporter", "30")["id"]
    waiting = system.wait_status(run_id, "retrying")
    slot = slot_of(tags(SHARDS)[Keys("layby", SHARDS).shard_number(run_id)])
    victim = cluster.owner(slot)
    assert cluster.replicas_of(victim), "the run's primary has a replica"
    cluster.kill(victim)
    cluster.wait_for_failover(victim)
    cluster.restart(victim)
    # The replica now primary holds the wait as it was: the same try, due at the same time.
    after = system.run(run_id)
    assert after["status"] == "retrying", after
    assert after["retry"] == waiting["retry"] and after["retry"]["calls"][0]["attempt"] == 2
    done = system.wait_status(run_id, "completed", timeout=90)
    assert done["result"] == f"exported on attempt 2 ({run_id}:export_day_0_0:1)"


def _keys_in(member: ClusterMember, slot: int) -> int:
    with member.client() as node:
        return int(node.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot))

