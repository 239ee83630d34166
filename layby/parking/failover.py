"""Riding out a Redis failover or restart, for writes that exist nowhere else once the
process moves on (a background job's result, the outcome of a send)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis

log = logging.getLogger(__name__)
T = TypeVar("T")

FAILOVER_DELAYS_S = (0.5, 1, 2, 4, 8, 16)


def through_failover(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`call`, tried again through about 30 s of Redis errors. Raises the last error after
    that."""
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
