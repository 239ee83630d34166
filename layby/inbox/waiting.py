"""What waits for a reviewer, and what they answered: the reviewers' inbox (`/inbox`) lists.

A request is in a reviewer's inbox when `routing` says they may answer it now: it names
them or a group of theirs (the default group when it names nobody), an escalation level that
reaches them has come, or someone handed it to them. The same rule lets them answer it, so
the list never shows what the reviewer cannot answer, nor hides what they can.

The lists are read from the runs themselves: the newest `SCAN` waiting runs for the inbox,
and the newest `HISTORY_SCAN` runs of any state for the history.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from layby.control import Runtime
from layby.inbox.forms import form_for
from layby.inbox.pages import outcome
from layby.reviewers import routing
from layby.reviewers.directory import Directory, Reviewer
from layby.reviewers.schemas import is_confirmation
from layby.wire import InterruptState, InterruptView, RunView, Status

SCAN = 2000  # waiting runs read for one inbox page, newest first
HISTORY_SCAN = 500  # runs of any state read for the history, newest first
_CHUNK = 100  # runs read per round trip


@dataclass(frozen=True)
class Waiting:
    """One open request in a reviewer's inbox: why it is there, and whether their approval
    is already among those a quorum counts."""

    run: RunView
    interrupt: InterruptView
    why: list[str]
    approved_by_me: bool
    left_s: float | None  # until it expires; None when it never does

    @property
    def ref(self) -> str:
        """How a form names it: the run and the interrupt."""
        return f"{self.run.id}/{self.interrupt.id}"

    @property
    def bulk_approvable(self) -> bool:
        """An approval with nothing to fill in: one of a selection approved at once."""
        return (not self.approved_by_me and is_confirmation(self.interrupt)
                and not any(f.required for f in form_for(self.interrupt).fields))


@dataclass
class Listing:
    """An inbox page: the requests that pass the filters, most urgent first, and the
    agents, tools and reasons to filter by (of every request, filtered or not)."""

    items: list[Waiting]
    agents: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    # More waiting runs than one page reads: the oldest are not shown.
    truncated: bool = False


@dataclass(frozen=True)
class Answered:
    """One thing a reviewer did: approved, declined, answered or handed a request on."""

    run_id: str
    agent: str
    interrupt_id: str
    tool: str
    message: str | None
    did: str  # "approved", "declined", "answered", "cancelled", "handed to bob"
    channel: str
    at: str


def _runs(rt: Runtime, status: Status | None, limit: int) -> Iterator[RunView]:
    run_ids = [run_id for run_id, _ in rt.store.runs.newest(status, limit)]
    for at in range(0, len(run_ids), _CHUNK):
        yield from rt.store.views(run_ids[at:at + _CHUNK])


def why(directory: Directory, intr: InterruptView, reviewer_id: str, now: float) -> list[str]:
    """Why `intr` is the reviewer's to answer now, in words; empty when it is not."""
    found: list[str] = []
    for level, since, names in routing.levels(intr):
        if since > now and level > intr.escalation_level:
            continue  # an escalation level not reached yet
        for name in names if names is not None else [directory.default_group or ""]:
            for person in directory.resolve([name]):
                if routing.handed_to(intr, person.id) != reviewer_id:
                    continue
                via = "you" if name == person.id else f"group {name}"
                said = (f"asked of {via}" if level == 0
                        else f"escalated to {via} (level {level})")
                if person.id != reviewer_id:
                    said = f"handed to you by {directory.reviewers[person.id].label} ({said})"
                if said not in found:
                    found.append(said)
    return found


def waiting_for(rt: Runtime, reviewer: Reviewer, *, agent: str | None = None,
                tool: str | None = None, reason: str | None = None,
                now: float | None = None) -> Listing:
    """The open requests `reviewer` may answer now, most urgent first (the soonest to
    expire, then the longest waiting), and those the filters keep."""
    now = time.time() if now is None else now
    directory = rt.reviewers.directory()
    everything: list[Waiting] = []
    for run in _runs(rt, Status.INTERRUPTED, SCAN + 1):
        for intr in run.interrupts:
            if intr.state is not InterruptState.OPEN:
                continue
            reasons = why(directory, intr, reviewer.id, now)
            if not reasons:
                continue
            expires = routing.epoch(intr.expires_at)
            mine = any(a.answered_by == f"reviewer:{reviewer.id}" for a in intr.approvals)
            everything.append(Waiting(run, intr, reasons, mine,
                                      None if expires is None else expires - now))
    everything.sort(key=lambda w: (w.left_s is None, w.left_s or 0.0,
                                   w.interrupt.created_at or ""))
    kept = [w for w in everything
            if (agent is None or w.run.agent == agent)
            and (tool is None or w.interrupt.tool_name == tool)
            and (reason is None or w.interrupt.reason == reason)]
    return Listing(kept,
                   agents=sorted({w.run.agent for w in everything}),
                   tools=sorted({w.interrupt.tool_name for w in everything}),
                   reasons=sorted({w.interrupt.reason for w in everything}),
                   truncated=rt.store.runs.count(Status.INTERRUPTED) > SCAN)


def find(rt: Runtime, reviewer: Reviewer, ref: str) -> Waiting | None:
    """The request `ref` (`<run id>/<interrupt id>`) as it waits for `reviewer`, or None
    when it is not theirs to answer now (or not open, or not there)."""
    run_id, _, interrupt_id = ref.partition("/")
    if not run_id or not interrupt_id:
        return None
    runs = rt.store.views([run_id])
    intr = next((i for run in runs for i in run.interrupts if i.id == interrupt_id), None)
    if intr is None or intr.state is not InterruptState.OPEN:
        return None
    now = time.time()
    reasons = why(rt.reviewers.directory(), intr, reviewer.id, now)
    if not reasons:
        return None
    expires = routing.epoch(intr.expires_at)
    mine = any(a.answered_by == f"reviewer:{reviewer.id}" for a in intr.approvals)
    return Waiting(runs[0], intr, reasons, mine, None if expires is None else expires - now)


def history_of(rt: Runtime, reviewer: Reviewer, limit: int = 100) -> list[Answered]:
    """What `reviewer` answered, approved or handed on, on any channel, newest first."""
    by = f"reviewer:{reviewer.id}"
    found: list[Answered] = []
    for run in _runs(rt, None, HISTORY_SCAN):
        for intr in run.interrupts:
            def one(did: str, channel: str, at: str, run: RunView = run,
                    intr: InterruptView = intr) -> Answered:
                return Answered(run.id, run.agent, intr.id, intr.tool_name, intr.message,
                                did, channel, at)
            answer = intr.answer
            if answer is not None and answer.answered_by == by:
                found.append(one(outcome(intr), answer.channel, answer.answered_at))
            else:  # an approval towards a quorum, met later by someone else's or not yet
                found += [one("approved", a.channel, a.answered_at)
                          for a in intr.approvals if a.answered_by == by]
            found += [one(f"handed to {d.to}", d.channel, d.at)
                      for d in intr.delegations if d.by == by]
    found.sort(key=lambda a: a.at, reverse=True)
    return found[:limit]
