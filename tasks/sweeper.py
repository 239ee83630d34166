"""The sweeper: publishes what the outbox still holds, queues due notifications (retries,
reminders, lost sends), applies expiry policies, queues again the steps whose failed tool
calls are due to be tried again, requeues runs whose worker died (a step
it held, a message it had reserved), requeues every waiting run at once when the store (or
a broker of its own) comes back from a restart or a failover (its last writes, a task
message among them, may be gone), folds the events of runs parked for a while into their
hashes, prunes finished runs from the indexes.
Safe to run anywhere, often, and concurrently: every change it makes is a script that
re-checks its condition.

Its clock (`tick`) runs in the sweeper's own process, a thread of the one-process worker
started from the sweeper's entry (`layby.tasks.clock`): not a Celery task a second, which
would put a message on the broker and a row in Flower every second (370 of 391 tasks after
six minutes), burying the runs' steps. Each sweep notes that it finished
(`store.deadlines.note_sweep`): the sweeper's liveness, which `/metrics` and `layby doctor` show.
`layby.sweep` stays a task others may send."""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

import redis

from layby.broker_config import tracing
from layby.broker_config.logs import about
from layby.control.runtime import Runtime
from layby.generation.interrupts import ExpiryAction
from layby.notifier import delivery
from layby.parking import Verdict, migrations
from layby.wire import Answer, InterruptState

log = logging.getLogger(__name__)

# Requeues owed, kept until done (otherwise a run a pass missed would wait for
# LAYBY_LOST_MESSAGE_S): after a worker's death, why a whole pass is owed (an error cut the
# last one short: the store away again, say); the runs whose own requeue failed, with the
# sweeps they failed in. (After a restart, the data says it: `parking.keys` server.)
_owed: list[str] = []
_failed: dict[str, int] = {}
# Sweeps a run's failed requeue is tried again in (a second apart), then left to the
# lost-message check; a record that cannot be read must not be tried forever.
RETRIES = 30


# One sweep at a time in a process: the clock's and a `layby.sweep` task's share `_owed`.
_one_at_a_time = threading.Lock()

# What waits for days (a finished run's index entries, past LAYBY_RETENTION_S) or for a
# delay of its own (events folded LAYBY_FOLD_EVENTS_AFTER_S after a park) is looked at less
# often than every pass: at 48 shards they were 240 of an idle pass's 590 commands. A run's
# events fold within one and a half times the delay; a finished run's entries go at most a
# minute after its keys (the lists skip an entry whose run is gone).
PRUNE_EVERY_S = 60.0
# When each runtime of this process last folded and pruned (the test kit may hold several).
_last_done: weakref.WeakKeyDictionary[Runtime, dict[str, float]] = weakref.WeakKeyDictionary()


def _due(rt: Runtime, what: str, every_s: float) -> bool:
    """Whether `what` is due in this pass (it then counts as done now)."""
    done = _last_done.setdefault(rt, {})
    now = time.monotonic()
    if what in done and now - done[what] < every_s:
        return False
    done[what] = now
    return True


def _fresh_lock() -> None:
    # A pool child forked while the clock (in the parent) held the lock would wait on it
    # forever at its first `layby.sweep` task: the child gets a lock of its own.
    global _one_at_a_time
    _one_at_a_time = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock)


def tick(rt: Runtime, every_s: float, stop: threading.Event) -> threading.Thread:
    """Sweep every `every_s` seconds until `stop`, in a thread of this process. A sweep that
    fails (the store away, say) is logged and tried again at the next tick."""

    def run() -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                sweep(rt)
            except redis.RedisError as exc:  # the store away: the next tick tries again
                log.warning("sweep failed (%s: %s); trying again in %g s",
                            type(exc).__name__, exc, every_s)
            except Exception:
                log.exception("sweep failed; trying again in %g s", every_s)
            stop.wait(max(0.0, every_s - (time.monotonic() - started)))

    thread = threading.Thread(target=run, name="sweeper clock", daemon=True)
    thread.start()
    return thread


def sweep(rt: Runtime) -> dict[str, int]:
    """One pass over everything the sweeper looks after; notes its end (liveness)."""
    with _one_at_a_time:
        counts = _sweep(rt)
        rt.store.deadlines.note_sweep()
    return counts


