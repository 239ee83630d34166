"""The measurements, against a running worker: layby interrupt cycles, bare Celery chains.

The runtime the measurements take is built from the bench's environment (its Redis, key
prefix and agent modules); the worker runs with the same environment.

Both measurements are closed loops with the same number of items in flight: a new run (or
chain) starts as soon as one finishes, until N have finished; throughput is N over the wall
time from the first start to the last finish.

The bench follows the runs' event streams with one `XREAD BLOCK` over all those in flight.
On a Redis or Valkey Cluster a command's keys must share a slot, and a run's stream is in
its shard's: there each run in flight is followed by a thread of its own, blocked on its
one stream (as the gateway follows a run for a client).

Times of a layby cycle come from the run's event stream. Every event's `at` is the Redis
server's clock (`TIME` inside the transition script, in ms), so the bench, the worker and
the server agree on one clock even when Redis runs on another machine.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from celery import chain

from bench import BenchError
from bench.agents import AGENT
from bench.tasks import hop
from layby.broker_config import JOBS, NOTIFY, TURNS
from layby.control import Runtime, commands
from layby.generation.interrupts import ResumeEntry
from layby.parking import Store, events
from layby.parking.events import recorded_at

# The queues of a layby worker (all but the sweep queue, as `layby up` runs it). Layby's
# steps and the baseline's hops both go to layby.turns.
WORKER_QUEUES = [TURNS, JOBS, NOTIFY]


@dataclass
class Cycle:
    """One run's event times (Redis server clock, ms) and how many tasks claimed it."""

    run_id: str
    created_at: int | None = None
    interrupted_at: int | None = None
    resuming_at: int | None = None  # the answer committed (answer script)
    resumed_at: int | None = None  # the resume task claimed the run (claim script)
    completed_at: int | None = None
    claims: int = 0  # `run.started` events: one per task that took a step of this run

    @property
    def answer_to_continuation_ms(self) -> int | None:
        if self.resuming_at is None or self.resumed_at is None:
            return None
        return self.resumed_at - self.resuming_at

    @property
    def cycle_ms(self) -> int | None:
        if self.created_at is None or self.completed_at is None:
            return None
        return self.completed_at - self.created_at


@dataclass
class LaybyOutcome:
    runs: int
    wall_s: float
    cycles: list[Cycle] = field(default_factory=list)

    @property
    def completed(self) -> int:
        return sum(1 for c in self.cycles if c.completed_at is not None)

    @property
    def per_s(self) -> float:
        return self.completed / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class ChainOutcome:
    chains: int
    hops: int
    wall_s: float
    completed: int

    @property
    def per_s(self) -> float:
        return self.completed / self.wall_s if self.wall_s > 0 else 0.0


def stream_items(reply: Any) -> list[tuple[str, list[tuple[str, dict[str, str]]]]]:
    if not reply:
        return []
    return list(reply.items()) if isinstance(reply, dict) else list(reply)  # RESP3 or RESP2


def layby_cycles(rt: Runtime, runs: int, in_flight: int, timeout_s: float, *,
                 lanes: bool = False) -> LaybyOutcome:
    """N runs of the bench agent; each is answered (in this process, through
    `control.commands.answer`, as the HTTP API would) as soon as it parks. `lanes`: follow
    each run with a read of its own, as on a cluster, where that is the only way."""
    store = rt.store
    if lanes or on_cluster(store):
        return _cycles_in_lanes(rt, runs, in_flight, timeout_s)
    streams: dict[str, str] = {}  # events key -> last id read
    active: dict[str, Cycle] = {}
    finished: list[Cycle] = []
    launched = 0
    started = time.perf_counter()
    last_progress = time.monotonic()
    while len(finished) < runs:
        while launched < runs and len(active) < in_flight:
            run_id = commands.new_run_id()
            commands.start_run(rt, AGENT, input=f"step {launched}", run_id=run_id)
            key = store.keys.events(run_id)
            streams[key] = "0-0"
            active[key] = Cycle(run_id)
            launched += 1
        reply = store.redis.xread(streams, count=100, block=500)
        items = stream_items(reply)
        if items:
            last_progress = time.monotonic()
        elif time.monotonic() - last_progress > timeout_s:
            raise BenchError(f"no layby run moved for {timeout_s} s; {len(finished)} of "
                             f"{runs} completed; waiting: "
                             f"{[c.run_id for c in active.values()][:5]}")
        for key, entries in items:
            cycle = active[key]
            done = False
            for event_id, fields in entries:
                streams[key] = max(streams[key], event_id, key=_stream_id)
                done = _on_event(rt, cycle, event_id, fields, streams, key) or done
            if done:
                finished.append(active.pop(key))
                del streams[key]
    return LaybyOutcome(runs, time.perf_counter() - started, finished)


def on_cluster(store: Store) -> bool:
    """Whether the store is on a cluster (redis-py's RedisCluster knows its nodes)."""
    return hasattr(store.redis, "nodes_manager")


def _cycles_in_lanes(rt: Runtime, runs: int, in_flight: int, timeout_s: float
                     ) -> LaybyOutcome:
    """`layby_cycles` on a cluster: `in_flight` threads, each starting a run, following its
    one stream until it completes (answering it when it parks), then the next."""
    store = rt.store
    numbers = iter(range(runs))
    lock = threading.Lock()
    finished: list[Cycle] = []
    failed: list[BaseException] = []

    def lane() -> None:
        while not failed:
            with lock:
                n = next(numbers, None)
            if n is None:
                return
            try:
                finished.append(_one_cycle(rt, store, n, timeout_s))
            except BaseException as exc:  # noqa: BLE001  (the first stops every lane)
                failed.append(exc)

    started = time.perf_counter()
    lanes = [threading.Thread(target=lane, name=f"bench lane {k}", daemon=True)
             for k in range(max(1, min(in_flight, runs)))]
    for thread in lanes:
        thread.start()
    for thread in lanes:
        thread.join()
    if failed:
        raise failed[0]
    return LaybyOutcome(runs, time.perf_counter() - started, finished)


