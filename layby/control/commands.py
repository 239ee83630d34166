"""What every way in can do to a run: start it, answer it, hand a request on, resume it,
cancel it, requeue it.

The HTTP API, the `layby` command, the notifier's channels and Celery's `layby.start_run`
all come through here: each command checks its input, commits one transition through
`parking`, then publishes what the transition put in the outbox. Errors are
`layby.errors.RequestError`s that say what is wrong and what to do.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import uuid
from datetime import UTC, datetime
from typing import Any, NoReturn

from layby.access import tokens
from layby.access.rights import (
    ADMIN,
    ANSWER,
    CANCEL,
    OPERATOR,
    READ,
    Identity,
    keys_named,
    may_review,
)
from layby.broker_config import tracing
from layby.control import audit
from layby.control.runtime import Runtime
from layby.errors import (
    ConfigError,
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from layby.generation.answers import check_answer, check_storable
from layby.generation.interrupts import CONFIRMATION, Interrupt, ResumeEntry
from layby.generation.messages import Message, text_message, why_not_a_start
from layby.generation.tools import Tool
from layby.parking import RunRecord, Store, Transition, Verdict, generated_run_id, iso
from layby.parking.keys import DEFAULT_TENANT
from layby.parking.records import Ownership
from layby.reviewers import routing
from layby.wire import Answer, Delegation, InterruptState, RunView, Status

log = logging.getLogger(__name__)


# Run ids go inside Redis hash tags and space-separated deadline entries.
RUN_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def new_run_id() -> str:
    """A fresh run id, as the store draws one: `run_` and 22 letters and digits."""
    return generated_run_id()


def start_run(rt: Runtime, agent: str, *, input: Any = None,
              messages: list[Message] | None = None, metadata: dict[str, Any] | None = None,
              idempotency_key: str | None = None, run_id: str | None = None,
              who: Identity = OPERATOR) -> tuple[RunView, bool]:
    """Create a run of `who`'s tenant (who must be allowed to start `agent`) and queue its
    first turn. Returns the run and whether it is new. An idempotency key is the tenant's:
    another tenant's same key is another run."""
    who.may_start(agent)
    if run_id is not None and not RUN_ID.match(run_id):
        raise Invalid(f"run id {run_id[:80]!r} is not usable: use 1 to 128 letters, digits, "
                      "'_', '-' or '.'")
    store = rt.store
    _check_agent(rt, agent)
    messages = _first_messages(input, messages)
    tenant = who.tenant
    if tenant != DEFAULT_TENANT and store.layout.keys.shard_count is None:
        raise Unavailable("runs of a tenant other than `default` need the store's sharded "
                          "layout, which this store is still moving to: finish the upgrade "
                          "(`layby migrate`), then start it again")
    if idempotency_key is not None and tenant != DEFAULT_TENANT:
        idempotency_key = f"{tenant}/{idempotency_key}"
    run_id = run_id or store.runs.new_run_id(idempotency_key)
    # The version it starts on is this process's; a run of an agent that pins keeps it.
    declared = rt.agents[agent]
    pinned = declared.on_change == "pin"
    # Who started it is kept where four eyes may apply: not for an admin's run.
    started_by = None if who.has(ADMIN) else who.caller
    result = store.runs.create_run(run_id, agent, input=input, messages=messages,
                                   metadata=metadata or {}, idempotency_key=idempotency_key,
                                   agent_version=declared.version, pinned=pinned,
                                   tenant=tenant, started_by=started_by,
                                   audit=[audit.entry(who.caller, tenant, "start", run=run_id)],
                                   trace=tracing.current())
    if result.verdict is Verdict.EXISTS:
        return _started_before(store, result, run_id, agent, idempotency_key, who), False
    rt.publish(result.entries)
    # The run as accepted, from what was written (a read could show a quick worker's
    # first turn in the reply to the request that created the run).
    created = iso(result.at or 0)
    return RunView(id=run_id, agent=agent, status=Status.QUEUED, version=1,
                   agent_version=declared.version, pinned=pinned, input=input,
                   messages=messages, interrupts=[], metadata=metadata or {},
                   tenant=tenant, started_by=started_by, created_at=created,
                   updated_at=created), True


