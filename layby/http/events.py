"""A run's events over HTTP: the server-sent events of `GET /v1/runs/{id}/events`, and the
async follower the AG-UI endpoint reads too."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

from layby.control import Runtime
from layby.control.connections import async_redis
from layby.parking import events
from layby.wire import FINAL_EVENTS, Event

# A stream entry id, as `Last-Event-ID` must give it; anything else breaks XREAD mid-stream.
# Each part is at most 19 digits: Redis reads them as 64-bit numbers, and 20 digits can
# overflow (ids it makes have 13 and a few).
EVENT_ID = re.compile(r"^\d{1,19}(-\d{1,19})?$")


# One async client per runtime and event loop, shared by every stream the gateway follows:
# a waiting stream holds one of its pool's connections, and gives it back when it ends
# (a new connection per stream costs more than the stream's own reads).
_clients: dict[tuple[int, int], tuple[asyncio.AbstractEventLoop, Any, AsyncExitStack]] = {}


async def _client(rt: Runtime) -> Any:
    loop = asyncio.get_running_loop()
    key = (id(rt), id(loop))
    found = _clients.get(key)
    if found is None or found[0] is not loop:
        stack = AsyncExitStack()
        client = await stack.enter_async_context(async_redis(rt.settings))
        found = _clients[key] = (loop, client, stack)
    return found[1]


async def close_clients(rt: Runtime) -> None:
    """Close the runtime's shared client on this event loop (the app's shutdown)."""
    found = _clients.pop((id(rt), id(asyncio.get_running_loop())), None)
    if found is not None:
        await found[2].aclose()


async def run_events(rt: Runtime, run_id: str, after: str, follow: bool = True
                     ) -> AsyncIterator[Event | None]:
    """The run's events after `after`, then (with `follow`) as they come; None for a
    keep-alive."""
    key = rt.store.keys.events(run_id)
    client = await _client(rt)
    async for event in events.follow(client, key, after, keep_going=follow):
        yield event


async def sse(rt: Runtime, run_id: str, after: str, follow: bool) -> AsyncIterator[bytes]:
    """Server-sent events from the run's stream: replay, then follow until the run ends."""
    async for event in run_events(rt, run_id, after, follow):
        if event is None:
            yield b": keep-alive\n\n"
            continue
        data = json.dumps(event.wire(), separators=(",", ":"))
        yield f"id: {event.id}\nevent: {event.type}\ndata: {data}\n\n".encode()
        if event.type in FINAL_EVENTS:
            return
