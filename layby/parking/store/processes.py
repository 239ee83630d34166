"""Live processes and the store's format: workers' and servers' beats (what each is and
hosts), the dead reaped, the format the store writes and its switch, and the server ids
noted to see a restart or a failover."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, cast

from redis import RedisCluster

from layby.parking import formats
from layby.parking.keys import Keys
from layby.parking.store.core import Part, on_cluster
from layby.parking.store.fields import dumps, text


class Processes(Part):
    """Live processes and the store's format (`store.processes`)."""

    def beat_worker(self, name: str, about: str,
                    hosting: Sequence[str] | None = None) -> None:
        """A process is alive (a worker's reserved messages are its own for one lease),
        and says what it is (`about`: "<kind> <newest format> <release>"); the format the
        store writes now comes back, and is the one this store writes from now on.
        `hosting`: the agent versions a worker runs pinned runs of (`<agent>@<version>`),
        told again at each beat, for `layby doctor`. The layout comes back too. While the
        store moves to the sharded layout, whose registry is named otherwise, the process
        takes itself out of the legacy one's."""
        layout = self.core.layout
        keys, legacy = layout.keys, layout.legacy

        def fill(pipe: Any) -> None:
            self.core.call("beat_worker", [keys.workers, keys.workers_about, keys.format],
                           client=pipe, worker=name, lease_ms=self.config.lease_ms, about=about)
            if hosting is not None:
                pipe.hset(keys.hosting, name, dumps(sorted(hosting)))
            if legacy is not None:
                pipe.zrem(legacy.workers, name)
                pipe.hdel(legacy.workers_about, name)
                pipe.hdel(legacy.hosting, name)

        began = time.monotonic()
        reply = self.core.pipelined(fill, "beat_worker")[0]
        self.core.learn(formats.parsed([r or None for r in reply[4:9]]), int(reply[3]), began)

    def reap_workers(self) -> list[tuple[str, int, str]]:
        """Processes whose beat lapsed, once each, with their last beat (epoch ms) and what
        they said they were."""
        reaped = []
        for keys in self._registries():
            raw = self.core.call("reap_workers", [keys.workers, keys.workers_about],
                                 lease_ms=self.config.lease_ms)
            found = [(text(raw[i]), int(text(raw[i + 1])), text(raw[i + 2]))
                     for i in range(0, len(raw), 3)]
            if found:
                self.redis.hdel(keys.hosting, *(name for name, _, _ in found))
            reaped += found
        return reaped

    def _registries(self) -> list[Keys]:
        """The layouts whose registry of processes is read: the store's, and the legacy
        one's while the store moves to the sharded layout (those that died before)."""
        layout = self.core.layout
        return [layout.keys] + ([layout.legacy] if layout.legacy is not None else [])

    def forget_worker(self, name: str) -> None:
        """A process that stopped cleanly (a worker's reserved messages went back to the
        queue)."""
        for keys in self._registries():
            pipe = self.redis.pipeline(transaction=True)
            pipe.zrem(keys.workers, name)
            pipe.hdel(keys.workers_about, name)
            pipe.hdel(keys.hosting, name)
            pipe.execute()

    def live_processes(self) -> dict[str, str]:
        """Every process whose beat has not lapsed, and what it said it is."""
        found: dict[str, str] = {}
        now = self.core.now_ms()
        for keys in self._registries():
            names = cast("list[str]", self.redis.zrangebyscore(keys.workers, f"({now}",
                                                               "+inf"))
            about = cast("list[str | None]", self.redis.hmget(keys.workers_about, names)) \
                if names else []
            found.update({name: told or "" for name, told in zip(names, about, strict=True)
                          if name not in found})
        return found

    def switch_format(self, to: int, *, force: bool = False,
                      shards: int | None = None) -> list[str]:
        """Start writing format `to` (`switch_format.lua`); the reply's verdict, then the
        older processes still alive (name, about, …) when that is why it did not. A store
        in the legacy layout is given `shards` (the sharded layout's count, for format 2 on),
        and its layout instant."""
        keys = self.core.keys
        delay_ms = int((formats.FRESH_S + formats.LAYOUT_MARGIN_S) * 1000)
        reply = self.core.call("switch_format", [keys.workers, keys.workers_about, keys.format],
                               to=to, force=force,
                               shards=shards if shards is not None and to >= formats.SHARDED
                               else "", layout_after_ms=delay_ms)
        if reply[0] == "switched":
            self.core.read_format()
        return [text(r) for r in reply]

    def server_id(self) -> str:
        """The Redis server's run id: a new one after a restart or a failover, when the
        server may have lost the last writes before it (a task message among them). On a
        cluster, its primaries' run ids, sorted: another after any one's failover."""
        if on_cluster(self.redis):
            found = cast("RedisCluster", self.redis).info(
                "server", target_nodes=RedisCluster.PRIMARIES)
            return ",".join(sorted(str(info.get("run_id", "")) for info in found.values()))
        return str(self.redis.info("server").get("run_id", ""))

    def noted_server(self, *, broker: bool = False) -> str | None:
        """The server id last noted in the data (`note_server`): kept with the data, so a
        restart or a failover shows as another id, even to a process that never saw the
        server before it. With `broker`, the broker's server (when it is another Redis)."""
        key = self.core.keys.broker_server if broker else self.core.keys.server
        return cast("str | None", self.redis.get(key))

    def note_server(self, server: str | None = None, *, first: bool = False,
                    broker: bool = False) -> None:
        """Note this server's id in the data (with `first`, only where none is); with
        `broker`, `server` is the broker's."""
        key = self.core.keys.broker_server if broker else self.core.keys.server
        self.redis.set(key, server or self.server_id(), nx=first)
