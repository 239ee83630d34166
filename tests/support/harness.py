"""Real parts for integration tests: a Valkey server, and layby systems on it.

A `LaybySystem` is what `layby up` runs (a worker, the sweeper, the HTTP gateway), each a
real subprocess, pointed at one Redis database, so systems on other databases never take
each other's messages. Tests talk to it the way users do: over HTTP on loopback.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

import layby
from layby.broker_config import JOBS, NOTIFY, TURNS, Settings
from layby.ops.embedded import free_port
from layby.ops.supervisor import gateway_argv, sweeper_argv, worker_argv
from layby.parking import codecs, formats
from layby.parking.keys import Keys
from layby.parking.migrations.m0001_versioned import old_keys
from layby.parking.scripts import standalone
from layby.wire import Status
from tests.support import forkserver
from tests.support.forkserver import Forked

API_KEY = "test-key-0123456789"
ROOT = Path(__file__).resolve().parents[2]
LAYBY = str(Path(sys.executable).parent / "layby")
# What a process started again logs once it is ready, by its name (without a number).
READY = {"worker": "ready.", "replies": "listening"}

BASE_ENV = {
    "LAYBY_API_KEYS": API_KEY,
    "LAYBY_AGENT_MODULES": "layby.demo.agents,tests.support.agents",
    "LAYBY_LEASE_S": "6",
    "LAYBY_LOST_MESSAGE_S": "6",
    "LAYBY_VISIBILITY_TIMEOUT_S": "30",
    "LAYBY_SWEEP_INTERVAL_S": "0.5",
    "LAYBY_OUTBOX_GRACE_S": "3",
    "LAYBY_DEMO_REPORT_S": "1",
    "LAYBY_DEMO_EXPIRY_S": "2",
    "PYTHONPATH": str(ROOT),
}


def keys_of(client: Any, prefix: str) -> Keys:
    """The keys of the store under `prefix`, in the layout its format key says."""
    return formats.keys_of(client, prefix)


def back_to_the_legacy_layout(client: Any, prefix: str) -> None:
    """The store as layby 0.2.0 made it (format 1, the legacy layout, one shard): every run
    moved back out of the sharded layout (lua/move_run.lua, its KEYS swapped), and its
    grants and idempotency keys; the format key without its shard count. Every process
    must be stopped."""
    sharded, legacy = formats.keys_of(client, prefix), Keys(prefix)
    if sharded.shard_count is None:
        return
    move = standalone(client, "move_run")
    for shard in sharded.shards:
        for status in Status:
            for run_id in client.zrange(shard.index(status), 0, -1):
                move(keys=[*sharded.for_scripts(run_id), *legacy.for_scripts(run_id)])
        for kind, named in (("grant", legacy.legacy.grant),
                            ("idem", legacy.legacy.idempotency)):
            for key in client.scan_iter(match=f"{shard.base}:{kind}:*"):
                client.rename(key, named(key.removeprefix(f"{shard.base}:{kind}:")))
    client.hdel(legacy.format, "shards", "sharded_at")
    client.hset(legacy.format, "version", 1)


def as_0_1_0s_predecessors_kept_it(client: Any, prefix: str, run_id: str) -> dict[str, str]:
    """Rewrite a parked run as layby 0.1.0's unreleased predecessors kept it, and the store
    as 0.1.0 left it (the legacy layout, no format version), for `layby migrate` to find:
    the run's id in its hash, its interrupts (in their wire form), notifications (under
    their long names) and open interrupts (a set) in keys of their own, none of the run's
    later fields. Returns the fields moved out (`i:<id>`, `n:<id>`), as they were. Every
    process must be stopped (none serves a store without a version)."""
    back_to_the_legacy_layout(client, prefix)
    keys = Keys(prefix)
    run = keys.run(run_id)
    interrupts, notifications, open_ids = old_keys(keys, run_id)
    held = client.hgetall(run)
    moved = {k: v for k, v in held.items() if k.startswith(("i:", "n:"))}
    for name, value in moved.items():
        if name.startswith("i:"):
            wire = codecs.interrupt(name[2:], value).model_dump_json(by_alias=True,
                                                                      exclude_none=True)
            client.hset(interrupts, name[2:], wire)
        else:
            client.hset(notifications, name[2:],
                        json.dumps(codecs.note(name[2:], value)))
    if held.get("open"):
        client.sadd(open_ids, *held["open"].split())
    client.hdel(run, *moved, "open", "waiting", "noted", "checkpointed")
    client.hset(run, "id", run_id)
    client.delete(keys.format)
    return moved


def source_copy(into: Path) -> Path:
    """The repository's files as a fresh clone has them (no build/, .venv, caches): what a
    wheel is built from, so a module deleted since the last local build cannot ride along."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\n")
    for name in filter(None, listed):
        origin = ROOT / name
        if origin.is_symlink():  # layby/tasks → ../tasks and the like, kept as links
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            (into / name).symlink_to(origin.readlink())
        elif origin.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, into / name)
    return into