def _check_agent(rt: Runtime, agent: str) -> None:
    """NotFound, naming the agents loaded here, for one this process does not load: a run
    starts on this process's version of its agent."""
    names = set(rt.agents)
    if agent not in names:
        raise NotFound(f"no agent named {agent!r}; known agents: {sorted(names)}",
                       detail={"agents": sorted(names)})


def _first_messages(input: Any, messages: list[Message] | None) -> list[Message]:
    """The history a run starts with: the user's request as one message, or the history
    given, when it can start a run."""
    if (input is None) == (messages is None):
        raise Invalid("give either `input` (the user's request) or `messages` (a history), "
                      "not both and not neither")
    if messages is None:
        text = input if isinstance(input, str) else json.dumps(input)
        messages = [text_message("user", text)]
    elif not messages:
        raise Invalid("`messages` is empty: give at least one user message")
    elif (why := why_not_a_start(messages)) is not None:
        raise Invalid(why, detail=[{"path": "/messages", "message": why}])
    return messages


def _started_before(store: Store, result: Transition, run_id: str, agent: str,
                    idempotency_key: str | None, who: Identity) -> RunView:
    """The run an earlier start with the same idempotency key made, given back to a caller
    who may see it; any other taken run id is a Conflict."""
    existing = store.runs.view(result.run_id or "")
    if existing is None:
        raise Conflict(f"run {result.run_id} for this idempotency key has expired")
    if not who.sees(existing.id, existing.tenant):
        # A run id taken by another tenant: said as any taken id, nothing of the run.
        raise Conflict(f"run id {run_id!r} is already taken", run_id=run_id)
    if idempotency_key is None or existing.agent != agent:
        raise Conflict(f"run id {run_id!r} is already taken",
                       run_id=run_id, detail={"runId": result.run_id})
    return existing


def not_found(run_id: str) -> NoReturn:
    raise NotFound(f"no run {run_id!r} (unknown, or finished and past retention)",
                   run_id=run_id)


def get_run(rt: Runtime, run_id: str, who: Identity = OPERATOR) -> RunView:
    """The run, when `who` may read it (another tenant's is NotFound, as one that is not)."""
    if who.run is not None:
        reach(rt, run_id, who, READ)  # a token: its run's state first
    view = rt.store.runs.view(run_id)
    if view is None:
        not_found(run_id)
    who.reach(run_id, view.tenant)
    who.require(READ, f"run {run_id}")
    return view


def reach(rt: Runtime, run_id: str, who: Identity, right: str) -> Ownership:
    """NotFound unless the run exists for `who` (its tenant's, or `who` an admin), then
    Forbidden unless `who` holds `right`, and for a run token, Unauthorized once its run
    ended or its tokens were revoked: one read of the run."""
    run = rt.store.runs.whose(run_id)
    if not run.exists:
        not_found(run_id)
    who.reach(run_id, run.tenant)
    admit_token(who, run)
    who.require(right, f"run {run_id}")
    return run


def admit_token(who: Identity, run: Ownership) -> None:
    """A run token is good while its run goes on and its tokens are not revoked (what the
    token's signature cannot say: read with the run)."""
    if who.run is None:
        return
    if run.status is not None and run.status.finished:
        raise Unauthorized(f"this run token's run ended ({run.status.value}): it is taken no "
                           "more")
    if run.tokens_after is not None and (who.issued_ms or 0) <= run.tokens_after:
        raise Unauthorized("this run token was revoked: ask for a new one")


