"""A RabbitMQ node for the tests, from Debian's `rabbitmq-server` package (CI installs it, as
it installs Chromium): started as this user with a data folder, ports and an epmd of its
own, so it shares nothing with another node or a system service, and stopped with its epmd.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kombu import Connection

from layby.ops.embedded import free_port

# The package's own scripts, which run as whoever starts them (/usr/sbin's wrapper would
# switch to the rabbitmq user).
BIN = Path("/usr/lib/rabbitmq/bin")


def available() -> bool:
    return (BIN / "rabbitmq-server").exists()


@contextmanager
def running(root: Path) -> Iterator[Rabbit]:
    """A node started in `root` (refused, saying how to get one, when the package is not
    installed), stopped on the way out."""
    if not available():
        raise RuntimeError("these tests need Debian's rabbitmq-server (apt-get install "
                           "rabbitmq-server; .ci/run does it)")
    rabbit = Rabbit(root).start()
    try:
        yield rabbit
    finally:
        rabbit.stop()


class Rabbit:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.epmd_port = free_port()
        self.name = f"layby{self.port}@localhost"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    @property
    def env(self) -> dict[str, str]:
        self.root.mkdir(parents=True, exist_ok=True)
        return {**os.environ, "HOME": str(self.root), "RABBITMQ_NODENAME": self.name,
                "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1", "RABBITMQ_NODE_PORT": str(self.port),
                "RABBITMQ_DIST_PORT": str(free_port()), "ERL_EPMD_PORT": str(self.epmd_port),
                "RABBITMQ_MNESIA_BASE": str(self.root / "mnesia"),
                "RABBITMQ_LOG_BASE": str(self.root / "log"),
                "RABBITMQ_CONFIG_FILE": str(self.root / "rabbitmq"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.root / "enabled_plugins"),
                "RABBITMQ_PID_FILE": str(self.root / "rabbit.pid")}

    def start(self, timeout: float = 60) -> Rabbit:
        env = self.env
        (self.root / "enabled_plugins").write_text("[].\n")
        # No management plugin, nothing on other ports; quorum queues need no more.
        (self.root / "rabbitmq.conf").write_text("loopback_users = none\n")
        with open(self.root / "server.out", "ab") as out:
            self.process = subprocess.Popen([str(BIN / "rabbitmq-server")], env=env,
                                            stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with Connection(self.url, connect_timeout=1) as conn:
                    conn.connect()
                return self
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("RabbitMQ did not start: see "
                                       f"{self.root / 'server.out'}") from None
                time.sleep(0.3)

    def kill(self) -> None:
        """SIGKILL the node (its epmd stays): `start` brings it back on its data."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        epmd = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
        subprocess.run([epmd, "-kill"], env=self.env, capture_output=True, check=False)
