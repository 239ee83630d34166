"""What the store's transitions come to, typed: the scripts reply with short arrays
(`{'ok', version, entry}`, `{'conflict', id, first answer, status}`, …), read here, once,
into `Transition`s with named fields."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from layby.generation.interrupts import Interrupt
from layby.generation.messages import load_messages
from layby.parking import codecs
from layby.parking.records import OutboxEntry, RunRecord
from layby.wire import Answer, RunView, Status


class Verdict(StrEnum):
    OK = "ok"                  # applied
    FAILED = "failed"          # applied, and the run failed (an expiry's policy)
    EXISTS = "exists"          # create: the idempotency key or run id is taken
    STALE = "stale"            # the version or the claim moved on: a duplicate step
    BUSY = "busy"              # another worker's lease is live
    EXHAUSTED = "exhausted"    # claimed too often at one version
    MISSING = "missing"        # no such run
    FINISHED = "finished"      # the run is over
    UNKNOWN = "unknown"        # an answer names an interrupt the run does not have
    CONFLICT = "conflict"      # an answer to an interrupt that is not open
    INCOMPLETE = "incomplete"  # a resume that leaves interrupts open
    EARLY = "early"            # a job's answer, kept for the park that is still to come
    SKIPPED = "skipped"        # requeue: the run waits for nothing a requeue gives
    GONE = "gone"              # expiry: answered meanwhile, or the run is over
    LATER = "later"            # expiry, requeue of a retrying run: not due yet
    AGAIN = "again"            # a reviewer's second approval of a request needing several
    ELSEWHERE = "elsewhere"    # claim: pinned to an agent version the claimer does not host


@dataclass(frozen=True)
class Transition:
    """A transition's result: the store's `verdict`, the run's new `version` and the outbox
    `entries` to publish when it applied; when it did not, what stood in the way."""

    verdict: Verdict
    version: int | None = None
    entries: tuple[OutboxEntry, ...] = ()
    status: Status | None = None       # the run's status (stale, finished, conflict, skipped)
    run_id: str | None = None          # exists: the run holding the key
    interrupt_id: str | None = None    # unknown, conflict: the interrupt named
    first: Answer | None = None        # conflict: the answer recorded first, if any;
                                       # again: the reviewer's earlier approval
    still_open: tuple[str, ...] = ()   # incomplete: the interrupts left open
    owner: str | None = None           # busy: who holds the lease
    attempt: int | None = None         # claim: this attempt; exhausted: the attempts made
    claimed_from: Status | None = None  # claim: the status the run was claimed from
    record: RunRecord | None = None    # claim: the run, as the step needs it
    planned: tuple[str, ...] = ()      # park, delegate: notifications planned
    dispatch: tuple[str, ...] = ()     # …of which the caller must queue the delivery
    resumed: bool = False              # answer, expire, park: the run resumes (queued)
    at: int | None = None              # create, answer: when it applied (ms, server clock)
    event_id: str | None = None        # create, answer: the last event it wrote
    view: RunView | None = None        # answer (asked for): the run as it left it
    agent_version: str | None = None   # elsewhere: the version the run is pinned to

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.OK


def entries_of(raw: Iterable[Any]) -> tuple[OutboxEntry, ...]:
    return tuple(OutboxEntry.model_validate_json(e) for e in raw if e)


def _status(raw: Any) -> Status | None:
    return Status(raw) if raw in Status._value2member_map_ else None


def refusal(reply: list[Any]) -> Transition:
    """A reply saying why a transition did not apply."""
    verdict, rest = Verdict(reply[0]), [str(x) for x in reply[1:]]
    first = rest[0] if rest else None
    match verdict:
        case Verdict.STALE | Verdict.FINISHED | Verdict.SKIPPED:
            return Transition(verdict, status=_status(first))
        case Verdict.BUSY:
            return Transition(verdict, owner=first)
        case Verdict.EXHAUSTED:
            return Transition(verdict, attempt=int(first or 0))
        case Verdict.EXISTS:
            return Transition(verdict, run_id=first)
        case Verdict.UNKNOWN:
            return Transition(verdict, interrupt_id=first)
        case Verdict.CONFLICT:
            return Transition(verdict, interrupt_id=first, status=_status(rest[2]),
                              first=Answer.model_validate_json(rest[1]) if rest[1] else None)
        case Verdict.AGAIN:
            return Transition(verdict, interrupt_id=first,
                              first=Answer.model_validate_json(rest[1]))
        case Verdict.INCOMPLETE:
            return Transition(verdict, still_open=tuple(rest))
        case Verdict.ELSEWHERE:
            return Transition(verdict, agent_version=first)
        case _:
            return Transition(verdict)


def committed(reply: list[Any]) -> Transition:
    """`{'ok' | 'failed', version, entry or '', {planned…}, {to dispatch…}, resumed}`
    (those after the entry when the transition has them), or a refusal."""
    if reply[0] in (Verdict.OK, Verdict.FAILED):
        # The step's task message, and the Slack update's (answers, hand-overs, a cancel).
        entries = entries_of([*reply[2:3], *reply[8:9]])
        planned = tuple(str(x) for x in reply[3]) if len(reply) > 3 else ()
        dispatch = tuple(str(x) for x in reply[4]) if len(reply) > 4 else ()
        return Transition(Verdict(reply[0]), int(reply[1]), entries, planned=planned,
                          dispatch=dispatch, resumed=len(reply) > 5 and reply[5] == "1",
                          at=int(reply[6]) if len(reply) > 6 else None,
                          event_id=str(reply[7]) if len(reply) > 7 and reply[7] else None)
    return refusal(reply)


def claimed(reply: list[Any], run_id: str, version: int) -> Transition:
    """claim_run's `{'ok', previous status, lease until, attempt, agent, messages, metadata,
    {checkpoints}, waiting, {interrupts}, {answers}, agent version, pinned, tenant, trace,
    trace_was}`, or a refusal."""
    if reply[0] != Verdict.OK:
        return refusal(reply)
    _, status, _, attempt, agent, messages, metadata, saved, waiting, specs, answers = reply[:11]
    agent_version, pinned, tenant, trace, trace_was = [*reply[11:16], "", "", "", "", ""][:5]
    parked_on: list[Interrupt] = []
    found: dict[str, Answer] = {}
    if waiting:
        parked_on = [codecs.interrupt(iid, s) for iid, s in zip(waiting.split(), specs,
                                                                  strict=True) if s]
        found = {a.interrupt_id: a for a in (Answer.model_validate_json(x)
                                             for x in answers if x)}
    record = RunRecord(run_id, agent, Status.RUNNING, version,
                       load_messages(json.loads(messages)), codecs.metadata(metadata),
                       checkpoints={saved[i]: json.loads(saved[i + 1])
                                    for i in range(0, len(saved), 2)},
                       parked_on=parked_on, answers=found,
                       agent_version=agent_version or None, pinned=pinned == "1",
                       tenant=tenant or "default", trace=trace or None,
                       trace_was=trace_was or None)
    return Transition(Verdict.OK, version, claimed_from=_status(status),
                      attempt=int(attempt), record=record)


def created(reply: list[Any], run_id: str) -> Transition:
    """create_run's `{'created', entry or '', created at, event id}`, or
    `{'exists', run id}`."""
    if reply[0] == "created":
        return Transition(Verdict.OK, 1, entries_of(reply[1:2]), run_id=run_id,
                          at=int(reply[2]), event_id=str(reply[3]))
    return refusal(reply)


def requeued(reply: list[Any]) -> Transition:
    """requeue_run's `{'ok', entry or ''}`, or a refusal."""
    if reply[0] == Verdict.OK:
        return Transition(Verdict.OK, entries=entries_of(reply[1:2]))
    return refusal(reply)


def scheduled(reply: list[Any], version: int) -> Transition:
    """schedule_retry's `{'ok', due ms}` (the run waits at `version`), or a refusal."""
    if reply[0] == Verdict.OK:
        return Transition(Verdict.OK, version, at=int(reply[1]))
    return refusal(reply)
