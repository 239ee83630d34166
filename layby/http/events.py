"""A run's events over HTTP: the server-sent events of `GET /v1/runs/{id}/events`, and the
async follower the AG-UI endpoint reads too."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from layby.control import Runtime
from layby.control.connections import async_redis
from layby.http.drain import Drain, retry_hint
from layby.parking import events
from layby.parking.keys import DEFAULT_TENANT, Keys
from layby.wire import FINAL_EVENTS, Event

# A stream entry id, as `Last-Event-ID` must give it; anything else breaks XREAD mid-stream.
# Each part is at most 19 digits: Redis reads them as 64-bit numbers, and 20 digits can
# overflow (ids it makes have 13 and a few).
EVENT_ID = re.compile(r"^\d{1,19}(-\d{1,19})?$")


# A stream is not cached, nor held back by a proxy (nginx buffers replies unless told).
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class EventStreamResponse(StreamingResponse):
    """Server-sent events, streamed until they end or the client goes, whichever is first.
    Starlette's StreamingResponse races the two in an anyio task group; plain asyncio tasks
    do the same for less, which counts on a stream of a few short bursts (a run's cycle
    over HTTP is two requests and one such stream)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        streaming = asyncio.ensure_future(self.stream_response(sending))
        gone = asyncio.ensure_future(self.listen_for_disconnect(receive))
        app = scope.get("app")
        drain: Drain | None = getattr(getattr(app, "state", None), "drain", None)
        drained = asyncio.ensure_future(drain.wait() if drain else asyncio.Future())
        try:
            await asyncio.wait((streaming, gone, drained),
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Cancelled mid-read, the stream's Redis connection is dropped, not reused.
            for task in (streaming, gone, drained):
                task.cancel()
            await asyncio.gather(streaming, gone, drained, return_exceptions=True)
        if drained.done() and not drained.cancelled() and streaming.cancelled():
            # The gateway drains: the stream ends here, cleanly, and says when to come back
            # (with Last-Event-ID, to a gateway that stays).
            if not started:
                await send({"type": "http.response.start", "status": self.status_code,
                            "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": retry_hint(),
                        "more_body": False})
            return
        if not streaming.cancelled() and streaming.exception() is not None:
            raise streaming.exception()  # type: ignore[misc]
        if self.background is not None:
            await self.background()


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


async def _where(rt: Runtime, run_id: str) -> tuple[str, events.Where | None]:
    """The run's events key (the run moved first, while the store moves to the sharded
    layout: `Store.keys_of`), and, while it may still move (a store in the legacy layout),
    how to find it again."""
    store = rt.store
    keys = await _keys_of(rt, run_id)
    if keys.shard_count is not None:  # the sharded layout: it stays there
        return keys.events(run_id), None

    async def where() -> str:
        return (await asyncio.to_thread(store.keys_of, run_id)).events(run_id)

    return keys.events(run_id), where


async def _keys_of(rt: Runtime, run_id: str) -> Keys:
    """`Store.keys_of`, on a thread only when it may take a round trip."""
    settled = rt.store.settled_keys()
    return settled if settled is not None else await asyncio.to_thread(rt.store.keys_of, run_id)


async def run_tenant(rt: Runtime, run_id: str) -> str | None:
    """The run's tenant, or None when it is not there (unknown, or past retention)."""
    client = await _client(rt)
    keys = await _keys_of(rt, run_id)
    agent, tenant = await client.hmget(keys.run(run_id), ["agent", "tenant"])
    return None if agent is None else str(tenant or DEFAULT_TENANT)


async def run_events(rt: Runtime, run_id: str, after: str, follow: bool = True, *,
                     fresh: bool = False) -> AsyncIterator[Event | None]:
    """The run's events after `after`, then (with `follow`) as they come; None for a
    keep-alive. `fresh`: the request started the run (`parking.events.follow_raw`)."""
    key, where = await _where(rt, run_id)
    client = await _client(rt)
    async for event in events.follow(client, key, after, keep_going=follow, where=where,
                                     fresh=fresh):
        yield event


async def sse(rt: Runtime, run_id: str, after: str, follow: bool, *, fresh: bool = False
              ) -> AsyncIterator[bytes]:
    """Server-sent events from the run's stream: replay, then follow until the run ends.
    Each entry is written as it is stored (its data is not parsed and written again).
    `fresh`: the request started the run (`parking.events.follow_raw`)."""
    client = await _client(rt)
    key, where = await _where(rt, run_id)
    async for batch in events.follow_raw(client, key, after, keep_going=follow,
                                         where=where, fresh=fresh):
        if batch is None:
            yield b": keep-alive\n\n"
            continue
        # What one read found goes out in one write.
        out, final = [], False
        for event_id, fields in batch:
            kind = fields["type"]
            out.append(f"id: {event_id}\nevent: {kind}\n"
                       f"data: {events.wire_json(event_id, fields)}\n\n")
            if kind in FINAL_EVENTS:
                final = True
                break
        yield "".join(out).encode()
        if final:
            return
