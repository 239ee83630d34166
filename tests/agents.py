"""Agents for tests only (loaded by the test systems next to the demo agents)."""

from __future__ import annotations

from generation import Agent, Call, Reply, ScriptedModel, ToolContext, tool


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

twice = Agent(name="test.twice", tools=(two_approvals,), model=ScriptedModel(steps=[
    Reply(calls=[Call(name="two_approvals", input={"action": "launch"})]),
    Reply(text="Result: {two_approvals[done]}"),
]))
