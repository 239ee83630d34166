"""Answers through the reviewer channels (page, email reply, webhook callback): who the
answer is from, whether they may give it, then the same `control.commands.answer` as every
other way in, recorded with the reviewer, the channel and the time."""

from __future__ import annotations

from dataclasses import dataclass, replace

from layby.control import Runtime, commands
from layby.errors import Invalid, NotFound
from layby.generation.interrupts import ResumeEntry
from layby.parking import Transition
from layby.reviewers import routing, tokens
from layby.reviewers.directory import Reviewer
from layby.reviewers.tokens import BadToken, Grant
from layby.wire import InterruptState, InterruptView, RunView


class NotAllowed(BadToken):
    """A known reviewer who is not (or no longer) asked for this interrupt."""


@dataclass(frozen=True)
class Opened:
    """What a valid token opens: the reviewer, the run and the interrupt it names."""

    grant: Grant
    reviewer: Reviewer
    run: RunView
    interrupt: InterruptView

    @property
    def is_open(self) -> bool:
        return self.interrupt.state is InterruptState.OPEN


def verify_token(rt: Runtime, token: str) -> Grant:
    """The grant behind `token` (one read); BadToken says why not."""

    def lookup(ref: str) -> Grant | None:
        raw = rt.store.answers.grant(ref)
        return Grant.loads(raw) if raw else None

    return tokens.verify(rt.reviewers.token_keys(), token, lookup)


def open_token(rt: Runtime, token: str) -> Opened:
    """The reviewer, run and interrupt behind `token`; BadToken says why not."""
    return open_grant(rt, verify_token(rt, token))


def open_grant(rt: Runtime, grant: Grant) -> Opened:
    """The reviewer, run and interrupt a verified token's grant names; NotAllowed when the
    reviewer is gone or no longer asked."""
    reviewer = rt.reviewers.get(grant.reviewer)
    if reviewer is None:
        raise NotAllowed(f"reviewer {grant.reviewer!r} is no longer in the reviewer directory")
    return _opened(rt, grant, reviewer)


def open_expired(rt: Runtime, grant: Grant) -> Opened | None:
    """What an expired token named, to show where its request stands (it answers nothing);
    None when the reviewer or the run is gone."""
    reviewer = rt.reviewers.get(grant.reviewer)
    try:
        return _opened(rt, grant, reviewer) if reviewer else None
    except (NotFound, NotAllowed):
        return None


def open_for(rt: Runtime, reviewer: Reviewer, run_id: str, interrupt_id: str) -> Opened:
    """What a reviewer authenticated otherwise (a signed webhook) may answer."""
    run = commands.get_run(rt, run_id)
    grant = Grant(run_id, interrupt_id, reviewer.id, run.version, 0)
    return _opened(rt, grant, reviewer, run)


def reopen(rt: Runtime, opened: Opened) -> Opened:
    """The same request read again, after an answer was given or refused: the token and the
    reviewer were checked when it was opened (a link that expires or a reviewer removed in
    between must not turn the reply to their own answer into a refusal)."""
    run = commands.get_run(rt, opened.run.id)
    interrupt = next(i for i in run.interrupts if i.id == opened.interrupt.id)
    return replace(opened, run=run, interrupt=interrupt)


def _opened(rt: Runtime, grant: Grant, reviewer: Reviewer, run: RunView | None = None
            ) -> Opened:
    run = run or commands.get_run(rt, grant.run_id)
    interrupt = next((i for i in run.interrupts if i.id == grant.interrupt_id), None)
    if interrupt is None:
        raise NotFound(f"run {run.id} has no interrupt {grant.interrupt_id!r}", run_id=run.id)
    if reviewer.id not in {r.id for r in rt.reviewers.asked_for(interrupt)}:
        handed = routing.handed_to(interrupt, reviewer.id)
        if handed != reviewer.id:
            raise NotAllowed(f"{reviewer.label} handed this request to {handed}; this link "
                             "no longer answers it", run_id=run.id)
        raise NotAllowed(f"{reviewer.label} is not among the reviewers of this request",
                         run_id=run.id)
    return Opened(grant, reviewer, run, interrupt)


def refuse_if_closed(opened: Opened) -> None:
    """Refuse (Conflict, naming who answered first, how and when) an interrupt that is no
    longer open, before its answer is read: a late reply that cannot be read must not be
    told the request is still open."""
    if not opened.is_open:
        raise commands.not_open(opened.run.id, opened.interrupt, opened.interrupt.answer,
                                status=opened.run.status.value)


def handover_choices(rt: Runtime, interrupt: InterruptView) -> list[tuple[str, str]]:
    """(id, label) of the reviewers a request can be handed to: those who can be told (an
    email, a webhook or Slack), not asked already, who have not handed it on themselves."""
    asked = {r.id for r in rt.reviewers.asked_for(interrupt)}
    gave_up = {d.reviewer for d in interrupt.delegations}
    return [(r.id, f"{r.name} ({r.id})" if r.name else r.id)
            for r in rt.reviewers.directory().reviewers.values()
            if (r.email or r.webhook or r.slack_id) and r.id not in asked | gave_up]


def delegate(rt: Runtime, opened: Opened, to: str, *, channel: str,
             note: str | None = None) -> Transition:
    """The opened reviewer hands the request to `to` (another reviewer of the directory)."""
    refuse_if_closed(opened)
    return commands.delegate(rt, opened.run.id, opened.interrupt.id,
                             reviewer=opened.reviewer.id, to=to,
                             by=f"reviewer:{opened.reviewer.id}", channel=channel, note=note)


def answer(rt: Runtime, opened: Opened, entry: ResumeEntry, *, channel: str,
           idempotency_key: str | None = None) -> Transition:
    """Record `entry` for the opened interrupt. A token from an earlier step of the run (a
    version that moved on) is refused; an interrupt already answered is refused with who
    answered it first (so a token is accepted once), unless this is the same request
    again with the same `idempotency_key`."""
    grant, run = opened.grant, opened.run
    if opened.is_open and grant.version != run.version:
        raise BadToken(f"this token was issued for version {grant.version} of run {run.id}, "
                       f"which is now at version {run.version}", run_id=run.id)
    if entry.metadata and "replaceInput" in entry.metadata and not \
            commands.reviewers_may_edit(rt, run.agent, opened.interrupt):
        # Reviewers approve or decline what the agent asked for; changing what the tool
        # runs with is for the run's owner, unless the tool lets reviewers edit it.
        raise Invalid("reviewers cannot change the tool's input (metadata.replaceInput) of "
                      f"{opened.interrupt.tool_name!r}: approve or decline it, or ask the "
                      "run's owner to change it through /v1 (or declare the tool with "
                      "allow_edit=True)", run_id=run.id)
    entry = entry.model_copy(update={"interrupt_id": opened.interrupt.id})
    return commands.answer(rt, run.id, [entry], by=f"reviewer:{opened.reviewer.id}",
                           channel=channel, idempotency_key=idempotency_key)
