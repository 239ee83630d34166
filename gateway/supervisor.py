"""`layby up`: the whole system on one machine, started in order and stopped in reverse.

Redis (embedded unless `LAYBY_REDIS_URL` is set), a worker on every layby queue, the
sweeper's clock (Celery beat sending `layby.sweep`) and the HTTP gateway, each a child
process in its own process group. Ctrl-C (or SIGTERM) stops the gateway, the clock and the
worker (a warm shutdown puts back what it holds), then Redis.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from broker_config import SWEEP, Settings, worker_queues
from gateway.embedded import EmbeddedRedis


def worker_argv(queues: list[str], concurrency: int | None, loglevel: str) -> list[str]:
    argv = [sys.executable, "-m", "celery", "-A", "broker_config", "worker", "-Q",
            ",".join(queues), "-n", f"layby-{os.getpid()}@%h", "-l", loglevel]
    return argv + (["-c", str(concurrency)] if concurrency else [])


def sweeper_argv() -> list[str]:
    """A one-process worker on the sweep queue with the clock (beat) that feeds it, so
    sweeps never wait behind model calls and their log lines stay out of the worker's."""
    # The in-memory scheduler: a fixed interval needs no schedule file to survive restarts.
    return [sys.executable, "-m", "celery", "-A", "broker_config", "worker", "-Q", SWEEP,
            "-P", "solo", "-B", "--scheduler", "celery.beat:Scheduler", "-n",
            f"layby-sweeper-{os.getpid()}@%h", "-l", "WARNING"]


@dataclass
class Child:
    name: str
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None


@dataclass
class System:
    settings: Settings
    port: int
    concurrency: int | None = None
    redis: EmbeddedRedis | None = None
    children: list[Child] = field(default_factory=list)
    stopping: bool = False

    def api_key(self) -> str:
        if self.settings.api_keys:
            return self.settings.api_keys[0]
        key_file = self.settings.data_dir / "api_key"
        if key_file.exists():
            return key_file.read_text().strip()
        key = "lby_" + secrets.token_urlsafe(24)
        key_file.write_text(key + "\n")
        key_file.chmod(0o600)
        return key

    def start(self) -> dict[str, str]:
        data_dir = self.settings.data_dir.resolve()
        data_dir.mkdir(parents=True, exist_ok=True)
        url = self.settings.redis_url
        if not url:
            self.redis = EmbeddedRedis(data_dir / "valkey").start()
            url = self.redis.url
            self.settings.url_file.write_text(url + "\n")
        env = {**os.environ, "LAYBY_REDIS_URL": url, "LAYBY_DATA_DIR": str(data_dir),
               "LAYBY_PORT": str(self.port)}
        key = self.api_key()
        if not self.settings.api_keys:
            env["LAYBY_API_KEYS"] = key
        self.children = [
            Child("worker", worker_argv(worker_queues(self.settings), self.concurrency,
                                        "INFO")),
            Child("sweeper", sweeper_argv()),
            Child("gateway", [sys.executable, "-m", "uvicorn", "gateway.app:app", "--host",
                              self.settings.host, "--port", str(self.port),
                              "--log-level", "warning"]),
        ]
        for child in self.children:
            child.process = subprocess.Popen(child.argv, env=env, start_new_session=True)
        return {"redis": url, "gateway": f"http://{self.settings.host}:{self.port}",
                "api_key": key, "data_dir": str(data_dir)}

    def wait(self) -> int:
        """Until a signal or a child's death; returns the exit code for `layby up`."""
        def _stop(signum: int, _frame: object) -> None:
            self.stopping = True

        signal.signal(signal.SIGINT, _stop)
        signal.signal(signal.SIGTERM, _stop)
        while not self.stopping:
            for child in self.children:
                if child.process and child.process.poll() is not None:
                    print(f"layby: {child.name} exited with code {child.process.returncode}; "
                          "stopping everything", file=sys.stderr)
                    return 1
            time.sleep(0.2)
        return 0

    def stop(self) -> None:
        for child in reversed(self.children):
            if child.process and child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        for child in reversed(self.children):
            if child.process is None:
                continue
            try:
                child.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
        if self.redis is not None:
            self.redis.stop()
            url_file: Path = self.settings.url_file
            url_file.unlink(missing_ok=True)
