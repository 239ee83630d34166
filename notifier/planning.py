"""Planning announcements: when a run parks (or a request is handed on), which reviewers
hear of which interrupt, on which channel, and when: the first reviewers now, each
escalation level at its time, reminders every `remind_every` and before expiry. Each
notification gets an id made from what it announces, so planning twice plans nothing new;
the store skips what is still to come once the interrupt is answered.

`for_park` plans in the step that parks, before its commit, and the park records the plan
in the same transition (no task in between); `plan` plans a parked run again (the
announcement task, for runs whose park could not plan: a reviewer directory that did not
load, say)."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from layby.broker_config import Settings
from layby.generation.interrupts import BACKGROUND_JOB, Interrupt
from layby.parking import Announcements, Store, formats
from layby.parking.clock import iso
from layby.reviewers import routing, tokens
from layby.reviewers.config import Reviewers
from layby.reviewers.directory import Directory, Reviewer
from layby.reviewers.routing import epoch
from layby.wire import Delegation, InterruptState, InterruptView, Notification, Status

log = logging.getLogger(__name__)

# A notification's channel and kind, as `Notification` takes them.
Channel = Literal["email", "webhook", "slack"]
Kind = Literal["request", "reminder", "escalation"]
CHANNELS: tuple[Channel, ...] = ("email", "webhook", "slack")
_REACHED_BY = {"email": "email", "webhook": "webhook", "slack": "slack_id"}


def notification_id(run_id: str, interrupt_id: str, reviewer: str, channel: str,
                    kind: str) -> str:
    digest = hashlib.sha256("\x00".join((run_id, interrupt_id, reviewer, channel, kind))
                            .encode()).hexdigest()
    return f"ntf_{digest[:20]}"


def channels_of(reviewer: Reviewer, slack: bool = True) -> list[Channel]:
    """The channels `reviewer` is reached on (Slack only where it is configured)."""
    return [c for c in CHANNELS if getattr(reviewer, _REACHED_BY[c])
            and (slack or c != "slack")]


def slack_groups(directory: Directory, intr: InterruptView) -> list[tuple[str, int, float]]:
    """(group, level, when) of each group asked for `intr` whose requests are posted to a
    Slack channel."""
    found: list[tuple[str, int, float]] = []
    for level, since, names in routing.levels(intr):
        wanted = names or ([directory.default_group] if directory.default_group else [])
        found += [(name, level, since) for name in wanted
                  if name in directory.slack_channels and name not in
                  {g for g, _, _ in found}]
    return found


def in_slack_channels(directory: Directory, intr: InterruptView) -> set[str]:
    """The reviewers who see `intr` in a group's Slack channel (sent no direct message)."""
    return {routing.handed_to(intr, member) for group, _, _ in slack_groups(directory, intr)
            for member in directory.groups[group]}


MAX_REMINDERS = 20  # repeated reminders planned per reviewer (`remind_every`)


