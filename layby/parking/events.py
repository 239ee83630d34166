"""A run's event stream (a capped Redis Stream the transition scripts append to), read in one
place: entries as `Event`s, a page of them, the newest park, and an async follower for
server-sent events and AG-UI.

A run parked for a while has its events folded out of the stream into its hash
(lua/fold_events.lua, by the sweeper): every read here goes through lua/read_events.lua,
which gives them back as the stream held them, then the stream's. Only a follower's wait
is a blocking XREAD on the stream itself, after a read that found nothing new.

The events of a step (`turn.committed`, `run.interrupted`, `run.completed`) say where its
messages are in the run's history (`from`, `historyTo`); the entry holds the messages in a
field of their own, `messages`, beside `data`. A park's event is stored without them, and
so are the earlier steps' events of a parked run (park_run.lua drops the field): the
history is held once, in the run. Every reader here gives them back inside the data, the
event's last member: from the field, or from the history as it is when read (a resume's
rewrite of the parked model message included). So what a reader gets has `messages`, as an
event always did."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.exceptions import (
    ConnectionError,
    NoScriptError,
    RedisClusterException,
    ResponseError,
    TimeoutError,
)

from layby.parking.clock import iso
from layby.parking.scripts import argv, folding_source
from layby.wire import Event

KEEP_ALIVE_MS = 15_000
# A follower of a run that may move to the sharded layout (its store in the legacy one)
# waits at most this long at once, and looks where the run is between waits: a blocking
# XREAD is not woken by the move (the stream renamed away).
WHERE_EVERY_MS = 1_000
# How a follower finds the run's events key again (`follow_raw`).
Where = Callable[[], Awaitable[str]]
# The most events one read returns, and a count above any run's (a run keeps
# LAYBY_EVENTS_MAX, 2,000 by default, in its stream and as many folded).
PAGE = 500
EVERY = 1_000_000

_READ = folding_source("read_events")
_READ_SHA = hashlib.sha1(_READ.encode()).hexdigest()


# The events that carry a step's messages, or say where they are in the history.
STEP_EVENTS = frozenset({"turn.committed", "run.interrupted", "run.completed"})


def _without_messages(fields: dict[str, str]) -> bool:
    """A step's entry whose messages are left for the history to give."""
    return fields.get("type") in STEP_EVENTS and "messages" not in fields


def run_key(events_key: str) -> str:
    """The run's hash beside its events (`<prefix>:{<run id>}:events`, parking.keys)."""
    return events_key.removesuffix(":events") + ":run"


def _spliced(fields: dict[str, str]) -> dict[str, str]:
    """An entry whose messages are a field of their own, as readers get it: its data (a
    JSON object, as Python wrote it) with them as its last member, spliced in unparsed."""
    rest = dict(fields)
    messages = rest.pop("messages")
    data = (rest.get("data") or "{}").rstrip()
    inside = data[:-1].rstrip()
    rest["data"] = f'{inside}{"" if inside.endswith("{") else ","}"messages":{messages}}}'
    return rest


def _filled(fields: dict[str, str], history: list[Any]) -> dict[str, str]:
    """A step's entry without its messages, given them from the history (when it says
    where they are in it)."""
    data = json.loads(fields.get("data") or "{}")
    if not isinstance(data, dict) or "from" not in data or "historyTo" not in data:
        return fields
    data["messages"] = history[int(data["from"]):int(data["historyTo"])]
    return {**fields, "data": json.dumps(data, separators=(",", ":"), ensure_ascii=False)}


def _with_messages(found: list[tuple[str, dict[str, str]]], history: str | None
                   ) -> list[tuple[str, dict[str, str]]]:
    messages = json.loads(history) if history else []
    return [(eid, _filled(fields, messages) if _without_messages(fields)
             else _spliced(fields) if "messages" in fields else fields)
            for eid, fields in found]


