"""One step of an agent loop, as a pure function of the history.

`model_turn` calls the model once and runs every tool it asked for (in parallel); `resume_turn`
applies answers to a parked turn the way Genkit does (`respond`, `restart`, pending outputs).
Both return an `Outcome`: go on, park on interrupts, finish, fail, or wait to try failed
tool calls again (`Retry`, under their `RetryPolicy`). Nothing here talks to Redis or
Celery: durability comes in through `Checkpoints` (so a step run twice does not call the
model or a finished tool twice, and a step taken again after a retry's wait knows its
calls' failed attempts) and background jobs through a `JobStarter`.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from pydantic import ValidationError

from layby.errors import InvalidAnswer, UnknownToolCall, UnresolvedToolCall
from layby.generation import spans
from layby.generation.agents import Agent
from layby.generation.interrupts import Interrupt, OnExpire, ResumeMode
from layby.generation.messages import Message, Part, ToolRequest, ToolResponse
from layby.generation.models import ModelRequest
from layby.generation.retries import (
    DEFAULT_RETRY,
    RetryCall,
    RetryLater,
    RetryPolicy,
    Tried,
    checkpoint_key,
)
from layby.generation.tools import (
    Ask,
    EndRun,
    JobStarter,
    Tool,
    ToolContext,
    ToolInterrupt,
    schema_of,
    type_path,
    typed_answer,
)

log = logging.getLogger(__name__)
# How much of a failed attempt's error a run keeps while it waits to try again.
_ERROR_SHOWN = 1000


class Checkpoints(Protocol):
    """Results saved within one version of a run, read back when a step runs again.

    `durable`: whether losing the result could make a second run of the step repeat a side
    effect (a model reply that tools with bodies will act on; a tool's outcome while others
    of its turn still run, or when its turn parks). The rest can be kept in memory: the
    step's commit follows at once, and a step run again computes them again without harm.
    """

    def get(self, key: str) -> Any | None: ...

    def put(self, key: str, value: Any, *, durable: bool = True) -> None: ...


class NoCheckpoints:
    def get(self, key: str) -> Any | None:
        return None

    def put(self, key: str, value: Any, *, durable: bool = True) -> None:
        pass


@dataclass
class Step:
    """Where a run stands when a step begins."""

    run_id: str
    version: int
    history: list[Message]
    run_metadata: dict[str, Any] = field(default_factory=dict)
    checkpoints: Checkpoints = field(default_factory=NoCheckpoints)
    jobs: JobStarter | None = None
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    # Whether a failed call may wait to be tried again (False while a layby that knows no
    # such waits shares the store: its failure then counts as its last attempt).
    retries: bool = True
    # How long its model call and each tool call took, as they happen (for the run's
    # timeline): {"kind": "model"|"tool", "name", "ms", and a tool's "ref" and "outcome"}.
    timings: list[dict[str, Any]] = field(default_factory=list)

    @property
    def turns_taken(self) -> int:
        return sum(1 for m in self.history if m.role == "model")


# Each outcome but `Retry` names, in `exhausted`, the tools whose calls ran out of attempts
# in the step (for /metrics).
@dataclass
class Continue:
    messages: list[Message]
    # Nothing ran to reach it (a resume that only applied answers): a step run again
    # reaches it again, so it needs no commit of its own before the next turn.
    replayable: bool = False
    exhausted: list[str] = field(default_factory=list)


@dataclass
class Park:
    messages: list[Message]
    interrupts: list[Interrupt]
    exhausted: list[str] = field(default_factory=list)


@dataclass
class Finish:
    messages: list[Message]
    result: str
    exhausted: list[str] = field(default_factory=list)


@dataclass
class Fail:
    messages: list[Message]
    code: str
    message: str
    detail: dict[str, Any] | None = None  # kept in the run's error beside code and message
    exhausted: list[str] = field(default_factory=list)


@dataclass
class Retry:
    """Calls of the turn failed in a way their policy tries again: the step is to be taken
    again, at the same version, once the longest of their waits is over. Nothing is
    committed (`messages` is the history as it was); what the turn's other calls did is
    kept in its checkpoints, and so are the failed calls' attempts (`RetryCall.tried`)."""

    messages: list[Message]
    calls: list[RetryCall]

    @property
    def wait_s(self) -> float:
        return max(c.wait_s for c in self.calls)


