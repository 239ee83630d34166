"""The SIGKILL storm: workers die every 2-5 s (the whole worker with its pool, as when a
machine disappears, or one pool child) while runs of a transfer go through their
approvals; once approved, its step waits 0.2 s before it moves the money
(`test.careful_transfer`), so kills land on steps that are running. Figures: runs,
completed, lost, duplicate transfers, the longest wait between a crash and the steps it
interrupted running again, and the time from the last kill until every run finished."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from datetime import datetime
from pathlib import Path

import psutil

from faults.common import Approver, Outcome, Size, run_figures, start_runs, system
from tests.support.harness import LaybySystem

NAME = "sigkill storm"
AGENTS = "layby.demo.agents,tests.support.agents,tests.support.agents_durability"


def run(size: Size, folder: Path) -> Outcome:
    count, storm_s = size.pick((100, 30.0), (1000, 120.0))
    # Four pool processes: the steps mostly wait (as model calls do), and the queue must not
    # be what runs wait for.
    layby, server = system(folder / "storm", workers=4, LAYBY_TEST_BEFORE_TRANSFER_S="0.2",
                           LAYBY_AGENT_MODULES=AGENTS)
    try:
        # Runs arrive all through the storm, so every kill finds steps running.
        runs: list[str] = []
        starter = threading.Thread(target=_arrive, args=(layby, count, storm_s, runs),
                                   daemon=True)
        starter.start()
        approver = Approver(layby, [])
        approver.start()
        hits: list[tuple[str, float, float]] = []
        kill_times: list[float] = []
        kills = _storm(layby, storm_s, hits, kill_times, approver, runs)
        last_kill, last_kill_wall = time.monotonic(), time.time()
        starter.join(120)
        approver.track(runs)
        finished = approver.wait(120)
        waits = _reruns(layby, hits, kill_times)
        outcome = Outcome(NAME, {**run_figures(runs, approver, layby), "kills": kills,
                                 "storm (s)": storm_s})
        ends = [at for _, at in approver.finished.values()]
        longest, slowest = max(waits, default=(0.0, ""))
        f = outcome.figures
        f["steps a kill landed on"] = len(waits)
        f["longest crash-to-rerun wait (s)"] = round(longest, 1)
        f["last kill to every run finished (s)"] = \
            round(max(max(ends, default=last_kill) - last_kill, 0.0), 1) if finished \
            else "never"
        for run_id in sorted(approver.pending)[:3]:  # what a run that never ended shows
            f[f"unfinished {run_id}"] = _history(layby, run_id, last_kill_wall)
        if longest >= 10:  # what it waited for, to see why
            killed_at = max(at for r, _, at in hits if r == slowest)
            f["slowest run's events around its kill"] = _history(layby, slowest, killed_at)
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


def _arrive(layby: LaybySystem, count: int, seconds: float, runs: list[str]) -> None:
    """Start `count` runs spread evenly over `seconds` (on a schedule: a slow start does
    not push the later ones past the storm)."""
    began, gap = time.monotonic(), seconds / count
    for i in range(count):
        runs.extend(start_runs(layby, 1, agent="test.careful_transfer", batch=f"storm-{i}"))
        time.sleep(max(0.0, began + (i + 1) * gap - time.monotonic()))


def _storm(layby: LaybySystem, seconds: float, hits: list[tuple[str, float, float]],
           kill_times: list[float], approver: Approver, runs: list[str]) -> int:
    """Kill a worker (all of it, or one pool child) every 2-5 s for `seconds`; a dead
    worker is started again, as its process manager would. Each kill's wall time goes to
    `kill_times`, each running step it landed on to `hits`."""
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
        seen_at, running = time.time(), _running(layby)
        children = psutil.Process(main.pid).children()
        whole = kills % 2 == 0 or not children  # the whole worker: no goodbye
        os.killpg(main.pid, signal.SIGKILL) if whole else \
            os.kill(rng.choice(children).pid, signal.SIGKILL)
        killed_at = time.time()
        kill_times.append(killed_at)
        hits.extend((run_id, seen_at, killed_at) for run_id in running)
        kills += 1
        if whole:
            main.wait()
            generation += 1
            layby.start_worker(f"worker-{generation}")
    return kills


def _running(layby: LaybySystem) -> dict[str, int]:
    """The runs whose step a worker holds right now, with their versions."""
    with layby.api() as api:
        found = api.get("/v1/runs", params={"status": "running", "limit": 500}).json()
    return {r["id"]: r["version"] for r in found["runs"]}


STEP_EVENTS = ("run.started", "turn.committed", "run.interrupted", "run.completed",
               "run.failed")


def _reruns(layby: LaybySystem, hits: list[tuple[str, float, float]],
            kill_times: list[float]) -> list[tuple[float, str]]:
    """For each step a kill landed on, the wait until the run's next step event (the step
    taken up again: `run.started`; or its end, had it committed just before the kill),
    read from the run's own events; with the run. A step that committed between the look
    at the running runs and the kill was done before the kill: it is not counted.

    A step requeued twice was lost once more: a later kill took down the worker that had
    taken the requeued step (reserved, not yet started). Its wait then runs from that later
    kill, the one between its two requeues, so each crash's recovery is measured once; two
    requeues with no kill between them keep the first kill's wait, which shows it."""
    waits = []
    for run_id, seen_at, killed_at in hits:
        history = _events(layby, run_id)
        events = [(at, kind) for at, kind in history if kind in STEP_EVENTS]
        if any(seen_at < at <= killed_at for at, _ in events):
            continue
        after = [at for at, _ in events if at > killed_at]
        if not after:
            waits.append((float("inf"), run_id))
            continue
        requeued = [at for at, kind in history
                    if kind == "run.requeued" and killed_at < at < after[0]]
        crash = killed_at
        if len(requeued) >= 2:
            crash = max((k for k in kill_times if requeued[-2] < k < requeued[-1]),
                        default=killed_at)
        waits.append((after[0] - crash, run_id))
    return waits


def _events(layby: LaybySystem, run_id: str) -> list[tuple[float, str]]:
    with layby.api() as api:
        text = api.get(f"/v1/runs/{run_id}/events", params={"follow": "false"}).text
    return [(datetime.fromisoformat(e["at"]).timestamp(), e["type"])
            for e in (json.loads(line[6:]) for line in text.splitlines()
                      if line.startswith("data: "))]


def _history(layby: LaybySystem, run_id: str, killed_at: float) -> list[str]:
    return [f"{at - killed_at:+.1f}s {kind}" for at, kind in _events(layby, run_id)]

