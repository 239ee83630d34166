"""With `--cluster`: one server beside the cluster, set up as each of its primaries is (a
broker apart, as many replicas), measured in the same rounds, so that "cycles a primary can
carry" has a baseline from the same run on the same machine.

Apart from the cluster, what a primary spends is its share of the cycles, and what feeding
its replicas costs. One server given the same replicas and the same broker apart spends the
second alike, and its runs are followed as the cluster's are, each by a read of its own
(on one server the bench could follow them all with one `XREAD`, as a cluster cannot: the
cheaper reads were the bench's client's, not the store's). What is left between the two
is the cluster's own cost (its nodes' upkeep, and on a small machine, more servers sharing
its cores). Two runs of the bench, one of each, differ by more than that on a small machine;
rounds that alternate in one run do not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench import BenchError
from bench.processes import Worker


@dataclass
class Beside:
    """The server, its replicas, its broker, its runtime and its worker."""

    folder: Path
    replicas: int
    servers: list[Any] = field(default_factory=list)  # EmbeddedRedis: primary, replicas, broker
    worker: Worker | None = None
    rt: Any = None  # layby.control.Runtime

    @property
    def primary(self) -> redis.Redis:
        """A client of the one server: what `costs.counted` reads its counters from."""
        return self.rt.store.redis  # type: ignore[no-any-return]

    def start(self, env: dict[str, str], concurrency: int) -> Beside:
        """Servers first (the replicas' links up), then the runtime and a worker that read
        `env` with the server's and the broker's URLs in place of the cluster's."""
        from celery import current_app

        from bench.measure import WORKER_QUEUES
        from layby.broker_config import Settings
        from layby.control import build
        from layby.ops.embedded import EmbeddedRedis
        from layby.ops.supervisor import worker_argv

        malloc = Settings().embedded_malloc
        primary = EmbeddedRedis(self.folder / "one", malloc=malloc).start()
        self.servers.append(primary)
        for n in range(self.replicas):
            self.servers.append(EmbeddedRedis(
                self.folder / f"one-replica{n}", malloc=malloc,
                options={"replicaof": f"{primary.host} {primary.port}"}).start())
        broker = EmbeddedRedis(self.folder / "one-broker", malloc=malloc).start()
        self.servers.append(broker)
        _wait_linked(self.servers[1:1 + self.replicas])
        own = {"LAYBY_REDIS_URL": primary.url, "LAYBY_BROKER_URL": broker.url,
               "LAYBY_BROKER_KEY_PREFIX": ""}
        settings = Settings(**{k.removeprefix("LAYBY_").lower(): v for k, v in own.items()})
        # A Celery app built becomes the current one, which the bare chains publish with:
        # the cluster's stays current.
        cluster_app = current_app._get_current_object()  # type: ignore[attr-defined]
        self.rt = build(settings)
        cluster_app.set_current()
        argv = worker_argv(settings, WORKER_QUEUES, concurrency, "WARNING")
        self.worker = Worker(argv, {**env, **own}, self.folder / "one-worker.log").start()
        return self

    def cycles(self, runs: int, in_flight: int, timeout_s: float) -> Any:
        """`runs` cycles on the one server (`measure.layby_cycles`), each run followed by a
        read of its own as on the cluster (so the two differ by the store, not by how the
        bench's client follows); BenchError if its worker died."""
        from bench import measure

        if self.worker is None or not self.worker.alive():
            tail = self.worker.tail() if self.worker is not None else ""
            raise BenchError(f"the worker beside the cluster exited:\n{tail}")
        return measure.layby_cycles(self.rt, runs, in_flight, timeout_s, lanes=True)

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
        if self.rt is not None:
            self.rt.store.redis.close()
            self.rt.celery.pool.force_close_all()
        for server in reversed(self.servers):
            server.stop()


def _wait_linked(replicas: list[Any], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    for replica in replicas:
        with redis.Redis.from_url(replica.url, decode_responses=True) as client:
            while client.info("replication").get("master_link_status") != "up":
                if time.monotonic() > deadline:
                    raise BenchError(f"the replica at {replica.url} did not link to its "
                                     f"server within {timeout_s:g} s")
                time.sleep(0.05)


def summary(beside: Beside, spent: Any, completed: int, cluster_per_primary: float | None
            ) -> dict[str, Any]:
    """The one server's figures (`costs.per_item`), its replicas as it counts them, and
    the cluster's cycles a primary over its own."""
    from bench import costs

    linked = int(beside.primary.info("replication").get("connected_slaves", 0))
    assert beside.worker is not None
    figures = {**costs.per_item(spent, completed), "completed": completed,
               "replicas": linked, "redis_url": beside.servers[0].url,
               "worker": " ".join(beside.worker.argv[1:])}
    one = figures.get("per_s_per_primary")
    figures["cluster_over_one_server"] = (round(cluster_per_primary / one, 3)
                                          if one and cluster_per_primary else None)
    return figures