Outcome = Continue | Park | Finish | Fail | Retry


# What one tool call came to; stored as a checkpoint under "tool:<ref>" (but a "retry" or a
# "fail", which no step must find again: the call is to run again, or the run ends).
@dataclass
class CallResult:
    kind: str  # "output" | "interrupt" | "end" | "retry" | "fail"
    output: Any = None
    interrupt: Interrupt | None = None
    result: str | None = None
    retry: RetryCall | None = None  # "retry": the call, to try again
    exhausted: bool = False  # the call's error ends its attempts ("output", "fail")

    def dump(self) -> dict[str, Any]:
        return {"kind": self.kind, "output": self.output, "result": self.result,
                "interrupt": self.interrupt.wire() if self.interrupt else None}

    @classmethod
    def load(cls, data: dict[str, Any]) -> CallResult:
        intr = data.get("interrupt")
        return cls(data["kind"], data.get("output"),
                   Interrupt.model_validate(intr) if intr else None, data.get("result"))


def model_turn(agent: Agent, step: Step) -> Outcome:
    """Call the model once, then run the tools it asked for."""
    if step.turns_taken >= agent.max_turns:
        return Fail(step.history, "max_turns",
                    f"agent {agent.name!r} reached its limit of {agent.max_turns} model turns "
                    "without finishing; raise max_turns or change the prompt")
    saved = step.checkpoints.get("model")
    if saved is not None:
        message = Message.model_validate(saved)
    else:
        request = ModelRequest(messages=step.history, system=agent.system,
                               tools=[t.definition() for t in agent.tools], config=agent.config)
        began = time.monotonic()
        with spans.model_call(agent.model.name, step.run_id, step.history) as span:
            reply = agent.model.generate(request)
            spans.record_reply(span, reply.message, reply.finish_reason, reply.usage)
        step.timings.append({"kind": "model", "name": agent.model.name,
                             "ms": round((time.monotonic() - began) * 1000)})
        message = _with_refs(reply.message, step.turns_taken)
        # Tools with bodies act on this reply: a step run again must see the same one.
        step.checkpoints.put("model", message.wire(), durable=any(
            _acts(agent, p.tool_request.name) for p in message.tool_requests
            if p.tool_request is not None))
    calls = message.tool_requests
    if not calls:
        return Finish([*step.history, message], message.text)
    results = _run_calls(agent, step, [(p.tool_request, None) for p in calls])  # type: ignore[misc]
    return _settle(step, message, calls, results, resumed=False)


def _with_refs(message: Message, turn: int) -> Message:
    """Give every tool request a ref unique in its message (models may omit or repeat them)."""
    seen: set[str] = set()
    content = []
    for i, part in enumerate(message.content):
        req = part.tool_request
        if req is not None and (not req.ref or req.ref in seen):
            req = req.model_copy(update={"ref": f"call_{turn}_{i}"})
            part = part.model_copy(update={"tool_request": req})
        if req is not None:
            seen.add(req.ref or "")
        content.append(part)
    return message.model_copy(update={"role": "model", "content": content})


@dataclass
class _Call:
    request: ToolRequest
    restart: Part | None  # the restart entry, when the tool runs again with an answer


def _acts(agent: Agent, name: str) -> bool:
    """Whether calling tool `name` runs code of its own (an interrupt tool only asks)."""
    tool = agent.tool(name)
    return tool is not None and not tool.is_interrupt


