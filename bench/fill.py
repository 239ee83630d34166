"""Parked runs built fast (`--parked`): each run taken from its start to its park, its
announcement delivered, by the product's own code and the store's own transitions, in the
bench process, many at once, their commands sent to the server together.

A run is started with `control.commands.start_run`, its first step is taken with the
worker's own `tasks.steps.advance` (the claim, the scripted model's turn, the interrupt, the
plan of its announcement, the park), and the announcement it asks for is delivered through
the store's `start_delivery` and `finish_delivery`, as `notifier.delivery.deliver` does once
a webhook answered 200; the sweeper folds its events 30 s later, as it folds every parked
run's. So what a built run holds is what a run parked by a worker holds, field for field
(the bench's tests compare the two, ids and times aside): the same scripts, given the same
arguments by the same code.
What is left out is no part of what is stored: the broker (the step is taken here at once,
so the message that would carry it is not sent: its outbox entry is acked as a publisher
acks what it sent; its queue's number is taken as a pushed message's is), Celery's worker
and the webhook's HTTP request.

Why: parking through the worker runs at about 175 parks a second on this machine, so
1,000,000 parked runs would take over an hour and a half; most of that is Celery's and the
webhook's own work, none of which is stored. Here the Python of a run is the product's, and
its round trips are shared: `Coalesced` sends the commands that many threads have waiting as
one pipeline, so the server reads them in one go and the threads compute meanwhile; two
processes share the work (a run's Python is the larger part of what it costs).
"""

from __future__ import annotations

import multiprocessing
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import redis
from celery import Celery

from bench import BenchError
from layby.access.rights import OPERATOR, Identity
from layby.broker_config import DELIVER_TASK
from layby.control import Runtime, commands
from layby.parking import OutboxEntry, Store
from layby.tasks.steps import advance

THREADS = 48  # runs under way at once in a process: each waits for its pipeline most of its time
# Processes that take runs to their parks: the Python of a run (about 1.6 ms here) is most
# of what a built run costs, the server's (0.7 ms) the rest, so two share the cores.
PROCESSES = 2
SMALL = 1000  # fewer runs than this are built in this process alone
REPORT_EVERY_S = 30.0


class Coalesced(redis.Redis):
    """A client of one server whose commands, sent from many threads at once, go out
    together: a sender thread sends whatever is waiting as one pipeline and hands each
    thread its reply (or its error, raised in that thread). A command is sent as soon as
    the pipeline before it is back, so none waits for a batch to fill."""

    def __init__(self, pool: redis.ConnectionPool) -> None:
        super().__init__(connection_pool=pool)
        self._waiting: list[tuple[tuple[Any, ...], dict[str, Any], Future[Any]]] = []
        self._lock = threading.Condition()
        self._closed = False
        self._sender = threading.Thread(target=self._send, name="bench fill sender",
                                        daemon=True)
        self._sender.start()

    def execute_command(self, *args: Any, **options: Any) -> Any:
        done: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise BenchError("the fill's client is closed")
            self._waiting.append((args, options, done))
            self._lock.notify()
        return done.result()

    def _send(self) -> None:
        while True:
            with self._lock:
                while not self._waiting and not self._closed:
                    self._lock.wait()
                if self._closed and not self._waiting:
                    return
                batch, self._waiting = self._waiting, []
            try:
                pipe = super().pipeline(transaction=False)
                for args, options, _ in batch:
                    pipe.execute_command(*args, **options)
                replies = pipe.execute(raise_on_error=False)
            except Exception as exc:  # noqa: BLE001  (every caller gets it, in its thread)
                for _, _, done in batch:
                    done.set_exception(exc)
                continue
            for (_, _, done), reply in zip(batch, replies, strict=True):
                if isinstance(reply, Exception):
                    done.set_exception(reply)
                else:
                    done.set_result(reply)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._sender.join(10)


class _Deliveries(Celery):
    """Where a step that parks dispatches its announcement's deliveries
    (`notifier.delivery.dispatch`): noted by run, for the builder to make; nothing is sent."""

    def __init__(self) -> None:
        super().__init__("bench-fill", set_as_current=False)
        self.due: dict[str, list[str]] = defaultdict(list)
        self.lock = threading.Lock()

    @contextmanager
    def producer_or_acquire(self, producer: Any = None) -> Iterator[Any]:
        yield None

    def send_task(self, name: str, args: Any = None, *_: Any, **__: Any) -> Any:
        if name != DELIVER_TASK:
            raise BenchError(f"a built run's step sent {name}: the fill delivers "
                             f"announcements only")
        run_id, notification_id = args
        with self.lock:
            self.due[run_id].append(notification_id)


