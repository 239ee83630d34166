"""Genkit's interrupt scenarios at the generation level: no Redis, no Celery.

Model turns are played by `ScriptedModel`; durability is an in-memory checkpoint store that
keeps JSON text, as Redis would.
"""

import ast
import importlib
import inspect
import json
import time
from typing import Any

import pytest

from layby import generation
from layby.generation import (
    CONFIRMATION,
    INPUT_REQUIRED,
    Agent,
    Ask,
    Call,
    Case,
    Choose,
    Continue,
    Fail,
    Finish,
    Interrupt,
    InvalidAnswer,
    Message,
    ModelRequest,
    ModelResponse,
    Park,
    Part,
    Reply,
    Resume,
    ResumeEntry,
    ResumeMode,
    ScriptedModel,
    Step,
    ToolContext,
    ToolRequest,
    ToolResponse,
    UnknownToolCall,
    UnresolvedToolCall,
    check_answer,
    interrupt_tool,
    model_turn,
    resume_turn,
    text_message,
    to_resume,
    tool,
)
from layby.generation.interrupts import interrupt_id
from layby.generation.messages import dump_messages, load_messages

RUN = "run-1"


# --- helpers -------------------------------------------------------------------------------


class MemoryCheckpoints:
    """Checkpoints kept as JSON text, so anything Redis could not store fails here too.

    As a step's checkpoints are after its worker died: the durable ones only (the others
    live in the worker's memory until the commit). `kept_only_in_memory` lists the others.
    """

    def __init__(self) -> None:
        self.data: dict[str, str] = {}
        self.kept_only_in_memory: list[str] = []

    def get(self, key: str) -> Any | None:
        raw = self.data.get(key)
        return None if raw is None else json.loads(raw)

    def put(self, key: str, value: Any, *, durable: bool = True) -> None:
        text = json.dumps(value)  # fails here for what Redis could not store
        if durable:
            self.data[key] = text
        else:
            self.kept_only_in_memory.append(key)


