"""What waits for a reviewer, and what they answered: the reviewers' inbox (`/inbox`) lists.

A request is in a reviewer's inbox when `routing` says they may answer it now: it names
them or a group of theirs (the default group when it names nobody), an escalation level that
reaches them has come, or someone handed it to them. The same rule lets them answer it, so
the list never shows what the reviewer cannot answer, nor hides what they can.

The lists are read from the runs themselves. The inbox reads the open interrupts of the
waiting runs the reviewers' request index holds under the reviewer's names (`names_of`:
their id, their groups; up to `SCAN` of them, the most recently asked;
`parking.store.inbox`), or, in a store still moving from layby 0.2.0's layout (before
migration 2 is through), of the newest `SCAN` waiting runs of all; where there are more,
also of the `URGENT` runs whose requests expire soonest. It reads their specs and reviews,
not their histories (for the live inboxes at most once per `FRESH_S`), picks the
reviewer's, orders them by urgency, and reads in full only the `PAGE` most urgent, which
also drops any answered since. The history reads the newest `HISTORY_SCAN` runs of any
state.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from layby.answering.forms import form_for
from layby.answering.pages import outcome
from layby.control import Runtime
from layby.parking import formats
from layby.parking.store.inbox import DEFAULT_GROUP
from layby.reviewers import routing
from layby.reviewers.directory import Directory, Reviewer
from layby.reviewers.schemas import is_confirmation
from layby.wire import InterruptState, InterruptView, RunView, Status

SCAN = 5_000  # waiting runs whose open interrupts one inbox page reads, newest first
URGENT = 1_000  # and the runs whose requests expire soonest, however old
# One read of the waiting runs serves every live inbox of the process for this long: many
# reviewers watching cost the store one read, not one each. (A page reads afresh.)
FRESH_S = 2.0
PAGE = 100  # requests an inbox page shows, the most urgent first
HISTORY_SCAN = 500  # runs of any state read for the history, newest first
_CHUNK = 500  # runs read per round trip


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
    """An inbox page: the most urgent requests that pass the filters (at most `PAGE`), how
    many pass them, and the agents, tools and reasons to filter by (of every request,
    filtered or not)."""

    items: list[Waiting]
    total: int = 0
    agents: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    # More waiting runs than one page reads: the oldest are not looked at.
    truncated: bool = False


@dataclass(frozen=True)
class _Open:
    """A request as the list picks and orders it, before its run is read whole."""

    run_id: str
    agent: str
    interrupt: InterruptView
    why: list[str]
    left_s: float | None

    @property
    def ref(self) -> str:
        return f"{self.run_id}/{self.interrupt.id}"


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
    run_ids = [run_id for run_id, _ in rt.store.all_runs.newest(status, limit)]
    for at in range(0, len(run_ids), _CHUNK):
        yield from rt.store.runs.views(run_ids[at:at + _CHUNK])


def why(directory: Directory, intr: InterruptView, reviewer_id: str, now: float) -> list[str]:
    """Why `intr` is the reviewer's to answer now, in words; empty when it is not."""
    found: list[str] = []
    for level, since, names in routing.levels(intr):
        if since > now and level > intr.escalation_level:
            continue  # an escalation level not reached yet
        # No names (None or []) is the default group, as `Directory.resolve` reads it.
        for name in names or [directory.default_group or ""]:
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


# What one read of the waiting runs found: (run id, agent, open interrupts), and whether
# there were more runs than it read.
_Read = tuple[list[tuple[str, str, list[InterruptView]]], bool]
_Key = tuple[int, tuple[str, ...]]  # the runtime, the reviewer's names
# The last read for each reviewer's names, kept while it may still serve (`KEEP_S`), and one
# lock each: one reviewer's read never waits behind another's.
_last_read: dict[_Key, tuple[float, _Read]] = {}
_read_locks: dict[_Key, threading.Lock] = {}
_locks_lock = threading.Lock()
KEEP_S = 60.0


def names_of(directory: Directory, reviewer: Reviewer) -> list[str]:
    """The names under which the request index holds what may be `reviewer`'s: their own
    id (asked, or handed to them), their groups', and the default group's."""
    groups = [name for name, members in directory.groups.items() if reviewer.id in members]
    default = [DEFAULT_GROUP] if directory.default_group in groups else []
    return [reviewer.id, *groups, *default]


def _read_waiting(rt: Runtime, names: tuple[str, ...]) -> _Read:
    """The waiting runs that may hold requests for the reviewer of `names`: those the
    request index holds under them, else (no names: a store without the index yet) the
    newest `SCAN` of all; and, where those are not all there are, the runs whose requests
    expire soonest, however old."""
    if names:
        run_ids, more = rt.store.inbox.asking(names, SCAN)
    else:
        run_ids = [run_id for run_id, _ in rt.store.all_runs.newest(Status.INTERRUPTED, SCAN)]
        more = rt.store.all_runs.count(Status.INTERRUPTED) > SCAN
    if more:  # the most urgent are looked at in a store of any size
        run_ids = list(dict.fromkeys([*rt.store.deadlines.soonest_deadlines(URGENT), *run_ids]))
    return [item for at in range(0, len(run_ids), _CHUNK)
            for item in rt.store.inbox.open_interrupts(run_ids[at:at + _CHUNK])], more


