"""Agent versions at the generation level: the fingerprint, the check a run parked on one
version passes before it resumes on another, the migrate hook's view of the run. No Redis;
the end-to-end tests with real workers are in tests/upgrades/test_agent_versions.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any

import pytest
from pydantic import Field

from layby.generation import (
    AGENT_CHANGED,
    Agent,
    Call,
    ConfigError,
    Park,
    Reply,
    ResumeEntry,
    ScriptedModel,
    Step,
    StoredRun,
    fingerprint,
    hosted,
    hosted_versions,
    interrupt_tool,
    model_turn,
    parked_version,
    resume_turn,
    text_message,
    to_resume,
    tool,
    what_changed,
)
from layby.generation.tools import APPROVAL_MARK

RUN = "run-v"


@tool(requires_approval=True)
def refund(order: str, amount: int) -> dict:
    """Refund an order."""
    return {"refunded": amount, "order": order}


@tool(requires_approval=True, name="refund")
def refund_widened(order: str, amount: float, note: str = "") -> dict:
    """Refund an order, in part if need be."""
    return {"refunded": amount, "order": order}


@tool(requires_approval=True, name="refund")
def refund_narrowed(order: str, amount: Annotated[int, Field(le=100)]) -> dict:
    """Refund an order, up to 100."""
    return {"refunded": amount, "order": order}


@tool(name="refund")
def refund_unguarded(order: str, amount: int) -> dict:
    """Refund an order without asking anyone."""
    return {"refunded": amount, "order": order}


@interrupt_tool(output=int)
def pick(question: str) -> None:
    """Ask for a number."""


@interrupt_tool(output=Annotated[int, Field(le=10)], name="pick")
def pick_small(question: str) -> None:
    """Ask for a small number."""


SCRIPT = ScriptedModel(steps=[Reply(calls=[Call(name="refund",
                                                input={"order": "42", "amount": 250})]),
                              Reply(text="done: {refund}")])


def agent(*tools: Any, **options: Any) -> Agent:
    return Agent(name="shop", model=SCRIPT, tools=tools or (refund,), **options)


def parked(on: Agent) -> tuple[Park, StoredRun]:
    """A run of `on` parked on its refund's approval, as the store would hand it back."""
    outcome = model_turn(on, Step(RUN, 1, [text_message("user", "refund order 42")]))
    assert isinstance(outcome, Park), outcome
    run = StoredRun(id=RUN, agent=on.name, agent_version=on.version,
                    parked_version=parked_version(outcome.interrupts),
                    messages=outcome.messages, interrupts=outcome.interrupts)
    return outcome, run


def approved(run: StoredRun, approved: bool = True, **metadata: Any) -> StoredRun:
    [intr] = run.interrupts
    return run.model_copy(update={"answers": {intr.id: ResumeEntry(
        interrupt_id=intr.id, status="resolved", payload={"approved": approved},
        metadata=metadata or None)}})


# --- the fingerprint --------------------------------------------------------------------


def test_the_fingerprint_is_twelve_hex_digits_the_same_in_every_process():
    # Pinned: the same declaration gives the same version in every process and release
    # (a worker started tomorrow must host the runs pinned today).
    assert agent().version == "e47e837d25d5" == fingerprint(agent())
    assert isinstance(agent().version, str) and len(agent().version) == 12


@pytest.mark.parametrize("change", [
    {"tools": (refund_widened,)}, {"tools": (refund, pick)}, {"tools": ()},
    {"system": "Be brief."}, {"model": SCRIPT.model_copy(update={"name": "other"})},
    {"name": "shop2"}])
def test_the_fingerprint_changes_with_a_tool_schema_the_system_prompt_or_the_model(change):
    assert replace(agent(), **change).version != agent().version


def test_what_a_parked_run_does_not_depend_on_leaves_the_fingerprint_alone():
    same = replace(agent(), max_turns=3, description="refunds", config={"temperature": 0},
                   model=ScriptedModel(steps=[Reply(text="other script")]))
    assert same.version == agent().version


def test_an_explicit_version_wins_and_survives_a_replace():
    given = agent(version="2024-06.1")
    assert given.version == "2024-06.1"
    assert replace(given, system="changed").version == "2024-06.1"
    # A worked-out one is worked out again for the changed agent.
    assert replace(agent(), system="changed").version == fingerprint(
        replace(agent(), system="changed"))


@pytest.mark.parametrize("bad", ["", "has space", "a@b", 'q"uote', "x" * 65, "a,b"])
def test_a_version_that_could_not_name_a_queue_is_refused(bad):
    with pytest.raises(ConfigError, match="version"):
        agent(version=bad)


def test_on_change_is_continue_or_pin():
    assert agent().on_change == "continue"
    assert agent(on_change="pin").on_change == "pin"
    with pytest.raises(ConfigError, match="on_change"):
        agent(on_change="migrate")


def test_a_worker_hosts_its_agents_versions_or_those_it_is_told():
    a, b = agent(version="1"), replace(agent(), name="other", version="7")
    assert hosted([a, b]) == ("other@7", "shop@1")
    assert hosted([a, b], ["1", "2"]) == ("other@1", "other@2", "shop@1", "shop@2")
    assert hosted_versions(hosted([a, b])) == ["1", "7"]
    with pytest.raises(ConfigError, match="LAYBY_AGENT_VERSIONS"):
        hosted([a], ["no way"])