def _one_cycle(rt: Runtime, store: Store, n: int, timeout_s: float) -> Cycle:
    run_id = commands.new_run_id()
    commands.start_run(rt, AGENT, input=f"step {n}", run_id=run_id)
    key = store.keys.events(run_id)
    streams = {key: "0-0"}
    cycle = Cycle(run_id)
    last_progress = time.monotonic()
    while True:
        # A second at most: a longer block would outlast the client's socket timeout.
        items = stream_items(events.wait(store.redis, key, streams[key], count=100,
                                         block_ms=1000))
        if items:
            last_progress = time.monotonic()
        elif time.monotonic() - last_progress > timeout_s:
            raise BenchError(f"layby run {run_id} did not move for {timeout_s} s")
        for _, entries in items:
            for event_id, fields in entries:
                streams[key] = max(streams[key], event_id, key=_stream_id)
                if _on_event(rt, cycle, event_id, fields, streams, key):
                    return cycle


def _stream_id(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)


def _on_event(rt: Runtime, cycle: Cycle, event_id: str, fields: dict[str, str],
              streams: dict[str, str], key: str) -> bool:
    """Note the event's time, answer an interrupt; True when the run is over. An answer
    follows the stream from after the events it wrote itself (as a client that follows a
    run's events from its own last write does): they are not read back."""
    kind, at = fields["type"], recorded_at(event_id)
    if kind == "run.created":
        cycle.created_at = at
    elif kind == "run.started":
        cycle.claims += 1
        data = json.loads(fields.get("data") or "{}")
        if data.get("from") == "resuming" and cycle.resumed_at is None:
            cycle.resumed_at = at
    elif kind == "run.interrupted":
        cycle.interrupted_at = at
        data = json.loads(fields["data"])
        entries = [ResumeEntry(interrupt_id=i["id"], status="resolved", payload=True)
                   for i in data.get("interrupts", [])]
        answered = commands.answer(rt, cycle.run_id, entries, by="bench", channel="bench")
        if answered.resumed and answered.event_id:
            # The `at` of the run.resuming it wrote (its last event): that event's id's time.
            cycle.resuming_at = recorded_at(answered.event_id)
            streams[key] = max(streams[key], answered.event_id, key=_stream_id)
    elif kind == "run.resuming":
        cycle.resuming_at = at
    elif kind == "run.completed":
        cycle.completed_at = at
        return True
    elif kind in ("run.failed", "run.cancelled"):
        raise BenchError(f"run {cycle.run_id} ended {kind}: {fields.get('data')}")
    return False


def celery_chains(store: Store, chains: int, hops: int, in_flight: int,
                  timeout_s: float) -> ChainOutcome:
    """N bare Celery chains of `hops` no-op tasks on layby's app, queue and worker."""
    if hops < 1:
        raise BenchError(f"a chain needs at least one hop, not {hops}")
    done_key = f"{store.config.prefix}:bench:done:{uuid.uuid4().hex}"

    def launch(n: int) -> None:
        links = [hop.si().set(queue=TURNS) for _ in range(hops - 1)]
        links.append(hop.si(done_key, str(n)).set(queue=TURNS))
        if len(links) == 1:
            links[0].apply_async()
        else:
            chain(*links).apply_async()

    launched = completed = 0
    started = time.perf_counter()
    last_progress = time.monotonic()
    while completed < chains:
        while launched < chains and launched - completed < in_flight:
            launch(launched)
            launched += 1
        got = store.redis.blpop([done_key], timeout=0.5)
        if got is None:
            if time.monotonic() - last_progress > timeout_s:
                raise BenchError(f"no Celery chain finished for {timeout_s} s; {completed} "
                                 f"of {chains} done")
            continue
        completed += 1 + len(store.redis.lpop(done_key, in_flight) or [])
        last_progress = time.monotonic()
    wall = time.perf_counter() - started
    store.redis.delete(done_key)
    return ChainOutcome(chains, hops, wall, completed)


def celery_latency(store: Store, tasks: int, timeout_s: float) -> list[int]:
    """Publish → start of N one-hop tasks, one at a time (ms, the Redis server's clock: read
    just before `apply_async`, and by the task as it starts)."""
    done_key = f"{store.config.prefix}:bench:latency:{uuid.uuid4().hex}"
    waits = []
    for _ in range(tasks):
        hop.si(done_key, None, store.now_ms()).set(queue=TURNS).apply_async()
        got = store.redis.blpop([done_key], timeout=timeout_s)
        if got is None:
            raise BenchError(f"a one-hop task did not start within {timeout_s} s")
        waits.append(int(got[1]))
    store.redis.delete(done_key)
    return waits


def split(total: int, parts: int) -> list[int]:
    """`total` runs as `parts` rounds (fewer when there are fewer runs), as even as can be."""
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def wait_for_worker(store: Store, alive: Any, timeout_s: float = 90.0) -> float:
    """Until the worker runs a task (one chain of one hop); returns the seconds it took."""
    started = time.monotonic()
    done_key = f"{store.config.prefix}:bench:ready:{uuid.uuid4().hex}"
    hop.si(done_key, "ready").set(queue=TURNS).apply_async()
    while not store.redis.blpop([done_key], timeout=0.5):
        if not alive():
            raise BenchError("the worker exited before it took a task")
        if time.monotonic() - started > timeout_s:
            raise BenchError(f"the worker took no task within {timeout_s} s")
    store.redis.delete(done_key)
    return time.monotonic() - started