def wait_until(check: Callable[[], Any], timeout: float = 20.0, every: float = 0.1,
               what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


def wait_up(up: subprocess.Popen[bytes], base: str, log: Path, within: float = 90,
            what: str = "layby up") -> None:
    """Waits for `layby up` (started as `up`, writing to `log`) to say at `base` that it is
    ready; one that exits first fails the test at once, with what it said, where a wait to
    the timeout would only say it never came up."""
    def ready() -> bool:
        if up.poll() is not None:
            raise AssertionError(f"{what} exited with {up.returncode}; it said:\n"
                                 f"{log.read_text()[-3000:]}")
        try:
            return httpx.get(f"{base}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False
    wait_until(ready, within, what=what)


@dataclass
class Proc:
    name: str
    argv: list[str]
    log: Path
    process: subprocess.Popen[bytes] | Forked | None = None

    def start(self, env: dict[str, str]) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        if (forked := forkserver.spawn(self.argv, env, ROOT, self.log)) is not None:
            self.process = forked
            return
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(self.argv, env=env, cwd=ROOT, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self, timeout: float = 20) -> None:
        self.terminate()
        self.reap(timeout)

    def terminate(self) -> None:
        """SIGTERM to its process group: the warm shutdown its process manager would ask for."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)

    def reap(self, timeout: float = 20) -> None:
        """Wait for it to exit (after `terminate`); SIGKILL after `timeout` seconds."""
        if self.process and self.process.poll() is None:
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()


def stop_all(systems: Iterable[LaybySystem]) -> None:
    """Stop every process of `systems` at once, as a process manager stops a host's
    services: each warm shutdown takes about a second of Celery's own (its event loop's
    poll), so one after another would cost every test that many seconds."""
    running = [proc for system in systems for proc in reversed(system.procs.values())]
    for proc in running:
        proc.terminate()
    for proc in running:
        proc.reap()


@dataclass
class LaybySystem:
    redis_url: str
    logs: Path
    env_overrides: dict[str, str] = field(default_factory=dict)
    worker_count: int = 2
    port: int = 0
    procs: dict[str, Proc] = field(default_factory=dict)
    # "DEBUG": every process logs everything, uvicorn's access log included.
    log_level: str | None = None

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, **BASE_ENV, "LAYBY_REDIS_URL": self.redis_url,
                "LAYBY_DATA_DIR": str(self.logs / "data"),
                **({"LAYBY_LOG_LEVEL": self.log_level} if self.log_level else {}),
                **self.env_overrides}

    @property
    def settings(self) -> Settings:
        """The system's settings, as its processes read them from their environment."""
        return Settings(**{name.removeprefix("LAYBY_").lower(): value
                           for name, value in self.env.items() if name.startswith("LAYBY_")})

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, key: str | None = API_KEY) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=30)

    def start(self) -> LaybySystem:
        self.port = self.port or free_port()
        self.start_worker()
        self._start("sweeper", sweeper_argv(self.settings))
        self._start("gateway", gateway_argv("127.0.0.1", self.port, log_level=(
            self.log_level.lower() if self.log_level else "warning")))
        wait_until(self._gateway_up, 30, what="the gateway")
        return self

    def _start(self, name: str, argv: list[str], **env: str) -> Proc:
        proc = Proc(name, argv, self.logs / f"{name}.log")
        proc.start({**self.env, **env})
        self.procs[name] = proc
        return proc

    def start_worker(self, name: str = "worker", **env: str) -> Proc:
        """A worker on the system's queues; `env`: variables of its own (another agent
        module, say: a worker on a new version of the code)."""
        proc = self._start(name, worker_argv(self.settings, [TURNS, JOBS, NOTIFY, "celery"],
                                             self.worker_count, self.log_level or "INFO"),
                           **env)
        wait_until(lambda: READY["worker"] in proc.output(), 40, what=f"{name} to be ready")
        return proc

    def _gateway_up(self) -> bool:
        try:
            return httpx.get(f"{self.base_url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        stop_all([self])

    def start_again(self, *names: str) -> None:
        """Start the processes `stop` stopped (those `names` only, when given) as they were;
        returns once they are ready."""
        for name, proc in self.procs.items():
            running = proc.process is not None and proc.process.poll() is None
            if running or (names and name not in names):
                continue
            before = len(proc.output())
            proc.start(self.env)
            if name == "gateway":
                wait_until(self._gateway_up, 30, what="the gateway")
            elif (marker := READY.get(name.rstrip("0123456789"))) is not None:
                wait_until(lambda p=proc, m=marker, b=before: m in p.output()[b:], 40,
                           what=f"{name} to be ready")

    def layby(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """`layby <args>` (the command line) on the system's store."""
        return forkserver.run([LAYBY, *args], self.env, ROOT, timeout)

    # -- what users do ---------------------------------------------------------------

    def start_run(self, agent: str, text: str, **extra: Any) -> dict[str, Any]:
        with self.api() as api:
            reply = api.post("/v1/runs", json={"agent": agent, "input": text, **extra})
        assert reply.status_code == 202, reply.text
        return reply.json()

    def run(self, run_id: str) -> dict[str, Any]:
        with self.api() as api:
            reply = api.get(f"/v1/runs/{run_id}")
        assert reply.status_code == 200, reply.text
        return reply.json()

    def wait_status(self, run_id: str, *statuses: str, timeout: float = 30) -> dict[str, Any]:
        """The run once its status is one of `statuses`, found by following its events as
        `layby.Client.wait` does (no polling); AssertionError after `timeout` seconds, or
        at once when it finished in another state."""
        with layby.Client(self.base_url, api_key=API_KEY, timeout=30) as client:
            with contextlib.suppress(TimeoutError):
                client.wait(run_id, until=statuses, timeout=timeout)
        run = self.run(run_id)
        if run["status"] in statuses:
            return run
        raise AssertionError(f"run {run_id} is {run['status']}, not {statuses}, after "
                             f"{timeout} s: {run.get('error') or run['interrupts']}")

    def open_interrupts(self, run: dict[str, Any]) -> list[dict[str, Any]]:
        return [i for i in run["interrupts"] if i["state"] == "open"]

    def answer(self, run_id: str, interrupt_id: str, status: str = "resolved",
               payload: Any = None, metadata: dict[str, Any] | None = None) -> httpx.Response:
        body: dict[str, Any] = {"status": status, "payload": payload}
        if metadata is not None:
            body["metadata"] = metadata
        with self.api() as api:
            return api.post(f"/v1/runs/{run_id}/interrupts/{interrupt_id}", json=body)

    def ledger(self) -> dict[str, list[dict[str, Any]]]:
        return httpx.get(f"{self.base_url}/demo/ledger", timeout=10).json()
