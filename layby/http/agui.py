"""The AG-UI endpoint: `POST /agui/{agent}` takes AG-UI's `RunAgentInput` and streams the
layby run behind the thread as AG-UI events over server-sent events.

The thread IS the layby run: run id `agui_<threadId>` when that is a valid run id (see
`control.commands.RUN_ID`), else `agui.<sha256(threadId)[:40]>`. The first POST on a thread
starts the run with the text of its last user message; a POST with `resume` answers every
open interrupt at once (channel "agui") and follows the run until it pauses again or ends.
A POST without `resume` on a thread that has open interrupts gets RUN_ERROR; on a thread
whose interrupts were answered elsewhere it reconnects: it replays the run's events since
its last pause and follows them. A resume whose entries are all recorded already (a
replayed request) is not refused: it follows the stream too.

Translation of layby events into AG-UI events is in pure functions (`translate`,
`pause_events`, `agui_messages`, `agui_interrupt`); the endpoint only prepares the run
and feeds them the run's event stream.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Annotated, Any

from ag_ui.core import (
    AssistantMessage,
    BaseEvent,
    CustomEvent,
    FunctionCall,
    MessagesSnapshotEvent,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunStartedEvent,
    StateSnapshotEvent,
    SystemMessage,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCall,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    ToolMessage,
    UserMessage,
)
from ag_ui.core import (
    Interrupt as AguiInterrupt,
)
from ag_ui.encoder import EventEncoder
from fastapi import APIRouter, Depends, Path, Request
from starlette.concurrency import run_in_threadpool

from layby.access.rights import READ, Identity
from layby.control import Runtime, commands
from layby.errors import Conflict, Invalid, LaybyError, NotFound
from layby.generation.interrupts import BACKGROUND_JOB, ResumeEntry
from layby.generation.messages import Message, Part, ToolRequest, ToolResponse, load_messages
from layby.http.deps import Caller, Rt, sane_body
from layby.http.errors import documented, event_stream
from layby.http.events import STREAM_HEADERS, EventStreamResponse, run_events
from layby.parking.keys import DEFAULT_TENANT
from layby.wire import Event, InterruptState, RunView

router = APIRouter(tags=["ag-ui"])

CHANNEL = "agui"
AGUI_FIELDS = ("id", "reason", "message", "toolCallId", "responseSchema", "expiresAt",
               "metadata")


def thread_run_id(thread_id: str, tenant: str = DEFAULT_TENANT) -> str:
    """The layby run id of an AG-UI thread (one rule, no table to keep). A tenant's own
    (other than `default`): two tenants' threads of one id are two runs."""
    if tenant != DEFAULT_TENANT:
        return "agui." + hashlib.sha256(f"{tenant}\x00{thread_id}".encode()).hexdigest()[:40]
    plain = f"agui_{thread_id}"
    if commands.RUN_ID.match(plain):
        return plain
    return "agui." + hashlib.sha256(thread_id.encode()).hexdigest()[:40]


def message_id(run_id: str, index: int) -> str:
    """A history message's AG-UI id: stable, so a resume that rewrites it keeps its id."""
    return f"{run_id}.m{index}"


def call_id(run_id: str, index: int, part: Part) -> str:
    """A tool call's AG-UI id, the same on its request and on its result: the call's ref,
    or (a history stored without refs) one made from the model message that asked for it,
    which the tool message holding the result follows directly."""
    call: ToolRequest | ToolResponse
    if part.tool_request is not None:
        call, asked_at = part.tool_request, index
    else:
        assert part.tool_response is not None
        call, asked_at = part.tool_response, index - 1
    return call.ref or f"{message_id(run_id, asked_at)}.{call.name}"


def _content(output: Any) -> str:
    return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)


def last_user_text(messages: Iterable[Any]) -> tuple[str, str]:
    """(id, text) of the last user message of a RunAgentInput; Invalid when there is none."""
    for message in reversed(list(messages)):
        if isinstance(message, UserMessage):
            content = message.content
            text = content if isinstance(content, str) else "".join(
                getattr(p, "text", "") or "" for p in content)
            if text.strip():
                return message.id, text
    raise Invalid("the first request on a thread needs a user message with text: it becomes "
                  "the run's input")


# -- translation: layby → AG-UI (pure) -------------------------------------------------


@dataclass
class Cursor:
    """What this stream has told its client: which thread and AG-UI run it speaks for, and
    how many messages of the run's history the client already has."""

    thread_id: str
    agui_run_id: str
    run_id: str
    seen: int = 0


