"""Parked runs at scale (`--parked N[,M…]`): park runs with the product's own start path,
then measure what must not grow with their number: an answer, a page of the list (the
first, one deep in, all states at once), a park, and the memory each parked run takes.

Each level is a site of its own: its own server (unless the bench was given one), worker,
sweeper and webhook reviewer. The sites are parked up to their levels one after the other,
then measured side by side: in turns, each site in ABBA order parks a timed batch and is
probed (lists, then as many answers), and each timing at the deepest level is compared
with the first level's taken in the same turn, seconds apart. On two shared cores the
machine's own speed drifts by tens of percent from one minute to the next (another
tenant, the host), and parking 100,000 runs takes a quarter of an hour: levels measured
one after the other compare two moments of the machine, not two levels.

A level is built by taking each of its runs from its start to its park in the bench
process (`fill`: the product's start, the worker's own step code, the store's transitions;
what a run holds is what the worker would have stored), about three times as fast as the
worker parks them; with `burst`, the runs are started through
`control.commands.start_run`, many at once (a thread pool), and parked by the site's worker,
as a burst of starts from a service would be (its announcements delivered by the worker to
the webhook): slower, and it measures the burst itself (copies of step messages, each
announcement queued once). Either way the timed parks of the turns go through the worker.
Memory per parked run is the server's `used_memory` grown while a level's runs were
parked, over their number; `MEMORY USAGE` of a sample splits it by key.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bench import BenchError, fill
from bench.agents import AGENT, ANNOUNCED
from bench.hooks import Sink
from bench.measure import stream_items
from bench.report import distribution
from layby.broker_config import DELIVER_TASK
from layby.control import Runtime, commands
from layby.generation.interrupts import ResumeEntry
from layby.parking import Store, events
from layby.parking.keys import ShardKeys
from layby.parking.registries import cursor_of
from layby.wire import Status

SAMPLES = 200  # timed list calls of each kind a turn
PARK_BATCH = 200  # runs parked (timed) and runs answered a turn, at most
PARK_CHUNKS = 4  # a turn's parks, in chunks taken at each site in turn
TURNS = 5  # turns of each site; the figure of a level is the middle one
# Runs built before memory is first read: the builder's scripts (its store's, which queue
# nothing) are then in the server's script cache, not counted against the level's runs.
FILL_FIRST = 8
TIMINGS = ("list_first_page_ms", "list_deep_page_ms", "list_all_states_ms", "answer_ms",
           "answer_to_completed_ms")


@dataclass
class Site:
    """One level: the runtime on its own server and prefix, and its reviewer (None: the
    parked runs announce nothing)."""

    level: int
    rt: Runtime
    sink: Sink | None = None
    worker: str = ""  # the site's worker's node name: its counts are asked of it alone
    burst: bool = False  # built by starts through the worker, not by `fill`
    parks: int = 0  # runs parked here by the worker (each announced to the sink once)
    filled: int = 0  # runs parked here by `fill` (their announcements recorded as sent)
    sent_before: int = 0
    tasks_before: int = 0
    built: dict[str, Any] = field(default_factory=dict)  # memory, measured once built
    turns: list[dict[str, Any]] = field(default_factory=list)

    @property
    def store(self) -> Store:
        return self.rt.store

    @property
    def agent(self) -> str:
        """The agent parked: with a sink, the one that announces its question to it."""
        return ANNOUNCED if self.sink is not None else AGENT

    def sent(self) -> int:
        return sum(self.sink.ids.values()) if self.sink is not None else 0


def side_by_side(sites: list[Site], timeout_s: float,
                 samples: int = SAMPLES) -> list[dict[str, Any]]:
    """Build every site up to its level, then measure them in turns, `samples` timed list
    calls of each kind a turn; the figures of each level, in the order of `sites`
    (smallest level first)."""
    for site in sites:
        build_up(site, timeout_s)
    # One batch for all (a quarter of the smallest level, at most PARK_BATCH): parks/s of
    # 200 runs started at once and of 15 are not alike.
    batch = max(1, min(PARK_BATCH, min(site.level for site in sites) // 4))
    # (The sweeper folds a turn's parks 30 s later, during a later turn: at every site
    # alike.)
    for i in range(TURNS):
        order = sites if i % 2 == 0 else sites[::-1]
        parks = timed_parks(order, batch, timeout_s)
        _rewrites_done(sites)
        for site, rate, found in zip(order, parks, probe(order, batch, samples),
                                     strict=True):
            site.turns.append({"parks_per_s": rate, **found})
    return [figures(site, timeout_s) for site in sites]


def _rewrites_done(sites: list[Site]) -> None:
    """No server's append-only file rewrite shares the cores with what is timed next."""
    for site in sites:
        persisted(site.store)


