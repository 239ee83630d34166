"""Advancing a run: claim it, take steps with `generation`, commit each through `parking`.

A step is a model turn, or the resume of a parked turn once every interrupt has an answer.
The claim reads everything the step needs; the commit writes the outcome and queues what
follows, each one round trip. A step whose tool calls failed in a way their policy tries
again commits nothing: it waits in the store (`retrying`, with what it did so far saved
beside its checkpoints), and the sweeper queues it again, at the same version, when the
next try is due; no worker waits meanwhile. After a `Continue` the next turn is taken in
the same task while the time budget lasts (fewer hops), else queued; a resume that only
applied answers is not even committed before the turn after it (a step run again reaches
it again). A heartbeat keeps the claim while a step runs (`tasks.heartbeat`). When a run
parks, its announcements are planned here and recorded by the park itself.

Everything here may run twice: the claim refuses stale or duplicate messages, checkpoints
keep a redelivered step from calling the model or a finished tool again where that could
repeat a side effect, and every commit is a compare-and-set on the run's version.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import redis

from layby.broker_config import tracing
from layby.control import audit
from layby.control.commands import answered_as, now_iso
from layby.control.runtime import Runtime, worker_name
from layby.errors import ConfigError, ResumeError
from layby.generation import spans
from layby.generation.agents import Agent
from layby.generation.answers import to_resume
from layby.generation.interrupts import BACKGROUND_JOB, Interrupt, ResumeEntry
from layby.generation.messages import Message, dump_messages
from layby.generation.providers.common import ProviderError
from layby.generation.retries import checkpoint_key
from layby.generation.stored_run import StoredRun
from layby.generation.turn import (
    Continue,
    Fail,
    Finish,
    Outcome,
    Park,
    Retry,
    Step,
    model_turn,
    resume_turn,
)
from layby.generation.versions import (
    AGENT_CHANGED,
    Changed,
    migrated,
    parked_version,
    what_changed,
)
from layby.notifier import delivery, planning
from layby.parking import Announcements, RunRecord, Store, Transition, Verdict, formats
from layby.parking.clock import iso
from layby.tasks.heartbeat import Heartbeat
from layby.tasks.jobs import starter
from layby.wire import Answer, InterruptState, RetryWait, Status, ToolRetry

log = logging.getLogger(__name__)
# How long a worker holds a pinned run's step it does not host before handing it back: a
# worker that reads the run's queue for another agent of the same version would otherwise
# bounce it back and forth as fast as the queue turns.
HAND_BACK_PAUSE_S = 1.0


class LostClaim(Exception):
    """Another worker (or a cancel) took the run over while this step ran."""


@dataclass
class StoreCheckpoints:
    """A step's results: durable ones saved in the store at once (each save renews the
    claim), the others kept in memory until the commit, which follows."""

    store: Store
    run_id: str
    version: int
    owner: str
    saved: dict[str, Any]
    unsaved: set[str] = field(default_factory=set)  # kept in memory only

    def get(self, key: str) -> Any | None:
        return self.saved.get(key)

    def put(self, key: str, value: Any, *, durable: bool = True) -> None:
        if durable and not self.store.runs.save_checkpoint(self.run_id, self.version, self.owner,
                                                           key, value):
            raise LostClaim(f"run {self.run_id} moved on while version {self.version} ran")
        self.saved[key] = value
        if durable:
            self.unsaved.discard(key)
        else:
            self.unsaved.add(key)

    def pending(self) -> dict[str, Any]:
        """What is kept in memory only: saved with a wait to retry, which commits nothing."""
        return {key: self.saved[key] for key in self.unsaved}


def advance(rt: Runtime, run_id: str, version: int, task_id: str | None = None) -> str:
    """Take the run's pending steps; returns how it went (for logs and Flower)."""
    store = rt.store
    unique = uuid.uuid4().hex  # (one draw of the system's randomness: a system call)
    owner = f"{worker_name()}:{task_id or unique}:{unique[:8]}"
    claim = store.runs.claim(run_id, version, owner, rt.hosted)
    if claim.verdict is Verdict.ELSEWHERE:
        return _hand_back(rt, run_id, version, claim.agent_version)
    if claim.verdict is Verdict.EXHAUSTED:
        store.runs.fail(run_id, {"code": "attempts_exhausted",
                                 "message": f"gave up after {claim.attempt} attempts at version "
                                            f"{version}; see the worker logs for the cause"},
                        version=version)
        return "failed"
    if not claim.ok:
        log.info("run %s v%s: %s, nothing to do", run_id, version, claim.verdict)
        return claim.verdict.value
    assert claim.record is not None
    record = claim.record
    parked_in = record.trace_was if claim.claimed_from is Status.RESUMING else None
    try:
        with Heartbeat(store, run_id, version, owner,
                       rt.settings.heartbeat_interval_s) as beat, \
                tracing.resumed(run_id, parked_in):
            return _loop(rt, beat, record)
    except LostClaim as lost:
        log.info("%s", lost)
        return "stale"
    except Exception:
        # Give the step back at once rather than after the lease; attempts are bounded.
        rt.publish(store.runs.requeue(run_id, owner=owner).entries)
        raise