def mint_token(rt: Runtime, run_id: str, who: Identity, can: list[str], ttl_s: int
               ) -> tuple[str, str]:
    """A run token for `run_id` with `can` (some of `who`'s own rights on it), for `ttl_s`
    seconds: (the token, when it expires). Only a key mints one."""
    if who.run is not None:
        raise Forbidden("a run token mints no tokens: ask the service that gave it",
                        detail={"right": "mint"})
    run = reach(rt, run_id, who, READ)
    if run.status is not None and run.status.finished:
        raise Conflict(f"run {run_id} has ended ({run.status.value}): a token for it would "
                       "be refused", run_id=run_id, detail={"status": run.status.value})
    wrong = sorted(set(can) - tokens.TOKEN_RIGHTS)
    if wrong:
        raise Invalid(f"a run token cannot carry {wrong[0]!r}: it may carry "
                      f"{sorted(tokens.TOKEN_RIGHTS)}", detail={"right": wrong[0]})
    for right in can:
        who.require(right, "(a token carries no more than the key that mints it)")
    if not 1 <= ttl_s <= tokens.MAX_TTL_S:
        raise Invalid(f"ttlS must be 1 to {tokens.MAX_TTL_S} seconds, not {ttl_s}")
    try:
        keys = rt.reviewers.token_keys()
    except ConfigError:
        raise ConfigError("run tokens are signed with the token keys: set LAYBY_TOKEN_KEYS "
                          "to 'id:secret' (`layby secret tokens`; `layby up` makes them)",
                          run_id=run_id) from None
    now_ms = rt.store.now_ms()
    expires_s = now_ms // 1000 + ttl_s
    token = tokens.mint(keys, tokens.RunToken(
        run_id, run.tenant, who.caller, frozenset(can), now_ms, expires_s))
    rt.store.audit.record([audit.entry(who.caller, run.tenant, "token.mint", run=run_id)],
                          of=run_id)
    log.info("run token minted for run %s by %s: %s for %d s", run_id, who.caller,
             ",".join(sorted(can)), ttl_s, extra={"run_id": run_id})
    return token, iso(expires_s * 1000)


def revoke_tokens(rt: Runtime, run_id: str, who: Identity) -> str:
    """Refuse every run token of `run_id` minted until now; when (ISO 8601)."""
    if who.run is not None:
        raise Forbidden("a run token revokes no tokens", detail={"right": "mint"})
    run = reach(rt, run_id, who, READ)
    at = rt.store.runs.revoke_tokens(run_id, who.caller, audit=[
        audit.entry(who.caller, run.tenant, "token.revoke", run=run_id)])
    if at is None:
        not_found(run_id)
    return iso(at)


def answer(rt: Runtime, run_id: str, entries: list[ResumeEntry], *, by: str, channel: str,
           require_all: bool = False, idempotency_key: str | None = None,
           view: bool = False, who: Identity | None = None) -> Transition:
    """Record answers; the one that closes the last open interrupt queues the resume. With
    `view`, the result's `view` is the run as they left it (read in the same round trip).

    Refuses, without storing anything: unknown ids (NotFound), answers to what is not open
    or has expired (Conflict, naming who answered first), payloads outside their schema
    (Invalid, listing the errors), and with `require_all`, a set that leaves one open.
    The same request again with the same `idempotency_key` (a client retrying after a lost
    reply or a 503) is its own answer, not a rival's: verdict EXISTS, nothing recorded.
    `who`: a key's identity (the API, AG-UI): another tenant's run is NotFound; an approval
    needs `approve`, and not from the key that started the run (four eyes); any other
    answer needs `answer`. Reviewers' channels give none: the directory decides there.
    """
    record, specs, answers, open_ids = rt.store.answers.answerable(run_id)
    if record is None:
        raise NotFound(f"no run {run_id!r}", run_id=run_id)
    with tracing.answering(run_id, channel, [e.interrupt_id for e in entries], record.trace):
        return _answer(rt, record, specs, answers, open_ids, entries, by=by, channel=channel,
                       require_all=require_all, idempotency_key=idempotency_key, view=view,
                       who=who)