def fill(client: Redis, key: str, found: list[tuple[str, dict[str, str]]]
         ) -> list[tuple[str, dict[str, str]]]:
    """Entries as read, as readers get them: a step's messages inside its data, from the
    entry's own field or, stored without them, from the history (one read of it, only when
    some need it)."""
    if not any(_without_messages(fields) for _, fields in found):
        return _with_messages(found, None)
    # The clients decode replies; redis-py's types say `bytes | str` (see parking.store).
    return _with_messages(found, cast("str | None", client.hget(run_key(key), "messages")))


async def fill_async(client: AsyncRedis, key: str, found: list[tuple[str, dict[str, str]]]
                     ) -> list[tuple[str, dict[str, str]]]:
    """`fill`, on an async client."""
    if not any(_without_messages(fields) for _, fields in found):
        return _with_messages(found, None)
    return _with_messages(found, cast("str | None",
                                      await client.hget(run_key(key), "messages")))


def recorded_at(event_id: str) -> int:
    """When the event was written (ms): its id's time."""
    return int(event_id.partition("-")[0])


def event_of(event_id: str, fields: dict[str, str]) -> Event:
    return Event(id=event_id, type=fields["type"], version=int(fields["version"]),
                 at=iso(recorded_at(event_id)),
                 data=json.loads(fields.get("data") or "null"))


def _entries(reply: Any) -> list[tuple[str, dict[str, str]]]:
    return [(eid, dict(zip(fields[::2], fields[1::2], strict=True))) for eid, fields in reply]


def stored(client: Redis, key: str, after: str = "0-0", count: int = PAGE
           ) -> list[tuple[str, dict[str, str]]]:
    """The entries after `after` (a stream id), folded or not, as the stream holds them."""
    args = [run_key(key), key, *argv({"after": after, "count": count})]
    try:
        reply = client.evalsha(_READ_SHA, 2, *args)
    except NoScriptError:
        reply = client.eval(_READ, 2, *args)
    return _entries(reply)


async def stored_async(client: AsyncRedis, key: str, after: str = "0-0", count: int = PAGE
                       ) -> list[tuple[str, dict[str, str]]]:
    """`stored`, on an async client."""
    args = [run_key(key), key, *argv({"after": after, "count": count})]
    try:
        reply = await client.evalsha(_READ_SHA, 2, *args)
    except NoScriptError:
        reply = await client.eval(_READ, 2, *args)
    return _entries(reply)


def read(client: Redis, key: str, after: str = "0-0", *, block_ms: int | None = None,
         count: int = PAGE) -> list[Event]:
    """Events after `after` (a stream id); with `block_ms`, wait that long for one."""
    found = stored(client, key, after, count)
    if not found and block_ms is not None:
        reply: Any = wait(client, key, after, count=count, block_ms=block_ms)
        found = reply[0][1] if reply else []
    return [event_of(eid, fields) for eid, fields in fill(client, key, found)]


# What a read sent to the node the client's map names meets when the map is stale or the
# node away (a slot moved, a failover): the read goes again the usual way.
_NOT_THERE = (ResponseError, ConnectionError, TimeoutError, RedisClusterException)


def wait(client: Redis | RedisCluster, key: str, after: str, *, count: int, block_ms: int
         ) -> Any:
    """`XREAD COUNT count BLOCK block_ms STREAMS key after`, its reply as redis-py gives it.

    On a cluster it goes straight to the node that holds the key's slot in the client's
    map: redis-py cannot read XREAD's keys from its command table (they follow `STREAMS`)
    and would ask the server for them first, a round trip a read (`COMMAND GETKEYS`). Sent
    so, a read that meets a stale map goes again the usual way, which learns the new one
    (redis-py does not retry a read it was told where to send)."""
    if isinstance(client, RedisCluster):
        try:
            node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
            return client.execute_command(  # type: ignore[no-untyped-call]
                *_xread(key, after, count, block_ms), target_nodes=node)
        except _NOT_THERE:
            pass
    return client.xread({key: after}, count=count, block=block_ms)


async def wait_async(client: AsyncRedis | AsyncRedisCluster, key: str, after: str, *,
                     count: int, block_ms: int) -> Any:
    """`wait`, on an async client."""
    if isinstance(client, AsyncRedisCluster):
        try:
            node = client.get_node_from_key(key)
            return await client.execute_command(*_xread(key, after, count, block_ms),
                                                target_nodes=node)
        except _NOT_THERE:
            pass
    return await client.xread({key: after}, count=count, block=block_ms)


