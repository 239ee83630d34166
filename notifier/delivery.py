"""Delivering one notification: take it (once, even with duplicate task messages), send it
on its channel, record what came of it. Failures are retried with exponential backoff and
jitter; after the last attempt the failure is recorded on the run, which stays parked."""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from celery import Celery

from layby.broker_config import DELIVER_TASK, NOTIFY, Settings
from layby.notifier import mail, slack_messages, webhooks
from layby.notifier.mail import PermanentFailure
from layby.parking import Store
from layby.parking.failover import through_failover
from layby.reviewers.config import Reviewers
from layby.wire import Notification, RunView

if TYPE_CHECKING:
    from layby.parking.registries import Shard

log = logging.getLogger(__name__)


def backoff_s(settings: Settings, attempt: int) -> float:
    """Delay before attempt `attempt + 1`: doubling from the base, capped, with jitter so
    that many notifications failing together do not come back together."""
    ceiling = min(settings.notify_backoff_max_s,
                  settings.notify_backoff_s * 2 ** max(0, attempt - 1))
    return random.uniform(ceiling / 2, ceiling)


def dispatch(app: Celery, pairs: list[tuple[str, str]]) -> int:
    """Queue a delivery task per (run id, notification id). One that cannot be queued now is
    still due in the store, and the sweeper queues it later."""
    sent = 0
    try:
        with app.producer_or_acquire() as producer:
            for run_id, notification_id in pairs:
                app.send_task(DELIVER_TASK, args=[run_id, notification_id], queue=NOTIFY,
                              producer=producer)
                sent += 1
    except Exception:
        log.exception("could not queue %d deliveries; the sweeper will", len(pairs) - sent)
    return sent


def dispatch_due(store: Store, app: Celery, settings: Settings,
                 shards: Sequence[Shard] | None = None) -> int:
    """The sweeper's part: queue deliveries that are due (retries, reminders, lost ones),
    in `shards` when given (`store.deadlines.find_due`), every shard otherwise."""
    return dispatch(app, store.outbox.claim_due_notifications(
        retry_ms=int(settings.outbox_grace_s * 1000), shards=shards))


def deliver(store: Store, settings: Settings, reviewers: Reviewers, run_id: str,
            notification_id: str) -> str:
    """Send one notification if it is due; returns what happened (sent, retry, failed, or
    why nothing was sent: later, done, skipped…)."""
    deadline_ms = int(settings.notify_send_timeout_s * 1000)
    code, note = store.outbox.start_delivery(run_id, notification_id, deadline_ms=deadline_ms,
                                             max_attempts=settings.notify_attempts)
    if code != "ok" or note is None:
        return code
    run = store.runs.view(run_id)
    try:
        if run is None:
            raise PermanentFailure(f"run {run_id} is gone")
        message = _send(settings, reviewers, run, note)
    except PermanentFailure as exc:
        return _finish(store, run_id, note, "failed", str(exc))
    except Exception as exc:  # noqa: BLE001  (any trouble on the way out is worth a retry)
        error = f"{type(exc).__name__}: {exc}"
        if note.attempts >= settings.notify_attempts:
            return _finish(store, run_id, note, "failed",
                           f"gave up after {note.attempts} attempts: {error}")
        delay = backoff_s(settings, note.attempts)
        log.warning("notification %s of run %s (%s to %s) failed, attempt %d; next in %.0f s: "
                    "%s", note.id, run_id, note.channel, note.reviewer, note.attempts, delay,
                    error)
        through_failover(store.outbox.finish_delivery, run_id, note, "retry", error=error,
                                 retry_in_ms=int(delay * 1000))
        return "retry"
    return _finish(store, run_id, note, "sent", message=message or "")


def _finish(store: Store, run_id: str, note: Notification, outcome: str,
            error: str = "", message: str = "") -> str:
    if outcome == "failed":
        log.error("notification %s of run %s (%s to %s) failed for good: %s", note.id, run_id,
                  note.channel, note.reviewer, error)
    else:
        log.info("notification %s of run %s sent (%s to %s)", note.id, run_id, note.channel,
                 note.reviewer)
    # Sent is sent: recorded through a failover, or the notification would go out again.
    through_failover(store.outbox.finish_delivery, run_id, note, outcome, error=error,
                     message=message)
    return outcome


def _send(settings: Settings, reviewers: Reviewers, run: RunView, note: Notification
          ) -> str | None:
    """Send `note`; returns where its message is, for channels that update theirs."""
    interrupt = next((i for i in run.interrupts if i.id == note.interrupt_id), None)
    if interrupt is None:
        raise PermanentFailure(f"interrupt {note.interrupt_id} is not in run {run.id}")
    if note.channel == "slack":  # to a reviewer, or to a group's channel
        return slack_messages.send(settings, reviewers, run, interrupt, note)
    reviewer = reviewers.get(note.reviewer)
    if reviewer is None:
        raise PermanentFailure(f"reviewer {note.reviewer!r} is no longer in the directory")
    if note.channel == "email":
        if not reviewer.email:
            raise PermanentFailure(f"reviewer {reviewer.id!r} has no email address any more")
        mail.send(settings, mail.notification_mail(settings, run, interrupt, reviewer, note))
    else:
        if not reviewer.webhook:
            raise PermanentFailure(f"reviewer {reviewer.id!r} has no webhook any more")
        webhooks.send(settings, reviewer, note,
                      webhooks.notification_body(settings, run, interrupt, reviewer, note))
    return None
