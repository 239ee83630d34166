"""The gateway's drain, for rolling deployments: on SIGTERM (or SIGINT) it stops being ready
(`/readyz` answers 503, so a load balancer sends new requests elsewhere), and ends its open
event streams cleanly, each with a `retry` hint: clients reconnect with `Last-Event-ID`,
to a gateway that stays, and miss nothing. uvicorn, whose own handler runs next, stops
listening and lets the requests in flight finish; without the drain, a stream that never
ends would hold the process until it is killed.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

# What an ended stream tells its client: come back (to another gateway) after this long.
RETRY_MS = 500
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Drain:
    """One gateway's drain: set once, by a signal or by `start()`."""

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.draining = False

    def install(self) -> None:
        """Chain a handler before the process's own (uvicorn's) for SIGTERM and SIGINT.
        Only the main thread may (a gateway in a test's thread simply has no drain)."""
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in SIGNALS:
            previous = signal.getsignal(sig)
            signal.signal(sig, self._chained(previous))

    def _chained(self, previous: Any) -> Callable[[int, FrameType | None], None]:
        def handle(sig: int, frame: FrameType | None) -> None:
            self.start()
            if callable(previous):
                previous(sig, frame)
        return handle

    def start(self) -> None:
        self.draining = True
        if self._loop is not None and self._event is not None:
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait(self) -> None:
        """Return once the drain starts (never, in a gateway without one)."""
        if self._event is None:
            await asyncio.Future()
        else:
            await self._event.wait()


def retry_hint() -> bytes:
    """The last bytes of a stream ended by the drain (SSE's reconnection time)."""
    return f"retry: {RETRY_MS}\n\n".encode()