def _run_calls(agent: Agent, step: Step,
               calls: list[tuple[ToolRequest, Part | None]]) -> dict[str, CallResult]:
    running = [len(calls)]
    parks = [False]  # a call of this turn interrupted: the turn parks
    lock = threading.Lock()

    def one(call: tuple[ToolRequest, Part | None]) -> tuple[str, CallResult]:
        request, restart = call
        ref = request.ref or ""
        key = f"tool:{ref}"
        saved = step.checkpoints.get(key)
        if saved is not None:
            result = CallResult.load(saved)
            with lock:
                running[0] -= 1
                parks[0] |= result.kind == "interrupt"
            return ref, result
        result = _run_one(agent, step, request, restart)
        with lock:
            running[0] -= 1
            parks[0] |= result.kind == "interrupt"
            others, parking = running[0], parks[0]
        if result.kind in ("retry", "fail"):
            return ref, result  # to run again, or the end of the run: nothing to keep
        # What a tool with a body did is kept while others still run, or when the turn
        # parks (a park's commit comes after its policy and announcements are worked
        # out), so a step run again does not repeat it. The last call of a turn that goes
        # on is followed by the commit at once (a turn that waits to retry a call saves
        # what it kept in memory with the wait: `tasks.steps`).
        step.checkpoints.put(key, result.dump(),
                             durable=(others > 0 or parking) and _acts(agent, request.name))
        return ref, result

    if len(calls) == 1:
        return dict([one(calls[0])])
    # Each call in the step's context (its span is the tool call's parent): a pool's
    # threads have their own.
    contexts = [contextvars.copy_context() for _ in calls]
    with ThreadPoolExecutor(max_workers=min(8, len(calls))) as pool:
        return dict(pool.map(lambda cc: cc[0].run(one, cc[1]), zip(contexts, calls, strict=True)))


def _run_one(agent: Agent, step: Step, request: ToolRequest, restart: Part | None) -> CallResult:
    began = time.monotonic()
    with spans.tool_call(request.name, request.ref or "", agent.name, step.run_id) as span:
        result = _call_tool(agent, step, request, restart)
        spans.record_outcome(span, result.kind)
    step.timings.append({"kind": "tool", "name": request.name, "ref": request.ref or "",
                         "ms": round((time.monotonic() - began) * 1000),
                         "outcome": result.kind})
    return result


def _call_tool(agent: Agent, step: Step, request: ToolRequest, restart: Part | None
               ) -> CallResult:
    tool = agent.tool(request.name)
    if tool is None:
        return CallResult("output", {"error": f"unknown tool {request.name!r}; available: "
                                              f"{[t.name for t in agent.tools]}"})
    tried = Tried.load(step.checkpoints.get(checkpoint_key(request.ref or "")))
    began = _iso(step.now())
    ctx = ToolContext(step.run_id, step.version, request.ref or "", tool.name,
                      step.run_metadata, restarted=restart is not None,
                      resumed=typed_answer(restart.meta("resumedType"), restart.meta("resumed"))
                      if restart else None, jobs=step.jobs,
                      approval_asked=bool(restart and restart.meta("approval")),
                      attempt=tried.failed + 1 if tried else 1)
    try:
        return CallResult("output", tool.call(ctx, request.input))
    except ToolInterrupt as signal:
        return CallResult("interrupt", interrupt=_interrupt(agent, step, tool, ctx, request,
                                                            signal.ask))
    except EndRun as end:
        return CallResult("end", result=end.result)
    except ValidationError as exc:
        return CallResult("output", {"error": f"invalid input for {tool.name}: "
                                              f"{exc.errors(include_url=False)}"})
    except Exception as exc:  # noqa: BLE001  (a tool's failure is tried again, or news for the model)
        return _failed(agent, step, tool, ctx, exc, tried.first_at if tried else began)