def _sweep(rt: Runtime) -> dict[str, int]:
    store = rt.store
    counts = {"expired": 0,
              "requeued": _after_a_restart(rt) + _after_worker_deaths(rt) + _retry_failed(rt)}
    # Where anything is due, asked once the passes above made due what they had to: the
    # reads below then look only there (an idle pass reads no shard).
    due = store.deadlines.find_due()
    counts["published"] = rt.publish(store.outbox.claim_outbox(shards=due.outbox))
    counts["notifications"] = _guarded(delivery.dispatch_due, store, rt.celery, rt.settings,
                                       due.notifications)
    for run_id, interrupt_id in store.deadlines.due_deadlines(shards=due.deadlines):
        with about(run_id=run_id, interrupt_id=interrupt_id):
            counts["expired"] += _guarded(expire, rt, run_id, interrupt_id)
    for run_id in store.deadlines.due_retries(shards=due.retries):
        with about(run_id=run_id):
            counts["retried"] = counts.get("retried", 0) + _guarded(_retry_due, rt, run_id)
    for run_id in store.deadlines.lapsed_leases(shards=due.leases):
        with about(run_id=run_id):
            counts["requeued"] += _guarded(_requeue, rt, run_id,
                                           "its worker stopped answering")
    for run_id in (store.deadlines.waiting_too_long(store.config.lost_message_ms)
                   if due.lost else ()):
        with about(run_id=run_id):
            counts["requeued"] += _guarded(_requeue, rt, run_id,
                                           "its task message is overdue")
    counts["folded"] = (_guarded(store.lists.fold_parked)
                        if _due(rt, "fold", rt.settings.fold_events_after_s / 2) else 0)
    counts["switched"] = _guarded(_switch_format, rt)
    counts["pruned"] = store.lists.prune_finished() if _due(rt, "prune", PRUNE_EVERY_S) else 0
    return counts


def _switch_format(rt: Runtime) -> int:
    """Once no process of an older release is alive (none beats in the registry), the
    store starts writing the newest format this code knows (`layby.parking.formats`):
    1 when it switched. A store in the legacy layout switching to format 2 gets this
    sweeper's LAYBY_STORE_SHARDS, and moves to the sharded layout at its layout instant."""
    store, newest = rt.store, migrations.newest()
    if store.writing >= newest:
        return 0
    reply = store.processes.switch_format(store.writing + 1, shards=rt.settings.store_shards)
    if reply[0] != "switched":
        return 0
    log.warning("no process of an older release is left: the store writes format %d now; "
                "`layby migrate` brings the records written before to it", store.writing)
    return 1


def _after_a_restart(rt: Runtime) -> int:
    """Requeue every queued or resuming run once the store's server, or the broker's when it
    is a Redis server of its own, is another than the one noted in the data: a message it
    lost would otherwise wait for LAYBY_LOST_MESSAGE_S. A message that was not lost arrives
    twice; the second finds its version taken and does nothing. The new server is noted
    once the pass is done: a pass an error cut short (a new primary still settling) is
    done again at the next sweep."""
    store = rt.store
    changed = []
    for what, server, broker in (("store", store.processes.server_id(), False),
                                 ("broker", rt.broker_server_id(), True)):
        if server is None:
            continue
        noted = store.processes.noted_server(broker=broker)
        if noted is None:  # data no layby process has seen yet
            store.processes.note_server(server, first=True, broker=broker)
        elif noted != server:
            changed.append((what, server, broker))
    if not changed:
        return 0
    which = " and the ".join(what for what, _, _ in changed)
    log.warning("the %s is a new server (restarted, or failed over): requeueing every "
                "waiting run", which)
    requeued = _requeue_pass(rt, f"the {which} restarted")
    for _, server, broker in changed:
        store.processes.note_server(server, broker=broker)
    return requeued


def _after_worker_deaths(rt: Runtime) -> int:
    """Requeue the waiting runs whose messages a dead worker may have reserved: they would
    otherwise come back after kombu's visibility timeout, or LAYBY_LOST_MESSAGE_S. Those
    still in their queue are left there (`store.deadlines.maybe_reserved`): after a burst, a copy of
    each would only lengthen it. Deliveries of notifications are queued again too."""
    for name, last_beat_ms, told in rt.store.processes.reap_workers():
        ago = (rt.store.now_ms() - last_beat_ms) / 1000
        if told and not told.startswith("worker "):  # a gateway or a listener: no messages
            log.warning("%s stopped beating (last beat %.1f s ago)", name, ago)
            continue
        log.warning("worker %s stopped beating (last beat %.1f s ago): requeueing every "
                    "waiting run", name, ago)
        _owed.append(f"worker {name} died")
    if not _owed:
        return 0
    why = "; ".join(dict.fromkeys(_owed))
    rt.store.outbox.redue_queued_notifications()
    requeued = sum(_requeue_or_owe(rt, run_id, why)
                   for run_id in rt.store.deadlines.maybe_reserved())
    _owed.clear()
    return requeued