def _hand_back(rt: Runtime, run_id: str, version: int, pinned_to: str | None) -> str:
    """A step of a run pinned to a version this worker does not host (the claim refused it,
    changing nothing): back on the run's own queue, `layby.turns@<version>`, for a worker
    that hosts it. Never run here."""
    time.sleep(HAND_BACK_PAUSE_S)
    result = rt.store.runs.requeue(run_id)
    rt.publish(result.entries)
    log.warning("run %s v%s is pinned to version %s of its agent, which this worker does not "
                "host; handed back to its queue", run_id, version, pinned_to)
    return "elsewhere"


def _loop(rt: Runtime, beat: Heartbeat, record: RunRecord) -> str:
    store, run_id, owner = rt.store, beat.run_id, beat.owner
    budget_ends = time.monotonic() + rt.settings.turn_budget_s
    agent = rt.agents.get(record.agent)
    if agent is None:
        store.runs.fail(run_id, {"code": "unknown_agent",
                                 "message": f"no agent named {record.agent!r} is loaded on "
                                            "this worker; check LAYBY_AGENT_MODULES"},
                        version=record.version, owner=owner)
        return "failed"
    committed = record.messages  # the history as the store holds it
    step = _step(rt, record.version, owner, record.messages, record.metadata,
                 record.checkpoints, run_id)
    while True:
        started = time.monotonic()
        with spans.agent_turn(agent.name, agent.model.name, run_id, step.version):
            outcome = _take_step(agent, step, record)
        if isinstance(outcome, Park):
            tracing.parked(run_id, [(i.id, i.reason) for i in outcome.interrupts])
        inline = time.monotonic() < budget_ends
        if isinstance(outcome, Continue) and outcome.replayable and inline:
            # Nothing ran: the next turn goes on from here, at the same version, and one
            # commit covers both.
            step = replace(step, history=outcome.messages)
            continue
        if isinstance(outcome, Retry):
            beat.release()  # schedule_retry releases the claim: nothing to renew
            return _wait_to_retry(rt, step, owner, outcome)
        done, version = _commit(rt, agent, step, committed, owner, outcome, inline=inline,
                                tenant=record.tenant)
        log.info("run %s: %s in %.0f ms", run_id, type(outcome).__name__.lower(),
                 (time.monotonic() - started) * 1000)
        if done:
            return type(outcome).__name__.lower()
        # A turn taken inline holds the claim at the new version.
        beat.version = version
        committed = outcome.messages
        step = _step(rt, version, owner, outcome.messages, step.run_metadata, {}, run_id)


