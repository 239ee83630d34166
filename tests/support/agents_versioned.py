"""Agents for tests/upgrades/test_agent_versions.py, in two versions of the code: what a deployment
had (LAYBY_TEST_AGENT_VARIANT=a, the default) and what replaced it (b). A worker loads
`tests.support.agents_versioned` with the variant of its environment, so one system can run both.

Every agent refunds order 42 for 250 after a person approves; in b:

- `versioned.removed` has lost its refund tool;
- `versioned.widened` takes any amount, with a note;
- `versioned.narrowed` refunds at most 100 (the parked call's 250 no longer fits);
- `versioned.migrated` too, with a migrate hook that brings parked calls down to 100;
- `versioned.pinned` (on_change="pin") has another system prompt, so another version. Its
  tool says which worker ran it (LAYBY_TEST_WORKER_TAG).
"""

from __future__ import annotations

import os
from typing import Annotated

from pydantic import Field

from layby import Agent, Call, Reply, ScriptedModel, StoredRun, tool

VARIANT = os.environ.get("LAYBY_TEST_AGENT_VARIANT", "a")
REFUND = Call(name="refund", input={"order": "42", "amount": 250})


def _script() -> ScriptedModel:
    return ScriptedModel(steps=[Reply(calls=[REFUND]),
                                Reply(text="refunded {refund[refunded]} on {refund[worker]}")])


def _worker() -> str:
    return os.environ.get("LAYBY_TEST_WORKER_TAG", "?")


@tool(requires_approval=True)
def refund(order: str, amount: int) -> dict:
    """Refund an order."""
    return {"order": order, "refunded": amount, "worker": _worker()}


@tool(requires_approval=True, name="refund")
def refund_any(order: str, amount: float, note: str = "") -> dict:
    """Refund an order, in part if need be."""
    return {"order": order, "refunded": amount, "worker": _worker()}


@tool(requires_approval=True, name="refund")
def refund_small(order: str, amount: Annotated[int, Field(le=100)]) -> dict:
    """Refund an order, up to 100."""
    return {"order": order, "refunded": amount, "worker": _worker()}


def at_most_100(run: StoredRun) -> StoredRun:
    """Calls parked with a larger amount go on with 100."""
    for intr in run.interrupts:
        if intr.tool_name == "refund" and intr.tool_input["amount"] > 100:
            run = run.replace_input(intr.id, {**intr.tool_input, "amount": 100})
    return run


def agents(variant: str) -> dict[str, Agent]:
    """The agents of one variant of the code, by name."""
    new = variant == "b"
    made = [
        Agent(name="versioned.removed", model=_script(), tools=() if new else (refund,)),
        Agent(name="versioned.widened", model=_script(),
              tools=(refund_any,) if new else (refund,)),
        Agent(name="versioned.narrowed", model=_script(),
              tools=(refund_small,) if new else (refund,)),
        Agent(name="versioned.migrated", model=_script(),
              tools=(refund_small,) if new else (refund,),
              migrate=at_most_100 if new else None),
        Agent(name="versioned.pinned", model=_script(), tools=(refund,), on_change="pin",
              system="Refund carefully." if new else "Refund.")]
    return {a.name: a for a in made}


# Module-level, where LAYBY_AGENT_MODULES finds them.
_these = agents(VARIANT)
removed, widened = _these["versioned.removed"], _these["versioned.widened"]
narrowed, migrated = _these["versioned.narrowed"], _these["versioned.migrated"]
pinned = _these["versioned.pinned"]