def message_events(run_id: str, index: int, message: Message) -> list[BaseEvent]:
    """A new history message as AG-UI streams it: model text as TEXT_MESSAGE_*, tool
    requests as TOOL_CALL_START/ARGS/END, tool responses as TOOL_CALL_RESULT."""
    mid = message_id(run_id, index)
    out: list[BaseEvent] = []
    if message.role == "model":
        if message.text:
            out += [TextMessageStartEvent(message_id=mid, role="assistant"),
                    TextMessageContentEvent(message_id=mid, delta=message.text),
                    TextMessageEndEvent(message_id=mid)]
        for part in message.tool_requests:
            req = part.tool_request
            assert req is not None
            cid = call_id(run_id, index, part)
            out += [ToolCallStartEvent(tool_call_id=cid, tool_call_name=req.name,
                                       parent_message_id=mid),
                    ToolCallArgsEvent(tool_call_id=cid, delta=json.dumps(req.input)),
                    ToolCallEndEvent(tool_call_id=cid)]
    elif message.role == "tool":
        for part in message.content:
            res = part.tool_response
            if res is not None:
                cid = call_id(run_id, index, part)
                out.append(ToolCallResultEvent(message_id=f"{mid}.{cid}", tool_call_id=cid,
                                               role="tool", content=_content(res.output)))
    return out


def added_events(cursor: Cursor, start: int, messages: list[Message]) -> list[BaseEvent]:
    """Events for the messages a step wrote at `start`: a message the client already has
    (the parked model message a resume rewrites) is not sent again."""
    out: list[BaseEvent] = []
    for offset, message in enumerate(messages):
        index = start + offset
        if index >= cursor.seen:
            out += message_events(cursor.run_id, index, message)
    cursor.seen = max(cursor.seen, start + len(messages))
    return out


# How people review it, carried in AG-UI's `metadata` under "layby" (AG-UI has no fields
# for it): the rule that routed it, approvals needed and given, escalation, hand-overs.
REVIEW_FIELDS = ("rule", "requiredApprovals", "approvals", "escalation", "escalationLevel",
                 "delegations")


def agui_interrupt(spec: dict[str, Any]) -> AguiInterrupt:
    """AG-UI's Interrupt from a layby interrupt (wire form): AG-UI's fields, and how it is
    reviewed in `metadata.layby`."""
    fields = {k: spec[k] for k in AGUI_FIELDS if spec.get(k) is not None}
    review = {k: spec[k] for k in REVIEW_FIELDS if spec.get(k) not in (None, [], 0)
              and not (k == "requiredApprovals" and spec[k] == 1)}
    if review:
        fields["metadata"] = {**(fields.get("metadata") or {}), "layby": review}
    return AguiInterrupt.model_validate(fields)


# The CUSTOM event a stream carries while a run waits to try failed tool calls again; its
# value is the run's `retry` (layby.wire.RetryWait, camelCase).
TOOL_RETRY_EVENT = "layby:tool_retry"


def waits_on_people(interrupts: list[dict[str, Any]]) -> bool:
    """A park on background jobs only answers itself: the stream keeps following it."""
    return any(i.get("reason") != BACKGROUND_JOB for i in interrupts)


def translate(cursor: Cursor, event: Event) -> tuple[list[BaseEvent], str | None]:
    """AG-UI events for one layby event, and whether the stream ends there:
    "pause" (follow with `pause_events`), "end" (the run finished or failed) or None."""
    data = event.data if isinstance(event.data, dict) else {}
    out: list[BaseEvent] = []
    if "messages" in data and "from" in data:
        out += added_events(cursor, int(data["from"]), load_messages(data["messages"]))
    if event.type == "run.interrupted":
        return out, "pause" if waits_on_people(data.get("interrupts", [])) else None
    if event.type == "run.retrying":
        # Tool calls failed and wait to be tried again: the stream goes on following the
        # run, the front end told which calls, which attempt comes, the last error, when.
        out.append(CustomEvent(name=TOOL_RETRY_EVENT, value=data))
        return out, None
    if event.type == "run.completed":
        out.append(RunFinishedEvent(thread_id=cursor.thread_id, run_id=cursor.agui_run_id,
                                    result=data.get("result")))
        return out, "end"
    if event.type in ("run.failed", "run.cancelled"):
        out.append(RunErrorEvent(message=str(data.get("message") or event.type),
                                 code=str(data.get("code") or event.type)))
        return out, "end"
    return out, None


