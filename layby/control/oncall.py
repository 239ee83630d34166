"""On-call work on parked and stuck runs: find what is stuck, and fix it.

What `layby ops` does, as plain functions on a `Store`: list runs whose worker died (lapsed
lease), runs waiting longer than LAYBY_LOST_MESSAGE_S for a message that may be lost,
outbox entries not published in time, and parked runs whose notifications failed; requeue
the stuck runs, send failed notifications again, prune finished runs past retention. Every
change is one of the store's transition scripts, which re-checks its condition, so running
these next to the sweeper is safe.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from layby.broker_config import DELIVER_TASK, NOTIFY
from layby.control.runtime import Runtime
from layby.parking import Store, Verdict

log = logging.getLogger(__name__)

LEASE_LAPSED = "lease_lapsed"
WAITING_TOO_LONG = "waiting_too_long"
OUTBOX_OVERDUE = "outbox_overdue"
NOTIFICATION_FAILED = "notification_failed"


@dataclass
class Finding:
    """One thing wrong: what, with which run, and the command that fixes it."""

    kind: str
    run_id: str
    problem: str
    fix: str
    detail: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return f"{self.run_id}  {self.kind:19}  {self.problem}\n    fix: {self.fix}"

    def wire(self) -> dict[str, Any]:
        return {"kind": self.kind, "runId": self.run_id, "problem": self.problem,
                "fix": self.fix, "detail": self.detail}


def _seconds(ms: int) -> str:
    return f"{ms / 1000:.1f} s"


def stuck(rt: Runtime, *, limit: int = 200) -> list[Finding]:
    """Everything that looks stuck, at most `limit` of each kind (every parked run is
    looked at for failed notifications)."""
    store = rt.store
    return [*lapsed(store, limit), *waiting(store, limit), *overdue_outbox(store, limit),
            *failed_notifications(store, limit)]


def lapsed(store: Store, limit: int = 200) -> list[Finding]:
    now = store.now_ms()
    found = []
    for run_id in store.deadlines.lapsed_leases(limit):
        owner, until = store.runs.lease_of(run_id)
        late = now - (until or now)
        found.append(Finding(
            LEASE_LAPSED, run_id,
            f"claimed by {owner or 'a worker'} whose lease lapsed {_seconds(late)} ago "
            "(the worker died or hangs)",
            f"layby runs requeue {run_id}   (or: layby ops requeue-stuck)",
            {"owner": owner, "lapsedMs": late}))
    return found


def waiting(store: Store, limit: int = 200) -> list[Finding]:
    now = store.now_ms()
    found = []
    for run_id in store.deadlines.waiting_too_long(store.config.lost_message_ms, limit):
        status, updated = store.runs.status_of(run_id)
        since = now - (updated or now)
        found.append(Finding(
            WAITING_TOO_LONG, run_id,
            f"{status} for {_seconds(since)}, longer than LAYBY_LOST_MESSAGE_S "
            f"({_seconds(store.config.lost_message_ms)}), and its task message is no longer "
            "in its queue: lost",
            f"layby runs requeue {run_id}   (or: layby ops requeue-stuck)",
            {"status": status.value if status else None, "waitingMs": since}))
    return found


def overdue_outbox(store: Store, limit: int = 200) -> list[Finding]:
    found = []
    for entry_id, late in store.outbox.overdue_outbox(store.config.outbox_grace_ms, limit):
        run_id = entry_id.split(":", 1)[0]
        found.append(Finding(
            OUTBOX_OVERDUE, run_id,
            f"outbox entry {entry_id} is {_seconds(late)} overdue: not published "
            "(is the sweeper running? is the broker reachable?)",
            "layby ops requeue-stuck   (publishes overdue outbox entries; check `layby "
            "sweeper` is running)",
            {"entryId": entry_id, "lateMs": late}))
    return found


def failed_notifications(store: Store, limit: int = 200) -> list[Finding]:
    """Failed notifications of parked runs, the first `limit` of them: every parked run is
    looked at, a page at a time."""
    found: list[Finding] = []
    for run_id, notes in store.outbox.notifications_of_parked():
        for note in notes:
            if note.state != "failed":
                continue
            if len(found) >= limit:
                return found
            found.append(Finding(
                NOTIFICATION_FAILED, run_id,
                f"notification {note.id} ({note.kind} of {note.interrupt_id} to "
                f"{note.reviewer} by {note.channel}) failed after {note.attempts} "
                f"attempt(s): {note.last_error or 'no error recorded'}",
                f"layby ops retry-notifications {run_id}",
                {"notificationId": note.id, "interruptId": note.interrupt_id,
                 "reviewer": note.reviewer, "channel": note.channel,
                 "attempts": note.attempts, "error": note.last_error}))
    return found


@dataclass
class Requeued:
    run_id: str
    outcome: str  # requeued | busy (its lease was taken again) | skipped (<status>) | missing
    why: str

    def wire(self) -> dict[str, Any]:
        return {"runId": self.run_id, "outcome": self.outcome, "why": self.why}


def requeue_stuck(rt: Runtime, *, limit: int = 200) -> tuple[list[Requeued], int]:
    """Requeue runs with a lapsed lease or waiting too long, and publish overdue outbox
    entries. Returns what came of each run, and how many outbox entries were published.

    Runs are requeued as the sweeper does (`store.runs.requeue` without an owner): a lease that
    a worker took again since the listing is left alone ("busy"), not taken over."""
    store = rt.store
    done = []
    stuck = [*((run_id, LEASE_LAPSED) for run_id in store.deadlines.lapsed_leases(limit)),
             *((run_id, WAITING_TOO_LONG)
               for run_id in store.deadlines.waiting_too_long(store.config.lost_message_ms, limit))]
    for run_id, why in stuck:
        result = store.runs.requeue(run_id)
        if result.ok:
            rt.publish(result.entries)
            outcome = "requeued"
        elif result.verdict is Verdict.SKIPPED:
            outcome = f"skipped ({result.status or '?'})"
        else:
            outcome = result.verdict.value
        done.append(Requeued(run_id, outcome, why))
    published = rt.publish(store.outbox.claim_outbox(limit))
    return done, published


def retry_notifications(rt: Runtime, run_ids: list[str]) -> dict[str, list[str]]:
    """Failed notifications of these runs back to pending, and their deliveries queued.
    Returns run id → the notification ids sent again."""
    found = {run_id: rt.store.outbox.retry_notifications(run_id) for run_id in run_ids}
    # The store queued the deliveries itself, unless the broker is elsewhere.
    dispatch = [(run_id, nid) for run_id, (_, ids) in found.items() for nid in ids]
    if dispatch:
        try:
            with rt.celery.producer_or_acquire() as producer:
                for run_id, nid in dispatch:
                    rt.celery.send_task(DELIVER_TASK, args=[run_id, nid], queue=NOTIFY,
                                        producer=producer)
        except Exception:  # each is due in the store: the sweeper queues it
            log.exception("could not queue the retried notifications; the sweeper will")
    return {run_id: retried for run_id, (retried, _) in found.items()}


def with_failed_notifications(store: Store) -> list[str]:
    """Every parked run with a failed notification."""
    return [run_id for run_id, notes in store.outbox.notifications_of_parked()
            if any(n.state == "failed" for n in notes)]


def purge(store: Store, *, dry_run: bool = False) -> dict[str, int]:
    """Drop index entries of finished runs past retention; counts by status. With
    `dry_run`, count only."""
    found = store.all_runs.finished_before(store.lists.retention_cutoff_ms())
    counts = {status.value: count for status, count in found.items()}
    if not dry_run:
        counts["pruned"] = store.lists.prune_finished()
    return counts