class CountingModel:
    """Wraps a model and counts how often it is asked."""

    def __init__(self, inner: ScriptedModel) -> None:
        self.inner = inner
        self.name = inner.name
        self.calls = 0

    def generate(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        return self.inner.generate(request)


def stored(messages: list[Message]) -> list[Message]:
    """The history as another process reads it back: through JSON."""
    return load_messages(json.loads(json.dumps(dump_messages(messages))))


def start(text: str = "hello", version: int = 1, checkpoints: Any = None) -> Step:
    step = Step(RUN, version, [text_message("user", text)])
    if checkpoints is not None:
        step.checkpoints = checkpoints
    return step


def next_step(messages: list[Message], version: int, checkpoints: Any = None) -> Step:
    step = Step(RUN, version, stored(messages))
    if checkpoints is not None:
        step.checkpoints = checkpoints
    return step


def request_part(message: Message, ref: str) -> Part:
    return next(p for p in message.tool_requests if p.tool_request.ref == ref)


def response_part(message: Message, ref: str) -> Part:
    assert message.role == "tool"
    return next(p for p in message.content if p.tool_response and p.tool_response.ref == ref)


def respond(name: str, ref: str, output: Any) -> Part:
    return Part(tool_response=ToolResponse(name=name, ref=ref, output=output))


def restart(name: str, ref: str, input: Any = None, **metadata: Any) -> Part:
    return Part(tool_request=ToolRequest(name=name, ref=ref, input=input), metadata=metadata)


@interrupt_tool(output=str)
def ask_user(question: str):
    """Ask the user a question; the answer is the output."""


def make_transfer(log: list[tuple[int, str, bool, Any]]):
    @tool
    def transfer(amount: int, to: str, ctx: ToolContext) -> dict:
        """Send money; a person approves first (and approves again above 1000)."""
        log.append((amount, to, ctx.restarted, ctx.resumed))
        if not ctx.restarted:
            ctx.interrupt(f"send {amount} to {to}?", reason=CONFIRMATION,
                          metadata={"amount": amount})
        answer = ctx.resumed if isinstance(ctx.resumed, dict) else {}
        if amount > 1000 and not answer.get("second"):
            ctx.interrupt(f"second approval for {amount}", reason=CONFIRMATION)
        return {"sent": amount, "to": to, "approvedBy": answer.get("by")}

    return transfer


def make_counter(name: str, value: Any, log: list[str]):
    @tool(name=name)
    def counted() -> Any:
        """A plain tool that records each run."""
        log.append(name)
        return value

    return counted


# --- 1. interrupt, then respond --------------------------------------------------------------


def test_interrupt_then_respond_gives_the_answer_as_tool_output():
    model = ScriptedModel(steps=[
        Reply(calls=[Call(name="ask_user", input={"question": "Which city?"}, ref="q1")]),
        Reply(text="Booking a trip to {ask_user}."),
    ])
    agent = Agent("planner", model, tools=(ask_user,))

    parked = model_turn(agent, start("plan a trip"))

    assert isinstance(parked, Park)
    [intr] = parked.interrupts
    assert intr.mode is ResumeMode.RESPOND
    assert intr.tool_call_id == "q1"
    assert intr.tool_name == "ask_user"
    assert intr.reason == INPUT_REQUIRED
    assert intr.message == "Which city?"
    assert intr.response_schema == {"type": "string"}
    assert intr.id == interrupt_id(RUN, 1, "q1")
    # Genkit: the model message is rewritten, no tool message is added
    assert [m.role for m in parked.messages] == ["user", "model"]
    marker = request_part(parked.messages[-1], "q1").metadata
    assert marker == {"interrupt": {"id": intr.id, "reason": INPUT_REQUIRED}}

    answer = Resume(respond=[respond("ask_user", "q1", "Lisbon")])
    resumed = resume_turn(agent, next_step(parked.messages, 2), answer)

    assert isinstance(resumed, Continue)
    assert [m.role for m in resumed.messages] == ["user", "model", "tool"]
    tool_message = resumed.messages[-1]
    assert tool_message.metadata == {"resumed": True}
    part = response_part(tool_message, "q1")
    assert part.tool_response.output == "Lisbon"
    assert part.meta("interruptResponse") is True
    model_part = request_part(resumed.messages[1], "q1")
    assert model_part.metadata == {"resolvedInterrupt": {"id": intr.id, "reason": INPUT_REQUIRED}}

    done = model_turn(agent, next_step(resumed.messages, 2))
    assert isinstance(done, Finish)
    assert done.result == "Booking a trip to Lisbon."
    assert done.messages[-1].role == "model"


def test_respond_output_is_checked_against_the_interrupt_tools_output_schema():
    model = ScriptedModel(steps=[Reply(calls=[Call(name="ask_user", ref="q1",
                                                   input={"question": "How many?"})])])
    agent = Agent("planner", model, tools=(ask_user,))
    parked = model_turn(agent, start())
    assert isinstance(parked, Park)

    with pytest.raises(InvalidAnswer) as caught:
        resume_turn(agent, next_step(parked.messages, 2),
                    Resume(respond=[respond("ask_user", "q1", {"not": "a string"})]))
    assert caught.value.ref == "q1"


# --- 2. interrupt, then restart with resumed metadata -----------------------------------------


def test_restart_runs_the_tool_again_with_resumed_metadata():
    log: list = []
    transfer = make_transfer(log)
    model = ScriptedModel(steps=[
        Reply(calls=[Call(name="transfer", input={"amount": 100, "to": "bob"}, ref="t1")]),
        Reply(text="Sent {transfer[sent]} to {transfer[to]}."),
    ])
    agent = Agent("bank", model, tools=(transfer,))

    parked = model_turn(agent, start())

    assert isinstance(parked, Park)
    [intr] = parked.interrupts
    assert intr.mode is ResumeMode.RESTART
    assert intr.reason == CONFIRMATION
    assert intr.message == "send 100 to bob?"
    assert intr.tool_input == {"amount": 100, "to": "bob"}
    assert intr.input_schema is not None and set(intr.input_schema["required"]) == {"amount", "to"}
    assert request_part(parked.messages[-1], "t1").meta("interrupt") == {
        "id": intr.id, "reason": CONFIRMATION, "amount": 100}
    assert log == [(100, "bob", False, None)]

    resume = Resume(restart=[restart("transfer", "t1", {"amount": 100, "to": "bob"},
                                     resumed={"by": "alice"})])
    resumed = resume_turn(agent, next_step(parked.messages, 2), resume)

    assert isinstance(resumed, Continue)
    assert log[1] == (100, "bob", True, {"by": "alice"})
    assert len(log) == 2
    part = response_part(resumed.messages[-1], "t1")
    assert part.tool_response.output == {"sent": 100, "to": "bob", "approvedBy": "alice"}
    assert resumed.messages[-1].metadata == {"resumed": True}
    assert "resolvedInterrupt" in request_part(resumed.messages[1], "t1").metadata
    assert "interrupt" not in request_part(resumed.messages[1], "t1").metadata

    done = model_turn(agent, next_step(resumed.messages, 2))
    assert isinstance(done, Finish) and done.result == "Sent 100 to bob."


def test_restart_without_input_keeps_the_input_from_history():
    log: list = []
    agent = Agent("bank", ScriptedModel(steps=[Reply(calls=[
        Call(name="transfer", input={"amount": 7, "to": "eve"}, ref="t1")])]),
        tools=(make_transfer(log),))
    parked = model_turn(agent, start())

    resumed = resume_turn(agent, next_step(parked.messages, 2),
                          Resume(restart=[restart("transfer", "t1", resumed=True)]))

    assert isinstance(resumed, Continue)
    assert log[-1] == (7, "eve", True, True)
    assert response_part(resumed.messages[-1], "t1").tool_response.output["sent"] == 7


# --- 3. respond and restart in one resume -----------------------------------------------------


def test_mixed_respond_and_restart_in_one_resume():
    log: list = []
    transfer = make_transfer(log)
    model = ScriptedModel(steps=[Reply(text="Let me check.", calls=[
        Call(name="ask_user", input={"question": "Which city?"}, ref="city"),
        Call(name="transfer", input={"amount": 50, "to": "hotel"}, ref="pay"),
        Call(name="ask_user", input={"question": "How many nights?"}, ref="nights"),
    ])])
    agent = Agent("planner", model, tools=(ask_user, transfer))

    parked = model_turn(agent, start())

    assert isinstance(parked, Park)
    by_ref = {i.tool_call_id: i for i in parked.interrupts}
    assert set(by_ref) == {"city", "pay", "nights"}
    assert by_ref["city"].mode is ResumeMode.RESPOND
    assert by_ref["pay"].mode is ResumeMode.RESTART
    assert len({i.id for i in parked.interrupts}) == 3

    resume = Resume(
        respond=[respond("ask_user", "nights", "3"), respond("ask_user", "city", "Porto")],
        restart=[restart("transfer", "pay", resumed={"by": "ann"})],
    )
    resumed = resume_turn(agent, next_step(parked.messages, 2), resume)

    assert isinstance(resumed, Continue)
    tool_message = resumed.messages[-1]
    # one tool message, responses in the order of the requests, each on its own ref
    assert [p.tool_response.ref for p in tool_message.content] == ["city", "pay", "nights"]
    assert response_part(tool_message, "city").tool_response.output == "Porto"
    assert response_part(tool_message, "nights").tool_response.output == "3"
    assert response_part(tool_message, "city").meta("interruptResponse") is True
    assert response_part(tool_message, "pay").tool_response.output == {
        "sent": 50, "to": "hotel", "approvedBy": "ann"}
    model_message = resumed.messages[1]
    assert model_message.text == "Let me check."
    assert all("resolvedInterrupt" in p.metadata and "interrupt" not in p.metadata
               for p in model_message.tool_requests)


def test_repeated_refs_from_the_model_are_made_unique_and_each_answered():
    model = ScriptedModel(steps=[Reply(calls=[
        Call(name="ask_user", input={"question": "First name?"}, ref="dup"),
        Call(name="ask_user", input={"question": "Last name?"}, ref="dup"),
    ])])
    agent = Agent("form", model, tools=(ask_user,))

    parked = model_turn(agent, start())

    assert isinstance(parked, Park)
    refs = [p.tool_request.ref for p in parked.messages[-1].tool_requests]
    assert len(set(refs)) == 2
    asked = {i.tool_call_id: i.message for i in parked.interrupts}
    assert asked == {refs[0]: "First name?", refs[1]: "Last name?"}

    resumed = resume_turn(agent, next_step(parked.messages, 2), Resume(respond=[
        respond("ask_user", refs[1], "Lovelace"), respond("ask_user", refs[0], "Ada")]))
    outputs = [p.tool_response.output for p in resumed.messages[-1].content]
    assert outputs == ["Ada", "Lovelace"]


# --- 4. a finished sibling's output is kept, not run again ------------------------------------


@pytest.mark.parametrize("value", [0, "", False, None, [], {}, 3, "x"])
def test_sibling_output_is_pending_and_not_run_again(value):
    runs: list[str] = []
    sibling = make_counter("lookup", value, runs)
    model = ScriptedModel(steps=[Reply(calls=[
        Call(name="lookup", ref="look"),
        Call(name="ask_user", input={"question": "ok?"}, ref="q"),
    ])])
    agent = Agent("a", model, tools=(sibling, ask_user))

    parked = model_turn(agent, start(checkpoints=MemoryCheckpoints()))

    assert isinstance(parked, Park)
    assert runs == ["lookup"]
    [intr] = parked.interrupts
    assert intr.tool_call_id == "q"
    look = request_part(parked.messages[-1], "look")
    assert look.metadata == {"pendingOutput": value}

    resumed = resume_turn(agent, next_step(parked.messages, 2, MemoryCheckpoints()),
                          Resume(respond=[respond("ask_user", "q", "yes")]))

    assert isinstance(resumed, Continue)
    assert runs == ["lookup"]
    part = response_part(resumed.messages[-1], "look")
    assert part.tool_response.output == value
    assert part.meta("source") == "pending"
    assert "pendingOutput" not in (request_part(resumed.messages[1], "look").metadata or {})
    assert response_part(resumed.messages[-1], "q").tool_response.output == "yes"


def test_several_falsy_siblings_with_a_restart():
    runs: list[str] = []
    log: list = []
    model = ScriptedModel(steps=[Reply(calls=[
        Call(name="zero", ref="z"),
        Call(name="empty", ref="e"),
        Call(name="transfer", input={"amount": 1, "to": "x"}, ref="t"),
    ])])
    agent = Agent("a", model, tools=(make_counter("zero", 0, runs),
                                     make_counter("empty", "", runs), make_transfer(log)))

    parked = model_turn(agent, start())
    resumed = resume_turn(agent, next_step(parked.messages, 2),
                          Resume(restart=[restart("transfer", "t", resumed={"by": "b"})]))

    assert isinstance(resumed, Continue)
    assert sorted(runs) == ["empty", "zero"]
    tool_message = resumed.messages[-1]
    assert [(p.tool_response.ref, p.tool_response.output, p.meta("source"))
            for p in tool_message.content][:2] == [("z", 0, "pending"), ("e", "", "pending")]
    assert response_part(tool_message, "t").tool_response.output["approvedBy"] == "b"


# --- 5. answers naming calls that are not waiting ---------------------------------------------


@pytest.fixture
def parked_pair():
    runs: list[str] = []
    model = ScriptedModel(steps=[Reply(calls=[
        Call(name="lookup", ref="look"),
        Call(name="ask_user", input={"question": "ok?"}, ref="q"),
    ])])
    agent = Agent("a", model, tools=(make_counter("lookup", 1, runs), ask_user))
    parked = model_turn(agent, start())
    assert isinstance(parked, Park)
    return agent, parked


@pytest.mark.parametrize("resume, ref", [
    (Resume(respond=[respond("ask_user", "nope", "yes")]), "nope"),
    (Resume(respond=[respond("lookup", "q", "yes")]), "q"),
    (Resume(respond=[respond("ask_user", "q", "yes"), respond("lookup", "look", 2)]), "look"),
    (Resume(respond=[respond("ask_user", "q", "yes")], restart=[restart("lookup", "look")]),
     "look"),
    (Resume(respond=[respond("ask_user", "q", "yes")], decline={"ghost": None}), "ghost"),
    (Resume(respond=[respond("ask_user", "q", "yes")], decline={"look": "no"}), "look"),
], ids=["wrong-ref", "wrong-name", "respond-to-finished", "restart-finished",
        "decline-unknown", "decline-finished"])
def test_answer_naming_a_call_that_is_not_waiting_is_refused(parked_pair, resume, ref):
    agent, parked = parked_pair
    with pytest.raises(UnknownToolCall) as caught:
        resume_turn(agent, next_step(parked.messages, 2), resume)
    assert caught.value.ref == ref
    assert caught.value.run_id == RUN


def test_interrupt_left_without_answer_is_unresolved(parked_pair):
    agent, parked = parked_pair
    with pytest.raises(UnresolvedToolCall) as caught:
        resume_turn(agent, next_step(parked.messages, 2), Resume())
    assert caught.value.ref == "q"


def test_resume_without_a_parked_model_turn_is_refused():
    agent = Agent("a", ScriptedModel(steps=[]), tools=(ask_user,))
    with pytest.raises(UnresolvedToolCall):
        resume_turn(agent, start(), Resume(respond=[respond("ask_user", "q", "x")]))


# --- 6. restart input: forged versus replaceInput ----------------------------------------------


@pytest.fixture
def parked_transfer():
    log: list = []
    model = ScriptedModel(steps=[Reply(calls=[
        Call(name="transfer", input={"amount": 100, "to": "bob"}, ref="t1")])])
    agent = Agent("bank", model, tools=(make_transfer(log),))
    parked = model_turn(agent, start())
    assert isinstance(parked, Park)
    return agent, parked, log


def test_restart_with_changed_input_but_no_replace_input_is_refused(parked_transfer):
    agent, parked, log = parked_transfer
    forged = Resume(restart=[restart("transfer", "t1", {"amount": 100, "to": "mallory"},
                                     resumed={"by": "alice"})])
    with pytest.raises(InvalidAnswer) as caught:
        resume_turn(agent, next_step(parked.messages, 2), forged)
    assert caught.value.ref == "t1"
    assert len(log) == 1  # the tool did not run again


def test_restart_with_replace_input_runs_the_tool_on_the_new_input(parked_transfer):
    agent, parked, log = parked_transfer
    resume = Resume(restart=[restart("transfer", "t1", {"amount": 100, "to": "bob"},
                                     resumed={"by": "alice"},
                                     replaceInput={"amount": 40, "to": "bob"})])
    resumed = resume_turn(agent, next_step(parked.messages, 2), resume)

    assert isinstance(resumed, Continue)
    assert log[-1] == (40, "bob", True, {"by": "alice"})
    assert response_part(resumed.messages[-1], "t1").tool_response.output["sent"] == 40


@pytest.mark.parametrize("replace", [{"amount": "lots", "to": "bob"}, {"amount": 5}])
def test_replace_input_outside_the_input_schema_is_refused(parked_transfer, replace):
    agent, parked, log = parked_transfer
    resume = Resume(restart=[restart("transfer", "t1", resumed=True, replaceInput=replace)])
    with pytest.raises(InvalidAnswer) as caught:
        resume_turn(agent, next_step(parked.messages, 2), resume)
    assert caught.value.detail  # the schema errors, for the API to show
    assert len(log) == 1


# --- 7. max turns -----------------------------------------------------------------------------


def test_agent_that_never_stops_calling_tools_fails_with_max_turns():
    runs: list[str] = []
    model = CountingModel(ScriptedModel(steps=[], finish=Reply(calls=[Call(name="ping")])))
    agent = Agent("loop", model, tools=(make_counter("ping", "pong", runs),), max_turns=3)

    step = start()
    outcome = model_turn(agent, step)
    for version in range(2, 10):
        if not isinstance(outcome, Continue):
            break
        outcome = model_turn(agent, next_step(outcome.messages, version))

    assert isinstance(outcome, Fail)
    assert outcome.code == "max_turns"
    assert "3" in outcome.message
    assert model.calls == 3
    assert runs == ["ping"] * 3
    assert [m.role for m in outcome.messages] == ["user"] + ["model", "tool"] * 3


def test_max_turns_allows_exactly_that_many_turns():
    model = ScriptedModel(steps=[Reply(calls=[Call(name="ping")]), Reply(text="done")])
    agent = Agent("two", model, tools=(make_counter("ping", 1, []),), max_turns=2)
    first = model_turn(agent, start())
    assert isinstance(first, Continue)
    last = model_turn(agent, next_step(first.messages, 2))
    assert isinstance(last, Finish) and last.result == "done"


# --- 8. a restarted tool that interrupts again -------------------------------------------------


def test_restarted_tool_that_interrupts_again_parks_again():
    log: list = []
    model = ScriptedModel(steps=[Reply(calls=[
        Call(name="ask_user", input={"question": "Which account?"}, ref="acct"),
        Call(name="transfer", input={"amount": 5000, "to": "bob"}, ref="big"),
    ])])
    agent = Agent("bank", model, tools=(ask_user, make_transfer(log)))

    first = model_turn(agent, start())
    assert isinstance(first, Park)
    first_big = next(i for i in first.interrupts if i.tool_call_id == "big")

    second = resume_turn(agent, next_step(first.messages, 2), Resume(
        respond=[respond("ask_user", "acct", "savings")],
        restart=[restart("transfer", "big", resumed={"by": "alice"})]))

    assert isinstance(second, Park)
    [again] = second.interrupts
    assert again.tool_call_id == "big"
    assert again.message == "second approval for 5000"
    assert again.id != first_big.id
    assert again.turn == first_big.turn  # the same model turn asked both times
    assert [m.role for m in second.messages] == ["user", "model"]
    parked_message = second.messages[-1]
    assert request_part(parked_message, "acct").metadata == {"pendingOutput": "savings"}
    assert request_part(parked_message, "big").metadata == {
        "interrupt": {"id": again.id, "reason": CONFIRMATION}}

    third = resume_turn(agent, next_step(second.messages, 3), Resume(
        restart=[restart("transfer", "big", resumed={"by": "bob", "second": True})]))

    assert isinstance(third, Continue)
    tool_message = third.messages[-1]
    acct = response_part(tool_message, "acct")
    assert acct.tool_response.output == "savings" and acct.meta("source") == "pending"
    assert response_part(tool_message, "big").tool_response.output == {
        "sent": 5000, "to": "bob", "approvedBy": "bob"}
    assert [entry[2] for entry in log] == [False, True, True]


def test_a_declined_sibling_stays_declined_when_the_turn_parks_again():
    log: list = []
    model = ScriptedModel(steps=[
        Reply(calls=[Call(name="transfer", input={"amount": 20, "to": "cat"}, ref="small"),
                     Call(name="transfer", input={"amount": 5000, "to": "bob"}, ref="big")]),
        Choose(cases=[Case(tool="transfer", declined=True, reply=Reply(text="declined"))],
               otherwise=Reply(text="all sent")),
    ])
    agent = Agent("bank", model, tools=(make_transfer(log),))
    first = model_turn(agent, start())

    second = resume_turn(agent, next_step(first.messages, 2), Resume(
        decline={"small": "no"}, restart=[restart("transfer", "big", resumed={"by": "al"})]))
    assert isinstance(second, Park)
    third = resume_turn(agent, next_step(second.messages, 3), Resume(
        restart=[restart("transfer", "big", resumed={"by": "al", "second": True})]))

    assert isinstance(third, Continue)
    small = response_part(third.messages[-1], "small")
    assert small.tool_response.output == {"status": "declined", "reason": "no"}
    assert small.meta("cancelled") is True
    assert [entry[0] for entry in log].count(20) == 1  # the declined call never ran again


# --- interrupt metadata, background jobs, ending a run -------------------------------------


def test_interrupt_metadata_cannot_hide_the_interrupt_id_in_the_marker():
    @tool
    def ship(order: str, ctx: ToolContext) -> str:
        """Ship an order once approved."""
        if not ctx.restarted:
            ctx.interrupt("ship it?", metadata={"id": order, "reason": "policy", "risk": "low"})
        return f"shipped {order}"

    agent = Agent("shop", ScriptedModel(steps=[Reply(calls=[
        Call(name="ship", input={"order": "order-42"}, ref="s1")])]), tools=(ship,))
    parked = model_turn(agent, start())

    [intr] = parked.interrupts
    assert intr.metadata == {"id": "order-42", "reason": "policy", "risk": "low"}
    marker = request_part(parked.messages[-1], "s1").meta("interrupt")
    assert marker["id"] == intr.id and marker["reason"] == CONFIRMATION
    assert marker["risk"] == "low"


def test_background_job_parks_and_its_result_answers_the_call():
    started = []

    @tool
    def render(scene: str, ctx: ToolContext) -> dict:
        """Render a scene in the background."""
        ctx.start_job("render.scene", scene, quality="high", expires_in=60)

    agent = Agent("studio", ScriptedModel(steps=[
        Reply(calls=[Call(name="render", input={"scene": "intro"}, ref="r1")]),
        Reply(text="Rendered at {render[url]}"),
    ]), tools=(render,))
    step = start()
    step.jobs = started.append

    parked = model_turn(agent, step)

    assert isinstance(parked, Park)
    [intr] = parked.interrupts
    [job] = started
    assert (job.task, job.args, job.kwargs) == ("render.scene", ("intro",), {"quality": "high"})
    assert job.interrupt_id == intr.id and job.run_id == RUN
    assert intr.reason == "layby:background_job" and intr.mode is ResumeMode.RESPOND
    assert intr.metadata == {"jobId": job.job_id, "task": "render.scene"}
    assert intr.expires_at is not None

    resume = to_resume(parked.interrupts, {intr.id: resolved(intr, {"url": "s3://intro"})})
    resumed = resume_turn(agent, next_step(parked.messages, 2), resume)
    done = model_turn(agent, next_step(resumed.messages, 2))
    assert isinstance(done, Finish) and done.result == "Rendered at s3://intro"


def test_a_tool_can_end_the_run():
    @tool
    def stop(reason: str, ctx: ToolContext) -> str:
        """End the conversation."""
        ctx.end_run(f"stopped: {reason}")

    model = CountingModel(ScriptedModel(steps=[Reply(calls=[
        Call(name="stop", input={"reason": "done"})])]))
    agent = Agent("a", model, tools=(stop,))
    outcome = model_turn(agent, start())
    assert isinstance(outcome, Finish)
    assert outcome.result == "stopped: done"
    assert [m.role for m in outcome.messages] == ["user", "model", "tool"]


# --- 9. checkpoints ---------------------------------------------------------------------------


def make_slow(name: str, value: Any, log: list[str], seconds: float = 0.3):
    @tool(name=name)
    def slow() -> Any:
        """A plain tool that takes its time, and records each run."""
        time.sleep(seconds)
        log.append(name)
        return value

    return slow


def test_a_turn_run_twice_with_its_checkpoints_calls_nothing_twice():
    # `lookup` ends while `slow` still runs, and the turn parks (on `ask_user`): what both
    # did is kept, and so is the model's reply they acted on. A step run again (its park
    # lost with its worker) calls none of them again.
    runs: list[str] = []
    model = CountingModel(ScriptedModel(steps=[Reply(calls=[
        Call(name="lookup", ref="look"),
        Call(name="slow", ref="s"),
        Call(name="ask_user", input={"question": "ok?"}, ref="q"),
    ])]))
    agent = Agent("a", model, tools=(make_counter("lookup", {"n": 1}, runs),
                                     make_slow("slow", "done", runs), ask_user))
    checkpoints = MemoryCheckpoints()

    first = model_turn(agent, start(checkpoints=checkpoints))
    assert set(checkpoints.data) == {"model", "tool:look", "tool:s"}
    again = model_turn(agent, start(checkpoints=checkpoints))

    assert model.calls == 1
    assert runs == ["lookup", "slow"]
    assert isinstance(again, Park) and isinstance(first, Park)
    assert again.messages == first.messages
    # An ask is asked again alike (only the moment it was made differs).
    assert [i.model_copy(update={"created_at": None}) for i in again.interrupts] == \
        [i.model_copy(update={"created_at": None}) for i in first.interrupts]

    # without the checkpoints, the same step does call everything again
    model_turn(agent, start(checkpoints=MemoryCheckpoints()))
    assert model.calls == 2 and runs == ["lookup", "slow", "lookup", "slow"]


def test_results_the_commit_follows_at_once_stay_in_memory():
    # One tool that only asks: nothing acts on the reply, and the ask is recomputed alike.
    model = ScriptedModel(steps=[Reply(calls=[
        Call(name="ask_user", input={"question": "ok?"}, ref="q")])])
    checkpoints = MemoryCheckpoints()
    parked = model_turn(Agent("a", model, tools=(ask_user,)), start(checkpoints=checkpoints))
    assert isinstance(parked, Park)
    assert checkpoints.data == {}
    assert sorted(checkpoints.kept_only_in_memory) == ["model", "tool:q"]


def test_a_resume_run_twice_with_its_checkpoints_runs_the_restart_once():
    # Two restarts: the one that ends first is kept while the other still runs.
    log: list = []

    @tool
    def slow_gate(ctx: ToolContext) -> str:
        """Approved first, then slow."""
        if not ctx.restarted:
            ctx.interrupt("go?", reason=CONFIRMATION)
        time.sleep(0.3)
        return "done"

    model = ScriptedModel(steps=[Reply(calls=[
        Call(name="transfer", input={"amount": 9, "to": "bob"}, ref="t1"),
        Call(name="slow_gate", ref="s1")])])
    agent = Agent("bank", model, tools=(make_transfer(log), slow_gate))
    parked = model_turn(agent, start())
    assert isinstance(parked, Park)
    checkpoints = MemoryCheckpoints()
    resume = Resume(restart=[restart("transfer", "t1", resumed={"by": "al"}),
                             restart("slow_gate", "s1", resumed={"by": "al"})])

    first = resume_turn(agent, next_step(parked.messages, 2, checkpoints), resume)
    again = resume_turn(agent, next_step(parked.messages, 2, checkpoints), resume)

    assert isinstance(again, Continue) and not again.replayable
    assert again.messages == first.messages
    assert len(log) == 2  # the first run and one restart: the second step reads it back
    assert "tool:t1" in checkpoints.data


def test_a_finished_turn_replayed_from_checkpoints_gives_the_same_messages():
    runs: list[str] = []
    model = CountingModel(ScriptedModel(steps=[Reply(text="hi", calls=[Call(name="ping")])]))
    agent = Agent("a", model, tools=(make_counter("ping", "pong", runs),))
    checkpoints = MemoryCheckpoints()

    first = model_turn(agent, start(checkpoints=checkpoints))
    again = model_turn(agent, start(checkpoints=checkpoints))

    assert isinstance(first, Continue) and isinstance(again, Continue)
    assert again.messages == first.messages
    # The reply `ping` acts on is kept; `ping` itself ended last (the commit follows).
    assert (model.calls, runs) == (1, ["ping", "ping"])


def test_a_resume_that_only_applies_answers_needs_no_commit_of_its_own():
    model = ScriptedModel(steps=[Reply(calls=[
        Call(name="ask_user", input={"question": "Which city?"}, ref="q1")])])
    agent = Agent("a", model, tools=(ask_user,))
    parked = model_turn(agent, start())
    resumed = resume_turn(agent, next_step(parked.messages, 2),
                          Resume(respond=[respond("ask_user", "q1", "Paris")]))
    assert isinstance(resumed, Continue) and resumed.replayable


# --- 10. cancelled answers ----------------------------------------------------------------------


def _decline_agent(log: list):
    model = ScriptedModel(steps=[
        Reply(calls=[Call(name="transfer", input={"amount": 900, "to": "bob"}, ref="t1")]),
        Choose(cases=[Case(tool="transfer", declined=True,
                           reply=Reply(text="Not sent: {transfer[reason]}."))],
               otherwise=Reply(text="Sent {transfer[sent]}.")),
    ])
    return Agent("bank", model, tools=(make_transfer(log),))


def test_declined_interrupt_gives_a_declined_response_and_the_declined_branch():
    log: list = []
    agent = _decline_agent(log)
    parked = model_turn(agent, start())

    resumed = resume_turn(agent, next_step(parked.messages, 2),
                          Resume(decline={"t1": "too expensive"}))

    assert isinstance(resumed, Continue)
    assert len(log) == 1  # a declined tool does not run
    part = response_part(resumed.messages[-1], "t1")
    assert part.tool_response.output == {"status": "declined", "reason": "too expensive"}
    assert part.meta("cancelled") is True
    done = model_turn(agent, next_step(resumed.messages, 2))
    assert isinstance(done, Finish) and done.result == "Not sent: too expensive."


def test_approved_interrupt_takes_the_other_branch():
    log: list = []
    agent = _decline_agent(log)
    parked = model_turn(agent, start())
    resumed = resume_turn(agent, next_step(parked.messages, 2),
                          Resume(restart=[restart("transfer", "t1", resumed={"by": "al"})]))
    done = model_turn(agent, next_step(resumed.messages, 2))
    assert isinstance(done, Finish) and done.result == "Sent 900."


# --- 11. answers: checking and mapping ----------------------------------------------------------


@interrupt_tool(output=str, reason=CONFIRMATION)
def approve(action: str):
    """Approve or reject an action."""
    return Ask(message=f"approve {action}?",
               response_schema={"type": "string", "enum": ["approve", "reject"]})


@pytest.fixture
def three_interrupts():
    log: list = []
    model = ScriptedModel(steps=[Reply(calls=[
        Call(name="approve", input={"action": "deploy"}, ref="ap"),
        Call(name="transfer", input={"amount": 10, "to": "bob"}, ref="tr"),
        Call(name="ask_user", input={"question": "why?"}, ref="why"),
    ])])
    agent = Agent("ops", model, tools=(approve, make_transfer(log), ask_user))
    parked = model_turn(agent, start())
    assert isinstance(parked, Park)
    by_ref = {i.tool_call_id: i for i in parked.interrupts}
    return agent, parked, by_ref, log


def resolved(intr: Interrupt, payload: Any = None, **metadata: Any) -> ResumeEntry:
    return ResumeEntry(interrupt_id=intr.id, status="resolved", payload=payload,
                       metadata=metadata or None)


def test_check_answer_refuses_a_payload_outside_the_response_schema(three_interrupts):
    _, _, by_ref, _ = three_interrupts
    ap = by_ref["ap"]
    assert ap.message == "approve deploy?"
    assert ap.response_schema == {"type": "string", "enum": ["approve", "reject"]}

    errors = check_answer(ap, resolved(ap, "maybe"))
    assert errors and errors[0]["path"] == "/" and "maybe" in errors[0]["message"]
    assert check_answer(ap, resolved(ap, "approve")) == []
    assert check_answer(ap, ResumeEntry(interrupt_id=ap.id, status="cancelled")) == []


def test_check_answer_refuses_replace_input_on_a_respond_interrupt(three_interrupts):
    _, _, by_ref, _ = three_interrupts
    ap = by_ref["ap"]
    errors = check_answer(ap, resolved(ap, "approve", replaceInput={"action": "rollback"}))
    assert [e["path"] for e in errors] == ["/metadata/replaceInput"]


def test_check_answer_checks_replace_input_against_the_input_schema(three_interrupts):
    _, _, by_ref, _ = three_interrupts
    tr = by_ref["tr"]
    assert check_answer(tr, resolved(tr, {"by": "al"}, replaceInput={"amount": 3, "to": "x"})) \
        == []
    errors = check_answer(tr, resolved(tr, None, replaceInput={"amount": "three", "to": "x"}))
    assert [e["path"] for e in errors] == ["/metadata/replaceInput/amount"]
    errors = check_answer(tr, resolved(tr, None, replaceInput={"amount": 3}))
    assert [e["path"] for e in errors] == ["/metadata/replaceInput"]


def test_to_resume_maps_answers_to_respond_restart_and_decline(three_interrupts):
    agent, parked, by_ref, _log = three_interrupts
    answers = {
        by_ref["ap"].id: resolved(by_ref["ap"], "approve"),
        by_ref["tr"].id: resolved(by_ref["tr"], {"by": "al"},
                                  replaceInput={"amount": 12, "to": "bob"}),
        by_ref["why"].id: ResumeEntry(interrupt_id=by_ref["why"].id, status="cancelled",
                                      metadata={"reason": "not now"}),
    }

    resume = to_resume(parked.interrupts, answers)

    assert [(p.tool_response.name, p.tool_response.ref, p.tool_response.output)
            for p in resume.respond] == [("approve", "ap", "approve")]
    [again] = resume.restart
    assert (again.tool_request.name, again.tool_request.ref) == ("transfer", "tr")
    # No input of its own: the request runs again as history has it, unless replaced.
    assert again.tool_request.input is None
    assert again.metadata == {"resumed": {"by": "al"},
                              "replaceInput": {"amount": 12, "to": "bob"}}
    assert resume.decline == {"why": "not now"}

    # and it applies to the parked turn as is
    resumed = resume_turn(agent, next_step(parked.messages, 2), resume)
    assert isinstance(resumed, Continue)
    outputs = {p.tool_response.ref: p.tool_response.output for p in resumed.messages[-1].content}
    assert outputs == {"ap": "approve", "tr": {"sent": 12, "to": "bob", "approvedBy": "al"},
                       "why": {"status": "declined", "reason": "not now"}}


def test_to_resume_marks_a_restart_without_payload_as_resumed_and_skips_unanswered(
        three_interrupts):
    _, parked, by_ref, _ = three_interrupts
    resume = to_resume(parked.interrupts, {by_ref["tr"].id: resolved(by_ref["tr"])})
    assert resume.respond == [] and resume.decline == {}
    [again] = resume.restart
    assert again.metadata == {"resumed": True}


# --- 12. the public API -----------------------------------------------------------------------

# Public names of generation's modules that are plumbing for layby's own layers.
INTERNAL = {
    "Wire", "Role", "dump_messages", "load_messages", "interrupt_id", "check_reason",
    "CORE_REASONS", "schema_of", "type_path", "typed_answer", "answer_type", "APPROVAL_MARK",
    "JobStarter", "DEFAULT_MAX_TURNS", "Checkpoints",
    "NoCheckpoints", "CallResult", "DECLINED", "log", "pydantic_errors",
    "Step",  # scripted.Step, the type of a script step; generation.Step is turn.Step
}
MODULES = ["agents", "answers", "interrupts", "messages", "models", "scripted",
           "stored_run", "tools", "turn", "versions"]


def test_all_lists_each_public_name_once_and_each_is_importable():
    names = generation.__all__
    assert len(names) == len(set(names))
    namespace: dict[str, Any] = {}
    exec("from layby.generation import *", namespace)  # noqa: S102
    assert set(names) <= set(namespace)
    for name in names:
        assert getattr(generation, name) is namespace[name]


def test_all_covers_every_public_name_the_modules_define():
    missing = []
    for short in MODULES:
        module = importlib.import_module(f"layby.generation.{short}")
        for name in _top_level_names(inspect.getsource(module)):
            if not name.startswith("_") and name not in INTERNAL \
                    and name not in generation.__all__:
                missing.append(f"generation.{short}.{name}")
    assert missing == []


def _top_level_names(source: str) -> list[str]:
    names = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return names


def test_check_answer_with_the_tool_applies_its_own_validators() -> None:
    """A JSON schema carries neither formats nor validators: with the tool at hand, what
    would fail at resume is refused before it is stored."""
    from datetime import datetime

    from pydantic import BaseModel, field_validator

    class Slot(BaseModel):
        when: datetime
        seats: int

        @field_validator("seats")
        @classmethod
        def _positive(cls, value: int) -> int:
            if value < 1:
                raise ValueError("seats must be at least 1")
            return value

    @interrupt_tool(output=Slot)
    def pick_slot(topic: str) -> None:
        return None

    intr = Interrupt(id="i", reason=INPUT_REQUIRED, tool_call_id="r", tool_name="pick_slot",
                     mode=ResumeMode.RESPOND, response_schema=pick_slot.output_schema)
    bad = ResumeEntry(interrupt_id="i", status="resolved",
                      payload={"when": "tomorrow", "seats": 0})
    assert check_answer(intr, bad) == []  # the JSON schema alone lets it through
    paths = {e["path"] for e in check_answer(intr, bad, pick_slot)}
    assert paths == {"/when", "/seats"}
    good = ResumeEntry(interrupt_id="i", status="resolved",
                       payload={"when": "2026-12-01T10:00:00Z", "seats": 2})
    assert check_answer(intr, good, pick_slot) == []