def build_up(site: Site, timeout_s: float) -> None:
    """Park the site's runs up to its level (after SAMPLES parked, answered and completed:
    a page of all states then merges the same states at every level), then measure the
    memory they take, once the sweeper has folded their events into their hashes
    (LAYBY_FOLD_EVENTS_AFTER_S after each park: what a parked run holds for as long as it
    waits, not in its first seconds). The level's runs are built by `fill`, or with
    `site.burst`, started all at once and parked by the worker."""
    store = site.store
    site.sent_before, site.tasks_before = site.sent(), deliveries_done(site.rt, site.worker)
    finished = min(SAMPLES, site.level)
    _park_announced(site, finished, timeout_s)
    answer_at_rest(site.rt, [run_id for run_id, _
                             in store.all_runs.newest(Status.INTERRUPTED, finished)])
    if not site.burst:
        _filled(site, min(FILL_FIRST, site.level - store.all_runs.count(Status.INTERRUPTED)))
    have = store.all_runs.count(Status.INTERRUPTED)
    used_before, rss_before = _memory(store)
    started = time.monotonic()
    if site.burst:
        _park_announced(site, max(0, site.level - have), timeout_s)
    else:
        _filled(site, max(0, site.level - have))
    took = time.monotonic() - started
    folded(store, timeout_s)
    persisted(store)
    parked = store.all_runs.count(Status.INTERRUPTED)
    added = parked - have
    used_after, rss_after = _memory(store)
    sample = [run_id for run_id, _ in store.all_runs.newest(Status.INTERRUPTED, 50)]
    history = history_bytes(store, sample)
    by_key = breakdown(store, sample)
    in_index = sum(store.redis.memory_usage(shard.keys.index(Status.INTERRUPTED), samples=0)
                   or 0 for shard in store.shards) / max(1, parked)
    site.built = {
        "level": site.level, "parked": parked, "redis_url": site.rt.settings.redis_url,
        # How the level's runs were parked, and how fast (their events folded after).
        "built_by": "starts through the worker" if site.burst else "fill",
        "built_per_s": round(added / took, 1) if took > 0 else None,
        # The server's own growth (meaningful with many runs: small levels drown in what
        # else the server holds and frees), and the sum of a sample's keys.
        "memory_per_parked_run": memory_per_run(used_before, used_after, added),
        "memory_of_keys_per_run": round(sum(by_key.values()) + in_index, 1),
        # What the machine gives the server for them: the allocator's own overhead and
        # the fragmentation of its heap included.
        "rss_per_parked_run": memory_per_run(rss_before, rss_after, added),
        "history_bytes": history,
        "memory_budget": round(1.5 * history + 1024, 1),
        "memory_by_key": {**by_key, "index": round(in_index, 1)}}


