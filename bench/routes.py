"""What each request of a cycle costs the gateway (`--http`): its process's CPU by route,
one request at a time on one kept connection, so that nothing else the gateway serves is in
a route's figure.

Beside a cycle's routes (a start, a run read, an answer, a finished run's events) it takes
`GET /healthz` and `GET /v1/agents`: the first is the floor any request pays here (uvicorn,
the app's middleware, a thread, one PING), the second the same with the key checked and no
store. What a route costs above them is its own work: validation, the store's round
trips, JSON. Untimed: the figures are CPU, read from the gateway's process (`psutil`, in
clock ticks of 10 ms: over a few requests a figure is coarse).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx

from bench import BenchError
from bench.agents import AGENT
from bench.costs import process_cpu_us

# The report's names, in the order they are measured: the floor first, then a cycle's
# requests as it makes them (a run read stands for the reads a caller makes between).
HEALTHZ = "GET /healthz"
AGENTS = "GET /v1/agents"
START = "POST /v1/runs"
READ = "GET /v1/runs/{id}"
ANSWER = "POST /v1/runs/{id}/interrupts/{id}"
EVENTS = "GET /v1/runs/{id}/events"


def by_route(url: str, key: str, gateway_pid: int, n: int, timeout_s: float
             ) -> dict[str, Any]:
    """µs of the gateway's CPU a request, by route, over `n` requests of each; and how many
    events a finished run's stream sent (`events_per_stream`)."""
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, headers=headers, timeout=timeout_s) as http:
        spent: dict[str, float] = {}

        def timed(route: str, calls: list[Callable[[], httpx.Response]]) -> list[Any]:
            before = process_cpu_us(None, gateway_pid)["gateway"]
            replies = [_ok(route, call()) for call in calls]
            after = process_cpu_us(None, gateway_pid)["gateway"]
            spent[route] = round((after - before) / len(calls), 1)
            return replies

        timed(HEALTHZ, [lambda: http.get("/healthz")] * n)
        timed(AGENTS, [lambda: http.get("/v1/agents")] * n)
        started = timed(START, [_start(http, i) for i in range(n)])
        ids = [reply.json()["id"] for reply in started]
        timed(READ, [_read(http, run_id) for run_id in ids])
        parked = _wait_all(http, ids, "interrupted", timeout_s)
        timed(ANSWER, [_answer(http, run_id, view["interrupts"][0]["id"])
                       for run_id, view in zip(ids, parked, strict=True)])
        _wait_all(http, ids, "completed", timeout_s)
        streams = timed(EVENTS, [_events(http, run_id) for run_id in ids])
    events = sum(reply.text.count("\nevent: ") for reply in streams)  # after each `id:`
    return {"requests": n, "us_by_route": spent, "events_per_stream": round(events / n, 2)}


def _ok(route: str, reply: httpx.Response) -> httpx.Response:
    if reply.status_code >= 300:
        raise BenchError(f"{route} answered {reply.status_code}: {reply.text[:300]}")
    return reply


def _start(http: httpx.Client, i: int) -> Callable[[], httpx.Response]:
    # As the client starts a run: with an Idempotency-Key of its own.
    return lambda: http.post("/v1/runs", json={"agent": AGENT, "input": f"route {i}"},
                             headers={"Idempotency-Key": uuid.uuid4().hex})


def _read(http: httpx.Client, run_id: str) -> Callable[[], httpx.Response]:
    return lambda: http.get(f"/v1/runs/{run_id}")


def _answer(http: httpx.Client, run_id: str, interrupt_id: str
            ) -> Callable[[], httpx.Response]:
    return lambda: http.post(f"/v1/runs/{run_id}/interrupts/{interrupt_id}",
                             json={"status": "resolved", "payload": True},
                             headers={"Idempotency-Key": uuid.uuid4().hex})


def _events(http: httpx.Client, run_id: str) -> Callable[[], httpx.Response]:
    # A finished run's events, to the stream's end (`follow=false`): what writing events
    # costs, without a wait.
    return lambda: http.get(f"/v1/runs/{run_id}/events", params={"follow": "false"})


def _wait_all(http: httpx.Client, ids: list[str], status: str, timeout_s: float
              ) -> list[dict[str, Any]]:
    """Each run's view once it is in `status` (read between the timed passes)."""
    views = []
    for run_id in ids:
        deadline = time.monotonic() + timeout_s
        while (view := _ok(READ, http.get(f"/v1/runs/{run_id}")).json())["status"] != status:
            if view["status"] in ("failed", "cancelled") or time.monotonic() > deadline:
                raise BenchError(f"run {run_id} is {view['status']}, not {status}, after "
                                 f"the gateway's routes were measured: {view.get('error')}")
            time.sleep(0.01)
        views.append(view)
    return views