def _step(rt: Runtime, version: int, owner: str, history: list[Message],
          metadata: dict[str, Any], saved: dict[str, Any], run_id: str) -> Step:
    # A failed call waits to be tried again only in a store every process sharing it knows
    # such waits in (format 2: no layby 0.2.0 left, `layby.parking.formats`).
    return Step(run_id, version, history, metadata,
                checkpoints=StoreCheckpoints(rt.store, run_id, version, owner, dict(saved)),
                jobs=starter(rt.celery), retries=rt.store.writing >= formats.SHARDED)


def _wait_to_retry(rt: Runtime, step: Step, owner: str, outcome: Retry) -> str:
    """The step's failed calls wait to be tried again (schedule_retry.lua): the run is
    `retrying` until the longest of their waits is over, this step's results kept. Returns
    what Flower shows of the task: the calls, their attempts and errors' types (an error's
    message is the tool's, and may hold what Flower must not show)."""
    due = datetime.now(UTC) + timedelta(seconds=outcome.wait_s)
    wait = RetryWait(calls=[
        ToolRetry(tool_call_id=c.ref, tool_name=c.tool, attempt=c.next_attempt,
                  max_attempts=c.max_attempts, last_error=c.tried.error,
                  first_attempt_at=c.tried.first_at) for c in outcome.calls],
        next_attempt_at=iso(int(due.timestamp() * 1000)))
    checkpoints = step.checkpoints
    assert isinstance(checkpoints, StoreCheckpoints)
    kept = {**checkpoints.pending(),
            **{checkpoint_key(c.ref): c.tried.dump() for c in outcome.calls}}
    result = rt.store.runs.schedule_retry(step.run_id, step.version, owner, wait,
                                          int(due.timestamp() * 1000), wait.wire(),
                                          checkpoints=kept, tools=[c.tool for c in outcome.calls])
    if not result.ok:
        raise LostClaim(f"run {step.run_id}: the wait to retry at version {step.version} was "
                        f"refused ({result.verdict}: the run is {result.status or 'gone'})")
    tried = ", ".join(f"{c.tool} attempt {c.tried.failed} of {c.max_attempts} failed "
                      f"({c.error_type})" for c in outcome.calls)
    log.info("run %s waits %.1f s to try again: %s", step.run_id, outcome.wait_s, tried)
    return f"retrying in {outcome.wait_s:.1f} s: {tried}"


def _take_step(agent: Agent, step: Step, record: RunRecord) -> Outcome:
    try:
        if _is_parked(step.history):
            return _resume(agent, step, record)
        return _model_turn_with_retries(agent, step)
    except ResumeError as exc:
        return Fail(step.history, "invalid_resume", exc.message)


def _model_turn_with_retries(agent: Agent, step: Step, attempts: int = 3) -> Outcome:
    """A model turn, tried again (with a short pause) after errors that may pass.

    A `ProviderError` that is not transient (a refused key, an unknown model, a rejected
    request) and a `ConfigError` (no model configured) fail the run at once: trying again
    would only delay the same answer. Transient ones (timeouts, 429, 5xx) have already been
    retried by the provider's SDK; they get `attempts` tries here too.
    """
    for attempt in range(1, attempts + 1):
        try:
            return model_turn(agent, step)
        except (LostClaim, redis.RedisError):
            raise  # not the model's fault: advance() gives the step back for another try
        except Exception as exc:
            permanent = isinstance(exc, ConfigError) or (
                isinstance(exc, ProviderError) and not exc.transient)
            if permanent:
                # No traceback: the message says it all, and provider errors are redacted.
                log.error("model %s failed for run %s: %s: %s", agent.model.name,
                          step.run_id, type(exc).__name__, exc)
                return Fail(step.history, "model_error",
                            f"the model {agent.model.name!r} failed: "
                            f"{type(exc).__name__}: {exc}")
            if attempt == attempts:
                log.exception("model %s failed for run %s", agent.model.name, step.run_id)
                return Fail(step.history, "model_error",
                            f"the model {agent.model.name!r} failed {attempts} times: "
                            f"{type(exc).__name__}: {exc}")
            time.sleep(min(8.0, 0.5 * 4 ** (attempt - 1)))
    raise AssertionError("unreachable")


