"""A Sentinel failover under load: layby reaches a Valkey primary through three sentinels;
while runs of demo.transfer go through their approvals, the primary is SIGKILLed and the
sentinels promote a replica. Once with LAYBY_REDIS_MIN_REPLICAS_ACK=0 (replication left
asynchronous) and once with 1 (an acknowledged transition is on a replica first). Figures
per pass: runs, completed, lost, duplicate transfers, how long the API took to answer
again, and how long until every run finished."""

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
from tests.support.harness import LaybySystem
from tests.support.sentinels import SentinelSetup

NAME = "sentinel failover"


def run(size: Size, folder: Path) -> Outcome:
    count = size.pick(40, 200)
    outcome = Outcome(NAME)
    for ack in (0, 1):
        figures = _pass(count, ack, folder / f"ack{ack}")
        outcome.figures.update({f"ack {ack}: {k}": v for k, v in figures.items()})
        outcome.targets.update({f"ack {ack}: {k}": met
                                for k, met in _targets(figures, count, ack).items()})
    return outcome


def _targets(f: dict[str, Any], count: int, ack: int) -> dict[str, bool]:
    safe = {"0 duplicate side effects": f["duplicate side effects"] == 0,
            "the API answered 200 or 503 meanwhile, never a 500":
                set(f["API answers until then"]) <= {"200", "503"}}
    if not ack:
        # Asynchronous replication loses the primary's last writes, as documented: an
        # answer taken just before the kill may be gone (it must be given again), so runs
        # lost here are reported, not a miss. Losing none is what ack 1 is for.
        return safe
    return {"all completed": f["completed"] == count, "0 lost": f["lost"] == 0, **safe}


def _pass(count: int, ack: int, folder: Path) -> dict[str, Any]:
    # With ack 1 the promoted replica needs a replica of its own, or every acknowledged
    # write after the failover waits for one that does not exist.
    sentinels = SentinelSetup(folder / "valkey", replica_count=1 + ack)
    try:
        sentinels.start()
        # The settings as shipped: the lease (6 s) outlasts the few seconds a failover
        # takes, so a step that waits on the store is not taken for a dead worker's.
        layby = LaybySystem(sentinels.url, folder / "system", env_overrides={
            **AS_SHIPPED, **sentinels.env, "LAYBY_REDIS_MIN_REPLICAS_ACK": str(ack)})
        try:
            return _under_load(layby.start(), sentinels, count)
        finally:
            layby.stop()
    finally:
        sentinels.stop()


def _under_load(layby: LaybySystem, sentinels: SentinelSetup, count: int) -> dict[str, Any]:
    runs = start_runs(layby, count)
    old = sentinels.primary()
    approver = Approver(layby, runs)
    approver.start()
    before = _midway(layby, count)
    # No wait for the replicas to catch up: a primary that dies does not wait either.
    old.kill()
    killed_at = time.monotonic()
    back = _back(layby, sentinels, old.port, killed_at)
    finished = approver.wait(180)
    ends = [at for _, at in approver.finished.values()]
    return {**run_figures(runs, approver, layby),
            "completed before the kill": before,
            **back,
            "kill to every run finished (s)":
                round(max(ends, default=killed_at) - killed_at, 1) if finished else "never"}


def _midway(layby: LaybySystem, count: int, seconds: float = 120) -> int:
    """Until the store holds half the runs completed (or `seconds` passed), and how many:
    the kill lands with runs in every phase, some parked, some mid-step, some being
    answered. Asked of the store, not of the approver, whose view lags a sweep behind:
    by the time it has seen half finished, the others may have finished too."""
    deadline = time.monotonic() + seconds
    with layby.api() as api:
        while True:
            done = len(api.get("/v1/runs", params={"status": "completed", "limit": 500}
                               ).json()["runs"])
            if done >= count // 2 or time.monotonic() > deadline:
                return done
            time.sleep(0.02)


def _back(layby: LaybySystem, sentinels: SentinelSetup, old_port: int,
          killed_at: float, seconds: float = 90) -> dict[str, Any]:
    """Seconds from the kill until: the sentinels named another primary, GET /v1/agents
    answered 200 (it needs no store), and GET /v1/runs answered 200 (it reads the store);
    and what the API answered meanwhile (503 while the store is away, never a 500)."""
    seen: Counter[str] = Counter()
    checks = {
        "kill to new primary named (s)":
            lambda _: sentinels.primary_port() not in (None, old_port),
        "kill to GET /v1/agents 200 (s)": lambda api: answered(api, "/v1/agents", seen),
        "kill to GET /v1/runs 200 (s)": lambda api: answered(api, "/v1/runs?limit=1", seen),
    }
    found: dict[str, Any] = {}
    with layby.api() as api:
        api.timeout = httpx.Timeout(5)
        while len(found) < len(checks) and time.monotonic() - killed_at < seconds:
            for name, check in checks.items():
                if name not in found and check(api):
                    found[name] = round(time.monotonic() - killed_at, 1)
            time.sleep(0.1)
    return {**{name: found.get(name, "never") for name in checks},
            "API answers until then": dict(seen)}

