"""kombu's Redis transports (`redis://`, `rediss://`, `sentinel://`) with one fix: a worker
that loses the broker while it runs acks_late tasks reconnects instead of stopping.

Celery 5.7 and kombu 5.7: when the connection drops while the worker's channel waits in
BRPOP and holds unacked messages (tasks running), the consumer first collects the
connection. Closing the channel drains the pending BRPOP, which raises ConnectionError on
the dead socket, so the close stops half way; the transport is detached, and the second
close, which puts the unacked messages back, fails with `AttributeError: 'NoneType' object
has no attribute 'hostname'`: "Unrecoverable error", and the worker shuts down. A Redis
restart or a Sentinel failover during a task is enough. Here a BRPOP on a connection that
died while closing has nothing to drain: the close goes on (kombu restores what it can,
and whatever stays in its `unacked` hash comes back after the visibility timeout).

`install()` points the URL schemes at these classes, so `broker_url` keeps its usual form
and every URL, log line and Flower page still says `redis://` or `sentinel://`.
"""

from __future__ import annotations

from queue import Empty
from typing import Any

from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis


class _CloseAfterLoss:
    _closing: bool
    connection_errors: tuple[type[BaseException], ...]

    def _brpop_read(self, **options: Any) -> Any:
        try:
            return super()._brpop_read(**options)  # type: ignore[misc]
        except self.connection_errors:
            if not self._closing:
                raise
            raise Empty() from None


class Channel(_CloseAfterLoss, kombu_redis.Channel):
    pass


class SentinelChannel(_CloseAfterLoss, kombu_redis.SentinelChannel):
    pass


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel


def install() -> None:
    for scheme, name in (("redis", "Transport"), ("rediss", "Transport"),
                         ("sentinel", "SentinelTransport")):
        TRANSPORT_ALIASES[scheme] = f"{__name__}:{name}"
