"""The same cycles through the gateway (`--http`): the bench starts a gateway process
(uvicorn, as `layby gateway` runs it) on loopback and drives each cycle with
`layby.AsyncClient`, as a service would: start the run and follow its event stream in one
request (`AsyncClient.stream`: SSE, no polling) until it parks, answer, follow it until it
completes. Figure: completed cycles
over wall time, beside the direct path's measured in the same run.

The client's transport (`--http-transport`): aiohttp's (`layby.client.aiohttp_transport`,
the `aiohttp` extra) when it is installed, as a service that makes many requests would
choose it; else httpx's own.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from bench import BenchError
from bench.agents import AGENT
from layby import AsyncClient
from layby.client import aiohttp_transport


def default_transport() -> str:
    """aiohttp's when the `aiohttp` extra is installed, else httpx's."""
    try:
        import httpx_aiohttp  # noqa: F401
    except ImportError:
        return "httpx"
    return "aiohttp"


@dataclass
class HttpOutcome:
    runs: int
    completed: int
    wall_s: float

    @property
    def per_s(self) -> float:
        return self.completed / self.wall_s if self.wall_s > 0 else 0.0


async def _cycle(client: AsyncClient, n: int) -> bool:
    completed = False
    # Started and followed in one request; read to the stream's end (it ends after the
    # run's last event): the connection is kept for the next request.
    async with client.stream(AGENT, input=f"http {n}") as run:
        async for event in run:
            if event.type == "run.interrupted":
                for intr in event.data.get("interrupts", []):
                    await client.answer(run.id, intr["id"], True)
            elif event.type == "run.completed":
                completed = True
            elif event.type in ("run.failed", "run.cancelled"):
                raise BenchError(f"run {run.id} ended {event.type} over HTTP: {event.data}")
    return completed


async def _cycles(url: str, key: str, runs: int, in_flight: int, timeout_s: float,
                  transport: str) -> HttpOutcome:
    async with AsyncClient(url, key, transport=(
            aiohttp_transport() if transport == "aiohttp" else None)) as client:
        queue = iter(range(runs))
        done = 0

        async def lane() -> None:
            nonlocal done
            for n in queue:
                if await asyncio.wait_for(_cycle(client, n), timeout_s):
                    done += 1

        started = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(in_flight)))
        return HttpOutcome(runs, done, time.perf_counter() - started)


def cycles(url: str, key: str, runs: int, in_flight: int, timeout_s: float,
           transport: str) -> HttpOutcome:
    """N cycles over HTTP, `in_flight` at once, on uvloop when it is there (as uvicorn
    runs the gateway, and as a service would run its client)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_cycles(url, key, runs, in_flight, timeout_s, transport))
    return uvloop.run(_cycles(url, key, runs, in_flight, timeout_s, transport))