def agui_messages(run_id: str, history: list[Message],
                  user_message_id: str | None = None) -> list[Any]:
    """The run's history as AG-UI messages (ids as the stream gave them; the first user
    message keeps the id the client gave it)."""
    out: list[Any] = []
    for index, message in enumerate(history):
        mid = message_id(run_id, index)
        if message.role == "user":
            uid = user_message_id if index == 0 and user_message_id else mid
            out.append(UserMessage(id=uid, content=message.text))
        elif message.role == "system":
            out.append(SystemMessage(id=mid, content=message.text))
        elif message.role == "model":
            calls = [ToolCall(id=call_id(run_id, index, p),
                              function=FunctionCall(name=p.tool_request.name,
                                                    arguments=json.dumps(p.tool_request.input)))
                     for p in message.tool_requests if p.tool_request is not None]
            out.append(AssistantMessage(id=mid, content=message.text or None,
                                        tool_calls=calls or None))
        else:
            for part in message.content:
                res = part.tool_response
                if res is not None:
                    cid = call_id(run_id, index, part)
                    out.append(ToolMessage(id=f"{mid}.{cid}", tool_call_id=cid,
                                           content=_content(res.output)))
    return out


def pause_events(cursor: Cursor, history: list[Message], interrupts: list[dict[str, Any]],
                 state: Any = None, user_message_id: str | None = None) -> list[BaseEvent]:
    """STATE_SNAPSHOT, MESSAGES_SNAPSHOT, then RUN_FINISHED with the interrupt outcome."""
    layby = {"runId": cursor.run_id, "status": "interrupted",
             "interrupts": [i["id"] for i in interrupts]}
    snapshot = {**state, "layby": layby} if isinstance(state, dict) else {"layby": layby}
    # A background job answers itself: the client is asked only what people must answer.
    outcome = RunFinishedInterruptOutcome(interrupts=[
        agui_interrupt(i) for i in interrupts if i.get("reason") != BACKGROUND_JOB])
    return [StateSnapshotEvent(snapshot=snapshot),
            MessagesSnapshotEvent(messages=agui_messages(cursor.run_id, history,
                                                         user_message_id)),
            RunFinishedEvent(thread_id=cursor.thread_id, run_id=cursor.agui_run_id,
                             outcome=outcome)]


def error_events(exc: LaybyError) -> list[BaseEvent]:
    meta = {"layby": exc.detail} if exc.detail is not None else None
    return [RunErrorEvent(message=exc.message, code=type(exc).__name__.lower(),
                          metadata=meta)]


# -- preparing a request: start, answer or reconnect -------------------------------------


@dataclass
class Plan:
    """Where to follow the run's events from, and what the client has of its history."""

    run_id: str
    after: str = "0-0"
    seen: int = 0
    user_message_id: str | None = None
    fresh: bool = False  # started by this request: no event of it can be folded yet


def _after(park: Event | None, plan: Plan) -> Plan:
    if park is not None:
        plan.after = park.id
        plan.seen = int(park.data["from"]) + len(park.data["messages"])
    return plan


def prepare(rt: Runtime, agent: str, body: RunAgentInput, caller: Identity) -> Plan:
    """Start, resume or reconnect to the thread's run, as `caller` may; raises what
    RUN_ERROR reports."""
    # A run token's thread is its run, whatever its id.
    run_id = caller.run or thread_run_id(body.thread_id, caller.tenant)
    if caller.run is not None:
        commands.reach(rt, run_id, caller, READ)
    view = rt.store.runs.view(run_id)
    if view is not None:
        caller.reach(run_id, view.tenant)  # NotFound, as for a thread with no run
        caller.require(READ, f"run {run_id}")
    if view is not None and view.agent != agent:
        raise Conflict(f"thread {body.thread_id!r} runs agent {view.agent!r}, not {agent!r}",
                       run_id=run_id)
    if body.resume:
        if view is None:
            raise NotFound(f"thread {body.thread_id!r} has no run to resume", run_id=run_id)
        return _resume(rt, view, body, caller)
    if view is None:
        uid, text = last_user_text(body.messages)
        _, created = commands.start_run(rt, agent, input=text, run_id=run_id,
                                        idempotency_key=f"agui:{run_id}",
                                        metadata={"agui": {"threadId": body.thread_id,
                                                           "userMessageId": uid}},
                                        who=caller)
        return Plan(run_id, user_message_id=uid, fresh=created)
    return _reconnect(rt, view, body)


def _user_message_id(view: RunView) -> str | None:
    found: str | None = (view.metadata or {}).get("agui", {}).get("userMessageId")
    return found