def _open_interrupts(rt: Runtime, reviewer: Reviewer, max_age_s: float) -> _Read:
    """What `_read_waiting` finds for `reviewer`, as read at most `max_age_s` ago. One read
    at a time for each reviewer: whoever asks meanwhile waits for it, and takes a read that
    began after they asked (as fresh as one of their own) instead of another. Without the
    request index, one read serves every reviewer."""
    indexed = (rt.store.version or 0) >= formats.SHARDED
    names = tuple(names_of(rt.reviewers.directory(), reviewer)) if indexed else ()
    key = (id(rt), names)
    asked = time.monotonic()
    with _locks_lock:
        lock = _read_locks.setdefault(key, threading.Lock())
    with lock:
        last = _last_read.get(key)
        if last is not None and (last[0] >= asked or time.monotonic() - last[0] < max_age_s):
            return last[1]
        began = time.monotonic()
        found = _read_waiting(rt, names)
        with _locks_lock:
            _last_read[key] = (began, found)
            for old in [k for k, (at, _) in _last_read.items() if began - at > KEEP_S]:
                del _last_read[old]  # (its lock stays: one per reviewer, however many reads)
        return found


def _open_for(rt: Runtime, reviewer: Reviewer, now: float, max_age_s: float = 0.0
              ) -> tuple[list[_Open], bool]:
    """Every open request `reviewer` may answer now, the most urgent first: the soonest to
    expire, then the longest waiting; and whether there were more waiting runs than read."""
    directory = rt.reviewers.directory()
    found: list[_Open] = []
    read, more = _open_interrupts(rt, reviewer, max_age_s)
    for run_id, agent, interrupts in read:
        for intr in interrupts:
            reasons = why(directory, intr, reviewer.id, now)
            if reasons:
                found.append(_Open(run_id, agent, intr, reasons, _left(intr, now)))
    found.sort(key=lambda o: (o.left_s is None, o.left_s or 0.0,
                              o.interrupt.created_at or ""))
    return found, more


def refs_for(rt: Runtime, reviewer: Reviewer) -> frozenset[str]:
    """The requests (`<run id>/<interrupt id>`) waiting for `reviewer` now: what a live
    inbox compares to see whether its list changed."""
    return frozenset(o.ref for o in _open_for(rt, reviewer, time.time(), FRESH_S)[0])


def waiting_for(rt: Runtime, reviewer: Reviewer, *, agent: str | None = None,
                tool: str | None = None, reason: str | None = None,
                now: float | None = None, max_age_s: float = 0.0) -> Listing:
    """The open requests `reviewer` may answer now that the filters keep, the most urgent
    `PAGE` of them read whole; `max_age_s`: how old a look at the waiting runs will do."""
    now = time.time() if now is None else now
    everything, more = _open_for(rt, reviewer, now, max_age_s)
    kept = [o for o in everything
            if (agent is None or o.agent == agent)
            and (tool is None or o.interrupt.tool_name == tool)
            and (reason is None or o.interrupt.reason == reason)]
    runs = {run.id: run for run in rt.store.runs.views(list(dict.fromkeys(
        o.run_id for o in kept[:PAGE])))}
    items = []
    for o in kept[:PAGE]:
        run = runs.get(o.run_id)
        # Read again whole, a moment later: still open, and its approvals as they are now.
        intr = next((i for i in run.interrupts if i.id == o.interrupt.id), None) \
            if run else None
        if run is not None and intr is not None and intr.state is InterruptState.OPEN:
            items.append(Waiting(run, intr, o.why, _approved_by(intr, reviewer), o.left_s))
    return Listing(items, total=len(kept),
                   agents=sorted({o.agent for o in everything}),
                   tools=sorted({o.interrupt.tool_name for o in everything}),
                   reasons=sorted({o.interrupt.reason for o in everything}),
                   truncated=more)


_REF = re.compile(r"^([A-Za-z0-9_.-]{1,128})/([A-Za-z0-9_.-]{1,128})$")


def parse_ref(ref: str) -> tuple[str, str] | None:
    """(run id, interrupt id) of a form's `<run id>/<interrupt id>`; None for anything else
    (checked before anything is read)."""
    found = _REF.match(ref)
    return (found.group(1), found.group(2)) if found else None


def find(rt: Runtime, reviewer: Reviewer, ref: str) -> Waiting | None:
    """The request `ref` (`<run id>/<interrupt id>`) as it waits for `reviewer`, or None
    when it is not theirs to answer now (or not open, or not there)."""
    parsed = parse_ref(ref)
    if parsed is None:
        return None
    run_id, interrupt_id = parsed
    runs = rt.store.runs.views([run_id])
    intr = next((i for run in runs for i in run.interrupts if i.id == interrupt_id), None)
    if intr is None or intr.state is not InterruptState.OPEN:
        return None
    now = time.time()
    reasons = why(rt.reviewers.directory(), intr, reviewer.id, now)
    if not reasons:
        return None
    return Waiting(runs[0], intr, reasons, _approved_by(intr, reviewer), _left(intr, now))


def _approved_by(intr: InterruptView, reviewer: Reviewer) -> bool:
    """Whether the reviewer's approval is among those a quorum counts."""
    return any(a.answered_by == f"reviewer:{reviewer.id}" for a in intr.approvals)


def _left(intr: InterruptView, now: float) -> float | None:
    expires = routing.epoch(intr.expires_at)
    return None if expires is None else expires - now


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