def _requeue_pass(rt: Runtime, why: str) -> int:
    rt.store.outbox.redue_queued_notifications()
    return _requeue_waiting(rt, rt.store.now_ms(), why)


def _retry_failed(rt: Runtime) -> int:
    """The runs whose requeue failed in a pass, tried again (up to RETRIES sweeps)."""
    requeued = 0
    for run_id, failures in list(_failed.items()):
        with about(run_id=run_id):
            try:
                requeued += _requeue(rt, run_id, "its requeue failed before")
            except Exception:
                if failures + 1 < RETRIES:
                    _failed[run_id] = failures + 1
                    continue
                log.exception("sweeper: run %s could not be requeued in %d sweeps; left to "
                              "the lost-message check (LAYBY_LOST_MESSAGE_S)", run_id, RETRIES)
            _failed.pop(run_id, None)
    return requeued


def _requeue_waiting(rt: Runtime, before_ms: int, why: str) -> int:
    """Requeue every run queued or resuming since before `before_ms`, a page at a time (a
    requeued run's place moves to now, past the cutoff, so the next page is new runs).
    A run whose requeue fails is tried again at the next sweeps (`_failed`)."""
    requeued, tried, cutoff = 0, set(), before_ms - 1
    while fresh := [r for r in rt.store.deadlines.waiting(cutoff) if r not in tried]:
        for run_id in fresh:
            tried.add(run_id)
            requeued += _requeue_or_owe(rt, run_id, why)
    return requeued


def _requeue_or_owe(rt: Runtime, run_id: str, why: str) -> int:
    """Requeue one run of a pass; one whose requeue fails is tried again at the next
    sweeps (`_failed`)."""
    with about(run_id=run_id):
        try:
            return _requeue(rt, run_id, why)
        except Exception:
            log.exception("sweeper: requeueing run %s failed (%s); trying again at the next "
                          "sweep", run_id, why)
            _failed.setdefault(run_id, 0)
            return 0


def _guarded(step: Callable[..., int], *args: Any) -> int:
    """One run's trouble (a record a deploy can no longer read, say) must not stop the
    sweep for every other run."""
    try:
        return step(*args)
    except Exception:
        log.exception("sweeper: %s failed for %s", step.__name__, args)
        return 0


def _requeue(rt: Runtime, run_id: str, why: str) -> int:
    result = rt.store.runs.requeue(run_id)
    if not result.ok:
        return 0
    log.warning("run %s: %s; step requeued", run_id, why)
    rt.publish(result.entries)  # when the store could not queue it itself
    return 1


def _retry_due(rt: Runtime, run_id: str) -> int:
    """A retrying run whose next try is due: its step queued again, at the same version."""
    result = rt.store.runs.requeue(run_id)
    if not result.ok:
        return 0
    log.info("run %s: its failed tool calls are due to be tried again; step queued", run_id)
    rt.publish(result.entries)
    return 1


def expire(rt: Runtime, run_id: str, interrupt_id: str) -> int:
    store = rt.store
    spec = store.answers.interrupt(run_id, interrupt_id)
    if spec is None:
        store.answers.expire(run_id, _expiry_answer(interrupt_id, "cancelled", None), None)
        return 0
    policy = spec.on_expire
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    reason = f"no answer before {spec.expires_at}"
    if policy.action is ExpiryAction.RESOLVE:
        answer = _expiry_answer(interrupt_id, "resolved", policy.payload, now)
        fail = None
    else:
        answer = _expiry_answer(interrupt_id, "cancelled", None, now, reason)
        fail = ({"code": "interrupt_expired", "message": f"interrupt {interrupt_id} "
                 f"({spec.tool_name}) expired: {reason}"}
                if policy.action is ExpiryAction.FAIL else None)
    # The resume an expiry causes continues the sweeper's span of it, linked to the run's
    # trace as any resume is (`tracing.resumed`).
    with tracing.answering(run_id, "expiry", [interrupt_id], None):
        result = store.answers.expire(run_id, answer, fail, slack=bool(rt.settings.slack),
                                      trace=tracing.current())
        rt.publish(result.entries)
    if result.verdict in (Verdict.OK, Verdict.FAILED):
        log.info("run %s: interrupt %s expired (%s)", run_id, interrupt_id, policy.action.value)
        return 1
    return 0


def _expiry_answer(interrupt_id: str, status: Literal["resolved", "cancelled"],
                   payload: object, now: str = "",
                   reason: str | None = None) -> Answer:
    return Answer(interrupt_id=interrupt_id, status=status,
                  payload=payload, metadata={"reason": reason} if reason else None,
                  state=InterruptState.EXPIRED, answered_by="layby:expiry", channel="expiry",
                  answered_at=now)