def _answer(rt: Runtime, record: RunRecord, specs: list[Interrupt],
            answers: dict[str, Answer], open_ids: set[str], entries: list[ResumeEntry], *,
            by: str, channel: str, require_all: bool, idempotency_key: str | None,
            view: bool, who: Identity | None) -> Transition:
    run_id = record.id
    if who is not None:
        _admit_answerer(rt, who, record, specs, entries)
    if not entries:
        raise Invalid("no answers given: `resume` needs one entry per open interrupt")
    by_id = {s.id: s for s in specs}
    request_id = _request_id(by, idempotency_key)
    if idempotency_key is not None and _already_given(run_id, entries, answers, request_id):
        return Transition(Verdict.EXISTS, record.version)  # taken before: nothing new
    records = _answer_records(rt, record, entries, by_id, answers, open_ids, by=by,
                              channel=channel, request_id=request_id)
    votes = _counted_approvals(records, by_id)
    deadlines = {r.interrupt_id for r in records if by_id[r.interrupt_id].expires_at}
    kept = [audit.entry(by, record.tenant, answered_as(by_id[r.interrupt_id], r.entry()),
                        run=run_id, interrupt=r.interrupt_id, via=channel) for r in records]
    result = _recorded(rt.store.answers.answer(run_id, records, require_all=require_all,
                                               votes=votes, deadlines=deadlines, view=view,
                                               audit=kept, slack=bool(rt.settings.slack),
                                               trace=tracing.current()),
                       run_id, records, by_id)
    for rec in records:
        log.info("interrupt %s of run %s %s by %s via %s", rec.interrupt_id, run_id,
                 rec.state.value, by, channel,
                 extra={"run_id": run_id, "interrupt_id": rec.interrupt_id})
    # The resume's message, when the broker is elsewhere, and the update of the run's
    # Slack messages: both in the outbox since the answer's commit.
    rt.publish(result.entries)
    return result


def _admit_answerer(rt: Runtime, who: Identity, record: RunRecord, specs: list[Interrupt],
                    entries: list[ResumeEntry]) -> None:
    """A key's identity answers only a run it reaches (a run token, only while it is still
    good), and only with the rights these answers need (`_may_answer`)."""
    who.reach(record.id, record.tenant)
    if who.run is not None:
        admit_token(who, rt.store.runs.whose(record.id))
    _may_answer(who, record, specs, entries)


def _answer_records(rt: Runtime, record: RunRecord, entries: list[ResumeEntry],
                    by_id: dict[str, Interrupt], answers: dict[str, Answer],
                    open_ids: set[str], *, by: str, channel: str,
                    request_id: str) -> list[Answer]:
    """The answers to store, one an entry, each checked first (`_answerable`): a request
    answers an interrupt once."""
    records: list[Answer] = []
    for entry in entries:
        spec = _answerable(rt, record, entry, by_id, answers, open_ids)
        if any(r.interrupt_id == spec.id for r in records):
            raise Invalid(f"interrupt {spec.id} is answered twice in one request",
                          run_id=record.id)
        records.append(Answer(interrupt_id=spec.id, status=entry.status, payload=entry.payload,
                              metadata=entry.metadata, state=InterruptState(entry.status),
                              answered_by=by, channel=channel, answered_at=now_iso(),
                              answer_id=request_id))
    return records


def _counted_approvals(records: list[Answer], by_id: dict[str, Interrupt]) -> dict[str, int]:
    """The interrupts `records` approve that need several approvals, with how many each
    needs (the store's `votes`)."""
    # Approvals of requests that need several are counted, each reviewer's once; a
    # decline is an ordinary answer and closes the request.
    return {r.interrupt_id: by_id[r.interrupt_id].required_approvals for r in records
            if by_id[r.interrupt_id].required_approvals > 1 and approves(r.entry())}


def answered_as(spec: Interrupt, entry: ResumeEntry) -> str:
    """What an answer is, as the audit names it: an approval (a yes to a confirmation), a
    decline, or an answer."""
    if entry.status == "cancelled":
        return "decline"
    if spec.reason == CONFIRMATION:
        return "approve" if approves(entry) else "decline"
    return "answer"


