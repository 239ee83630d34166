"""Redis clients built from settings: the one place that turns LAYBY_REDIS_URL into a client.

The URL names one server (`redis://`, `rediss://`) or a Sentinel group in
kombu's form, `sentinel://[:password@]host:26379[/db];sentinel://host2:26379;…`, whose
primary is LAYBY_REDIS_SENTINEL_MASTER. A Sentinel client asks the sentinels where the
primary is each time it connects, so after a failover it reconnects to the new one; kombu
does the same for the broker (`broker_config.celery_app`).

Or it names a Redis or Valkey Cluster, `redis+cluster://[user:password@]host:port[,host:port…]`
(`valkey+cluster://`; `rediss+cluster://`, `valkeys+cluster://` with TLS): one node is
enough, the client learns the others and the slots from it, and follows MOVED and ASK
(redis-py's RedisCluster). The store is then in the sharded layout (`layby.parking.shards`),
each transition in one slot; the broker is a server beside it (LAYBY_BROKER_URL).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar, cast
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio as aioredis
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from pydantic import BaseModel, ConfigDict, SecretStr
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from layby.broker_config.settings import (
    SENTINEL_PORT,
    Settings,
    is_cluster_url,
    is_sentinel_url,
)
from layby.errors import ConfigError

SENTINEL_FORM = "sentinel://[:password@]host:26379/0;sentinel://host2:26379;…"
CLUSTER_FORM = "redis+cluster://[:password@]host:6379[,host2:6379…]"
# A cluster node that does not answer is left for another this soon: the client then asks
# the rest where the slots are (after a failover, the promoted replica).
CLUSTER_CONNECT_S = 2.0
CLUSTER_RETRIES = 8


class SentinelGroup(BaseModel):
    """What a `sentinel://` LAYBY_REDIS_URL says: the sentinels, and how to log in to the
    data nodes (primary and replicas) and which database to use there."""

    model_config = ConfigDict(frozen=True)

    sentinels: list[tuple[str, int]]
    username: str | None = None
    password: SecretStr | None = None
    db: int = 0


def _nth(i: int) -> str:
    return f"address {i + 1} of LAYBY_REDIS_URL"


def sentinel_group(url: str) -> SentinelGroup:
    """Parse a Sentinel URL the way kombu reads it, refusing what kombu would silently
    ignore. Errors say where and what, never the password."""
    parts = [p.strip() for p in url.split(";") if p.strip()]
    if not parts:
        raise ConfigError(f"LAYBY_REDIS_URL names no sentinel: give {SENTINEL_FORM}")
    sentinels: list[tuple[str, int]] = []
    first: tuple[str | None, str | None, int] | None = None
    for i, part in enumerate(parts):
        address, login, db = _sentinel_address(i, part)
        if first is None:
            first = (*login, db or 0)
        elif login not in ((None, None), first[:2]) or db not in (None, first[2]):
            # kombu (the broker) reads them from the first address only: a different one
            # further on would mean the broker and the store use different ones.
            raise ConfigError(
                f"{_nth(i)} gives a user, password or database other than the first "
                "address's: the broker reads them from the first address only; give them "
                "there, and the same or none in the others")
        sentinels.append(address)
    assert first is not None
    return SentinelGroup(sentinels=sentinels, username=first[0],
                         password=SecretStr(first[1]) if first[1] else None, db=first[2])


def _sentinel_address(i: int, part: str
                      ) -> tuple[tuple[str, int], tuple[str | None, str | None], int | None]:
    """One address of a Sentinel URL (`i`: its place, from 0), checked on its own: its
    host and port, its user and password, and its database (None where it gives none)."""
    if not is_sentinel_url(part):
        raise ConfigError(
            f"{_nth(i)} is not a sentinel:// address: a Sentinel URL lists sentinels "
            f"only, separated by ';' ({SENTINEL_FORM}); the primary and replicas are "
            "found through them")
    found = urlsplit(part)
    try:
        port = found.port or SENTINEL_PORT
    except ValueError:
        raise ConfigError(f"{_nth(i)} has a port that is not a number from 1 to "
                          "65535") from None
    if not found.hostname:
        raise ConfigError(f"{_nth(i)} has no host: give {SENTINEL_FORM}")
    if found.query or found.fragment:
        # kombu would drop them; say so rather than pretend they apply.
        raise ConfigError(
            f"{_nth(i)} has URL options (?…): a Sentinel URL takes none; the master name "
            "is LAYBY_REDIS_SENTINEL_MASTER and the sentinels' password "
            "LAYBY_REDIS_SENTINEL_PASSWORD")
    path = found.path.strip("/")
    if path and not path.isdigit():
        raise ConfigError(f"{_nth(i)} names database {path[:20]!r}: the path must be a "
                          "database number, as in sentinel://host:26379/0")
    login = (unquote(found.username) if found.username else None,
             unquote(found.password) if found.password else None)
    return (found.hostname, port), login, int(path) if path else None


class ClusterNodes(BaseModel):
    """What a cluster LAYBY_REDIS_URL says: some of its nodes (the client finds the rest),
    how to log in to them, and whether over TLS."""

    model_config = ConfigDict(frozen=True)

    nodes: list[tuple[str, int]]
    username: str | None = None
    password: SecretStr | None = None
    tls: bool = False


def cluster_nodes(url: str) -> ClusterNodes:
    """Parse a cluster URL, refusing what a cluster has no use for (a database other than
    0, options). Errors say what, never the password."""
    head, sep, rest = url.strip().partition("://")
    if not sep or not rest:
        raise ConfigError(f"LAYBY_REDIS_URL names no cluster node: give {CLUSTER_FORM}")
    login, at, hosts = rest.rpartition("@")
    hosts, _, path = hosts.partition("/")
    if "?" in hosts or "#" in hosts or path.strip("/") not in ("", "0"):
        raise ConfigError(
            "LAYBY_REDIS_URL names a database or options after the cluster's nodes: a "
            f"cluster has database 0 only and takes no options; give {CLUSTER_FORM}")
    nodes: list[tuple[str, int]] = []
    for i, part in enumerate(p.strip() for p in hosts.split(",")):
        found = urlsplit(f"redis://{part}")
        try:
            port = found.port or 6379
        except ValueError:
            raise ConfigError(f"{_nth(i)} has a port that is not a number from 1 to "
                              "65535") from None
        if not found.hostname:
            raise ConfigError(f"{_nth(i)} has no host: give {CLUSTER_FORM}")
        nodes.append((found.hostname, port))
    user, _, password = login.partition(":") if at else ("", "", "")
    return ClusterNodes(nodes=nodes, username=unquote(user) or None,
                        password=SecretStr(unquote(password)) if password else None,
                        tls=head.lower().startswith(("rediss", "valkeys")))


def _cluster_kwargs(settings: Settings, found: ClusterNodes,
                    timeout_s: float | None = None) -> dict[str, Any]:
    options = _node_kwargs(settings, timeout_s=timeout_s)
    # A node away is given up on quickly: the client asks another where its slots went.
    options["socket_connect_timeout"] = min(options["socket_connect_timeout"],
                                            CLUSTER_CONNECT_S)
    options.pop("retry_on_timeout")  # RedisCluster retries (after a new look at the slots)
    # Enough tries to outlast a failover (the cluster's node timeout and an election, a few
    # seconds) before a caller sees an error; each waits on redis-py's own backoff.
    options["retry"] = Retry(ExponentialWithJitterBackoff(base=0.1, cap=1.0),
                             retries=CLUSTER_RETRIES)
    options.update(username=found.username, ssl=found.tls,
                   password=found.password.get_secret_value() if found.password else None)
    return options


def cluster_client(settings: Settings, timeout_s: float | None = None
                   ) -> redis.cluster.RedisCluster:
    """A blocking client of the cluster of LAYBY_REDIS_URL."""
    found = cluster_nodes(redis_url(settings))
    nodes = [redis.cluster.ClusterNode(host, port)  # type: ignore[no-untyped-call, unused-ignore]
             for host, port in found.nodes]
    try:
        return redis.cluster.RedisCluster(startup_nodes=nodes,
                                          **_cluster_kwargs(settings, found, timeout_s))
    except redis.RedisError as exc:
        # redis-py asks the nodes for the slots as it is made: none answering is this.
        raise ConfigError(f"no node of the cluster of LAYBY_REDIS_URL answers ({exc}); "
                          "is it running, and are its slots all covered?") from None


def redis_url(settings: Settings) -> str:
    url = settings.resolved_redis_url()
    if not url:
        raise ConfigError("no Redis server is configured: set LAYBY_REDIS_URL, or start "
                          f"`layby up` (it writes {settings.url_file})")
    return url


_Client = TypeVar("_Client")  # the client `_from_url` makes


def _from_url(make: Callable[..., _Client], url: str, **options: Any) -> _Client:
    """`make(url)`, with redis-py's complaint about the URL as a ConfigError (a 503 over
    HTTP, a clear line from the CLI) that does not repeat the URL and its password."""
    try:
        return make(url, **options)
    except ValueError as exc:
        message = str(exc).replace(url, "LAYBY_REDIS_URL")
        raise ConfigError(f"LAYBY_REDIS_URL is not usable ({message}): give "
                          "redis://[:password@]host:6379/0, rediss://… or "
                          f"{SENTINEL_FORM}") from None


def _master_name(settings: Settings) -> str:
    name = settings.redis_sentinel_master.strip()
    if not name:
        raise ConfigError("LAYBY_REDIS_SENTINEL_MASTER is empty: give the name the sentinels "
                          "monitor the primary under (`sentinel monitor <name> …`)")
    return name


def _node_kwargs(settings: Settings, group: SentinelGroup | None = None,
                 timeout_s: float | None = None) -> dict[str, Any]:
    """Options of connections to the data nodes (primary, replicas), as opposed to the
    sentinels (`Settings.sentinel_kwargs`)."""
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": timeout_s or settings.redis_socket_timeout_s,
        "socket_connect_timeout": timeout_s or 10, "socket_keepalive": True,
        "health_check_interval": settings.redis_health_check_interval_s,
        "retry_on_timeout": True}
    if group is not None:
        options.update(db=group.db, username=group.username,
                       password=group.password.get_secret_value() if group.password else None)
    return options


def sentinel(settings: Settings, timeout_s: float | None = None
             ) -> redis.sentinel.Sentinel | None:
    """The Sentinel group of LAYBY_REDIS_URL (None for a single server)."""
    url = redis_url(settings)
    if not is_sentinel_url(url):
        return None
    group = sentinel_group(url)
    _master_name(settings)  # refused before anything connects
    # redis-py before 8.2 leaves Sentinel's methods unannotated (here and below).
    return redis.sentinel.Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
        group.sentinels, sentinel_kwargs=settings.sentinel_kwargs(timeout_s),
        **_node_kwargs(settings, group, timeout_s))


def redis_client(settings: Settings, timeout_s: float | None = None) -> redis.Redis:
    """A blocking client of the primary (of the cluster: a RedisCluster, which has the same
    commands, each sent to its key's node); `timeout_s` replaces the socket timeouts."""
    if is_cluster_url(redis_url(settings)):
        return cast("redis.Redis", cluster_client(settings, timeout_s))
    group = sentinel(settings, timeout_s)
    if group is None:
        return _from_url(redis.Redis.from_url, redis_url(settings),
                         **_node_kwargs(settings, timeout_s=timeout_s))
    client: redis.Redis = group.master_for(  # type: ignore[no-untyped-call, unused-ignore]
        _master_name(settings), redis_class=redis.Redis)
    return client


@asynccontextmanager
async def async_redis(settings: Settings) -> AsyncIterator[aioredis.Redis]:
    """An asyncio client of the primary for blocking reads (XREAD BLOCK), closed on exit.

    No socket timeout on reads, which a blocked XREAD would trip: a server that dies closes
    the socket, and keepalive finds one that vanished."""
    url = redis_url(settings)
    if is_cluster_url(url):
        found = cluster_nodes(url)
        cluster = redis.asyncio.cluster.RedisCluster(
            startup_nodes=[redis.asyncio.cluster.ClusterNode(host, port)
                           for host, port in found.nodes],
            **{**_cluster_kwargs(settings, found), "socket_timeout": None,
               "retry": AsyncRetry(ExponentialWithJitterBackoff(base=0.1, cap=1.0),
                                   retries=CLUSTER_RETRIES)})
        try:
            yield cast("aioredis.Redis", cluster)
        finally:
            await cluster.aclose()
        return
    group = sentinel_group(url) if is_sentinel_url(url) else None
    options = {**_node_kwargs(settings, group), "socket_timeout": None}
    manager: redis.asyncio.sentinel.Sentinel | None = None
    if group is None:
        client = _from_url(aioredis.Redis.from_url, url, **options)
    else:
        manager = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
            group.sentinels, sentinel_kwargs=settings.sentinel_kwargs(), **options)
        client = manager.master_for(_master_name(settings), redis_class=aioredis.Redis)
    try:
        yield client
    finally:
        await client.aclose()
        if manager is not None:
            await manager.aclose()