def _xread(key: str, after: str, count: int, block_ms: int) -> tuple[str | int, ...]:
    return ("XREAD", "COUNT", count, "BLOCK", block_ms, "STREAMS", key, after)


def last_park(client: Redis, key: str, interrupt_ids: set[str] | None = None) -> Event | None:
    """The newest `run.interrupted` event (that parked on one of `interrupt_ids`)."""
    for event_id, fields in reversed(stored(client, key, count=EVERY)):
        if fields.get("type") == "run.interrupted":
            ids = {i["id"] for i in json.loads(fields["data"]).get("interrupts", [])}
            if interrupt_ids is None or ids & interrupt_ids:
                # Only the park looked for reads the history for its messages.
                return event_of(event_id, fill(client, key, [(event_id, fields)])[0][1])
    return None


async def follow_raw(client: AsyncRedis, key: str, after: str, *, keep_going: bool = True,
                     where: Where | None = None, fresh: bool = False
                     ) -> AsyncIterator[list[tuple[str, dict[str, str]]] | None]:
    """`follow`, a batch at a time (what one read found), each entry as `fill` gives it:
    (id, fields), its data unparsed.

    The wait is a blocking XREAD on the stream, which a fold (events moved into the run's
    hash, the stream deleted) never wakes. So every wait begins with a read of folded and
    streamed events at once, unless the last wait just returned a part of the stream (a
    batch not full: all there was). An event appended and folded in the instant between
    that wait and the next, which only a sweeper's fold 30 s into a park can do, comes at
    the next keep-alive (15 s).

    `where`: the run may move to the sharded layout while it is followed (its store in the
    legacy one): a wait is at most WHERE_EVERY_MS, and after one that found nothing the
    run's events key is asked again (a move keeps the stream's ids: the follower goes on
    from `after` there).

    `fresh`: the run was created an instant ago (the request that follows it started it),
    so none of its events can have been folded: the first read is the wait itself, which
    returns at once what the stream holds after `after` (one round trip, no script)."""
    look = not (fresh and keep_going)
    waited = 0
    while True:
        batch = await stored_async(client, key, after) if look else []
        if not batch and not keep_going:
            return
        if not batch:
            pause = KEEP_ALIVE_MS if where is None else min(WHERE_EVERY_MS,
                                                            KEEP_ALIVE_MS - waited)
            reply: Any = await wait_async(client, key, after, count=PAGE, block_ms=pause)
            batch = reply[0][1] if reply else []
            if not batch:
                waited += pause
                if where is not None and (moved := await where()) != key:
                    key, look = moved, True
                if waited >= KEEP_ALIVE_MS:
                    waited, look = 0, True
                    yield None
                continue
        waited = 0
        look = len(batch) >= PAGE
        after = batch[-1][0]
        yield await fill_async(client, key, batch)


def wire_json(event_id: str, fields: dict[str, str]) -> str:
    """An entry as `Event.wire()` writes it, with its data (JSON as stored) spliced in
    unparsed."""
    return (f'{{"id":"{event_id}","type":{json.dumps(fields["type"])},'
            f'"version":{int(fields["version"])},"at":"{iso(recorded_at(event_id))}",'
            f'"data":{fields.get("data") or "null"}}}')


async def follow(client: AsyncRedis, key: str, after: str, *, keep_going: bool = True,
                 where: Where | None = None, fresh: bool = False
                 ) -> AsyncIterator[Event | None]:
    """Events after `after`: what is there, then, with `keep_going`, each as it comes and
    None every 15 s without one (for a keep-alive). Async, so a waiting stream holds a
    socket, not one of the server's threads."""
    async for batch in follow_raw(client, key, after, keep_going=keep_going, where=where,
                                  fresh=fresh):
        if batch is None:
            yield None
            continue
        for event_id, fields in batch:
            yield event_of(event_id, fields)
