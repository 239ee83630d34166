"""Approved transfers whose tools meet a failover: layby's store on a Valkey Cluster of 3
primaries with a replica each (its broker a Valkey server beside them,
LAYBY_REDIS_MIN_REPLICAS_ACK=1), the demo ledger (the transfers' outside world) on the same
cluster. Transfers are started, parked and approved; while their tools run, the primary
that serves the ledger is SIGKILLed. Tools meet connection errors and a cluster that is
down until its replica is promoted: they are tried again (the demo's `transfer_funds`
policy), and every transfer is made exactly once, every run says it was sent. Figures:
runs, completed, lost, transfers made, made twice, tries given again, what the runs said."""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from faults.common import AS_SHIPPED, Approver, Outcome, Size, listed, run_figures, start_runs
from layby.ops.embedded import EmbeddedCluster, EmbeddedRedis
from layby.parking.shards import slot_of
from tests.support.harness import LaybySystem

NAME = "tools meet a failover"
AFTER_PROMOTION_S = 60  # every run finished this soon after the replica took over


def run(size: Size, folder: Path) -> Outcome:
    # LAYBY_FAULTS_TRANSFERS: another number of transfers (600, the issue's own trial).
    count = int(os.environ.get("LAYBY_FAULTS_TRANSFERS") or size.pick(60, 200))
    cluster = EmbeddedCluster(folder / "cluster").start()
    broker = EmbeddedRedis(folder / "broker").start()
    try:
        layby = LaybySystem(f"redis+cluster://{cluster.members[0].address}",
                            folder / "system", worker_count=4, env_overrides={
                                **AS_SHIPPED, "LAYBY_BROKER_URL": broker.url,
                                "LAYBY_REDIS_MIN_REPLICAS_ACK": "1"})
        try:
            figures = _approved_through_a_failover(layby.start(), cluster, count)
        finally:
            layby.stop()
    finally:
        broker.stop()
        cluster.stop()
    return Outcome(NAME, figures, _targets(figures, count))


def _targets(f: dict[str, Any], count: int) -> dict[str, bool]:
    return {
        "all completed": f["completed"] == count, "0 lost": f["lost"] == 0,
        "every transfer made": f["transfers"] == count,
        "0 made twice": f["duplicate side effects"] == 0,
        "every run says it sent the money": f["runs that say they sent it"] == count,
        "the failover reached tools, which tried again": f["tries given again"] > 0,
        f"every run finished within {AFTER_PROMOTION_S} s of the promotion":
            isinstance(f["promotion to every run finished (s)"], float)
            and f["promotion to every run finished (s)"] <= AFTER_PROMOTION_S}


def _approved_through_a_failover(layby: LaybySystem, cluster: EmbeddedCluster,
                                 count: int) -> dict[str, Any]:
    runs = start_runs(layby, count, batch="tools")
    with layby.api() as api:
        deadline = time.monotonic() + 120
        while len(set(listed(api, "interrupted")) & set(runs)) < count:
            if time.monotonic() > deadline:
                raise RuntimeError("the runs did not all park within 2 minutes")
            time.sleep(0.2)
    # The ledger's primary: the tools' outside world, and a third of the store's shards.
    victim = cluster.owner(slot_of("transfers"))
    approver = Approver(layby, runs)
    approver.start()
    # The first transfers made: the rest are being approved, and their tools run.
    _until_transfers(layby, max(1, count // 10))
    cluster.kill(victim)
    killed_at = time.monotonic()
    failover = cluster.wait_for_failover(victim, timeout=60)
    promoted_at = time.monotonic()
    cluster.restart(victim)
    finished = approver.wait(240)
    last = max((at for _, at in approver.finished.values()), default=promoted_at)
    results = _results(layby, runs)
    return {**run_figures(runs, approver, layby),
            "tries given again": _retries(layby),
            "runs that say they sent it": sum(
                1 for text in results.values() if re.fullmatch(r"Sent \d+ to Bob\.", text)),
            "what the others said": dict(Counter(
                text for text in results.values()
                if not re.fullmatch(r"Sent \d+ to Bob\.", text)).most_common(3)),
            "kill to promotion (s)": round(failover.seconds, 1),
            "promotion to every run finished (s)":
                round(max(0.0, last - promoted_at), 1) if finished else "never",
            "kill to end (s)": round(time.monotonic() - killed_at, 1)}


def _until_transfers(layby: LaybySystem, made: int, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            ledger = httpx.get(f"{layby.base_url}/demo/ledger", timeout=10).json()
            if len(ledger.get("transfers", [])) >= made:
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"fewer than {made} transfers were made in {seconds} s")


def _retries(layby: LaybySystem) -> int:
    """The tries the transfers' tool was given again (`/metrics`)."""
    with layby.api() as api:
        text = api.get("/metrics").text
    found = re.search(r'^layby_tool_retries_total\{tool="transfer_funds"\} (\S+)$', text,
                      flags=re.MULTILINE)
    return int(float(found.group(1))) if found else 0


def _results(layby: LaybySystem, runs: list[str]) -> dict[str, str]:
    out = {}
    with layby.api() as api:
        for run_id in runs:
            try:
                run = api.get(f"/v1/runs/{run_id}").json()
            except (httpx.HTTPError, ValueError):
                continue
            out[run_id] = run.get("result") or f"({run.get('status')})"
    return out