def _may_answer(who: Identity, record: RunRecord, specs: list[Interrupt],
                entries: list[ResumeEntry]) -> None:
    """An approval (a yes to a confirmation) needs `approve` and four eyes; any other
    answer `answer`; an interrupt naming keys among its reviewers (at any level), one of
    them. An entry naming no interrupt of the run is left to the checks after."""
    by_id = {s.id: s for s in specs}
    for entry in entries:
        spec = by_id.get(entry.interrupt_id)
        if spec is not None:
            may_review(who, spec.id, keys_named([
                *(spec.reviewers or ()),
                *(name for step in spec.escalation or () for name in step.reviewers)]))
        if spec is not None and spec.reason == CONFIRMATION and approves(entry):
            who.may_approve(record.id, record.started_by)
        else:
            who.require(ANSWER, f"(interrupt {entry.interrupt_id})")


def approves(entry: ResumeEntry) -> bool:
    """Whether an answer says yes: resolved, and not `{"approved": false}` or `false`."""
    payload = entry.payload
    return entry.status == "resolved" and payload is not False and not (
        isinstance(payload, dict) and payload.get("approved") is False)


def _request_id(by: str, idempotency_key: str | None) -> str:
    """The id every answer of one request carries: random, or, with an idempotency key,
    the same for the same caller and key (another caller's key never matches)."""
    if idempotency_key is None:
        return uuid.uuid4().hex
    return "idem-" + hashlib.sha256(f"{by}\x00{idempotency_key}".encode()).hexdigest()[:32]


def _already_given(run_id: str, entries: list[ResumeEntry], answers: dict[str, Answer],
                   request_id: str) -> bool:
    """Whether this request (same caller, same idempotency key) was taken already: then
    its retry stands as it was. The key reused for a different answer is refused."""
    mine = [answers[e.interrupt_id] for e in entries
            if e.interrupt_id in answers and answers[e.interrupt_id].answer_id == request_id]
    if not mine:
        return False
    if len(mine) != len(entries) or any(a.entry() != e for a, e in zip(mine, entries, strict=True)):
        raise Conflict("this idempotency key (the Idempotency-Key, or a callback's "
                       "webhook-id) was used for another answer; send a new key with a new "
                       "answer", run_id=run_id)
    return True


def _answerable(rt: Runtime, record: RunRecord, entry: ResumeEntry,
                by_id: dict[str, Interrupt], answers: dict[str, Answer],
                open_ids: set[str]) -> Interrupt:
    """The interrupt `entry` answers, once every check a stored answer must pass passed."""
    run_id = record.id
    _check_storable(entry, rt.settings.max_answer_bytes)
    spec = by_id.get(entry.interrupt_id)
    if spec is None:
        raise NotFound(f"run {run_id} has no interrupt {entry.interrupt_id!r}",
                       run_id=run_id, detail={"interruptId": entry.interrupt_id})
    if entry.interrupt_id not in open_ids:  # the status says why: cancelled, failed…
        raise not_open(run_id, spec, answers.get(spec.id), status=record.status.value)
    _check_expiry(run_id, spec)
    errors = check_answer(spec, entry, _tool(rt, record.agent, spec.tool_name))
    if errors:
        raise Invalid(f"the answer to interrupt {spec.id} does not match what it asks for",
                      run_id=run_id, detail={"interruptId": spec.id, "errors": errors})
    return spec


def _recorded(result: Transition, run_id: str, records: list[Answer],
              by_id: dict[str, Interrupt]) -> Transition:
    """The store's verdict on the answers, or the refusal it means for the caller."""
    if result.verdict is Verdict.CONFLICT:
        if result.first is not None and result.first.answer_id in {r.answer_id for r in records}:
            # Our own answer, recorded by a first attempt whose reply was lost (a replay of
            # the script, or the caller's retry with its idempotency key): it stands; the
            # outbox publishes what it queued.
            return Transition(Verdict.OK, result.version)
        raise not_open(run_id, by_id[result.interrupt_id or ""], result.first,
                       status=result.status.value if result.status else None)
    if result.verdict is Verdict.AGAIN and result.first is not None:
        first = result.first
        if first.answer_id in {r.answer_id for r in records}:
            return Transition(Verdict.EXISTS, result.version)  # this request, again
        spec = by_id[result.interrupt_id or ""]
        raise Conflict(f"{first.answered_by} already approved interrupt {spec.id} (via "
                       f"{first.channel} at {first.answered_at}); it needs "
                       f"{spec.required_approvals} approvals from different reviewers, so "
                       "another reviewer must give the next one", run_id=run_id,
                       detail={"interruptId": spec.id, "approval": first.wire(),
                               "requiredApprovals": spec.required_approvals})
    if result.verdict is Verdict.INCOMPLETE:
        missing = sorted(set(result.still_open) - {r.interrupt_id for r in records})
        raise Invalid("a resume must answer every open interrupt; still open: "
                      f"{missing}", run_id=run_id, detail={"open": sorted(result.still_open)})
    if not result.ok:
        raise NotFound(f"run {run_id} or one of its interrupts is gone ({result.verdict})",
                       run_id=run_id)
    return result