def _is_parked(history: list[Message]) -> bool:
    last = history[-1] if history else None
    return bool(last and last.role == "model"
                and any(p.meta("interrupt") is not None for p in last.tool_requests))


def _resume(agent: Agent, step: Step, record: RunRecord) -> Outcome:
    """The parked turn resumed with its answers; on another version of the agent than the
    one it parked on, migrated (when the agent has a hook) and checked first."""
    specs, entries = _parked(step, record)
    parked_on = parked_version(specs)
    if parked_on != agent.version:
        stored = StoredRun(id=step.run_id, agent=agent.name,
                           agent_version=record.agent_version, parked_version=parked_on,
                           messages=step.history, interrupts=specs, answers=entries,
                           metadata=step.run_metadata)
        run = migrated(agent, stored) if agent.migrate is not None else stored
        changed = run if isinstance(run, Changed) else what_changed(agent, run)
        if changed is not None:
            log.warning("run %s cannot resume: %s", step.run_id, changed.message)
            error = changed.error(agent, parked_on)
            return Fail(step.history, AGENT_CHANGED, error["message"], error["detail"])
        assert isinstance(run, StoredRun)
        step = replace(step, history=run.messages)
        specs, entries = run.interrupts, run.answers
        log.info("run %s parked on %s resumes on version %s of %s", step.run_id,
                 parked_on or "an unrecorded version", agent.version, agent.name)
    return resume_turn(agent, step, to_resume(specs, entries))


def _parked(step: Step, record: RunRecord
            ) -> tuple[list[Interrupt], dict[str, ResumeEntry]]:
    """The parked turn's interrupts and their answers, as the claim read them (what the
    park waited on: the store records it, migration 1 for runs parked before it did)."""
    waiting = {p.meta("interrupt", {}).get("id") for p in step.history[-1].tool_requests}
    return ([s for s in record.parked_on if s.id in waiting],
            {k: a.entry() for k, a in record.answers.items()})


def _commit(rt: Runtime, agent: Agent, step: Step, committed: list[Message], owner: str,
            outcome: Outcome, *, inline: bool, tenant: str = "default") -> tuple[bool, int]:
    """Commit one outcome (`committed`: the history the store holds, which the event's
    messages follow); returns (finished with this task, the new version)."""
    store = rt.store
    added = _added(committed, outcome.messages)
    # Where the step's messages are in the history. `messages` goes last: the store keeps
    # them beside the event's data, and readers give them back as its last member
    # (layby.parking.events), so the event reads as it was written.
    event: dict[str, Any] = {"from": len(outcome.messages) - len(added),
                             "historyTo": len(outcome.messages)}
    # Where the step ran and what took how long, for the run's timeline. Not on a park's
    # event: a parked run keeps that one folded to a few words for as long as it waits.
    timed = {"worker": worker_name(), **({"timings": step.timings} if step.timings else {})}
    match outcome:
        case Continue(messages=messages, exhausted=exhausted):
            result = store.runs.advance(step.run_id, step.version, owner, messages,
                                        {**event, **timed, "agentVersion": agent.version,
                                         "messages": dump_messages(added)}, inline=inline,
                                        exhausted=exhausted)
        case Park():
            result = _park(rt, agent, step, owner, outcome, event, tenant)
        case Finish(messages=messages, result=text, exhausted=exhausted):
            event["result"] = text
            result = store.runs.complete(step.run_id, step.version, owner, messages, text,
                                         {**event, **timed, "agentVersion": agent.version,
                                          "messages": dump_messages(added)}, exhausted=exhausted)
        case Fail(messages=messages, code=code, message=message, detail=detail,
                  exhausted=exhausted):
            error = {"code": code, "message": message, **({"detail": detail} if detail else {})}
            result = store.runs.fail(step.run_id, error, version=step.version, owner=owner,
                                     messages=messages, exhausted=exhausted)
        case Retry():
            raise AssertionError("a wait to retry commits nothing (_wait_to_retry)")
    if not result.ok:
        raise LostClaim(f"run {step.run_id}: commit of version {step.version} refused "
                        f"({result.verdict}: the run is {result.status or 'gone'})")
    rt.publish(result.entries)
    if result.dispatch:
        delivery.dispatch(rt.celery, [(step.run_id, n) for n in result.dispatch])
    keep_going = isinstance(outcome, Continue) and inline
    return not keep_going, result.version or step.version