@dataclass
class _Plan(Announcements):
    """One planning: the announcements it makes (notifications, each with when to send it,
    None for now; the grants of the tokens issued for them; the hand-overs of reviewers
    away), for run `run_id` at `version`, which has sent `sent` before."""

    run_id: str = ""
    version: int = 0
    sent: list[Notification] = field(default_factory=list)
    settings: Settings | None = None
    reviewers: Reviewers | None = None
    now: float = field(default_factory=time.time)
    fits: Callable[[str], bool] | None = None  # which grant refs will do (`tokens.issue`)

    def token(self, intr: InterruptView, reviewer: Reviewer, expires: float | None) -> str:
        """The reviewer's token for `intr`: the one issued before, or a new one."""
        assert self.settings is not None and self.reviewers is not None
        issued = next((n.token for n in self.sent
                       if (n.interrupt_id, n.reviewer) == (intr.id, reviewer.id) and n.token),
                      None)
        if issued is None:
            issued = next((n.token for n, _ in self.notes
                           if (n.interrupt_id, n.reviewer) == (intr.id, reviewer.id)), None)
        if issued is not None:
            return issued
        grant = tokens.Grant(self.run_id, intr.id, reviewer.id, self.version,
                             int(expires or self.now + self.settings.token_ttl_s))
        ref, token = tokens.issue(self.reviewers.token_keys(), grant, self.fits)
        # Stored past the token's own expiry, so that an expired link still opens a page
        # saying the request expired (verify refuses it as an answer).
        keep_s = grant.expires - self.now + self.settings.retention_s
        self.grants.append((ref, grant.stored(), int(keep_s * 1000)))
        return token

    def away_handovers(self, intr: InterruptView) -> InterruptView:
        """`intr` with the requests of reviewers away handed to their delegates (recorded,
        so the audit shows them and the delegate stays asked when the reviewer is back)."""
        assert self.reviewers is not None
        directory = self.reviewers.directory()
        for _ in range(len(directory.reviewers)):
            gone = {d.reviewer for d in intr.delegations}  # handed on already
            away = [a.reviewer for a in routing.everyone(directory, intr)
                    if a.reviewer.away(self.now) and a.reviewer.id not in gone]
            if not away:
                break
            new = [Delegation(reviewer=r.id, to=r.delegate_to or "", by="directory",
                              channel="directory", at=iso(int(self.now * 1000)),
                              note=f"away until {r.away_until:%Y-%m-%d %H:%M %Z}".strip())
                   for r in away]
            self.handovers += [(intr.id, d) for d in new]
            intr = intr.model_copy(update={"delegations": [*intr.delegations, *new]})
        return intr

    def reminders(self, intr: InterruptView, start: float, expires: float | None
                  ) -> list[tuple[str, float]]:
        """(kind key, when) of each reminder: every `remind_every` while it waits (at most
        MAX_REMINDERS), and LAYBY_REMIND_BEFORE_S before it expires."""
        assert self.settings is not None
        found: list[tuple[str, float]] = []
        if intr.remind_every_s:
            for k in range(1, MAX_REMINDERS + 1):
                at = start + k * intr.remind_every_s
                if expires is not None and at >= expires:
                    break
                if at > self.now + 1:
                    found.append((f"reminder:{k}", at))
        if expires and self.settings.remind_before_s:
            at = expires - self.settings.remind_before_s
            if at > self.now + 1:
                found.append(("reminder", at))
        return found

    def sends(self, intr: InterruptView, level: int, since: float, expires: float | None,
              start: float) -> list[tuple[str, Kind, float | None]]:
        """(id key, kind, when: None for now) of the sends to one reviewer asked from
        `level` at `since`: the request or escalation, then the reminders."""
        first_kind: Kind = "request" if level == 0 else "escalation"
        first_at = None if since <= self.now + 1 else since
        sends: list[tuple[str, Kind, float | None]] = [(first_kind, first_kind, first_at)]
        return sends + [(key, "reminder", at) for key, at in
                        self.reminders(intr, start, expires) if at > since]

    def announce(self, intr: InterruptView, asked: routing.Asked, expires: float | None,
                 start: float, channels: list[Channel]) -> None:
        reviewer = asked.reviewer
        token = self.token(intr, reviewer, expires)
        for channel in channels:
            for key, kind, at in self.sends(intr, asked.level, asked.since, expires, start):
                note = Notification(
                    id=notification_id(self.run_id, intr.id, reviewer.id, channel, key),
                    interrupt_id=intr.id, reviewer=reviewer.id, channel=channel, kind=kind,
                    level=asked.level, token=token)
                self.notes.append((note, None if at is None else int(at * 1000)))

    def post_to_groups(self, intr: InterruptView, directory: Directory,
                       expires: float | None, start: float) -> None:
        """A Slack post per group channel asked (the notification's reviewer is the
        group's name; it carries no token: a click is checked by who clicks)."""
        for group, level, since in slack_groups(directory, intr):
            for key, kind, at in self.sends(intr, level, since, expires, start):
                note = Notification(
                    id=notification_id(self.run_id, intr.id, group, "slack", key),
                    interrupt_id=intr.id, reviewer=group, channel="slack", kind=kind,
                    level=level, token="")
                self.notes.append((note, None if at is None else int(at * 1000)))


