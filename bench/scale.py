"""Parked runs at scale (`--parked N[,M…]`): park runs with the product's own start path,
then measure what must not grow with their number: an answer, a page of the list (the
first, one deep in, all states at once), a park, and the memory each parked run takes.

Runs are started through `control.commands.start_run`, many at once (a thread pool), and
parked by the bench's worker; a level is reached when the index of interrupted runs holds
that many. Memory per parked run is the server's `used_memory` grown while a level's runs
were parked, over their number; `MEMORY USAGE` of a sample splits it by key.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench import BenchError
from bench.agents import AGENT, ANNOUNCED
from bench.hooks import Sink
from bench.report import distribution
from layby.broker_config import DELIVER_TASK
from layby.control import Runtime, commands
from layby.generation.interrupts import ResumeEntry
from layby.parking import Store
from layby.parking.registries import cursor_of
from layby.wire import Status

SAMPLES = 200  # timed calls of each kind a level


def park(rt: Runtime, count: int, timeout_s: float, agent: str = AGENT) -> None:
    """Start `count` runs of `agent` and wait until they are all parked."""
    store = rt.store
    index = store.runs.of[Status.INTERRUPTED]
    target = index.count() + count

    def start(i: int) -> None:
        commands.start_run(rt, agent, input=f"parked {i}")

    with ThreadPoolExecutor(max_workers=8) as pool:
        for done in pool.map(start, range(count), chunksize=256):
            del done
    last, last_change = index.count(), time.monotonic()
    while last < target:
        time.sleep(0.5)
        now = index.count()
        if now != last:
            last, last_change = now, time.monotonic()
        elif time.monotonic() - last_change > timeout_s:
            raise BenchError(f"parking stalled at {now} of {target} interrupted runs")


def agent_for(sink: Sink | None) -> str:
    """The agent parked: with a sink, the one that announces its question to it."""
    return ANNOUNCED if sink is not None else AGENT


PROBE_PARKS = 600  # runs parked, timed, at each level
# Each timing is taken this many times at a level, and the middle one kept: on two shared
# cores a burst of something else (a worker warming up, the server's background work) can
# slow one of them by half, which says nothing about the level.
REPEATS = 3


def timed_park(rt: Runtime, count: int, timeout_s: float, agent: str,
               sink: Sink | None = None) -> float:
    """Parks per second of `count` more runs, the middle of REPEATS batches (each started
    at once and parked by the worker, its announcements delivered before the next)."""
    rates = []
    for batch in _split(count, REPEATS):
        sent = sum(sink.ids.values()) if sink else 0
        started = time.perf_counter()
        park(rt, batch, timeout_s, agent)
        rates.append(batch / (time.perf_counter() - started))
        if sink is not None:
            _delivered(sink, sent + batch, timeout_s)
    return round(statistics.median(rates), 1) if rates else 0.0


def _split(count: int, parts: int) -> list[int]:
    return [n for i in range(parts) if (n := count // parts + (i < count % parts))]


def deliveries_done(rt: Runtime) -> int:
    """`layby.notify.deliver` tasks the workers have run (their own count)."""
    stats = rt.celery.control.inspect(timeout=5).stats() or {}
    return sum(int(s.get("total", {}).get(DELIVER_TASK, 0)) for s in stats.values())


def level(rt: Runtime, wanted: int, timeout_s: float, sink: Sink | None = None
          ) -> dict[str, Any]:
    """Park runs until `wanted` are parked (the last PROBE_PARKS of them timed), then
    measure memory and probe answers and lists. With `sink`, parked runs are announced
    to it: every announcement must be delivered, and queued, exactly once."""
    store = rt.store
    agent = agent_for(sink)
    have = store.runs.of[Status.INTERRUPTED].count()
    sent_before = sum(sink.ids.values()) if sink else 0
    tasks_before = deliveries_done(rt) if sink else 0
    used_before = int(store.redis.info("memory")["used_memory"])
    bulk = max(0, wanted - have - PROBE_PARKS)
    if bulk:
        park(rt, bulk, timeout_s, agent)
        if sink is not None:  # the timed parks do not wait behind the bulk's deliveries
            _delivered(sink, sent_before + bulk, timeout_s)
    # The sweeper folds each park's events LAYBY_FOLD_EVENTS_AFTER_S later: done with the
    # bulk's first, so the timed parks do not share the cores with the folds of thousands
    # of bulk parks at one level and of a few hundred at another.
    folded(store, timeout_s)
    persisted(store)
    parks_per_s = timed_park(rt, max(0, wanted - have - bulk), timeout_s, agent, sink)
    folded(store, timeout_s)
    persisted(store)
    used_after = int(store.redis.info("memory")["used_memory"])
    added = max(0, wanted - have)
    announced = _announced(rt, sink, added, sent_before, tasks_before, timeout_s) \
        if sink else {}
    sample = [run_id for run_id, _ in store.runs.newest(Status.INTERRUPTED, 50)]
    history = history_bytes(store, sample)
    per_run = memory_per_run(used_before, used_after, added)
    by_key = breakdown(store, sample)
    index = store.runs.of[Status.INTERRUPTED]
    in_index = (store.redis.memory_usage(index.key, samples=0) or 0) / max(1, index.count())
    figures = {"level": wanted, "parks_per_s": parks_per_s, **announced,
               # The server's own growth (meaningful with many runs: small levels drown in
               # what else the server holds and frees), and the sum of a sample's keys.
               "memory_per_parked_run": per_run,
               "memory_of_keys_per_run": round(sum(by_key.values()) + in_index, 1),
               "history_bytes": history,
               "memory_budget": round(1.5 * history + 1024, 1),
               "memory_by_key": {**by_key, "index": round(in_index, 1)}}
    persisted(store)
    return {**figures, **_middle([probe(rt) for _ in range(REPEATS)])}


def _middle(probes: list[dict[str, Any]]) -> dict[str, Any]:
    """Of each timing the probes took, the one with the middle p50 (an answer's time to
    completed comes from the same probe as the answer's)."""
    kept = dict(probes[0])
    for key, value in kept.items():
        if key != "answer_to_completed_ms" and isinstance(value, dict) and "p50" in value:
            took = sorted((p for p in probes if p.get(key)), key=lambda p: p[key]["p50"])
            middle = took[len(took) // 2]
            kept[key] = middle[key]
            if key == "answer_ms":
                kept["answer_to_completed_ms"] = middle["answer_to_completed_ms"]
    return kept


def folded(store: Store, timeout_s: float) -> None:
    """Until the sweeper has folded the events of every parked run (LAYBY_FOLD_EVENTS_AFTER_S
    after its park): what a parked run holds for as long as it waits, not in its first
    seconds."""
    index = store.keys.index(Status.INTERRUPTED)
    deadline = time.monotonic() + store.config.fold_after_ms / 1000 + timeout_s
    while time.monotonic() < deadline:
        newest = store.redis.zrevrange(index, 0, 0, withscores=True)
        cursor = store.redis.get(store.keys.fold_cursor)
        if not newest or (cursor is not None and int(cursor) >= int(newest[0][1])):
            return
        time.sleep(0.5)
    raise BenchError(f"the sweeper did not fold the parked runs' events in {timeout_s} s "
                     f"past LAYBY_FOLD_EVENTS_AFTER_S")


def persisted(store: Store, timeout_s: float = 300) -> None:
    """Until the server has no append-only file rewrite or snapshot under way: parking tens
    of thousands of runs grows the file past the rewrite threshold, and a rewrite of
    hundreds of megabytes takes one of the two cores for a while. What is measured next
    is the cost of what is parked, not of that rewrite (which a server does now and then
    however many runs are parked)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = store.redis.info("persistence")
        if not (int(info.get("aof_rewrite_in_progress", 0))
                or int(info.get("rdb_bgsave_in_progress", 0))
                or int(info.get("aof_rewrite_scheduled", 0))):
            return
        time.sleep(0.5)


def _announced(rt: Runtime, sink: Sink, added: int, sent_before: int, tasks_before: int,
               timeout_s: float) -> dict[str, Any]:
    """Wait for the announcements of `added` parks to be delivered; count what ran."""
    _delivered(sink, sent_before + added, timeout_s)
    time.sleep(2)  # anything queued twice would run by now
    delivered = sum(sink.ids.values()) - sent_before
    tasks = deliveries_done(rt) - tasks_before
    return {"announcements": added, "deliveries": delivered, "delivery_tasks": tasks,
            "duplicate_tasks": tasks - added, "notify_queue_after": rt.store.redis.llen(
                rt.store.config.messages["deliver"][0]) if rt.store.config.messages else None}


def _delivered(sink: Sink, total: int, timeout_s: float) -> None:
    """Until the sink has taken `total` deliveries, or nothing new came for `timeout_s`."""
    last, last_change = -1, time.monotonic()
    while (now := sum(sink.ids.values())) < total:
        if now != last:
            last, last_change = now, time.monotonic()
        elif time.monotonic() - last_change > timeout_s:
            raise BenchError(f"{now} of {total} announcements delivered; none for "
                             f"{timeout_s} s")
        time.sleep(0.2)


def memory_per_run(before: int, after: int, runs: int) -> float:
    return round((after - before) / runs, 1) if runs else 0.0


def breakdown(store: Store, sample: list[str]) -> dict[str, float]:
    """Mean bytes per parked run by key (`MEMORY USAGE`), over `sample`."""
    parts = {"run": store.keys.run, "interrupts": store.keys.interrupts,
             "answers": store.keys.answers, "events": store.keys.events,
             "notifications": store.keys.notifications, "review": store.keys.review}
    pipe = store.redis.pipeline(transaction=False)
    for run_id in sample:
        for key_of in parts.values():
            pipe.memory_usage(key_of(run_id), samples=0)
    found = pipe.execute()
    totals = dict.fromkeys(parts, 0)
    for i, value in enumerate(found):
        totals[list(parts)[i % len(parts)]] += value or 0
    return {k: round(v / max(1, len(sample)), 1) for k, v in totals.items() if v}


def history_bytes(store: Store, sample: list[str]) -> float:
    """Mean size of the sample's serialized histories (the `messages` JSON as stored)."""
    pipe = store.redis.pipeline(transaction=False)
    for run_id in sample:
        pipe.hstrlen(store.keys.run(run_id), "messages")
    sizes = pipe.execute()
    return round(sum(sizes) / max(1, len(sizes)), 1)


def probe(rt: Runtime) -> dict[str, Any]:
    """Times (ms) of list pages at the top and deep in, and of answers (and from each
    answer until its run completed on the worker), on what is parked now."""
    store = rt.store
    index = store.runs.of[Status.INTERRUPTED]
    parked = index.count()
    deep = store.redis.zrevrange(index.key, parked // 2, parked // 2, withscores=True)
    deep_cursor = cursor_of(deep[0][0], int(deep[0][1])) if deep else None

    def timed(call: Any) -> float:
        started = time.perf_counter()
        call()
        return (time.perf_counter() - started) * 1000

    first = [timed(lambda: store.list_page(Status.INTERRUPTED, limit=50))
             for _ in range(SAMPLES)]
    middle = [timed(lambda: store.list_page(Status.INTERRUPTED, limit=50, cursor=deep_cursor))
              for _ in range(SAMPLES)]
    every = [timed(lambda: store.list_page(None, limit=50)) for _ in range(SAMPLES)]
    # Answer parked runs taken from deep in the index, each once, at rest: each answered
    # run resumes and finishes on the worker before the next answer, so an answer's time
    # is its own, not a share of the cores with the resumes of the answers before it
    # (those are timed apart: answer → completed).
    victims = [run_id for run_id, _ in store.runs.newest(Status.INTERRUPTED, SAMPLES,
                                                         offset=parked // 3)]
    answers, resumes = answer_at_rest(rt, victims)
    return {"parked": parked,
            "list_first_page_ms": distribution(first),
            "list_deep_page_ms": distribution(middle),
            "list_all_states_ms": distribution(every),
            "answer_ms": distribution(answers) if answers else None,
            "answer_to_completed_ms": distribution(resumes) if resumes else None}


def answer_at_rest(rt: Runtime, run_ids: list[str]) -> tuple[list[float], list[float]]:
    """Answer each parked run, one at a time, and wait for it to complete: the ms each
    answer took, and from each answer until its run completed."""
    answers, resumes = [], []
    for run_id in run_ids:
        view = rt.store.view(run_id)
        if view is None or not view.open_interrupts:
            continue
        entries = [ResumeEntry(interrupt_id=i.id, status="resolved", payload=True)
                   for i in view.open_interrupts]
        started = time.perf_counter()
        commands.answer(rt, run_id, entries, by="bench", channel="bench")
        answers.append((time.perf_counter() - started) * 1000)
        resumes.append(_until_completed(rt.store, run_id, started))
    return answers, resumes


def finished_first(rt: Runtime, timeout_s: float, sink: Sink | None) -> None:
    """Before the levels, SAMPLES runs parked, answered and completed: a page of all states
    then merges the same states at every level (the first level's would otherwise find no
    finished runs, and read less than the deeper ones)."""
    sent = sum(sink.ids.values()) if sink else 0
    park(rt, SAMPLES, timeout_s, agent_for(sink))
    if sink is not None:
        _delivered(sink, sent + SAMPLES, timeout_s)
    answer_at_rest(rt, [run_id for run_id, _ in rt.store.runs.newest(Status.INTERRUPTED,
                                                                       SAMPLES)])


def _until_completed(store: Store, run_id: str, started: float, timeout_s: float = 30
                     ) -> float:
    """Ms from `started` until the run is completed (its resume and last turn done)."""
    key = store.keys.run(run_id)
    deadline = started + timeout_s
    while store.redis.hget(key, "status") != Status.COMPLETED.value:
        if time.perf_counter() > deadline:
            raise BenchError(f"answered run {run_id} did not complete in {timeout_s} s")
        time.sleep(0.0005)
    return (time.perf_counter() - started) * 1000