def _failed(agent: Agent, step: Step, tool: Tool, ctx: ToolContext, exc: Exception,
            first_at: str) -> CallResult:
    """A call that raised: to try again (a failure its policy tries again, attempts left, a
    store that keeps waits), else its error for the model, or the run's end (a policy's
    `on_exhausted="fail"`)."""
    policy = agent.retry_policy(tool)
    later = isinstance(exc, RetryLater)
    # A tool that asks to be tried later is, even with retries off (the default's limit).
    bound: RetryPolicy = policy if policy is not None else DEFAULT_RETRY
    error = f"{type(exc).__name__}: {exc}"
    passing = later or (policy is not None and policy.retries(exc))
    # Kept in the run while it waits, shown in views and events: at most a screenful.
    tried = Tried(ctx.attempt, first_at, error if len(error) <= _ERROR_SHOWN else
                  error[:_ERROR_SHOWN - 1] + "…")
    if passing and step.retries and ctx.attempt < bound.max_attempts:
        wait = exc.after_s if isinstance(exc, RetryLater) else bound.wait_s(ctx.attempt)
        log.warning("tool %s failed in run %s (attempt %d of %d): %s; trying again in "
                    "%.1f s", tool.name, step.run_id, ctx.attempt, bound.max_attempts,
                    error, wait)
        return CallResult("retry", retry=RetryCall(ctx.ref, tool.name, tried,
                                                   bound.max_attempts, wait,
                                                   type(exc).__name__))
    log.warning("tool %s failed in run %s: %r", tool.name, step.run_id, exc)
    if not passing and ctx.attempt == 1:
        return CallResult("output", {"error": error})
    over_s = max(0.0, (step.now() - _parse_iso(first_at)).total_seconds())
    told = (f"{error} (tried {ctx.attempt} time{'s' if ctx.attempt > 1 else ''} over "
            f"{over_s:.0f} s)")
    if passing and bound.on_exhausted == "fail":
        return CallResult("fail", {"tool": tool.name, "ref": ctx.ref, "attempts": ctx.attempt,
                                   "overS": round(over_s, 3), "error": error},
                          result=f"tool {tool.name!r} failed: {told}", exhausted=True)
    return CallResult("output", {"error": told, "attempts": ctx.attempt,
                                 "overS": round(over_s, 3)}, exhausted=True)


