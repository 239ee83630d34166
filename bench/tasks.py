"""The baseline's Celery task: a no-op hop, registered (`@shared_task`) on layby's own app.

The bench's worker loads it through LAYBY_TASK_MODULES=bench.tasks, so it runs with exactly
the settings layby's tasks run with (acks_late, prefetch 1, events, same queues). The last
hop of a chain pushes the chain's token onto a Redis list: that is how the bench learns a
chain is done (the app keeps no results). Given `sent_ms` (the Redis server's clock when
the bench published it), a hop pushes how long it waited to start, on the same clock.
"""

from __future__ import annotations

from functools import cache

from celery import shared_task
from redis import Redis

from layby.broker_config import Settings
from layby.control.connections import redis_client

HOP = "bench.hop"


@cache
def _redis() -> Redis:
    return redis_client(Settings())


@shared_task(name=HOP)
def hop(done_key: str | None = None, token: str | None = None,
        sent_ms: int | None = None) -> None:
    if sent_ms is not None and done_key:
        seconds, micros = _redis().time()
        _redis().rpush(done_key, int(seconds) * 1000 + int(micros) // 1000 - int(sent_ms))
    elif done_key:
        _redis().rpush(done_key, token or "")
