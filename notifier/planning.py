"""Planning announcements: when a run parks, which reviewers hear of which interrupt, on
which channel, and when (now, and a reminder before expiry). Each notification gets an id
made from what it announces, so planning twice plans nothing new."""

from __future__ import annotations

import hashlib
import logging
import time
from datetime import datetime

from layby.broker_config import Settings
from layby.generation.interrupts import BACKGROUND_JOB
from layby.reviewers import tokens
from layby.reviewers.config import Reviewers
from layby.reviewers.directory import Reviewer
from layby.parking import Store
from layby.wire import InterruptState, Notification, Status

log = logging.getLogger(__name__)

CHANNELS = ("email", "webhook")


def notification_id(run_id: str, interrupt_id: str, reviewer: str, channel: str,
                    kind: str) -> str:
    digest = hashlib.sha256("\x00".join((run_id, interrupt_id, reviewer, channel, kind))
                            .encode()).hexdigest()
    return f"ntf_{digest[:20]}"


def channels_of(reviewer: Reviewer) -> list[str]:
    return [c for c in CHANNELS if getattr(reviewer, c)]


def epoch(moment: str | None) -> float | None:
    return datetime.fromisoformat(moment.replace("Z", "+00:00")).timestamp() if moment else None


def plan(store: Store, settings: Settings, reviewers: Reviewers, run_id: str) -> list[str]:
    """Record the notifications of the run's open interrupts; returns the ids of requests
    to send now (reminders wait in the store for their time)."""
    view = store.view(run_id)
    if view is None or view.status is not Status.INTERRUPTED:
        return []
    issued = {(n.interrupt_id, n.reviewer): n.token for n in view.notifications}
    planned: list[tuple[Notification, int | None]] = []
    grants: list[tuple[str, str, int]] = []
    now = time.time()
    for intr in view.interrupts:
        if intr.state is not InterruptState.OPEN or intr.reason == BACKGROUND_JOB:
            continue
        people = [r for r in reviewers.asked_for(intr) if channels_of(r)]
        if not people:
            log.warning("run %s: interrupt %s has no reviewer with an email or webhook; it "
                        "can be answered through /v1", run_id, intr.id,
                        extra={"interrupt_id": intr.id})
        expires = epoch(intr.expires_at)
        for reviewer in people:
            token = issued.get((intr.id, reviewer.id))
            if token is None:
                grant = tokens.Grant(run_id, intr.id, reviewer.id, view.version,
                                     int(expires or now + settings.token_ttl_s))
                ref, token = tokens.issue(reviewers.token_keys(), grant)
                # Stored past the token's own expiry, so that an expired link still opens
                # a page saying the request expired (verify refuses it as an answer).
                keep_s = grant.expires - now + settings.retention_s
                grants.append((ref, grant.dumps(), int(keep_s * 1000)))
            remind_at = None
            if expires and settings.remind_before_s:
                remind_at = expires - settings.remind_before_s
                remind_at = remind_at if remind_at > now + 1 else None
            for channel in channels_of(reviewer):
                for kind, at in (("request", None), ("reminder", remind_at)):
                    if kind == "reminder" and at is None:
                        continue
                    note = Notification(  # type: ignore[arg-type]  (channel, kind)
                        id=notification_id(run_id, intr.id, reviewer.id, channel, kind),
                        interrupt_id=intr.id, reviewer=reviewer.id, channel=channel,
                        kind=kind, token=token)
                    planned.append((note, None if at is None else int(at * 1000)))
    if not planned:
        return []
    new = set(store.plan_notifications(run_id, planned, grants))
    return [n.id for n, at in planned if at is None and n.id in new]
