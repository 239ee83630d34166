"""Agents for tests only (loaded by the test systems next to the demo agents)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

from pydantic import Field

from layby.broker_config import Settings
from layby.control.connections import redis_client
from layby.demo.agents import ask_question, compile_report
from layby.generation import (
    Agent,
    Approval,
    Ask,
    Call,
    Case,
    Choose,
    Reply,
    RetryLater,
    ScriptedModel,
    ToolContext,
    interrupt_tool,
    tool,
)


@tool
def ping(ctx: ToolContext) -> str:
    """A plain tool the looping agent calls forever."""
    return "pong"


@tool
def two_approvals(ctx: ToolContext, action: str) -> dict:
    """Asks for approval, then (restarted) for a second sign-off: it parks twice."""
    if not ctx.restarted:
        ctx.interrupt(f"Approve {action}?", response_schema={"type": "object"})
    if not (ctx.resumed or {}).get("second"):
        ctx.interrupt(f"Second sign-off for {action}?", response_schema={
            "type": "object", "properties": {"second": {"const": True}},
            "required": ["second"]})
    return {"done": action}


loop = Agent(name="test.loop", max_turns=3, tools=(ping,),
             model=ScriptedModel(steps=[], finish=Reply(calls=[Call(name="ping")])))

# A turn that takes a plain tool, then one that asks: a parked run with two steps' events.
ping_then_ask = Agent(name="test.ping_then_ask", tools=(ping, ask_question),
                      model=ScriptedModel(steps=[
                          Reply(calls=[Call(name="ping")]),
                          Reply(calls=[Call(name="ask_question", input={
                              "question": "Go on?", "choices": ["yes", "no"]})]),
                          Reply(text="You said {ask_question}."),
                      ]))

twice = Agent(name="test.twice", tools=(two_approvals,), model=ScriptedModel(steps=[
    Reply(calls=[Call(name="two_approvals", input={"action": "launch"})]),
    Reply(text="Result: {two_approvals[done]}"),
]))


@tool
def sign_off(ctx: ToolContext, who: str) -> dict:
    """Asks the reviewers named in `who` (people or groups, comma-separated) to sign off."""
    if not ctx.restarted:
        ctx.interrupt("Sign off on the quarterly audit?", response_schema={"type": "object"},
                      reviewers=[name.strip() for name in who.split(",") if name.strip()])
    return {"signed": True}


named = Agent(name="test.named", tools=(sign_off,), model=ScriptedModel(steps=[
    Reply(calls=[Call(name="sign_off", input={"who": "{input}"})]),
    Reply(text="Signed off."),
]))


@tool
def two_keys(ctx: ToolContext, action: str) -> dict:
    """A launch that two different people must approve (`required_approvals`)."""
    if not ctx.restarted:
        ctx.interrupt(f"Launch {action}?", response_schema=Approval, reviewers=["everyone"],
                      required_approvals=2)
    return {"launched": action if ctx.resumed.approved else None}


quorum = Agent(name="test.quorum", tools=(two_keys,), model=ScriptedModel(steps=[
    Reply(calls=[Call(name="two_keys", input={"action": "{input}"})]),
    Reply(text="Launched: {two_keys[launched]}"),
]))


@tool(requires_approval=lambda amount, **_: amount > 100)
def refund(order: str, amount: int) -> dict:
    """Refund an order; amounts over 100 need approval (which policy rules may give)."""
    return {"status": "refunded", "order": order, "amount": amount}


refunds = Agent(name="test.refunds", tools=(refund,), model=ScriptedModel(
    input_pattern=r"refund (?P<amount>\d+) on order (?P<order>\w+)",
    steps=[
        Reply(calls=[Call(name="refund", input={"order": "{order}", "amount": "{amount}"})]),
        Choose(cases=[Case(tool="refund", field="status", equals="refunded",
                           reply=Reply(text="Refunded {amount}."))],
               otherwise=Reply(text="Declined: {refund[reason]}.")),
    ]))


@tool(requires_approval=True, allow_edit=True)
def pay(to: str, amount: Annotated[int, Field(gt=0)]) -> dict:
    """Pay someone; the approver may correct the payee or the amount first."""
    return {"paid": amount, "to": to}


editable = Agent(name="test.editable", tools=(pay,), model=ScriptedModel(
    input_pattern=r"pay (?P<amount>\d+) to (?P<to>\w+)",
    steps=[
        Reply(calls=[Call(name="pay", input={"to": "{to}", "amount": "{amount}"})]),
        Choose(cases=[Case(tool="pay", declined=True, reply=Reply(text="Not paid."))],
               otherwise=Reply(text="Paid {pay[paid]} to {pay[to]}.")),
    ]))


# -- for the review page tests: a request whose words are full of HTML ------------------

MARKUP_QUESTION = 'Is <script>alert("owned")</script> & <b>bold</b> \'safe\'?'
MARKUP_CHOICES = ["<b>yes</b>", "no & never"]


@interrupt_tool(output=str)
def ask_markup(question: str) -> Ask:
    """Ask a question whose text and choices are HTML-looking strings."""
    return Ask(message=question, response_schema={"type": "string", "enum": MARKUP_CHOICES})


markup = Agent(name="test.markup", tools=(ask_markup,), model=ScriptedModel(steps=[
    Reply(calls=[Call(name="ask_markup", input={"question": MARKUP_QUESTION})]),
    Reply(text="You chose {ask_markup}."),
]))


# One turn that starts a background job and asks a person: the job answers itself, so an
# AG-UI client is asked only the question.
mixed = Agent(name="test.mixed", tools=(compile_report, ask_question), model=ScriptedModel(
    steps=[
        Reply(calls=[Call(name="compile_report", input={"topic": "sales"}),
                     Call(name="ask_question", input={"question": "Which format?",
                                                      "choices": ["pdf", "html"]})]),
        Reply(text="{compile_report[title]} as {ask_question}."),
    ]))


# -- for tests/ops/test_compose.py: a tool that holds its worker until the test lets it go --------

HOLD_KEY = "layby-test:hold:{run_id}"


@tool
def hold(ctx: ToolContext) -> str:
    """Marks itself as running, then waits for the test to push to its release list (at
    most two minutes, so a failed test never leaves a worker held)."""
    client = redis_client(Settings())
    key = HOLD_KEY.format(run_id=ctx.run_id)
    client.set(f"{key}:held", "1")
    deadline = time.monotonic() + 120
    # Short blocking pops: one longer than the client's socket timeout would fail.
    while time.monotonic() < deadline:
        if client.blpop([f"{key}:release"], timeout=5):
            return "released"
    return "never released"


held = Agent(name="test.hold", tools=(hold,), model=ScriptedModel(steps=[
    Reply(calls=[Call(name="hold")]),
    Reply(text="{hold}"),
]))


# -- for failover tests: a run that stays *running* until the test lets it go; a file, not
# Redis (as test.hold uses), because Redis is what those tests kill ----------------------


@tool
def wait_for_gate(ctx: ToolContext, gate: str) -> str:
    """Marks `<LAYBY_TEST_GATE_DIR>/<gate>.started`, then waits until the test creates
    `<gate>` (at most two minutes): the run is running, inside a tool, all that time."""
    folder = Path(os.environ["LAYBY_TEST_GATE_DIR"])
    (folder / f"{gate}.started").touch()
    deadline = time.monotonic() + 120
    while not (folder / gate).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {gate} never opened")
        time.sleep(0.05)
    return "released"


gated = Agent(name="test.gated", tools=(wait_for_gate,), model=ScriptedModel(steps=[
    Reply(calls=[Call(name="wait_for_gate", input={"gate": "{input}"})]),
    Reply(text="Released: {wait_for_gate}."),
]))


@tool
def export_day(ctx: ToolContext, after_s: float) -> str:
    """An exporter that is busy at the first attempt: try again in `after_s` seconds."""
    if ctx.attempt == 1:
        raise RetryLater(after_s=after_s, reason="exporter busy")
    return f"exported on attempt {ctx.attempt} ({ctx.idempotency_key})"


# The input is how many seconds the exporter asks to be given.
exporter = Agent(name="test.exporter", tools=(export_day,), model=ScriptedModel(steps=[
    Reply(calls=[Call(name="export_day", input={"after_s": "{input}"})]),
    Reply(text="{export_day}"),
]))