def _parse_iso(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return datetime.now(UTC)


def _interrupt(agent: Agent, step: Step, tool: Tool, ctx: ToolContext, request: ToolRequest,
               ask: Ask) -> Interrupt:
    now = step.now()
    expires = ask.expires_at or (now + timedelta(seconds=ask.expires_in)
                                 if ask.expires_in is not None else None)
    mode = ResumeMode.RESPOND if tool.is_interrupt or ask.reason == "layby:background_job" \
        else ResumeMode.RESTART
    return Interrupt(
        id=ctx.interrupt_id, reason=ask.reason or "confirmation", message=ask.message,
        tool_call_id=request.ref or "", response_schema=schema_of(ask.response_schema),
        response_type=type_path(ask.response_schema),
        expires_at=_iso(expires) if expires else None, metadata=ask.metadata,
        tool_name=tool.name, tool_input=_normalized(tool, request.input),
        input_schema=tool.input_schema if mode is ResumeMode.RESTART else None,
        mode=mode, on_expire=ask.on_expire or OnExpire(), reviewers=ask.reviewers,
        required_approvals=ask.required_approvals, agent_version=agent.version,
        # a restart runs while the parked model message is already in the history: it
        # belongs to that turn, not to the next one
        created_at=_iso(now), turn=step.turns_taken - (1 if ctx.restarted else 0))


def _normalized(tool: Tool, raw: Any) -> Any:
    """The input as the tool saw it (validated and coerced), for reviewers to read."""
    try:
        return tool.parse_input(raw).model_dump(mode="json")
    except ValidationError:
        return raw


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _settle(step: Step, message: Message, calls: list[Part], results: dict[str, CallResult],
            *, resumed: bool, responses: dict[str, Part] | None = None) -> Outcome:
    """Turn the results of a turn's tool calls into its outcome.

    `responses` holds answers already known (respond, decline, pending); `results` what ran.
    """
    exhausted = [_tool_of(calls, ref) for ref, r in results.items() if r.exhausted]
    failed = next((r for r in results.values() if r.kind == "fail"), None)
    if failed is not None:
        return Fail(step.history, "tool_failed", failed.result or "a tool failed",
                    failed.output, exhausted=exhausted)
    waiting = [r.retry for r in results.values() if r.kind == "retry" and r.retry]
    if waiting:
        return Retry(step.history, waiting)
    known = dict(responses or {})
    for part in calls:
        req = part.tool_request
        assert req is not None
        result = results.get(req.ref or "")
        if result is not None and result.kind == "output":
            known[req.ref or ""] = _response(req, result.output, None)
    ended = next((r for r in results.values() if r.kind == "end"), None)
    interrupts = [r.interrupt for r in results.values() if r.kind == "interrupt" and r.interrupt]
    base = step.history[:-1] if resumed else step.history
    if interrupts and not ended:
        return Park([*base, _mark(message, calls, results, known)], interrupts,
                    exhausted=exhausted)
    refs = [p.tool_request.ref or "" for p in calls if p.tool_request is not None]
    tool_message = Message(role="tool", content=[known[r] for r in refs if r in known],
                           metadata={"resumed": True} if resumed else None)
    model_message = _resolve_marks(message) if resumed else message
    messages = [*base, model_message, tool_message]
    if ended:
        return Finish(messages, ended.result or "", exhausted=exhausted)
    return Continue(messages, exhausted=exhausted)


def _tool_of(calls: list[Part], ref: str) -> str:
    return next((p.tool_request.name for p in calls
                 if p.tool_request is not None and p.tool_request.ref == ref), "")


def _response(req: ToolRequest, output: Any, metadata: dict[str, Any] | None) -> Part:
    return Part(tool_response=ToolResponse(name=req.name, ref=req.ref, output=output),
                metadata=metadata)


def _mark(message: Message, calls: list[Part], results: dict[str, CallResult],
          known: dict[str, Part]) -> Message:
    """Genkit's markers: `interrupt` on waiting requests, `pendingOutput` on finished ones."""
    content = []
    for part in message.content:
        req = part.tool_request
        if req is None:
            content.append(part)
            continue
        ref = req.ref or ""
        meta = {k: v for k, v in (part.metadata or {}).items()
                if k not in ("interrupt", "pendingOutput", "resolvedInterrupt")}
        result = results.get(ref)
        if result is not None and result.kind == "interrupt" and result.interrupt:
            intr = result.interrupt
            # the tool's metadata must not replace the id that answers are matched by
            meta["interrupt"] = {**(intr.metadata or {}), "id": intr.id, "reason": intr.reason}
        elif ref in known:
            meta["pendingOutput"] = known[ref].tool_response.output  # type: ignore[union-attr]
            if known[ref].meta("cancelled"):  # a decline must survive the turn parking again
                meta["cancelled"] = True
        content.append(part.model_copy(update={"metadata": meta or None}))
    return message.model_copy(update={"content": content})


def _resolve_marks(message: Message) -> Message:
    content = []
    for part in message.content:
        meta = dict(part.metadata or {})
        if "interrupt" in meta:
            meta["resolvedInterrupt"] = meta.pop("interrupt")
        meta.pop("pendingOutput", None)
        content.append(part.model_copy(update={"metadata": meta or None}))
    return message.model_copy(update={"content": content})


@dataclass
class Resume:
    """Answers to a parked turn, in Genkit's shapes.

    `respond`: toolResponse parts, the output of an interrupt. `restart`: toolRequest parts
    whose `metadata.resumed` the tool sees (with `metadata.replaceInput` when the input was
    edited). `decline`: refs whose request a reviewer cancelled, with the reason.
    """

    respond: list[Part] = field(default_factory=list)
    restart: list[Part] = field(default_factory=list)
    decline: dict[str, str | None] = field(default_factory=dict)


DECLINED = "declined"


def resume_turn(agent: Agent, step: Step, resume: Resume) -> Outcome:
    """Apply `resume` to the last (parked) model message, Genkit's way."""
    message = step.history[-1] if step.history else None
    if message is None or message.role != "model":
        raise UnresolvedToolCall("there is no parked model turn to resume", run_id=step.run_id)
    calls = message.tool_requests
    _check_waiting(step, calls, resume)
    responds = {p.tool_response.ref: p for p in resume.respond}  # type: ignore[union-attr]
    restarts = {p.tool_request.ref: p for p in resume.restart}  # type: ignore[union-attr]
    known: dict[str, Part] = {}
    to_run: list[tuple[ToolRequest, Part | None]] = []
    for part in calls:
        req = part.tool_request
        assert req is not None
        ref = req.ref or ""
        meta = part.metadata or {}
        if "pendingOutput" in meta:  # present even when the output is falsy
            known[ref] = _response(req, meta["pendingOutput"], {"source": "pending", **(
                {"cancelled": True} if meta.get("cancelled") else {})})
        elif ref in responds:
            known[ref] = _checked_response(agent, step, req, responds[ref])
        elif ref in resume.decline:
            known[ref] = _response(req, {"status": DECLINED, "reason": resume.decline[ref]},
                                   {"interruptResponse": True, "cancelled": True})
        elif ref in restarts:
            to_run.append((_restart_request(agent, step, req, restarts[ref]), restarts[ref]))
        else:
            raise UnresolvedToolCall(f"tool call {req.name!r} (ref {ref!r}) is interrupted "
                                     "and the resume gives it no answer",
                                     run_id=step.run_id, ref=ref)
    results = _run_calls(agent, step, to_run) if to_run else {}
    message = _replace_inputs(message, {r.ref or "": r for r, _ in to_run})
    outcome = _settle(step, message, message.tool_requests, results, resumed=True,
                      responses=known)
    if isinstance(outcome, Continue) and not to_run:
        outcome.replayable = True
    return outcome


def _check_waiting(step: Step, calls: list[Part], resume: Resume) -> None:
    """UnknownToolCall unless every call `resume` answers, restarts or declines is one of
    the parked message's `calls` still waiting on its interrupt."""
    by_ref = {p.tool_request.ref: p for p in calls if p.tool_request is not None}
    for entry in [*resume.respond, *resume.restart]:
        target = entry.tool_response or entry.tool_request
        assert target is not None
        waiting = by_ref.get(target.ref)
        waiting_call = waiting.tool_request if waiting is not None else None
        if waiting is None or waiting_call is None or waiting_call.name != target.name \
                or "interrupt" not in (waiting.metadata or {}):
            raise UnknownToolCall(f"no interrupted tool call {target.name!r} with ref "
                                  f"{target.ref!r} is waiting in this run",
                                  run_id=step.run_id, ref=target.ref)
    for ref in resume.decline:
        # a finished call has nothing to decline: its pending output would win silently
        declined = by_ref.get(ref)
        if declined is None or "interrupt" not in (declined.metadata or {}):
            raise UnknownToolCall(f"no interrupted tool call with ref {ref!r} is waiting",
                                  ref=ref, run_id=step.run_id)


def _replace_inputs(message: Message, requests: dict[str, ToolRequest]) -> Message:
    """Genkit's history after `replaceInput`: the new input, the original kept beside it."""
    content = []
    for part in message.content:
        req = part.tool_request
        new = requests.get(req.ref or "") if req is not None else None
        if req is not None and new is not None and new.input != req.input:
            part = part.model_copy(update={
                "tool_request": new,
                "metadata": {**(part.metadata or {}), "replacedInput": req.input}})
        content.append(part)
    return message.model_copy(update={"content": content})


def _checked_response(agent: Agent, step: Step, req: ToolRequest, answer: Part) -> Part:
    output = answer.tool_response.output  # type: ignore[union-attr]
    tool = agent.tool(req.name)
    if tool is not None and tool.is_interrupt:
        try:
            output = tool.output.dump_python(tool.output.validate_python(output), mode="json")
        except ValidationError as exc:
            raise InvalidAnswer(f"the answer to {req.name!r} does not match its output schema",
                                run_id=step.run_id, ref=req.ref,
                                detail=exc.errors(include_url=False)) from exc
    return _response(req, output, {"interruptResponse": True})


def _restart_request(agent: Agent, step: Step, req: ToolRequest, entry: Part) -> ToolRequest:
    given = entry.tool_request
    assert given is not None
    replace = entry.meta("replaceInput")
    if replace is None:
        if given.input is not None and given.input != req.input:
            raise InvalidAnswer(f"restart of {req.name!r} (ref {req.ref!r}) changes its input "
                                "without replaceInput; send the new input as replaceInput",
                                run_id=step.run_id, ref=req.ref)
        return req
    tool = agent.tool(req.name)
    if tool is not None:
        try:
            replace = tool.parse_input(replace).model_dump(mode="json")
        except ValidationError as exc:
            raise InvalidAnswer(f"replaceInput for {req.name!r} does not match its input schema",
                                run_id=step.run_id, ref=req.ref,
                                detail=exc.errors(include_url=False)) from exc
    return req.model_copy(update={"input": replace})