def _check_storable(entry: ResumeEntry, max_bytes: int) -> None:
    """Every channel's answers (pages, mail, callbacks, not only /v1's bodies) stored whole
    or not at all: refused when Redis could not take them or they exceed
    LAYBY_MAX_ANSWER_BYTES."""
    what = f"the answer to interrupt {entry.interrupt_id}"
    check_storable([entry.payload, entry.metadata], what)
    size = len(json.dumps([entry.payload, entry.metadata]).encode())
    if size > max_bytes:
        raise TooLarge(f"{what} is {size} bytes; at most {max_bytes} are taken "
                       "(LAYBY_MAX_ANSWER_BYTES)")


def _tool(rt: Runtime, agent_name: str, tool_name: str) -> Tool | None:
    """The tool itself where this process loads the agent (the gateway and workers do)."""
    agent = rt.agents.get(agent_name)
    return agent.tool(tool_name) if agent else None


def reviewers_may_edit(rt: Runtime, agent_name: str, interrupt: Interrupt) -> bool:
    """Whether reviewers may change the arguments of the call `interrupt` gates: a tool
    declared with `allow_edit=True` that runs again once approved (not an interrupt tool,
    whose answer is its output), approved by one reviewer."""
    found = _tool(rt, agent_name, interrupt.tool_name)
    # Not under a quorum: each approver would approve other arguments, and the last one's
    # edit would run without the others having seen it.
    return bool(found and found.allow_edit and interrupt.mode == "restart"
                and interrupt.required_approvals <= 1)


def _check_expiry(run_id: str, spec: Interrupt) -> None:
    if spec.expires_at and spec.expires_at < now_iso():
        raise Conflict(f"interrupt {spec.id} expired at {spec.expires_at}; its expiry policy "
                       f"({spec.on_expire.action.value}) applies", run_id=run_id,
                       detail={"interruptId": spec.id, "expiresAt": spec.expires_at})


def not_open(run_id: str, spec: Interrupt, first: Answer | None,
             status: str | None = None) -> Conflict:
    if first is None:
        return Conflict(f"interrupt {spec.id} is not open: the run is {status or 'over'}",
                        run_id=run_id, detail={"interruptId": spec.id, "runStatus": status})
    return Conflict(f"interrupt {spec.id} was already {first.state.value} by "
                    f"{first.answered_by} via {first.channel} at {first.answered_at}",
                    run_id=run_id, detail={"interruptId": spec.id, "answer": first.wire()})


