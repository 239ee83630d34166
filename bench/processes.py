"""The parts the benchmark starts, and their stopping: an embedded Valkey server in a
temporary folder (unless a Redis URL is given), or with `cluster`, an embedded Valkey
Cluster and a Valkey beside it for the broker (unless a broker URL is given), and one real
`celery worker` subprocess.

`Parts` is a context manager: whatever it started is stopped on the way out, in reverse
order, on success, on error and on Ctrl-C (SIGINT is ignored while it cleans up, so a second
Ctrl-C cannot leave a worker or a server behind).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from bench import BenchError

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Worker:
    """A process of the bench's (the worker, the gateway) in its own process group,
    logging to a file."""

    argv: list[str]
    env: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> Worker:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(self.argv, env=self.env, cwd=ROOT, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def nodename(self) -> str:
        """The Celery node name a worker answers remote control by (its `-n`, expanded)."""
        from celery.utils.nodenames import host_format

        return host_format(self.argv[self.argv.index("-n") + 1]) if "-n" in self.argv else ""

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        """Warm shutdown (SIGTERM to the group), then SIGKILL if it does not end in time."""
        if self.process is None:
            return
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class Parts:
    """A temporary folder, Valkey (embedded unless `redis_url`; with `cluster`, an embedded
    cluster of that many primaries, each with `replicas` replicas, and a broker beside it
    unless `broker_url`), and later the worker."""

    redis_url: str | None = None
    cluster: int = 0
    broker_url: str | None = None
    replicas: int = 1
    folder: Path | None = None
    server: object | None = None  # layby.ops.embedded.EmbeddedRedis, or EmbeddedCluster
    broker: object | None = None  # the embedded broker beside a cluster of the bench's
    worker: Worker | None = None
    gateway: Worker | None = None
    sweeper: Worker | None = None
    embedded: bool = False
    _stopped: bool = field(default=False, repr=False)

    def __enter__(self) -> Parts:
        self.folder = Path(tempfile.mkdtemp(prefix="layby-bench-"))
        try:
            if self.cluster:
                from layby.broker_config import Settings
                from layby.ops.embedded import EmbeddedCluster, EmbeddedRedis

                malloc = Settings().embedded_malloc
                cluster = EmbeddedCluster(self.folder / "cluster", shards=self.cluster,
                                          replicas_per_primary=self.replicas, malloc=malloc)
                self.server = cluster
                cluster.start()
                self.redis_url = cluster.url
                self.embedded = True
                if self.broker_url is None:
                    broker = EmbeddedRedis(self.folder / "broker", malloc=malloc)
                    self.broker = broker
                    self.broker_url = broker.start().url
            elif self.redis_url is None:
                from layby.broker_config import Settings
                from layby.ops.embedded import EmbeddedRedis

                self.server = EmbeddedRedis(self.folder / "valkey",
                                            malloc=Settings().embedded_malloc).start()
                self.redis_url = self.server.url  # type: ignore[attr-defined]
                self.embedded = True
        except BaseException:
            self.stop()
            raise
        return self

    def start_worker(self, queues: list[str], concurrency: int, env: dict[str, str]) -> Worker:
        from layby.broker_config import Settings
        from layby.ops.supervisor import worker_argv

        assert self.folder is not None
        argv = worker_argv(Settings(), queues, concurrency, "WARNING")
        self.worker = Worker(argv, env, self.folder / "worker.log").start()
        return self.worker

    def start_sweeper(self, env: dict[str, str]) -> Worker:
        """The sweeper (`layby sweeper`), for the parked runs' phase."""
        from layby.broker_config import Settings
        from layby.ops.supervisor import sweeper_argv

        assert self.folder is not None
        self.sweeper = Worker(sweeper_argv(Settings()), env, self.folder / "sweeper.log").start()
        return self.sweeper

    def start_gateway(self, env: dict[str, str]) -> str:
        """The gateway (uvicorn, as `layby gateway` runs it) on a free loopback port;
        returns its URL once it answers."""
        import socket
        import urllib.request

        from layby.ops.supervisor import gateway_argv

        assert self.folder is not None
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.gateway = Worker(gateway_argv("127.0.0.1", port), env,
                              self.folder / "gateway.log").start()
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not self.gateway.alive():
                raise BenchError(f"the gateway exited:\n{self.gateway.tail()}")
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=1):
                    return url
            except OSError:
                time.sleep(0.2)
        raise BenchError(f"the gateway did not answer within 60 s:\n{self.gateway.tail()}")

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for extra in (self.gateway, self.sweeper):
                if extra is not None:
                    extra.stop()
            if self.worker is not None:
                self.worker.stop()
            if self.server is not None:
                self.server.stop()  # type: ignore[attr-defined]
            if self.broker is not None:
                self.broker.stop()  # type: ignore[attr-defined]
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)
        finally:
            signal.signal(signal.SIGINT, previous)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        if error is not None and self.worker is not None and not isinstance(
                error, KeyboardInterrupt):
            print(f"bench: the worker's last log lines:\n{self.worker.tail()}",
                  file=sys.stderr)
        self.stop()
