"""What every scenario shares: its outcome (figures against targets), a layby system of
its own on loopback, and the user's side of a run (start it, approve what it asks, read the
demo ledger for side effects that happened twice)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from layby.ops.embedded import EmbeddedRedis
from tests.support.harness import LaybySystem

FINISHED = {"completed", "failed", "cancelled"}


@dataclass
class Outcome:
    """A scenario's figures, and each target with whether it was met."""

    name: str
    figures: dict[str, Any] = field(default_factory=dict)
    targets: dict[str, bool] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(self.targets.values())


@dataclass
class Size:
    """How big a run of the suite is: `--short` for CI, the full one for docs/reliability.md."""

    short: bool

    def pick(self, short: Any, full: Any) -> Any:
        return short if self.short else full


# The settings' own defaults where the tests' harness shortens them: the figures are those
# of a deployment as shipped.
AS_SHIPPED = {"LAYBY_LEASE_S": "6", "LAYBY_LOST_MESSAGE_S": "300",
              "LAYBY_VISIBILITY_TIMEOUT_S": "3600", "LAYBY_SWEEP_INTERVAL_S": "1.0",
              "LAYBY_OUTBOX_GRACE_S": "10"}


def system(folder: Path, server: EmbeddedRedis | None = None, workers: int = 2,
           **env: str) -> tuple[LaybySystem, EmbeddedRedis]:
    """A started layby system (worker, sweeper, gateway) on its own Valkey, with the
    settings as shipped unless `env` says otherwise."""
    server = server or EmbeddedRedis(folder / "valkey").start()
    running = LaybySystem(server.url, folder / "system", worker_count=workers,
                          env_overrides={**AS_SHIPPED, **env})
    return running.start(), server


def start_runs(system: LaybySystem, count: int, text: str = "Send {i} to Bob",
               agent: str = "demo.transfer", batch: str = "runs") -> list[str]:
    """Start `count` runs as a client that retries would: a retry after a 503 or a lost
    reply carries the same Idempotency-Key, so it is the same run."""
    with system.api() as api:
        ids = []
        for i in range(count):
            reply = _retrying(lambda i=i: api.post(  # type: ignore[misc]
                "/v1/runs", json={"agent": agent, "input": text.format(i=i + 1)},
                headers={"Idempotency-Key": f"faults-{batch}-{i}"}))
            ids.append(reply.json()["id"])
        return ids


def _retrying(call: Any, seconds: float = 60) -> httpx.Response:
    """A request a user's client would retry: 503s (the store away) and lost connections."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            reply = call()
            if reply.status_code < 500:
                return reply  # type: ignore[no-any-return]
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the gateway kept failing for a minute")
        time.sleep(0.2)


class Approver(threading.Thread):
    """Approves every open interrupt of `runs` as it appears (an Idempotency-Key per
    interrupt, so a retry after a 503 is the same answer), and notes when each run ends."""

    def __init__(self, system: LaybySystem, runs: Iterable[str]) -> None:
        super().__init__(daemon=True)
        self.system = system
        self.pending = set(runs)
        self.finished: dict[str, tuple[str, float]] = {}  # run → (status, when)
        self.halt = threading.Event()
        self.lock = threading.Lock()  # `track` adds runs from another thread

    def run(self) -> None:
        # Each pass reads the lists of waiting and finished runs, not every run: a pass
        # stays short with a thousand runs going.
        with self.system.api() as api:
            while not self.halt.is_set():
                try:
                    waiting = listed(api, "interrupted")
                    for run_id in sorted(waiting):
                        if self.halt.is_set():
                            return
                        with self.lock:
                            mine = run_id in self.pending
                        if mine:
                            self._visit(api, run_id)
                    for status in sorted(FINISHED):
                        self._note_finished(status, listed(api, status))
                except (httpx.HTTPError, ValueError, KeyError):
                    pass  # the gateway or the store away for a moment: the next pass retries
                time.sleep(0.2)

    def _note_finished(self, status: str, runs: dict[str, str]) -> None:
        # When each ended, by the run's own clock, on this process's monotonic one.
        offset = time.monotonic() - time.time()
        with self.lock:
            for run_id, updated in runs.items():
                if run_id in self.pending:
                    ended = datetime.fromisoformat(updated).timestamp() + offset
                    self.finished[run_id] = (status, ended)
                    self.pending.discard(run_id)

    def track(self, runs: Iterable[str]) -> None:
        """Approve these runs' interrupts too (runs started after the approver)."""
        with self.lock:
            self.pending.update(r for r in list(runs) if r not in self.finished)

    def _visit(self, api: httpx.Client, run_id: str) -> None:
        try:
            reply = api.get(f"/v1/runs/{run_id}")
            if reply.status_code != 200:
                return
            run = reply.json()
            if run["status"] in FINISHED:
                with self.lock:
                    self.finished[run_id] = (run["status"], time.monotonic())
                    self.pending.discard(run_id)
                return
            for intr in run["interrupts"]:
                if intr["state"] == "open":
                    api.post(f"/v1/runs/{run_id}/interrupts/{intr['id']}",
                             json={"status": "resolved", "payload": {"approved": True}},
                             headers={"Idempotency-Key": f"approve-{intr['id']}"})
        except httpx.HTTPError:
            pass  # the gateway or the store away for a moment: the next pass retries

    def wait(self, seconds: float) -> bool:
        """Whether every run ended within `seconds`."""
        deadline = time.monotonic() + seconds
        while self.pending and time.monotonic() < deadline:
            time.sleep(0.2)
        self.halt.set()
        self.join(10)
        return not self.pending


