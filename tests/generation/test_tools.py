"""Tools as users write them against `layby`'s surface: approval gates
(`@tool(requires_approval=…)`) and typed answers (`ctx.resumed` as the question's model).
The turn is played in process; the interrupt and its answer go through JSON, as they do
through Redis and the API."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from layby import CONFIRMATION, Agent, Approval, Call, Reply, ScriptedModel, ToolContext, tool
from layby.generation import (
    Continue,
    Interrupt,
    Park,
    ResumeEntry,
    Step,
    model_turn,
    resume_turn,
    text_message,
    to_resume,
)
from layby.generation.messages import dump_messages, load_messages

RUN = "run-tools"


class Shipping(BaseModel):
    """An answer with more than yes or no (module level, so answers can be typed)."""

    carrier: str
    express: bool = False


def stored(messages: list[Any]) -> list[Any]:
    return load_messages(json.loads(json.dumps(dump_messages(messages))))


def park(agent: Agent, text: str = "go") -> Park:
    parked = model_turn(agent, Step(RUN, 1, [text_message("user", text)]))
    assert isinstance(parked, Park), parked
    return parked


def answer(agent: Agent, parked: Park, *entries: ResumeEntry) -> Continue:
    """Resume as a worker does: the interrupts and answers read back from storage."""
    specs = [Interrupt.model_validate_json(json.dumps(i.wire())) for i in parked.interrupts]
    resumed = resume_turn(agent, Step(RUN, 2, stored(parked.messages)),
                          to_resume(specs, {e.interrupt_id: e for e in entries}))
    assert isinstance(resumed, Continue), resumed
    return resumed


def output_of(resumed: Continue) -> Any:
    [part] = [p for p in resumed.messages[-1].content if p.tool_response]
    return part.tool_response.output


def refund_agent(log: list[tuple[str, int]], rule: Any = True) -> Agent:
    @tool(requires_approval=rule)
    def refund(order: str, amount: int) -> dict[str, Any]:
        """Refund an order."""
        log.append((order, amount))
        return {"refunded": amount, "order": order}

    model = ScriptedModel(input_pattern=r"(?P<amount>\d+) on (?P<order>\w+)", steps=[
        Reply(calls=[Call(name="refund", input={"order": "{order}", "amount": "{amount}"})]),
        Reply(text="done"),
    ])
    return Agent("shop", model, tools=(refund,))


def test_requires_approval_asks_before_the_tool_runs_and_runs_it_once_approved() -> None:
    log: list[tuple[str, int]] = []
    agent = refund_agent(log)

    parked = park(agent, "refund 250 on o42")

    assert log == []  # nothing happens before a person says yes
    [intr] = parked.interrupts
    assert intr.reason == CONFIRMATION
    assert intr.message == 'Allow refund(order="o42", amount=250)?'
    assert intr.response_schema == Approval.model_json_schema()
    assert intr.tool_input == {"order": "o42", "amount": 250}

    resumed = answer(agent, parked, ResumeEntry(interrupt_id=intr.id, status="resolved",
                                                payload={"approved": True}))
    assert log == [("o42", 250)]
    assert output_of(resumed) == {"refunded": 250, "order": "o42"}


def test_a_rule_on_the_arguments_gates_only_the_calls_it_picks() -> None:
    log: list[tuple[str, int]] = []
    agent = refund_agent(log, rule=lambda amount, **_: amount > 100)

    small = model_turn(agent, Step(RUN, 1, [text_message("user", "refund 20 on o1")]))
    assert isinstance(small, Continue)  # no person asked for 20
    assert log == [("o1", 20)]

    parked = park(agent, "refund 2000 on o2")
    assert log == [("o1", 20)]
    answer(agent, parked, ResumeEntry(interrupt_id=parked.interrupts[0].id, status="resolved",
                                      payload={"approved": True}))
    assert log == [("o1", 20), ("o2", 2000)]


def test_a_declined_approval_never_runs_the_tool_and_tells_the_model_why() -> None:
    log: list[tuple[str, int]] = []
    agent = refund_agent(log)

    parked = park(agent, "refund 250 on o42")
    said_no = answer(agent, parked, ResumeEntry(
        interrupt_id=parked.interrupts[0].id, status="resolved",
        payload={"approved": False, "note": "already refunded"}))
    assert output_of(said_no) == {"status": "declined", "reason": "already refunded"}

    parked = park(agent, "refund 250 on o42")
    cancelled = answer(agent, parked, ResumeEntry(
        interrupt_id=parked.interrupts[0].id, status="cancelled",
        metadata={"reason": "not today"}))
    assert output_of(cancelled) == {"status": "declined", "reason": "not today"}
    assert log == []


def test_a_restarted_tool_gets_its_answer_as_the_questions_model() -> None:
    seen: list[Any] = []

    @tool
    def ship(ctx: ToolContext, parcel: str) -> str:
        """Ship a parcel, asking how."""
        if not ctx.restarted:
            ctx.interrupt(f"How should {parcel} go?", response_schema=Shipping)
        seen.append(ctx.resumed)
        assert isinstance(ctx.resumed, Shipping)
        return f"{parcel} by {ctx.resumed.carrier}{' express' if ctx.resumed.express else ''}"

    agent = Agent("post", ScriptedModel(steps=[
        Reply(calls=[Call(name="ship", input={"parcel": "p1"})]), Reply(text="ok")]),
        tools=(ship,))
    parked = park(agent)
    resumed = answer(agent, parked, ResumeEntry(interrupt_id=parked.interrupts[0].id,
                                                status="resolved",
                                                payload={"carrier": "dhl", "express": True}))

    assert seen == [Shipping(carrier="dhl", express=True)]
    assert output_of(resumed) == "p1 by dhl express"


def test_an_answer_stays_plain_data_when_its_model_cannot_be_found_again() -> None:
    class Local(BaseModel):  # defined in a function: no import path leads back to it
        carrier: str

    seen: list[Any] = []

    @tool
    def ship(ctx: ToolContext, parcel: str) -> str:
        """Ship a parcel."""
        if not ctx.restarted:
            ctx.interrupt("How?", response_schema=Local)
        seen.append(ctx.resumed)
        return "sent"

    agent = Agent("post", ScriptedModel(steps=[
        Reply(calls=[Call(name="ship", input={"parcel": "p1"})]), Reply(text="ok")]),
        tools=(ship,))
    parked = park(agent)
    answer(agent, parked, ResumeEntry(interrupt_id=parked.interrupts[0].id,
                                      status="resolved", payload={"carrier": "ups"}))
    assert seen == [{"carrier": "ups"}]


def test_tool_called_with_a_function_keeps_its_approval_gate() -> None:
    log: list[tuple[str, int]] = []

    def refund(order: str, amount: int) -> dict[str, Any]:
        """Refund an order."""
        log.append((order, amount))
        return {"refunded": amount}

    gated = tool(refund, requires_approval=True)
    agent = Agent("shop", ScriptedModel(steps=[
        Reply(calls=[Call(name="refund", input={"order": "o1", "amount": 5})]),
        Reply(text="done")]), tools=(gated,))
    park(agent)
    assert log == []


def test_an_approved_tool_asks_its_own_question_as_on_a_first_call() -> None:
    @tool(requires_approval=True)
    def ship(ctx: ToolContext, parcel: str) -> str:
        """Ship a parcel, after approval, asking how."""
        if not ctx.restarted:
            ctx.interrupt(f"How should {parcel} go?", response_schema=Shipping)
        assert isinstance(ctx.resumed, Shipping)
        return f"{parcel} by {ctx.resumed.carrier}"

    agent = Agent("post", ScriptedModel(steps=[
        Reply(calls=[Call(name="ship", input={"parcel": "p1"})]), Reply(text="ok")]),
        tools=(ship,))
    parked = park(agent)
    [approval] = parked.interrupts
    specs = [Interrupt.model_validate_json(json.dumps(approval.wire()))]
    again = resume_turn(agent, Step(RUN, 2, stored(parked.messages)), to_resume(
        specs, {approval.id: ResumeEntry(interrupt_id=approval.id, status="resolved",
                                         payload={"approved": True})}))
    assert isinstance(again, Park)  # approved, the tool asks how to ship
    [how] = again.interrupts
    assert how.message == "How should p1 go?"
    resumed = answer(agent, Park(again.messages, again.interrupts),
                     ResumeEntry(interrupt_id=how.id, status="resolved",
                                 payload={"carrier": "post"}))
    assert output_of(resumed) == "p1 by post"