def delegate(rt: Runtime, run_id: str, interrupt_id: str, *, reviewer: str, to: str,
             by: str, channel: str, note: str | None = None) -> Transition:
    """Hand `reviewer`'s part in an open interrupt to `to`, another reviewer of the
    directory: `to` is asked (a fresh token and notification), `reviewer` no longer is."""
    directory = rt.reviewers.directory()
    run = get_run(rt, run_id)
    intr = next((i for i in run.interrupts if i.id == interrupt_id), None)
    if intr is None:
        raise NotFound(f"run {run_id} has no interrupt {interrupt_id!r}", run_id=run_id)
    if intr.state is not InterruptState.OPEN:
        raise not_open(run_id, intr, intr.answer, status=run.status.value)
    target = directory.reviewers.get(to)
    if target is None:
        raise Invalid(f"there is no reviewer {to!r} in the reviewer directory to hand this "
                      "request to; use a reviewer's id", run_id=run_id)
    if to == reviewer:
        raise Invalid(f"{to} cannot hand a request to themselves", run_id=run_id)
    if any(d.reviewer == to for d in intr.delegations):
        raise Invalid(f"{target.label} handed this request on already; pick someone else",
                      run_id=run_id)
    if any(a.answered_by == f"reviewer:{reviewer}" for a in intr.approvals):
        # Their approval counts towards the quorum: handing on would let it count twice.
        raise Conflict(f"{reviewer} approved this request already; an approval that counts "
                       "cannot be handed on", run_id=run_id)
    if to in {r.id for r in rt.reviewers.asked_for(intr)}:
        raise Invalid(f"{target.label} is already asked for this request; pick someone "
                      "else", run_id=run_id)
    handover = Delegation(reviewer=reviewer, to=to, by=by, channel=channel, at=now_iso(),
                          note=note[:2000] if note else None)
    # The giver's Slack message no longer answers it: its update says so, without buttons.
    result = rt.store.answers.delegate(run_id, interrupt_id, handover,
                                       slack=bool(rt.settings.slack))
    if result.verdict is Verdict.AGAIN:
        raise Conflict(f"{reviewer} already handed this request to "
                       f"{routing.handed_to(intr, reviewer)}", run_id=run_id)
    if result.verdict is Verdict.CONFLICT:
        raise not_open(run_id, intr, result.first,
                       status=result.status.value if result.status else None)
    if not result.ok:
        raise NotFound(f"run {run_id} is gone ({result.verdict})", run_id=run_id)
    log.info("interrupt %s of run %s handed from %s to %s via %s", interrupt_id, run_id,
             reviewer, to, channel, extra={"run_id": run_id, "interrupt_id": interrupt_id})
    rt.publish(result.entries)
    return result


def answer_job(rt: Runtime, run_id: str, interrupt_id: str, *, task: str, result: Any = None,
               error: str | None = None) -> str:
    """A background job finished: its result (or failure) answers its interrupt, even when
    the job beat the park (the answer waits in the store and the park applies it)."""
    store = rt.store
    payload = {"status": "failed", "error": error} if error is not None else result
    record = Answer(interrupt_id=interrupt_id, status="resolved", payload=payload,
                    state=InterruptState.RESOLVED, answered_by=f"job:{task}", channel="job",
                    answered_at=now_iso())
    # The job's own span is in the run's trace already (the step that started it sent it).
    with tracing.answering(run_id, "job", [interrupt_id], None):
        outcome = store.answers.answer(run_id, [record], allow_early=True,
                                       trace=tracing.current())
        rt.publish(outcome.entries)
    return outcome.verdict.value


def cancel(rt: Runtime, run_id: str, *, by: str, reason: str | None = None,
           who: Identity | None = None) -> RunView:
    whose = reach(rt, run_id, who, CANCEL) if who is not None else rt.store.runs.whose(run_id)
    result = rt.store.runs.cancel(run_id, by, reason,
                                  audit=[audit.entry(by, whose.tenant, "cancel", run=run_id)],
                                  slack=bool(rt.settings.slack))
    if result.verdict is Verdict.MISSING:
        raise NotFound(f"no run {run_id!r}", run_id=run_id)
    if result.verdict is Verdict.FINISHED:
        raise Conflict(f"run {run_id} is already {result.status}", run_id=run_id,
                       detail={"status": result.status})
    rt.publish(result.entries)  # the update of its Slack messages
    return get_run(rt, run_id)


def requeue(rt: Runtime, run_id: str) -> Transition:
    """Queue a run's pending step again (for a step whose message was lost; a retrying run's
    failed calls are tried now)."""
    result = rt.store.runs.requeue(run_id, owner="*")
    if result.verdict is Verdict.MISSING:
        raise NotFound(f"no run {run_id!r}", run_id=run_id)
    if result.verdict is Verdict.SKIPPED:
        raise Conflict(f"run {run_id} is {result.status}: nothing to requeue", run_id=run_id)
    rt.publish(result.entries)
    return result
