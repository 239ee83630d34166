"""The benchmark's agent: one question, one answer, one final reply (scripted model).

A cycle of `bench.approval` takes one model turn that calls an interrupt tool (the run
parks), then, after the answer, one more model turn that finishes. Loaded by the bench's
worker through LAYBY_AGENT_MODULES=bench.agents.
"""

from __future__ import annotations

from layby.generation import Agent, Ask, Call, Reply, ScriptedModel, interrupt_tool

AGENT = "bench.approval"


@interrupt_tool(output=bool)
def approve(step: str) -> Ask:
    """Ask a person to approve a step; the answer (true or false) is the tool's output."""
    return Ask(message=f"Approve {step}?")


approval = Agent(
    name=AGENT,
    description="Asks for one approval, then says so: one interrupt per run.",
    tools=(approve,),
    model=ScriptedModel(steps=[
        Reply(calls=[Call(name="approve", input={"step": "{input}"})]),
        Reply(text="Approved: {approve}."),
    ]),
)


ANNOUNCED = "bench.announced"
HOOK_REVIEWER = "bench-hook"


@interrupt_tool(output=bool, name="approve")
def approve_by_hook(step: str) -> Ask:
    """The same question, asked of the bench's webhook reviewer (`--parked`)."""
    return Ask(message=f"Approve {step}?", reviewers=[HOOK_REVIEWER])


announced = Agent(
    name=ANNOUNCED,
    description="bench.approval, announced to a reviewer by webhook when it parks.",
    tools=(approve_by_hook,),
    model=ScriptedModel(steps=[
        Reply(calls=[Call(name="approve", input={"step": "{input}"})]),
        Reply(text="Approved: {approve}."),
    ]),
)