def _park(rt: Runtime, agent: Agent, step: Step, owner: str, outcome: Park,
          event: dict[str, Any], tenant: str) -> Transition:
    """Park the run on the outcome's interrupts as the reviewer policy routes them; the
    answers its rules give, and the announcements to the people the rest wait on, are
    recorded by the park itself."""
    store = rt.store
    interrupts, by_rule = _under_policy(rt, agent, step, outcome.interrupts)
    # What the run waits on (ids and reasons: the interrupts themselves are the
    # run's, read with it); those a rule answered are listed apart (each also has
    # its `interrupt.auto_answered` event).
    event["interrupts"] = [{"id": i.id, "reason": i.reason} for i in interrupts
                           if i.id not in by_rule]
    if by_rule:
        event["answeredByRule"] = [
            {"id": i.id, "rule": i.rule, "status": by_rule[i.id].status}
            for i in interrupts if i.id in by_rule]
    # The park's event carries no messages: a parked run's history is held once,
    # in the run, and readers of the event fill them in from there.
    # Background jobs answer themselves, rules answer what they answer; the rest
    # waits on people, told in the park itself.
    asking = [i for i in interrupts if i.reason != BACKGROUND_JOB and i.id not in by_rule]
    plan = planning.for_park(rt.settings, rt.reviewers, step.run_id, step.version + 1,
                             asking, fits=store.fits_with(step.run_id),
                             slack=planning.slack_stored(store)
                             ) if asking else Announcements()
    # A rule's answer is in the audit trail as any answer, its caller the rule.
    kept = [audit.entry(a.answered_by, tenant, answered_as(i, a.entry()),
                        run=step.run_id, interrupt=i.id, via="policy")
            for i in interrupts if (a := by_rule.get(i.id)) is not None]
    return store.runs.park(step.run_id, step.version, owner, outcome.messages, interrupts,
                           event, plan=plan, by_rule=by_rule, exhausted=outcome.exhausted,
                           audit=kept)


def _under_policy(rt: Runtime, agent: Agent, step: Step, interrupts: list[Interrupt]
                  ) -> tuple[list[Interrupt], dict[str, Answer]]:
    """The interrupts as the reviewer policy routes them, and the answers its rules give
    (recorded by the park itself, so a rule's answer is given once and notifies nobody)."""
    policy = rt.reviewers.policy()
    if policy is None:
        return interrupts, {}
    routed: list[Interrupt] = []
    by_rule: dict[str, Answer] = {}
    for intr in interrupts:
        decision = policy.decide(agent.name, intr, step.run_metadata,
                                 agent.tool(intr.tool_name))
        routed.append(decision.interrupt)
        if decision.answer is not None:
            entry = decision.answer
            by_rule[intr.id] = Answer(
                interrupt_id=intr.id, status=entry.status, payload=entry.payload,
                metadata=entry.metadata, state=InterruptState(entry.status),
                answered_by=f"policy:{decision.rule}", channel="policy",
                answered_at=now_iso())
            log.info("run %s: interrupt %s %s by rule %r", step.run_id, intr.id,
                     "approved" if entry.status == "resolved" else "declined", decision.rule)
    return routed, by_rule


def _added(before: list[Message], after: list[Message]) -> list[Message]:
    """The messages a step added or rewrote (a resume rewrites the parked model message)."""
    same = 0
    for old, new in zip(before, after, strict=False):
        if old != new:
            break
        same += 1
    return after[same:]