def figures(site: Site, timeout_s: float) -> dict[str, Any]:
    """The level's figures: what it was built with, each timing from the turn with the
    middle p50 (and every turn's p50), every announcement delivered and queued once."""
    out = dict(site.built)
    rates = [t["parks_per_s"] for t in site.turns]
    out["parks_per_s"] = round(statistics.median(rates), 1) if rates else 0.0
    out["parks_per_s_by_turn"] = rates
    for key in TIMINGS:
        took = [t for t in site.turns if t.get(key)]
        if not took:
            out[key] = None
            continue
        # An answer's time to completed comes from the same turn as the answer's.
        by = "answer_ms" if key == "answer_to_completed_ms" else key
        took.sort(key=lambda t: t[by]["p50"])
        out[key] = took[len(took) // 2][key]
        # A turn without it keeps its place (None): ratios pair the levels turn by turn.
        out[f"{key}_by_turn"] = [t[key]["p50"] if t.get(key) else None for t in site.turns]
    out["filled"] = site.filled
    if site.sink is not None:
        out.update(_announced(site, timeout_s))
    out.update(turn_messages(site.store))
    return out


def turn_messages(store: Store) -> dict[str, int]:
    """The step messages queued at the site (each takes a number of its queue, lua/
    _prelude.lua) against those its runs needed: one to start each run, and one to resume
    each answered run (a bench run asks one question; every answered run has completed by
    now). Any more are copies the sweeper queued, taking a waiting run for lost."""
    counts = {status: store.all_runs.count(status) for status in Status}
    needed = sum(counts.values()) + counts[Status.COMPLETED]
    sent = sum(int(store.redis.hget(shard.keys.queues, f"{store.tasks.turn_queue}:sent") or 0)
               for shard in store.shards)
    return {"turn_messages": sent, "turn_messages_needed": needed,
            "duplicate_turn_messages": sent - needed}


def park(rt: Runtime, count: int, timeout_s: float, agent: str = AGENT) -> None:
    """Start `count` runs of `agent` and wait until they are all parked."""
    store = rt.store
    target = store.all_runs.count(Status.INTERRUPTED) + count

    def start(i: int) -> None:
        commands.start_run(rt, agent, input=f"parked {i}")

    with ThreadPoolExecutor(max_workers=8) as pool:
        for done in pool.map(start, range(count), chunksize=256):
            del done
    last, last_change = store.all_runs.count(Status.INTERRUPTED), time.monotonic()
    while last < target:
        time.sleep(0.05)
        now = store.all_runs.count(Status.INTERRUPTED)
        if now != last:
            last, last_change = now, time.monotonic()
        elif time.monotonic() - last_change > timeout_s:
            raise BenchError(f"parking stalled at {now} of {target} interrupted runs")


def _filled(site: Site, count: int) -> None:
    """Park `count` runs at the site with `fill`, in this process."""
    if count > 0:
        fill.parked(site.rt, site.agent, count, label=f"level {site.level}: ")
        site.filled += count


def _park_announced(site: Site, count: int, timeout_s: float) -> None:
    """Park `count` runs at the site and wait for their announcements to be delivered."""
    if count <= 0:
        return
    sent = site.sent()
    park(site.rt, count, timeout_s, site.agent)
    site.parks += count
    if site.sink is not None:
        _delivered(site.sink, sent + count, timeout_s)


def timed_parks(sites: list[Site], count: int, timeout_s: float) -> list[float]:
    """Parks per second at each site of `count` more runs, parked in PARK_CHUNKS chunks
    taken site by site in turn (A B B A …): each site's time is the sum of moments close
    to the others'. (A whole batch parked at one site, then at the next, compared moments
    seconds apart: per-turn ratios spread 0.93 to 1.30 between two levels that way.)"""
    took_ms, parked = [0.0] * len(sites), [0] * len(sites)
    chunks = [count // PARK_CHUNKS + (k < count % PARK_CHUNKS) for k in range(PARK_CHUNKS)]
    for k, chunk in enumerate(c for c in chunks if c):
        for i in (range(len(sites)) if k % 2 == 0 else reversed(range(len(sites)))):
            _rewrites_done(sites)
            took_ms[i] += park_ms(sites[i], chunk, timeout_s)
            parked[i] += chunk
    return [round(n / ms * 1000, 1) if ms else 0.0 for n, ms in zip(parked, took_ms,
                                                                    strict=True)]


def park_ms(site: Site, count: int, timeout_s: float) -> float:
    """The time `count` more runs, started at once, take to be parked by the worker: from
    the server's clock before the first start to the last park's place in the index (the
    server's clock as the park committed). Their announcements are delivered before it
    returns."""
    store = site.store
    started = store.now_ms()
    _park_announced(site, count, timeout_s)
    newest = store.all_runs.newest(Status.INTERRUPTED, 1)
    return max(1.0, float(newest[0][1]) - started) if newest else 0.0


def deliveries_done(rt: Runtime, worker: str = "") -> int:
    """`layby.notify.deliver` tasks the site's worker has run (its own count); without a
    name, every worker that answers within the broadcast's 5 s."""
    # Asked of one worker by name, the answer ends the wait: a broadcast to whoever listens
    # waits out its whole timeout, four times per level.
    stats = rt.celery.control.inspect(
        timeout=5, **({"destination": [worker], "limit": 1} if worker else {})).stats() or {}
    return sum(int(s.get("total", {}).get(DELIVER_TASK, 0)) for s in stats.values())


def folded(store: Store, timeout_s: float) -> None:
    """Until the sweeper has folded the events of every parked run (LAYBY_FOLD_EVENTS_AFTER_S
    after its park)."""
    deadline = time.monotonic() + store.config.fold_after_ms / 1000 + timeout_s
    while time.monotonic() < deadline:
        if all(_folded(store, shard.keys) for shard in store.shards):
            return
        time.sleep(0.5)
    raise BenchError(f"the sweeper did not fold the parked runs' events in {timeout_s} s "
                     f"past LAYBY_FOLD_EVENTS_AFTER_S")


def _folded(store: Store, shard: ShardKeys) -> bool:
    """Whether the sweeper's fold of the shard's parked runs reached the newest."""
    newest = store.redis.zrevrange(shard.index(Status.INTERRUPTED), 0, 0, withscores=True)
    cursor = store.redis.get(shard.fold_cursor)
    return not newest or (cursor is not None and int(cursor) >= int(newest[0][1]))


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


def _announced(site: Site, timeout_s: float) -> dict[str, Any]:
    """Every park's announcement delivered, and the delivery tasks the worker ran: a
    delivery queued twice shows as a duplicate."""
    assert site.sink is not None
    _delivered(site.sink, site.sent_before + site.parks, timeout_s)
    time.sleep(2)  # anything queued twice would run by now
    tasks = deliveries_done(site.rt, site.worker) - site.tasks_before
    messages = site.store.config.messages
    return {"announcements": site.parks, "deliveries": site.sent() - site.sent_before,
            "delivery_tasks": tasks, "duplicate_tasks": tasks - site.parks,
            "notify_queue_after": site.store.redis.llen(messages["deliver"][0])
            if messages else None}


def _delivered(sink: Sink, total: int, timeout_s: float) -> None:
    """Until the sink has taken `total` deliveries, or nothing new came for `timeout_s`."""
    last, last_change = -1, time.monotonic()
    while (now := sum(sink.ids.values())) < total:
        if now != last:
            last, last_change = now, time.monotonic()
        elif time.monotonic() - last_change > timeout_s:
            raise BenchError(f"{now} of {total} announcements delivered; none for "
                             f"{timeout_s} s")
        time.sleep(0.05)


def _memory(store: Store) -> tuple[int, int]:
    """The server's `used_memory` and its resident size (bytes)."""
    info = store.redis.info("memory")
    return int(info["used_memory"]), int(info["used_memory_rss"])


def memory_per_run(before: int, after: int, runs: int) -> float:
    return round((after - before) / runs, 1) if runs else 0.0


def breakdown(store: Store, sample: list[str]) -> dict[str, float]:
    """Mean bytes per parked run by key (`MEMORY USAGE`), over `sample`."""
    parts = {"run": store.keys.run, "answers": store.keys.answers,
             "events": store.keys.events, "review": store.keys.review}
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


LISTS = ("list_first_page_ms", "list_deep_page_ms", "list_all_states_ms")


def probe(sites: list[Site], answers: int, samples: int = SAMPLES) -> list[dict[str, Any]]:
    """Times (ms) at each site of list pages at the top and deep in, and of `answers`
    answers (and from each answer until its run completed on its worker), on what is
    parked now, taken in turn: each call, and each answer, at every site one after the
    other (A B A B …), so that the levels' timings are taken milliseconds apart."""
    pages, victims = [], []
    for site in sites:
        store = site.store
        parked = store.all_runs.count(Status.INTERRUPTED)
        # Answered: runs a third deep in the index.
        victims.append([run_id for run_id, _ in store.all_runs.newest(
            Status.INTERRUPTED, answers, offset=parked // 3)])
        deep = store.all_runs.newest(Status.INTERRUPTED, 1, offset=parked // 2)
        cursor = cursor_of(*deep[0]) if deep else None
        pages.append({
            "list_first_page_ms": lambda s=store: s.lists.list_page(Status.INTERRUPTED, limit=50),
            "list_deep_page_ms": lambda s=store, c=cursor: s.lists.list_page(
                Status.INTERRUPTED, limit=50, cursor=c),
            "list_all_states_ms": lambda s=store: s.lists.list_page(None, limit=50)})
    took: list[dict[str, list[float]]] = [{key: [] for key in TIMINGS} for _ in sites]
    for key in LISTS:
        for _ in range(samples):
            for calls, times in zip(pages, took, strict=True):
                started = time.perf_counter()
                calls[key]()
                times[key].append((time.perf_counter() - started) * 1000)
    # Each answered once, at rest: each answered run resumes and finishes on its worker
    # before the next answer, so an answer's time is its own, not a share of the cores
    # with the resumes of the answers before it (those are timed apart: answer →
    # completed).
    for k in range(answers):
        for site, runs, times in zip(sites, victims, took, strict=True):
            if k < len(runs):
                answered, resumed = answer_at_rest(site.rt, [runs[k]])
                times["answer_ms"] += answered
                times["answer_to_completed_ms"] += resumed
    return [{key: distribution(values) if values else None for key, values in times.items()}
            for times in took]


def answer_at_rest(rt: Runtime, run_ids: list[str]) -> tuple[list[float], list[float]]:
    """Answer each parked run, one at a time, and wait for it to complete: the ms each
    answer took, and from each answer until its run completed."""
    answers, resumes = [], []
    for run_id in run_ids:
        view = rt.store.runs.view(run_id)
        if view is None or not view.open_interrupts:
            continue
        entries = [ResumeEntry(interrupt_id=i.id, status="resolved", payload=True)
                   for i in view.open_interrupts]
        started = time.perf_counter()
        answered = commands.answer(rt, run_id, entries, by="bench", channel="bench")
        answers.append((time.perf_counter() - started) * 1000)
        resumes.append(_until_completed(rt.store, run_id, answered.event_id or "0-0",
                                        started))
    return answers, resumes


def _until_completed(store: Store, run_id: str, after: str, started: float,
                     timeout_s: float = 30) -> float:
    """Ms from `started` until the run's `run.completed`, waited for on its event stream
    from `after` (the answer's last event): a blocking read, not a poll that would share
    the cores with the worker it waits on."""
    key = store.keys.events(run_id)
    deadline = started + timeout_s
    while (left := deadline - time.perf_counter()) > 0:
        # A second at most: a longer block would outlast the client's socket timeout.
        wait_ms = max(1, min(1000, int(left * 1000)))
        reply = events.wait(store.redis, key, after, count=100, block_ms=wait_ms)
        for _, entries in stream_items(reply):
            for event_id, fields in entries:
                after = event_id
                if fields.get("type") == "run.completed":
                    return (time.perf_counter() - started) * 1000
                if fields.get("type") in ("run.failed", "run.cancelled"):
                    raise BenchError(f"answered run {run_id} ended {fields['type']}: "
                                     f"{fields.get('data')}")
    raise BenchError(f"answered run {run_id} did not complete in {timeout_s} s")