# --- the check ---------------------------------------------------------------------------


def test_interrupts_record_the_version_they_were_asked_on():
    outcome, run = parked(agent())
    assert [i.agent_version for i in outcome.interrupts] == [agent().version]
    assert run.parked_version == agent().version


def test_a_run_whose_tool_is_gone_cannot_go_on_and_the_error_names_it():
    _, run = parked(agent())
    gone = agent(pick)
    changed = what_changed(gone, approved(run))
    assert changed is not None and changed.tool == "refund" and changed.change == "removed"
    assert changed.message == (f"tool 'refund' is gone in version {gone.version} of agent "
                               f"'shop' (the run was parked on {agent().version})")
    error = changed.error(gone, run.parked_version)
    assert error["code"] == AGENT_CHANGED
    assert error["detail"] == {"tool": "refund", "change": "removed",
                               "agentVersion": gone.version,
                               "parkedVersion": agent().version}


def test_a_widened_schema_takes_the_recorded_input():
    _, run = parked(agent())
    assert what_changed(agent(refund_widened), approved(run)) is None


def test_a_narrowed_schema_that_refuses_the_recorded_input_is_a_change_naming_the_field():
    _, run = parked(agent())
    changed = what_changed(agent(refund_narrowed), approved(run))
    assert changed is not None and changed.change == "input"
    assert "no longer takes the input it was called with" in changed.message
    assert "/amount: Input should be less than or equal to 100" in changed.message
    assert changed.errors[0]["path"] == "/amount"


def test_a_replaced_input_is_what_is_checked():
    _, run = parked(agent())
    assert what_changed(agent(refund_narrowed),
                        approved(run, replaceInput={"order": "42", "amount": 90})) is None
    changed = what_changed(agent(refund_narrowed),
                           approved(run, replaceInput={"order": "42", "amount": 120}))
    assert changed is not None and "the input the reviewer gave it" in changed.message


def test_an_answer_that_no_longer_fits_the_tools_output_is_a_change():
    asking = Agent(name="quiz", tools=(pick,), model=ScriptedModel(steps=[
        Reply(calls=[Call(name="pick", input={"question": "how many?"})])]))
    outcome = model_turn(asking, Step(RUN, 1, [text_message("user", "go")]))
    assert isinstance(outcome, Park)
    [intr] = outcome.interrupts
    run = StoredRun(id=RUN, agent="quiz", parked_version=asking.version,
                    messages=outcome.messages, interrupts=outcome.interrupts,
                    answers={intr.id: ResumeEntry(interrupt_id=intr.id, status="resolved",
                                                  payload=42)})
    changed = what_changed(replace(asking, tools=(pick_small,)), run)
    assert changed is not None and changed.change == "answer"
    # A decline gives no output to check.
    declined = run.model_copy(update={"answers": {intr.id: ResumeEntry(
        interrupt_id=intr.id, status="cancelled", metadata={"replaceInput": "junk"})}})
    assert what_changed(replace(asking, tools=(pick_small,)), declined) is None


def test_a_run_parked_before_versions_were_recorded_is_checked_and_says_so():
    _, run = parked(agent())
    old = run.model_copy(update={"parked_version": None, "interrupts": [
        i.model_copy(update={"agent_version": None}) for i in run.interrupts]})
    assert parked_version(old.interrupts) is None
    assert what_changed(agent(), approved(old)) is None
    changed = what_changed(agent(pick), approved(old))
    assert changed is not None and "parked before layby recorded versions" in changed.message


def test_a_decline_of_an_approval_stands_when_the_tool_no_longer_asks_for_one():
    outcome, run = parked(agent())
    answered = approved(run, approved=False)
    [intr] = answered.interrupts
    resumed = resume_turn(agent(refund_unguarded), Step(RUN, 2, outcome.messages),
                          to_resume(answered.interrupts, answered.answers))
    [response] = resumed.messages[-1].content
    assert response.tool_response is not None
    assert response.tool_response.output == {"status": "declined", "reason": "not approved"}
    assert (intr.metadata or {}).get(APPROVAL_MARK)  # the question was `requires_approval`'s


# --- what a migrate hook is given ----------------------------------------------------------


def test_rename_tool_renames_it_in_the_history_and_the_interrupts():
    _, run = parked(agent())
    renamed = run.rename_tool("refund", "refund_order")
    assert [i.tool_name for i in renamed.interrupts] == ["refund_order"]
    [request] = renamed.messages[-1].tool_requests
    assert request.tool_request is not None and request.tool_request.name == "refund_order"
    assert run.interrupts[0].tool_name == "refund"  # a copy: the original is left alone


def test_replace_input_changes_what_the_tool_is_given_and_then_fits():
    _, run = parked(agent())
    [intr] = run.interrupts
    fixed = approved(run).replace_input(intr.id, {"order": "42", "amount": 100})
    assert what_changed(agent(refund_narrowed), fixed) is None
    resumed = resume_turn(agent(refund_narrowed), Step(RUN, 2, fixed.messages),
                          to_resume(fixed.interrupts, fixed.answers))
    [response] = resumed.messages[-1].content
    assert response.tool_response is not None
    assert response.tool_response.output == {"refunded": 100, "order": "42"}
    with pytest.raises(KeyError):
        run.replace_input("int_nope", {})