def _resume(rt: Runtime, view: RunView, body: RunAgentInput, caller: Identity) -> Plan:
    """Answer with the resume entries (`messages` is not read: CopilotKit also sends a tool
    message for a `tool_call` interrupt it resumes, and applying it too would answer the
    call twice), then follow the run from its park."""
    store, run_id = rt.store, view.id
    entries = [ResumeEntry(interrupt_id=e.interrupt_id, status=e.status,
                           payload=e.payload, metadata=e.metadata) for e in body.resume or []]
    park = store.runs.last_park(run_id, {e.interrupt_id for e in entries})
    if park is None:
        raise NotFound(f"thread {body.thread_id!r} has no interrupt "
                       f"{[e.interrupt_id for e in entries]}", run_id=run_id)
    specs, answers, open_ids = store.answers.interrupts(run_id)
    fresh = [e for e in entries if e.interrupt_id in open_ids
             or e.interrupt_id not in answers or answers[e.interrupt_id].entry() != e]
    # Every open interrupt but background jobs, which answer themselves.
    waiting = {s.id for s in specs if s.id in open_ids and s.reason != BACKGROUND_JOB}
    missing = sorted(waiting - {e.interrupt_id for e in entries})
    if fresh and missing:
        raise Invalid("a resume must answer every open interrupt; still open: "
                      f"{missing}", run_id=run_id, detail={"open": missing})
    if fresh:  # entries all recorded already: a replay, nothing to answer
        commands.answer(rt, run_id, fresh, by=caller.caller, channel=CHANNEL, who=caller)
    return _after(park, Plan(run_id, user_message_id=_user_message_id(view)))


def _reconnect(rt: Runtime, view: RunView, body: RunAgentInput) -> Plan:
    """Input without a resume on a thread that has a run: follow it from its last park,
    unless it waits on people (then they must be answered first)."""
    park = rt.store.runs.last_park(view.id)  # before the status: a newer park shows there
    view = rt.store.runs.view(view.id) or view
    # A run waiting on background jobs only is followed, not refused: they answer themselves.
    waiting = [i.id for i in view.interrupts
               if i.state == InterruptState.OPEN and i.reason != BACKGROUND_JOB]
    if waiting:
        raise Conflict(f"thread {body.thread_id!r} waits on interrupts {waiting}: send a "
                       "`resume` entry for each of them", run_id=view.id,
                       detail={"open": waiting})
    return _after(park, Plan(view.id, user_message_id=_user_message_id(view)))


# -- the endpoint --------------------------------------------------------------------------


async def _stream(rt: Runtime, encoder: EventEncoder, cursor: Cursor, plan: Plan,
                  state: Any) -> AsyncIterator[str]:
    yield encoder.encode(RunStartedEvent(thread_id=cursor.thread_id,
                                         run_id=cursor.agui_run_id))
    async for event in run_events(rt, plan.run_id, plan.after, fresh=plan.fresh):
        if event is None:
            yield ": keep-alive\n\n"
            continue
        out, ending = translate(cursor, event)
        if ending == "pause":
            view = await run_in_threadpool(commands.get_run, rt, plan.run_id)
            history = view.messages[:int(event.data["from"])] + load_messages(
                event.data["messages"])
            # The park names its interrupts; the run holds them, with how their review
            # stands now.
            held = {i.id: i.wire() for i in view.interrupts}
            waiting = [held[i["id"]] for i in event.data["interrupts"] if i["id"] in held]
            out += pause_events(cursor, history, waiting, state, plan.user_message_id)
        for item in out:
            yield encoder.encode(item)
        if ending is not None:
            return


async def _refused(encoder: EventEncoder, cursor: Cursor,
                   exc: LaybyError) -> AsyncIterator[str]:
    yield encoder.encode(RunStartedEvent(thread_id=cursor.thread_id,
                                         run_id=cursor.agui_run_id))
    for item in error_events(exc):
        yield encoder.encode(item)


@router.post("/agui/{agent}", response_class=EventStreamResponse,
             responses={200: event_stream("the run as AG-UI events (server-sent events)",
                                          {"type": "object", "required": ["type"]}),
                        **documented(400, 401, 404, 413, 422, 503)},
             dependencies=[Depends(sane_body)])
async def run_agent(agent: Annotated[str, Path(max_length=200)], body: RunAgentInput,
                    request: Request, rt: Rt, caller: Caller) -> EventStreamResponse:
    """Run (or resume) the thread's layby run and stream it as AG-UI events."""
    if agent not in rt.agents:  # a wrong URL, not a run that went wrong
        raise NotFound(f"no agent named {agent!r}", detail={"agents": sorted(rt.agents)})
    # ag_ui declares `accept: str = None`: it takes None, as the default says.
    encoder = EventEncoder(accept=request.headers.get("accept"))  # type: ignore[arg-type]
    cursor = Cursor(body.thread_id, body.run_id,
                    caller.run or thread_run_id(body.thread_id, caller.tenant))
    try:
        plan = await run_in_threadpool(prepare, rt, agent, body, caller)
    except LaybyError as exc:
        stream: AsyncIterator[str] = _refused(encoder, cursor, exc)
    else:
        cursor.seen = plan.seen
        stream = _stream(rt, encoder, cursor, plan, body.state)
    return EventStreamResponse(stream, media_type=encoder.get_content_type(),
                               headers=STREAM_HEADERS)
