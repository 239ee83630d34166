"""A run's event stream (a capped Redis Stream the transition scripts append to), read in one
place: entries as `Event`s, a page of them, the newest park, and an async follower for
server-sent events and AG-UI.

The events of a step (`turn.committed`, `run.interrupted`, `run.completed`) say where its
messages are in the run's history (`from`, `historyTo`). A park's event is stored without
them, and so are the earlier steps' events of a parked run (park_run.lua): the history is
held once, in the run. Every reader here fills them in from the history as it is when read
(a resume's rewrite of the parked model message included), so what a reader gets has
`messages`, as an event always did."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from layby.parking.clock import iso
from layby.wire import Event

KEEP_ALIVE_MS = 15_000


# The events that carry a step's messages, or say where they are in the history.
STEP_EVENTS = frozenset({"turn.committed", "run.interrupted", "run.completed"})


def _without_messages(fields: dict[str, str]) -> bool:
    data = fields.get("data") or ""
    return (fields.get("type") in STEP_EVENTS and '"historyTo"' in data
            and '"messages"' not in data)


def run_key(events_key: str) -> str:
    """The run's hash beside its events (`<prefix>:{<run id>}:events`, parking.keys)."""
    return events_key.removesuffix(":events") + ":run"


def _filled(fields: dict[str, str], history: list[Any]) -> dict[str, str]:
    data = json.loads(fields["data"])
    data["messages"] = history[int(data["from"]):int(data["historyTo"])]
    return {**fields, "data": json.dumps(data, separators=(",", ":"), ensure_ascii=False)}


def _with_messages(found: list[tuple[str, dict[str, str]]], history: str | None
                   ) -> list[tuple[str, dict[str, str]]]:
    messages = json.loads(history) if history else []
    return [(eid, _filled(fields, messages) if _without_messages(fields) else fields)
            for eid, fields in found]


def fill(client: Redis, key: str, found: list[tuple[str, dict[str, str]]]
         ) -> list[tuple[str, dict[str, str]]]:
    """Entries as read, those stored without their messages given them from the history
    (one read of it, only when some need it)."""
    if not any(_without_messages(fields) for _, fields in found):
        return found
    return _with_messages(found, client.hget(run_key(key), "messages"))


async def fill_async(client: AsyncRedis, key: str, found: list[tuple[str, dict[str, str]]]
                     ) -> list[tuple[str, dict[str, str]]]:
    """`fill`, on an async client."""
    if not any(_without_messages(fields) for _, fields in found):
        return found
    return _with_messages(found, await client.hget(run_key(key), "messages"))


def recorded_at(event_id: str, fields: dict[str, str]) -> int:
    """When the event was written (ms): its id's time (an entry of an older layby says it
    in its `at` field too)."""
    return int(fields.get("at") or event_id.partition("-")[0])


def event_of(event_id: str, fields: dict[str, str]) -> Event:
    return Event(id=event_id, type=fields["type"], version=int(fields["version"]),
                 at=iso(recorded_at(event_id, fields)),
                 data=json.loads(fields.get("data") or "null"))


def read(client: Redis, key: str, after: str = "0-0", *, block_ms: int | None = None,
         count: int = 500) -> list[Event]:
    """Events after `after` (a stream id); with `block_ms`, wait that long for one."""
    if block_ms is None:
        found = client.xrange(key, f"({after}" if after != "0-0" else "-", "+", count)
    else:
        reply: Any = client.xread({key: after}, count=count, block=block_ms)
        found = reply[0][1] if reply else []
    return [event_of(eid, fields) for eid, fields in fill(client, key, found)]


def last_park(client: Redis, key: str, interrupt_ids: set[str] | None = None) -> Event | None:
    """The newest `run.interrupted` event (that parked on one of `interrupt_ids`)."""
    upper = "+"
    while True:
        batch = client.xrevrange(key, max=upper, min="-", count=200)
        for event_id, fields in batch:
            if fields.get("type") == "run.interrupted":
                ids = {i["id"] for i in json.loads(fields["data"]).get("interrupts", [])}
                if interrupt_ids is None or ids & interrupt_ids:
                    # Only the park looked for reads the history for its messages.
                    return event_of(event_id, fill(client, key, [(event_id, fields)])[0][1])
        if len(batch) < 200:
            return None
        upper = f"({batch[-1][0]}"


async def follow_raw(client: AsyncRedis, key: str, after: str, *, keep_going: bool = True
                     ) -> AsyncIterator[list[tuple[str, dict[str, str]]] | None]:
    """`follow`, a batch at a time (what one read found), each entry as the stream holds
    it: (id, fields), its data unparsed."""
    while True:
        reply = await client.xread({key: after}, count=500,
                                   block=KEEP_ALIVE_MS if keep_going else None)
        batch = reply[0][1] if reply else []
        if not batch:
            if not keep_going:
                return
            yield None
            continue
        after = batch[-1][0]
        yield await fill_async(client, key, batch)


def wire_json(event_id: str, fields: dict[str, str]) -> str:
    """An entry as `Event.wire()` writes it, with its data (JSON as stored) spliced in
    unparsed."""
    return (f'{{"id":"{event_id}","type":{json.dumps(fields["type"])},'
            f'"version":{int(fields["version"])},"at":"{iso(recorded_at(event_id, fields))}",'
            f'"data":{fields.get("data") or "null"}}}')


async def follow(client: AsyncRedis, key: str, after: str, *, keep_going: bool = True
                 ) -> AsyncIterator[Event | None]:
    """Events after `after`: what is there, then, with `keep_going`, each as it comes and
    None every 15 s without one (for a keep-alive). Async, so a waiting stream holds a
    socket, not one of the server's threads."""
    async for batch in follow_raw(client, key, after, keep_going=keep_going):
        if batch is None:
            yield None
            continue
        for event_id, fields in batch:
            yield event_of(event_id, fields)
