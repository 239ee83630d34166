"""The store killed in each phase of a run: Valkey SIGKILLed while runs are being started,
while they are parked, right after their answers (resuming) and while their steps run
(committing), then started again on its data. Figures per phase: runs, completed, lost,
duplicate transfers, and the time from the store's return until every run finished."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from faults.common import Approver, Outcome, Size, listed, run_figures, start_runs, system
from layby.ops.embedded import EmbeddedRedis
from tests.support.harness import LaybySystem

NAME = "store restarts"
AWAY_S = 2.0  # how long the store stays down


def run(size: Size, folder: Path) -> Outcome:
    count = size.pick(20, 200)
    layby, server = system(folder / "store")
    outcome = Outcome(NAME)
    try:
        for phase, before in PHASES.items():
            server, figures = _phase(layby, server, phase, count, before)
            outcome.figures.update({f"{phase}: {k}": v for k, v in figures.items()})
            back = figures["store back to every run finished (s)"]
            outcome.targets[f"{phase}: all completed, 0 lost, 0 duplicates, within 30 s "
                            "of the store's return"] = (
                figures["completed"] == count and figures["lost"] == 0
                and figures["duplicate side effects"] == 0
                and isinstance(back, float) and back < 30)
        return outcome
    finally:
        layby.stop()
        server.stop()


def _phase(layby: LaybySystem, server: EmbeddedRedis, phase: str, count: int,
           before: Callable[[LaybySystem, list[str]], None]
           ) -> tuple[EmbeddedRedis, dict[str, Any]]:
    runs: list[str] = []
    if phase == "starting":
        # Half the runs are started before the kill, the rest while the store is away and
        # after (the client retries its 503s with the same Idempotency-Key).
        starter = threading.Thread(target=lambda: runs.extend(
            start_runs(layby, count, batch=phase)), daemon=True)
        starter.start()
        _until(lambda: _count(layby) >= count // 2, 60)
    else:
        runs = start_runs(layby, count, batch=phase)
        before(layby, runs)
    server = _restart(server)
    back = time.monotonic()
    if phase == "starting":
        starter.join(120)
    approver = Approver(layby, runs)
    approver.start()
    finished = approver.wait(90)
    figures = run_figures(runs, approver, layby)
    ends = [at for _, at in approver.finished.values()]
    figures["store back to every run finished (s)"] = (
        round(max(max(ends, default=back) - back, 0.0), 1) if finished else "never")
    return server, figures


def _parked(layby: LaybySystem, runs: list[str]) -> None:
    _until(lambda: _all_in(layby, runs, {"interrupted"}), 120)


def _resuming(layby: LaybySystem, runs: list[str]) -> None:
    _parked(layby, runs)
    _approve_all(layby, runs)


def _committing(layby: LaybySystem, runs: list[str]) -> None:
    """The store goes while answers still arrive and the first steps after them run."""
    _parked(layby, runs)
    threading.Thread(target=_approve_all, args=(layby, runs), daemon=True).start()
    # At the first of this phase's runs to complete (the earlier phases' have long
    # completed), when the rest are mid-step or still being answered: any later, and the
    # runs of a short phase have all completed before the store goes.
    _until(lambda: bool(_completed(layby) & set(runs)), 60, every=0.02)


PHASES: dict[str, Callable[[LaybySystem, list[str]], None]] = {
    "starting": lambda layby, runs: None,
    "parked": _parked,
    "resuming": _resuming,
    "committing": _committing,
}


def _restart(server: EmbeddedRedis) -> EmbeddedRedis:
    port = server.port
    server.kill()
    time.sleep(AWAY_S)
    return EmbeddedRedis(server.data_dir, port=port).start()


def _approve_all(layby: LaybySystem, runs: list[str]) -> None:
    """One pass of approvals; those the store's going cut short are the Approver's."""
    with layby.api() as api:
        for run_id in runs:
            try:
                for intr in api.get(f"/v1/runs/{run_id}").json().get("interrupts", []):
                    if intr["state"] == "open":
                        api.post(f"/v1/runs/{run_id}/interrupts/{intr['id']}",
                                 json={"status": "resolved", "payload": {"approved": True}},
                                 headers={"Idempotency-Key": f"approve-{intr['id']}"})
            except httpx.HTTPError:
                return


def _all_in(layby: LaybySystem, runs: list[str], statuses: set[str]) -> bool:
    with layby.api() as api:
        return all(api.get(f"/v1/runs/{r}").json()["status"] in statuses for r in runs)


def _count(layby: LaybySystem) -> int:
    with layby.api() as api:
        return len(api.get("/v1/runs", params={"limit": 500}).json()["runs"])


def _completed(layby: LaybySystem) -> set[str]:
    with layby.api() as api:
        return set(listed(api, "completed"))


def _until(check: Callable[[], bool], seconds: float, every: float = 0.2) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up after {seconds} s waiting to set the scene")
        time.sleep(every)
