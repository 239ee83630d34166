"""Answers in the store: what an answer is checked against (the run, its interrupts, their
answers and reviews), answers recorded (quorums counted), hand-overs to another reviewer,
deadlines that pass, and the grants reviewers' tokens name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, cast

from layby.generation.interrupts import Interrupt
from layby.parking import codecs, results, scripts
from layby.parking.keys import DEFAULT_TENANT
from layby.parking.records import Announcements, RunRecord
from layby.parking.results import Transition, Verdict
from layby.parking.store.core import Part
from layby.parking.store.fields import (
    INTERRUPT,
    dumps,
    first_scan,
    interrupts_of,
    one_field,
    open_of,
    reviews_of,
    scanned_fields,
    traceparent,
)
from layby.parking.store.outbox import plan_args
from layby.parking.store.runs import read_view, view_of
from layby.wire import Answer, Delegation, Review, Status


class Answers(Part):
    """Answers: checked, recorded, handed on, expired (`store.answers`)."""

    def answerable(self, run_id: str) -> tuple[RunRecord | None, list[Interrupt],
                                               dict[str, Answer], set[str]]:
        """What an answer is checked against, in one round trip: the run, its interrupts,
        their answers and which are open. (The answer's script checks again what can have
        changed since: no transaction needed here.)"""
        keys = self.core.keys_of(run_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(keys.run(run_id), "agent", "status", "version", "metadata", "open",
                   "tenant", "by", "trace")
        first_scan(pipe, keys, run_id, INTERRUPT)
        pipe.hgetall(keys.answers(run_id))
        raw, specs, answers = pipe.execute()
        record = None if raw[0] is None else RunRecord(
            run_id, raw[0], Status(raw[1]), int(raw[2]), [], codecs.metadata(raw[3]),
            tenant=raw[5] or DEFAULT_TENANT, started_by=raw[6], trace=raw[7])
        specs = scanned_fields(self.redis, keys, run_id, INTERRUPT, specs)
        return (record, *interrupts_of(specs, answers, open_of(raw[4])))

    def answer(self, run_id: str, answers: list[Answer], *, require_all: bool = False,
               allow_early: bool = False, votes: dict[str, int] | None = None,
               deadlines: set[str] | None = None, view: bool = False,
               audit: Sequence[str] = (), slack: bool = False,
               trace: str | None = None) -> Transition:
        """Record answers. `votes`: the interrupts whose answer here is an approval counted
        toward several, with the approvals each needs (each reviewer's counts once).
        `deadlines`: the interrupts that expire, when the caller knows (None: any may).
        With `view`, the result's `view` is the run as the answers left it, read in the
        same round trip. With `slack`, the update of the run's Slack messages is among the
        result's `entries` (in the outbox, for the caller to publish). `trace`: the
        answer's trace context (a traceparent), which a resume continues."""
        given: list[dict[str, Any]] = []
        for a in answers:
            need = (votes or {}).get(a.interrupt_id, 1)
            given.append({"id": a.interrupt_id, "answer": dumps(a.wire()), "need": need,
                          "voter": a.answered_by if need > 1 else None,
                          "deadline": deadlines is None or a.interrupt_id in deadlines})
        named: dict[str, Any] = {"require_all": require_all, "allow_early": allow_early,
                                 "answers": given, "audit": list(audit), "slack": slack,
                                 "trace": traceparent(trace)}
        if not view or self.config.min_replicas_ack:
            return results.committed(self.core.run_script("answer_interrupts", run_id, **named))
        reply, read = self._run_then_read("answer_interrupts", run_id, named, read_view)
        return replace(results.committed(reply), view=view_of(run_id, *read))

    def _run_then_read(self, name: str, run_id: str, named: Mapping[str, Any],
                       read: Any) -> tuple[list[Any], list[Any]]:
        """A transition and reads after it, in one round trip and one moment (MULTI): the
        reads see what it wrote. (Not with `min_replicas_ack`: its WAIT is not for MULTI.)"""
        layout = self.core.keys_of(run_id)
        keys = layout.for_scripts(run_id)

        def fill(pipe: Any) -> None:
            self.core.queue(pipe, name, keys, scripts.argv(named))
            read(pipe, layout, run_id)

        reply, *found = self.core.pipelined(fill, name, transaction=True)
        return reply, found

    def delegate(self, run_id: str, interrupt_id: str, handover: Delegation,
                 plan: Announcements | None = None, *, slack: bool = False) -> Transition:
        """Hand an open interrupt from `handover.reviewer` to `handover.to`, recording
        `plan`, the new reviewer's announcements (None: queue the announcement task to plan
        them). AGAIN: handed on before. `slack`: as for `answer`."""
        given, grant_keys = plan_args(plan or Announcements())
        reply = self.core.run_script("delegate_interrupt", run_id, interrupt_id=interrupt_id,
                                     reviewer=handover.reviewer, handover=dumps(handover.wire()),
                                     announce=plan is None, plan=given, slack=slack,
                                     extra_keys=grant_keys)
        if reply[0] == Verdict.AGAIN:
            return Transition(Verdict.AGAIN, interrupt_id=interrupt_id)
        return results.committed(reply)

    def expire(self, run_id: str, answer: Answer, fail_error: dict[str, Any] | None, *,
               slack: bool = False, trace: str | None = None) -> Transition:
        """Apply an interrupt's expiry: `answer`, or `fail_error` to fail the run.
        `slack`, `trace`: as for `answer`."""
        reply = self.core.run_script("expire_interrupt", run_id, interrupt_id=answer.interrupt_id,
                                     answer=dumps(answer.wire()),
                                     fail_error=dumps(fail_error) if fail_error else "",
                                     retention_s=self.config.retention_s, slack=slack,
                                     trace=traceparent(trace))
        return results.committed(reply)

    def interrupts(self, run_id: str) -> tuple[list[Interrupt], dict[str, Answer], set[str]]:
        keys = self.core.keys_of(run_id)

        def fill(pipe: Any) -> None:
            pipe.hget(keys.run(run_id), "open")
            first_scan(pipe, keys, run_id, INTERRUPT)
            pipe.hgetall(keys.answers(run_id))

        open_field, specs, answers = self.core.pipelined(fill, transaction=True)
        return interrupts_of(scanned_fields(self.redis, keys, run_id, INTERRUPT, specs), answers,
                             open_of(open_field))

    def interrupt(self, run_id: str, interrupt_id: str) -> Interrupt | None:
        raw = one_field(self.redis, self.core.keys_of(run_id), run_id, INTERRUPT, interrupt_id)
        return codecs.interrupt(interrupt_id, raw) if raw else None

    def reviews(self, run_id: str) -> dict[str, Review]:
        """How people review each of the run's interrupts (only those under a policy, or
        handed on, have anything)."""
        return reviews_of(cast("dict[str, str]", self.redis.hgetall(
            self.core.keys_of(run_id).review(run_id))))

    def grant(self, ref: str) -> str | None:
        """The grant `ref` names, in the shard of `ref` itself: one read (refs are drawn
        to land in their run's shard, `Keys.fits_with`; a token names no run). While the
        store is between layouts, in the other one's too."""
        layout = self.core.layout
        found = cast("str | None", self.redis.get(layout.keys.shard_of(ref).grant(ref)))
        other = layout.legacy or layout.next
        if found is None and other is not None:
            found = cast("str | None", self.redis.get(other.shard_of(ref).grant(ref)))
        return found
