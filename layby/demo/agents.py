"""The demo agents: demo.trivia, demo.transfer, demo.parallel, demo.bbq, demo.report,
demo.expiring. Each is a scripted model over real tools and interrupts."""

from __future__ import annotations

import os
import time
from typing import Annotated, Any

from pydantic import Field

from layby import (
    CONFIRMATION,
    Agent,
    Approval,
    Ask,
    Call,
    Case,
    Choose,
    OnExpire,
    Reply,
    RetryPolicy,
    ScriptedModel,
    ToolContext,
    interrupt_tool,
    tool,
)
from layby.demo import ledger

__all__ = ["TRANSFER_RETRY", "TRIVIA_CHOICES", "Approval", "ask_question", "bbq",
           "compile_report", "expiring", "parallel", "report", "transfer", "trivia"]


@interrupt_tool(output=str)
def ask_question(question: str, choices: list[str] | None = None) -> Ask:
    """Ask the user a question; with choices, the answer must be one of them."""
    schema = {"type": "string", "enum": choices} if choices else {"type": "string",
                                                                   "minLength": 1}
    return Ask(message=question, response_schema=schema,
               metadata={"choices": choices} if choices else None)


# An approved transfer must happen: a ledger (its store) failing over, a connection reset,
# are tried again for about half a minute (waits of 0.5, 1, 2, 4, 8, 10 and 10 s), the same
# idempotency key each time, so the ledger records it once however often it was tried.
TRANSFER_RETRY = RetryPolicy(max_attempts=8, initial_interval_s=0.5, max_interval_s=10)


@tool(retry=TRANSFER_RETRY)
def transfer_funds(ctx: ToolContext, to: str,
                   amount: Annotated[int, Field(gt=0)]) -> dict[str, Any]:
    """Send money. Needs the account holder's approval first."""
    if not ctx.restarted:
        ctx.interrupt(f"Send {amount} to {to}?", reason=CONFIRMATION, response_schema=Approval,
                      metadata={"to": to, "amount": amount})
    approval = ctx.resumed  # an Approval: the question's response_schema
    if not (isinstance(approval, Approval) and approval.approved):
        return {"status": "not_approved", "to": to, "amount": amount}
    entry = ledger.record("transfers", ctx.idempotency_key,
                          {"run": ctx.run_id, "to": to, "amount": amount})
    # Lets tests stop a worker after the money moved and before the turn commits.
    time.sleep(float(os.environ.get("LAYBY_DEMO_TRANSFER_DELAY_S", "0")))
    return {"status": "sent", "to": to, "amount": amount, "id": entry["key"]}


@tool
def check_balance(ctx: ToolContext, account: str = "main") -> dict[str, Any]:
    """Look up an account balance (a plain tool: it never interrupts)."""
    ledger.record("calls", ctx.idempotency_key, {"run": ctx.run_id, "tool": "check_balance"})
    return {"account": account, "balance": 1000}


@tool
def compile_report(ctx: ToolContext, topic: str) -> dict[str, Any]:
    """Compile a report in the background; the run waits for it."""
    seconds = float(os.environ.get("LAYBY_DEMO_REPORT_S", "3"))
    ctx.start_job("demo.compile_report", topic=topic, seconds=seconds,
                  message=f"compiling a report on {topic}")


@tool
def deploy_release(ctx: ToolContext, release: str) -> dict[str, Any]:
    """Deploy a release to production after approval; the approval expires."""
    if not ctx.restarted:
        ctx.interrupt(f"Deploy {release} to production?", reason=CONFIRMATION,
                      response_schema=Approval,
                      expires_in=float(os.environ.get("LAYBY_DEMO_EXPIRY_S", "5")),
                      # pydantic takes the action's name and makes it an ExpiryAction (the
                      # public surface names actions by their strings)
                      on_expire=OnExpire(action="cancel"))  # type: ignore[arg-type]
    return {"status": "deployed", "release": release}


TRIVIA_CHOICES = ["Jaws", "Alien", "Star Wars", "Close Encounters of the Third Kind"]

