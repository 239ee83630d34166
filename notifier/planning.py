"""Planning announcements: when a run parks, which reviewers hear of which interrupt, on
which channel, and when (now, and a reminder before expiry). Each notification gets an id
made from what it announces, so planning twice plans nothing new."""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime

from layby.broker_config import Settings
from layby.generation.interrupts import BACKGROUND_JOB
from layby.reviewers import tokens
from layby.reviewers.config import Reviewers
from layby.reviewers.directory import Reviewer
from layby.parking import Store
from layby.wire import InterruptState, InterruptView, Notification, RunView, Status

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


@dataclass
class _Plan:
    """What one planning records: notifications (each with when to send it, None for now)
    and the grants of the tokens issued for them."""

    run: RunView
    settings: Settings
    reviewers: Reviewers
    now: float = field(default_factory=time.time)
    notes: list[tuple[Notification, int | None]] = field(default_factory=list)
    grants: list[tuple[str, str, int]] = field(default_factory=list)

    def token(self, intr: InterruptView, reviewer: Reviewer, expires: float | None) -> str:
        """The reviewer's token for `intr`: the one issued before, or a new one."""
        issued = next((n.token for n in self.run.notifications
                       if (n.interrupt_id, n.reviewer) == (intr.id, reviewer.id) and n.token),
                      None)
        if issued is not None:
            return issued
        grant = tokens.Grant(self.run.id, intr.id, reviewer.id, self.run.version,
                             int(expires or self.now + self.settings.token_ttl_s))
        ref, token = tokens.issue(self.reviewers.token_keys(), grant)
        # Stored past the token's own expiry, so that an expired link still opens a page
        # saying the request expired (verify refuses it as an answer).
        keep_s = grant.expires - self.now + self.settings.retention_s
        self.grants.append((ref, grant.dumps(), int(keep_s * 1000)))
        return token

    def remind_at(self, expires: float | None) -> float | None:
        if not (expires and self.settings.remind_before_s):
            return None
        at = expires - self.settings.remind_before_s
        return at if at > self.now + 1 else None

    def announce(self, intr: InterruptView, reviewer: Reviewer) -> None:
        expires = epoch(intr.expires_at)
        token = self.token(intr, reviewer, expires)
        remind_at = self.remind_at(expires)
        for channel in channels_of(reviewer):
            for kind, at in (("request", None), ("reminder", remind_at)):
                if kind == "reminder" and at is None:
                    continue
                note = Notification(  # type: ignore[arg-type]  (channel, kind)
                    id=notification_id(self.run.id, intr.id, reviewer.id, channel, kind),
                    interrupt_id=intr.id, reviewer=reviewer.id, channel=channel, kind=kind,
                    token=token)
                self.notes.append((note, None if at is None else int(at * 1000)))


def plan(store: Store, settings: Settings, reviewers: Reviewers, run_id: str) -> list[str]:
    """Record the notifications of the run's open interrupts; returns the ids of requests
    to send now (reminders wait in the store for their time)."""
    view = store.view(run_id)
    if view is None or view.status is not Status.INTERRUPTED:
        return []
    planning = _Plan(view, settings, reviewers)
    for intr in view.interrupts:
        if intr.state is not InterruptState.OPEN or intr.reason == BACKGROUND_JOB:
            continue
        people = [r for r in reviewers.asked_for(intr) if channels_of(r)]
        if not people:
            log.warning("run %s: interrupt %s has no reviewer with an email or webhook; it "
                        "can be answered through /v1", run_id, intr.id,
                        extra={"interrupt_id": intr.id})
        for reviewer in people:
            planning.announce(intr, reviewer)
    if not planning.notes:
        return []
    new = set(store.plan_notifications(run_id, planning.notes, planning.grants))
    return [n.id for n, at in planning.notes if at is None and n.id in new]
