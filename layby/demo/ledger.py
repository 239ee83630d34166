"""The demo ledger: every executed transfer and every plain tool call, recorded once per
idempotency key, so anyone can check at `GET /demo/ledger` that a side effect happened
exactly once however often a step was retried.

It stands for the outside world a real tool calls: it keeps its own connection to the
Redis server of the LAYBY_* settings, as a tool would keep a client of its own service.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, cast

from redis import Redis, RedisCluster
from redis.exceptions import AskError, MovedError

from layby.broker_config import Settings
from layby.control.connections import redis_client

# KEYS: 1 entries (list), 2 seen keys (hash). ARGV: 1 idempotency key, 2 entry JSON.
# Returns the entry as first recorded for that key.
_RECORD = """
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 1 then
  redis.call('RPUSH', KEYS[1], ARGV[2])
  return ARGV[2]
end
return redis.call('HGET', KEYS[2], ARGV[1])
"""
KINDS = ("transfers", "calls")

_lock = threading.Lock()
_connection: tuple[tuple[int, str | None], Redis, str] | None = None


def _redis() -> tuple[Redis, str]:
    """A connection to the server the settings name now, and the key prefix (made again in
    a forked child, or when the settings name another server)."""
    global _connection
    settings = Settings()
    where = (os.getpid(), settings.resolved_redis_url())
    with _lock:
        if _connection is None or _connection[0] != where:
            _connection = (where, redis_client(settings), settings.key_prefix)
        return _connection[1], _connection[2]


def _keys(prefix: str, kind: str, cluster: bool) -> list[str]:
    # On a cluster, one hash tag: both in the slot the script that writes them runs in.
    name = f"{{{kind}}}" if cluster else kind
    return [f"{prefix}:demo:{name}", f"{prefix}:demo:{name}:seen"]


class NotDurable(ConnectionError):
    """The ledger's server did not confirm an entry on a replica in time (a failover now
    could lose it), or no longer serves its slot. A passing failure: the tool's retry
    records it again, once by its key."""


def record(kind: str, idempotency_key: str, entry: dict[str, Any]) -> dict[str, Any]:
    """Record `entry` once for `idempotency_key`; returns the entry first recorded for it.
    With LAYBY_REDIS_MIN_REPLICAS_ACK, as durable as a bank's ledger: confirmed by that many
    replicas, or `NotDurable` (on a cluster, whose primaries fail over to replicas that may
    not have the last writes)."""
    client, prefix = _redis()
    settings = Settings()
    keys = _keys(prefix, kind, settings.store_is_cluster)
    entry = {**entry, "key": idempotency_key, "at": time.time()}
    wanted = settings.redis_min_replicas_ack
    if not wanted:
        first = client.eval(_RECORD, 2, *keys, idempotency_key, json.dumps(entry))
        return dict(json.loads(first))
    # WAIT counts the replicas that have this connection's writes: the same connection, to
    # the node that serves the key.
    node: Any = client
    cluster = cast("RedisCluster", client) if settings.store_is_cluster else None
    if cluster is not None:
        node = cluster.get_redis_connection(cluster.get_node_from_key(keys[0]))  # type: ignore[no-untyped-call]
    pipe = node.pipeline(transaction=False)
    pipe.eval(_RECORD, 2, *keys, idempotency_key, json.dumps(entry))
    pipe.wait(wanted, 2000)
    try:
        first, acked = pipe.execute()
    except (MovedError, AskError) as exc:
        # The key's slot is served elsewhere now (a failover, a slot moved): nothing was
        # written. The cluster's map is read again for the tool's next try.
        if cluster is not None:
            cluster.nodes_manager.initialize()
        raise NotDurable(f"the ledger's slot moved ({exc}); nothing was recorded") from exc
    if int(acked) < wanted:
        raise NotDurable(f"ledger entry {idempotency_key} confirmed by {acked} of {wanted} "
                         "replicas")
    return dict(json.loads(first))


def read(client: Redis, prefix: str, *, cluster: bool = False
         ) -> dict[str, list[dict[str, Any]]]:
    return {kind: [json.loads(e) for e in client.lrange(_keys(prefix, kind, cluster)[0], 0, -1)]
            for kind in KINDS}