class Direct(Runtime):
    """A site's runtime whose steps are taken in this process, at once: its store is the
    site's (same server, prefix, layout and settings), through a `Coalesced` client, with
    its transitions' task messages left in the outbox rather than pushed; `publish` acks
    them (the step they would carry is taken here) and the deliveries a park asks for are
    kept for the builder."""

    def __init__(self, site: Runtime) -> None:
        self.deliveries = _Deliveries()
        super().__init__(site.settings, self.deliveries, site.agents)
        self.client = Coalesced(site.store.redis.connection_pool)
        self.direct = Store(self.client, replace(site.store.config, messages=None))
        self.direct.writing = site.store.writing

    @property  # type: ignore[override]
    def store(self) -> Store:
        return self.direct

    def publish(self, entries: Any) -> int:
        found: list[OutboxEntry] = list(entries)
        self.direct.outbox.ack_outbox([(e.args[0], e.id) for e in found])
        return len(found)

    def close(self) -> None:
        self.client.close()


def parked(rt: Runtime, agent: str, count: int, label: str = "",
           processes: int | None = None, who: Identity = OPERATOR) -> float:
    """Start `count` runs of `agent` at the site of `rt` and take each to its park (its
    announcements delivered), in this process and `processes` - 1 forked from it (by
    default PROCESSES, or this one alone for fewer than SMALL runs), each with THREADS runs
    under way, started by `who` (in its tenant); returns runs parked a second."""
    if count <= 0:
        return 0.0
    if getattr(rt.store.redis, "nodes_manager", None) is not None:
        raise BenchError("parked runs are built on one server, not on a cluster")
    started = time.monotonic()
    if processes is None:
        processes = PROCESSES if count >= SMALL else 1
    shares = [count // processes + (k < count % processes) for k in range(processes)]
    shares = [n for n in shares if n]
    children = []
    context = multiprocessing.get_context("fork")
    offset = shares[0]
    for k, share in enumerate(shares[1:], start=1):
        child = context.Process(target=_lanes, args=(rt, agent, share, offset,
                                                     f"{label}share {k + 1}: ", who),
                                name=f"bench fill {k}", daemon=True)
        child.start()
        children.append(child)
        offset += share
    try:
        _lanes(rt, agent, shares[0], 0, f"{label}share 1: " if children else label, who)
    finally:
        for child in children:
            child.join()
    failed = [c for c in children if c.exitcode != 0]
    if failed:
        raise BenchError(f"{len(failed)} of the fill's processes failed (exit codes "
                         f"{[c.exitcode for c in failed]}); see above")
    took = time.monotonic() - started
    return round(count / took, 1) if took > 0 else 0.0


def _lanes(rt: Runtime, agent: str, count: int, first: int, label: str,
           who: Identity = OPERATOR) -> None:
    """Runs `first` to `first + count` of the fill, THREADS at a time, in this process."""
    direct = Direct(rt)
    started = time.monotonic()
    noted = started
    done = 0

    def one(i: int) -> None:
        view, _ = commands.start_run(direct, agent, input=f"parked {i}", who=who)
        outcome = advance(direct, view.id, 1)
        if outcome != "park":
            raise BenchError(f"run {view.id} of {agent} did not park: {outcome}")
        with direct.deliveries.lock:
            due = direct.deliveries.due.pop(view.id, [])
        for notification_id in due:
            code, note = direct.store.outbox.start_delivery(
                view.id, notification_id, deadline_ms=int(
                    rt.settings.notify_send_timeout_s * 1000),
                max_attempts=rt.settings.notify_attempts)
            if code != "ok" or note is None:
                raise BenchError(f"notification {notification_id} of run {view.id}: {code}")
            direct.store.outbox.finish_delivery(view.id, note, "sent")

    numbers = iter(range(first, first + count))
    lock = threading.Lock()
    failed: list[BaseException] = []

    def lane() -> None:
        nonlocal done, noted
        while not failed:
            with lock:
                i = next(numbers, None)
            if i is None:
                return
            try:
                one(i)
            except BaseException as exc:  # noqa: BLE001  (the first stops every lane)
                failed.append(exc)
                return
            with lock:
                done += 1
                now = time.monotonic()
                if now - noted > REPORT_EVERY_S:
                    noted = now
                    print(f"bench: {label}{done} of {count} runs parked "
                          f"({done / (now - started):.0f} a second)", file=sys.stderr)

    previous = sys.getswitchinterval()
    sys.setswitchinterval(0.001)  # the sender thread gets its turn soon after its reply
    try:
        lanes = [threading.Thread(target=lane, name=f"bench fill {k}", daemon=True)
                 for k in range(min(THREADS, count))]
        for thread in lanes:
            thread.start()
        for thread in lanes:
            thread.join()
    finally:
        sys.setswitchinterval(previous)
        direct.close()
    if failed:
        raise failed[0]
