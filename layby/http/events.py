"""A run's events over HTTP: the server-sent events of `GET /v1/runs/{id}/events`, and the
async follower the AG-UI endpoint reads too."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator

from layby.control import Runtime
from layby.control.connections import async_redis
from layby.parking import events
from layby.wire import FINAL_EVENTS, Event

# A stream entry id, as `Last-Event-ID` must give it; anything else breaks XREAD mid-stream.
EVENT_ID = re.compile(r"^\d{1,20}(-\d{1,20})?$")


async def run_events(rt: Runtime, run_id: str, after: str, follow: bool = True
                     ) -> AsyncIterator[Event | None]:
    """The run's events after `after`, then (with `follow`) as they come; None for a
    keep-alive. Its own async connection, closed when the stream ends."""
    key = rt.store.keys.events(run_id)
    async with async_redis(rt.settings) as client:
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
