"""The shop's support agent: it asks the customer why they want a refund, refunds the order
(a person approves refunds over 100 first) and has the credit note rendered in the
background. The model is scripted, so the example runs anywhere; swap in
`layby.models.OpenAIChatModel` or `AnthropicModel` for a real one."""

from __future__ import annotations

from typing import Any

from layby import (
    Agent,
    Ask,
    Call,
    Case,
    Choose,
    Reply,
    ScriptedModel,
    ToolContext,
    interrupt_tool,
    tool,
)

APPROVAL_LIMIT = 100


@interrupt_tool(output=str)
def ask_customer(question: str) -> Ask:
    """Ask the customer something; their answer is the tool's output."""
    return Ask(message=question, response_schema={"type": "string", "minLength": 1})


@tool(requires_approval=lambda amount, **_: amount > APPROVAL_LIMIT)
def refund(order: str, amount: int) -> dict[str, Any]:
    """Refund an order. Amounts over 100 wait for a person's approval."""
    return {"status": "refunded", "order": order, "amount": amount}


@tool
def credit_note(ctx: ToolContext, order: str, amount: int) -> dict[str, Any]:
    """Render the credit note: a background job whose result is this tool's output."""
    ctx.start_job("shop.render_credit_note", order=order, amount=amount,
                  message=f"rendering the credit note for order {order}")


support = Agent(
    name="shop.support",
    description="Refunds an order: 'Refund 250 on order 42'.",
    tools=(ask_customer, refund, credit_note),
    model=ScriptedModel(
        input_pattern=r"refund (?P<amount>\d+) on order (?P<order>\w+)",
        steps=[
            Reply(calls=[Call(name="ask_customer",
                              input={"question": "Why would you like a refund?"})]),
            Reply(calls=[Call(name="refund", input={"order": "{order}", "amount": "{amount}"})]),
            Choose(cases=[Case(tool="refund", field="status", equals="refunded",
                               reply=Reply(calls=[Call(name="credit_note", input={
                                   "order": "{order}", "amount": "{amount}"})]))],
                   otherwise=Reply(text="Refund of {amount} on order {order} declined: "
                                        "{refund[reason]}.")),
            Reply(text="Refunded {amount} on order {order} ({ask_customer}); credit note "
                       "{credit_note[number]}."),
        ]),
)