def slack_stored(store: Store) -> bool:
    """Whether the store may hold a notification on Slack: once it writes format 2, when no
    process of layby 0.2.0 (which cannot read one) is left, nor can join."""
    return store.writing >= formats.SHARDED


def announcements(settings: Settings, reviewers: Reviewers, run_id: str, version: int,
                  interrupts: list[InterruptView], sent: Sequence[Notification] = (), *,
                  fits: Callable[[str], bool] | None = None, slack: bool = True
                  ) -> Announcements:
    """The announcements of `interrupts` (those open and waiting on people) of run `run_id`
    at `version`, which has sent `sent` before. `fits`: the grant refs the store takes
    with the run (`Keys.fits_with`); `slack`: whether the store may hold Slack's
    (`slack_stored`; and Slack is configured)."""
    planning = _Plan(run_id=run_id, version=version, sent=list(sent), settings=settings,
                     reviewers=reviewers, fits=fits)
    slack = slack and settings.slack
    directory = reviewers.directory()
    if not directory.reviewers:  # no directory: runs are answered through the API only
        return Announcements()
    for intr in interrupts:
        if intr.state is not InterruptState.OPEN or intr.reason == BACKGROUND_JOB:
            continue
        intr = planning.away_handovers(intr)
        asked = routing.everyone(directory, intr)
        in_channels = in_slack_channels(directory, intr) if slack else set()
        reach = {a.reviewer.id: [c for c in channels_of(a.reviewer, slack)
                                 if c != "slack" or a.reviewer.id not in in_channels]
                 for a in asked}
        people = [a for a in asked if reach[a.reviewer.id]]
        if not people and not in_channels:
            # Asked of nobody by name and no default group: answered through the API, by
            # design. Named reviewers nobody can reach are worth a warning.
            (log.warning if intr.reviewers or directory.default_group else log.debug)(
                "run %s: interrupt %s has no reviewer with an email, webhook or Slack; it can be "
                "answered through /v1", run_id, intr.id, extra={"interrupt_id": intr.id})
        start = epoch(intr.created_at) or planning.now
        for one in people:
            planning.announce(intr, one, epoch(intr.expires_at), start, reach[one.reviewer.id])
        if slack:
            planning.post_to_groups(intr, directory, epoch(intr.expires_at), start)
    return Announcements(planning.notes, planning.grants, planning.handovers)


def for_park(settings: Settings, reviewers: Reviewers, run_id: str, version: int,
             interrupts: list[Interrupt], *, fits: Callable[[str], bool] | None = None,
             slack: bool = True) -> Announcements | None:
    """The announcements of the interrupts a run is about to park on (at `version`, the
    park's); None when they cannot be planned now (the reviewer directory does not load):
    the park then queues the announcement task, which tries until it can."""
    try:
        return announcements(settings, reviewers, run_id, version,
                             [InterruptView.of(i, None, True) for i in interrupts], fits=fits,
                             slack=slack)
    except Exception:  # never lose the park over its announcements
        log.exception("run %s: could not plan the announcements as it parks; the "
                      "announcement task will", run_id)
        return None


def plan(store: Store, settings: Settings, reviewers: Reviewers, run_id: str) -> list[str]:
    """Record the notifications of a parked run's open interrupts (requests now, escalations
    and reminders at their time); returns the ids of requests whose delivery the caller
    must queue (with the broker on the store's server, the store queued them)."""
    view = store.runs.view(run_id)
    if view is None or view.status is not Status.INTERRUPTED:
        return []
    plan = announcements(settings, reviewers, run_id, view.version, view.interrupts,
                         view.notifications, fits=store.fits_with(run_id),
                         slack=slack_stored(store))
    if not plan:
        return []
    _, dispatch = store.outbox.plan_notifications(run_id, plan)
    return dispatch