trivia = Agent(
    name="demo.trivia",
    description="Asks a movie trivia question and says whether you were right.",
    tools=(ask_question,),
    model=ScriptedModel(steps=[
        Reply(text="Here is a question for you.", calls=[Call(name="ask_question", input={
            "question": "Which 1975 film's tagline was \"Don't go in the water\"?",
            "choices": TRIVIA_CHOICES})]),
        Choose(cases=[Case(tool="ask_question", equals="Jaws",
                           reply=Reply(text="Right! It was Jaws (1975)."))],
               otherwise=Reply(text="Not quite: you said {ask_question}, but the answer is "
                                    "Jaws (1975).")),
    ]),
)

_TRANSFER_PATTERN = r"(?:send|transfer|pay)\s+\$?(?P<amount>\d+)\s+(?:to\s+)?(?P<to>[\w.-]+)"

transfer = Agent(
    name="demo.transfer",
    description="Sends money after approval: 'Send 250 to Bob'.",
    tools=(transfer_funds,),
    model=ScriptedModel(input_pattern=_TRANSFER_PATTERN, steps=[
        Reply(calls=[Call(name="transfer_funds", input={"to": "{to}", "amount": "{amount}"})]),
        Choose(cases=[
            Case(tool="transfer_funds", declined=True,
                 reply=Reply(text="Transfer cancelled: {transfer_funds[reason]}. "
                                  "No money was sent.")),
            Case(tool="transfer_funds", field="status", equals="sent",
                 reply=Reply(text="Sent {transfer_funds[amount]} to {transfer_funds[to]}.")),
            Case(tool="transfer_funds", field="status", equals="not_approved",
                 reply=Reply(text="The transfer was not approved; no money was sent.")),
        ], otherwise=Reply(text="The transfer was approved, but it could not be made: "
                                "{transfer_funds[error]}")),
    ]),
)

parallel = Agent(
    name="demo.parallel",
    description="One turn asks a question, asks for a transfer approval and checks a balance.",
    tools=(ask_question, transfer_funds, check_balance),
    model=ScriptedModel(steps=[
        Reply(calls=[
            Call(name="ask_question", input={"question": "Which account should we pay from?",
                                             "choices": ["main", "savings"]}),
            Call(name="transfer_funds", input={"to": "Carol", "amount": 40}),
            Call(name="check_balance", input={"account": "main"}),
        ]),
        Reply(text="Paying from {ask_question}; transfer {transfer_funds[status]}; "
                   "balance was {check_balance[balance]}."),
    ]),
)

bbq = Agent(
    name="demo.bbq",
    description="Asks clarifying questions one after another, then writes a BBQ plan.",
    tools=(ask_question,),
    model=ScriptedModel(steps=[
        Reply(calls=[Call(name="ask_question", ref="guests",
                          input={"question": "How many guests are coming?"})]),
        Reply(calls=[Call(name="ask_question", ref="diet",
                          input={"question": "Any dietary needs?",
                                 "choices": ["none", "vegetarian", "vegan", "gluten-free"]})]),
        Reply(calls=[Call(name="ask_question", ref="grill",
                          input={"question": "Charcoal or gas?",
                                 "choices": ["charcoal", "gas"]})]),
        Reply(text="BBQ plan: {guests} guests, {diet} menu, on a {grill} grill. Light it an "
                   "hour before they arrive."),
    ]),
)

report = Agent(
    name="demo.report",
    description="Starts a report as a background job and answers when it is done.",
    tools=(compile_report,),
    model=ScriptedModel(steps=[
        Reply(calls=[Call(name="compile_report", input={"topic": "{input}"})]),
        Choose(cases=[Case(tool="compile_report", field="status", equals="failed",
                           reply=Reply(text="The report failed: {compile_report[error]}"))],
               otherwise=Reply(text="{compile_report[title]}: {compile_report[summary]} "
                                    "({compile_report[pages]} pages).")),
    ]),
)

expiring = Agent(
    name="demo.expiring",
    description="Asks to approve a deployment; the approval expires after a few seconds.",
    tools=(deploy_release,),
    model=ScriptedModel(steps=[
        Reply(calls=[Call(name="deploy_release", input={"release": "v2.0"})]),
        Choose(cases=[Case(tool="deploy_release", declined=True,
                           reply=Reply(text="The deployment was not approved in time "
                                            "({deploy_release[reason]}); nothing was "
                                            "deployed."))],
               otherwise=Reply(text="Deployed {deploy_release[release]}.")),
    ]),
)