def answered(api: httpx.Client, path: str, seen: Counter[str]) -> bool:
    """GET `path`, its status (or the error that stood for one) counted in `seen`; whether
    it was 200."""
    try:
        status = str(api.get(path).status_code)
    except httpx.HTTPError as exc:
        status = type(exc).__name__
    seen[status] += 1
    return status == "200"


def listed(api: httpx.Client, status: str) -> dict[str, str]:
    """Runs in `status` (id → when they last changed), every page of them."""
    found: dict[str, str] = {}
    for offset in range(0, 10_001, 500):
        page = api.get("/v1/runs", params={"status": status, "limit": 500,
                                           "offset": offset}).json()["runs"]
        found.update((r["id"], r["updatedAt"]) for r in page)
        if len(page) < 500:
            break
    return found


def transfers(system: LaybySystem, runs: Iterable[str]) -> tuple[int, int]:
    """Of `runs`: how many moved money, and how many moved it more than once."""
    wanted = set(runs)
    counts = Counter(t["run"] for t in _retrying(
        lambda: httpx.get(f"{system.base_url}/demo/ledger", timeout=30)).json()
        .get("transfers", []) if t["run"] in wanted)
    return len(counts), sum(1 for n in counts.values() if n > 1)


def run_figures(runs: list[str], approver: Approver, system: LaybySystem
                ) -> dict[str, Any]:
    completed = sum(1 for s, _ in approver.finished.values() if s == "completed")
    moved, twice = transfers(system, runs)
    unfinished = [r for r in runs if r not in approver.finished]
    return {"runs": len(runs), "completed": completed,
            "lost": len(unfinished),
            # Where each lost run stopped, for whoever looks into it: its state, version,
            # and its last events.
            "lost runs": {r: _where(system, r) for r in unfinished[:5]},
            "failed": len(approver.finished) - completed,
            "transfers": moved, "duplicate side effects": twice}


def _where(system: LaybySystem, run_id: str) -> str:
    try:
        with system.api() as api:
            run = api.get(f"/v1/runs/{run_id}").json()
            events = api.get(f"/v1/runs/{run_id}/events", params={"follow": "false"}).text
    except (httpx.HTTPError, ValueError):
        return "unreadable"
    kinds = [line.removeprefix("event: ") for line in events.splitlines()
             if line.startswith("event: ")]
    return (f"{run.get('status')} at version {run.get('version')}, open "
            f"{[i['id'] for i in run.get('interrupts', []) if i.get('state') == 'open']}, "
            f"events {kinds[-6:]}")
