"""One store and one publisher per process, built from settings, rebuilt after a fork.

The store's client comes from `control.connections` (one server or a Sentinel group).

Publishing sends outbox entries to the broker, then acks them in the store; if the broker
is away the entries stay in the outbox and the sweeper publishes them later.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import redis

from layby.broker_config import NOTIFY, NOTIFY_TASK, app, get_settings
from layby.broker_config.settings import Settings
from layby.control.connections import redis_client
from layby.generation.agents import Agent, load_agents
from layby.parking import OutboxEntry, Store, StoreConfig

log = logging.getLogger(__name__)
T = TypeVar("T")
_lock = threading.Lock()
_state: dict[str, object] = {}


def store_config(settings: Settings) -> StoreConfig:
    return StoreConfig(prefix=settings.key_prefix, retention_s=settings.retention_s,
                       idempotency_ttl_s=settings.idempotency_ttl_s,
                       lease_ms=int(settings.lease_s * 1000), events_max=settings.events_max,
                       outbox_grace_ms=int(settings.outbox_grace_s * 1000),
                       notify_task=NOTIFY_TASK, notify_queue=NOTIFY,
                       min_replicas_ack=settings.redis_min_replicas_ack,
                       replica_ack_timeout_ms=int(settings.redis_replica_ack_timeout_s * 1000))


def store() -> Store:
    """The process's store (a new one in a forked child: sockets are not shared)."""
    with _lock:
        if _state.get("pid") != os.getpid():
            _state.clear()
            settings = get_settings()
            _state["store"] = Store(redis_client(settings), store_config(settings))
            _state["pid"] = os.getpid()
        return _state["store"]  # type: ignore[return-value]


def agents() -> dict[str, Agent]:
    with _lock:
        if "agents" not in _state:
            _state["agents"] = load_agents(get_settings().agent_modules)
        return _state["agents"]  # type: ignore[return-value]


FAILOVER_DELAYS_S = (0.5, 1, 2, 4, 8, 16)


def through_failover(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`call`, tried again through about 30 s of Redis errors (a failover, a restart): for
    records that exist nowhere else once the process moves on (a job's result, the outcome
    of a send). Raises the last error after that."""
    for delay in (*FAILOVER_DELAYS_S, None):
        try:
            return call(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError):
            # A server away or a replica not yet promoted; other errors (a script's, a
            # write not replicated but made) would come back the same after the wait.
            if delay is None:
                raise
            log.warning("Redis error; trying %s again in %.1f s", call.__name__, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# Tasks that ack their own outbox entry once their work is done, so that a task that fails
# for good (say, while the reviewer directory is broken) is published again by the sweeper
# until it succeeds: a parked run is never left unannounced.
ACKED_BY_THE_TASK = frozenset({NOTIFY_TASK})


def publish(entries: Iterable[OutboxEntry], target: Store | None = None) -> int:
    """Send entries to the broker and ack them; returns how many were sent."""
    entries = list(entries)
    if not entries:
        return 0
    try:
        with app.producer_or_acquire() as producer:
            for e in entries:
                app.send_task(e.task, args=e.args, task_id=e.id, queue=e.queue,
                              producer=producer)
    except Exception:  # the outbox keeps them; the sweeper tries again
        log.exception("publish failed; %d outbox entries left for the sweeper", len(entries))
        return 0
    (target or store()).ack_outbox([e.id for e in entries if e.task not in ACKED_BY_THE_TASK])
    return len(entries)
