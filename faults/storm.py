"""The SIGKILL storm: workers die every 2-5 s (the whole worker with its pool, as when a
machine disappears, or one pool child) while runs of a transfer go through their
approvals; once approved, its step waits half a second before it moves the money
(`test.careful_transfer`), so kills land on steps that are running. Figures: runs, completed, lost, duplicate transfers, the longest wait between a
crash and the steps it interrupted running again, and the time from the last kill until
every run finished."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

from faults.common import Approver, Outcome, Size, run_figures, start_runs, system
from tests.harness import LaybySystem

NAME = "sigkill storm"
AGENTS = "layby.demo.agents,tests.agents,tests.agents_durability"


def run(size: Size, folder: Path) -> Outcome:
    count, storm_s = size.pick((100, 30.0), (1000, 120.0))
    # Four pool processes: the steps mostly wait (as model calls do), and the queue must not
    # be what runs wait for.
    layby, server = system(folder / "storm", workers=4, LAYBY_TEST_BEFORE_TRANSFER_S="0.5",
                           LAYBY_AGENT_MODULES=AGENTS)
    try:
        # Runs arrive all through the storm, so every kill finds steps running.
        runs: list[str] = []
        starter = threading.Thread(target=_arrive, args=(layby, count, storm_s, runs),
                                   daemon=True)
        starter.start()
        approver = Approver(layby, [])
        approver.start()
        waits: list[float] = []
        kills = _storm(layby, storm_s, waits, approver, runs)
        last_kill = time.monotonic()
        starter.join(120)
        approver.track(runs)
        finished = approver.wait(120)
        _drain(waits)
        outcome = Outcome(NAME, {**run_figures(runs, approver, layby), "kills": kills,
                                 "storm (s)": storm_s})
        ends = [at for _, at in approver.finished.values()]
        longest = max(waits, default=0.0)
        outcome.figures["longest crash-to-rerun wait (s)"] = round(longest, 1)
        outcome.figures["last kill to every run finished (s)"] = \
            round(max(max(ends, default=last_kill) - last_kill, 0.0), 1) if finished \
            else "never"
        outcome.figures["steps interrupted by a kill"] = len(waits)
        for run_id in sorted(approver.pending)[:3]:  # what a run that never ended shows
            outcome.figures[f"unfinished {run_id}"] = [
                layby.run(run_id)["status"], *_history(layby, run_id, last_kill)]
        if longest >= 10 and _slowest:  # what it waited for, to see why
            outcome.figures["slowest run's events after the kill"] = _history(layby, *_slowest)
        f = outcome.figures
        outcome.targets = {
            "all completed": f["completed"] == count,
            "0 lost": f["lost"] == 0,
            "0 duplicate side effects": f["duplicate side effects"] == 0,
            "kills landed on running steps": bool(waits),
            "crash-to-rerun under 10 s": longest < 10,
            "all finished within 30 s of the last kill":
                finished and f["last kill to every run finished (s)"] < 30,
        }
        return outcome
    finally:
        layby.stop()
        server.stop()


_pending_watches: list[threading.Thread] = []
_slowest: list[Any] = []  # the run that waited longest, and when its worker was killed


def _arrive(layby: LaybySystem, count: int, seconds: float, runs: list[str]) -> None:
    """Start `count` runs spread evenly over `seconds`."""
    gap = seconds / count
    for i in range(count):
        runs.extend(start_runs(layby, 1, agent="test.careful_transfer", batch=f"storm-{i}"))
        time.sleep(gap)


def _storm(layby: LaybySystem, seconds: float, waits: list[float], approver: Approver,
           runs: list[str]) -> int:
    """Kill a worker (all of it, or one pool child) every 2-5 s for `seconds`; a dead
    worker is started again, as its process manager would."""
    rng = random.Random(20261125)
    end, kills, generation = time.monotonic() + seconds, 0, 0
    while time.monotonic() < end:
        time.sleep(rng.uniform(2, 5))
        approver.track(runs)
        # Aim at a worker that is running a step (a kill between steps proves little).
        wanted = time.monotonic() + 2
        while not _running(layby) and time.monotonic() < wanted:
            time.sleep(0.02)
        name = "worker" if generation == 0 else f"worker-{generation}"
        main = layby.procs[name].process
        assert main is not None
        running = _running(layby)
        children = psutil.Process(main.pid).children()
        if kills % 2 == 0 or not children:  # the whole worker: no goodbye
            os.killpg(main.pid, signal.SIGKILL)
            main.wait()
            generation += 1
            layby.start_worker(f"worker-{generation}")
        else:
            os.kill(rng.choice(children).pid, signal.SIGKILL)
        kills += 1
        watch = threading.Thread(target=_watch, args=(layby, running, time.monotonic(),
                                                      waits), daemon=True)
        watch.start()
        _pending_watches.append(watch)
    return kills


def _running(layby: LaybySystem) -> dict[str, int]:
    """The runs whose step a worker holds right now, with their versions."""
    with layby.api() as api:
        found = api.get("/v1/runs", params={"status": "running", "limit": 500}).json()
    return {r["id"]: r["version"] for r in found["runs"]}


def _watch(layby: LaybySystem, running: dict[str, int], killed_at: float,
           waits: list[float]) -> None:
    """How long until each step the kill may have interrupted moved on (committed, or
    parked): the crash-to-rerun wait, the step itself included."""
    left = dict(running)
    with layby.api() as api:
        while left and time.monotonic() - killed_at < 120:
            for run_id, version in list(left.items()):
                try:
                    run: dict[str, Any] = api.get(f"/v1/runs/{run_id}").json()
                except (httpx.HTTPError, ValueError):
                    continue
                if run["version"] > version or run["status"] not in ("running", "queued"):
                    waits.append(time.monotonic() - killed_at)
                    if waits[-1] >= max(waits):
                        _slowest[:] = [run_id, killed_at]
                    del left[run_id]
            time.sleep(0.1)
    waits.extend(120.0 for _ in left)


def _history(layby: LaybySystem, run_id: str, killed_at: float) -> list[str]:
    with layby.api() as api:
        text = api.get(f"/v1/runs/{run_id}/events", params={"follow": "false"}).text
    wall_kill = time.time() - (time.monotonic() - killed_at)
    found = []
    for line in text.splitlines():
        if line.startswith("data: "):
            event = json.loads(line[6:])
            at = datetime.fromisoformat(event["at"]).timestamp()
            found.append(f"{at - wall_kill:+.1f}s {event['type']}")
    return found


def _drain(waits: list[float]) -> None:
    for watch in _pending_watches:
        watch.join(130)
    _pending_watches.clear()
