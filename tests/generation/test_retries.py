"""Tools that try again (`RetryPolicy`, `RetryLater`), played in process as a worker plays a
step: a step whose call fails in a way its policy tries again comes to `Retry`, and is taken
again at the same version with what it saved (as the store keeps it through the wait). What
a user checks: the failing call alone runs again, as attempt 2 with the same idempotency
key; an approval holds; the model hears of the error only once the attempts ran out, told
how often and over how long; `on_exhausted="fail"` fails the run."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from layby import (
    Agent,
    Approval,
    Call,
    Reply,
    RetryLater,
    RetryPolicy,
    ScriptedModel,
    ToolContext,
    tool,
)
from layby.errors import ConfigError
from layby.generation import (
    Continue,
    Fail,
    Interrupt,
    Outcome,
    Park,
    ResumeEntry,
    Retry,
    Step,
    model_turn,
    resume_turn,
    text_message,
    to_resume,
)
from layby.generation.retries import checkpoint_key

RUN = "run-retries"
QUICK = RetryPolicy(max_attempts=3, initial_interval_s=2, backoff=3, max_interval_s=10,
                    jitter=0)


class Kept:
    """Checkpoints as the store keeps them for one version, through a wait to retry."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def get(self, key: str) -> Any | None:
        return self.data.get(key)

    def put(self, key: str, value: Any, *, durable: bool = True) -> None:
        self.data[key] = value


class Clock:
    def __init__(self) -> None:
        self.at = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.at


def take(agent: Agent, kept: Kept, clock: Clock,
         step: Callable[[Agent, Step], Outcome] = model_turn, **given: Any) -> Outcome:
    """One step of `RUN` at version 1, as a worker takes it; a `Retry` leaves its calls'
    attempts in `kept` (schedule_retry.lua), and the clock moves on by the wait."""
    history = given.pop("history", [text_message("user", "go")])
    outcome = step(agent, Step(RUN, 1, history, checkpoints=kept, now=clock, **given))
    if isinstance(outcome, Retry):
        for call in outcome.calls:
            kept.data[checkpoint_key(call.ref)] = call.tried.dump()
        clock.at += timedelta(seconds=outcome.wait_s)
    return outcome


def flaky(fails: int, error: type[Exception] = ConnectionResetError,
          policy: Any = "agent") -> tuple[Any, list[tuple[int, str]]]:
    """A tool `pay` that raises `error` its first `fails` calls; the calls it got, as
    (attempt, idempotency key)."""
    seen: list[tuple[int, str]] = []

    @tool(retry=policy)
    def pay(ctx: ToolContext, amount: int) -> dict[str, Any]:
        """Pay."""
        seen.append((ctx.attempt, ctx.idempotency_key))
        if len(seen) <= fails:
            raise error("connection reset by peer")
        return {"paid": amount}

    return pay, seen


def counted() -> tuple[Any, list[int]]:
    runs: list[int] = []

    @tool
    def look(ctx: ToolContext) -> int:
        """Look something up."""
        runs.append(ctx.attempt)
        return 42

    return look, runs


def agent_of(*tools: Any, retry: RetryPolicy | None = QUICK) -> Agent:
    calls = [Call(name=t.name, input={"amount": 5} if t.name == "pay" else {}) for t in tools]
    return Agent("shop", ScriptedModel(steps=[Reply(calls=calls), Reply(text="done")]),
                 tools=tools, tool_retry=retry)


def output(outcome: Outcome, name: str) -> Any:
    assert isinstance(outcome, Continue), outcome
    return next(p.tool_response.output for p in outcome.messages[-1].content
                if p.tool_response is not None and p.tool_response.name == name)


# -- the policy --------------------------------------------------------------------------


def test_waits_grow_by_the_backoff_up_to_the_longest_and_jitter_only_shortens_them() -> None:
    policy = RetryPolicy(initial_interval_s=1, backoff=2, max_interval_s=5, jitter=0.5)
    assert [policy.wait_s(n, draw=0) for n in (1, 2, 3, 4)] == [1, 2, 4, 5]
    assert policy.wait_s(3, draw=0.999) == pytest.approx(2.002)
    assert all(2 <= policy.wait_s(3) <= 4 for _ in range(200))


def test_the_default_tries_passing_errors_by_type_or_by_their_dotted_names() -> None:
    import httpx
    import redis

    policy = RetryPolicy()
    for passing in (ConnectionResetError(), TimeoutError(), redis.ConnectionError(),
                    redis.exceptions.ClusterDownError("CLUSTERDOWN"),
                    redis.exceptions.RedisClusterException("no node"),
                    httpx.ConnectError("refused"), httpx.ReadTimeout("slow")):
        assert policy.retries(passing), passing
    for lasting in (ValueError(), KeyError("x"), redis.AuthenticationError("wrong"),
                    httpx.UnsupportedProtocol("ftp")):
        assert not policy.retries(lasting), lasting
    mine = RetryPolicy(retry_on=(LookupError, "json.decoder.JSONDecodeError"),
                       non_retryable=("builtins.KeyError",))
    assert mine.retries(IndexError()) and mine.retries(json.JSONDecodeError("x", "", 0))
    assert not mine.retries(KeyError("x"))


def test_a_policy_that_cannot_work_is_refused_saying_what_is_wrong() -> None:
    with pytest.raises(ConfigError) as refused:
        RetryPolicy(max_attempts=0, backoff=0.5, jitter=2, retry_on=(42,))  # type: ignore[arg-type]
    text = str(refused.value)
    for said in ("max_attempts must be 1 or more", "backoff must be 1 or more",
                 "jitter must be between 0 and 1", "retry_on holds 42"):
        assert said in text
    with pytest.raises(ConfigError, match="retry must be a RetryPolicy or None"):
        tool(retry=3)(lambda: None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="after_s must be a number of seconds"):
        RetryLater(float("nan"))


# -- a call tried again ------------------------------------------------------------------


def test_only_the_failing_call_runs_again_as_its_next_attempt_with_the_same_key() -> None:
    pay, seen = flaky(fails=2)
    look, looked = counted()
    agent, kept, clock = agent_of(pay, look), Kept(), Clock()

    first = take(agent, kept, clock)
    assert isinstance(first, Retry) and first.wait_s == 2
    [call] = first.calls
    assert (call.tool, call.next_attempt, call.max_attempts) == ("pay", 2, 3)
    assert call.tried.error == "ConnectionResetError: connection reset by peer"
    second = take(agent, kept, clock)
    assert isinstance(second, Retry) and second.wait_s == 6  # 2 x 3
    third = take(agent, kept, clock)

    assert output(third, "pay") == {"paid": 5} and output(third, "look") == 42
    assert third.exhausted == []
    assert [a for a, _ in seen] == [1, 2, 3]
    assert len({key for _, key in seen}) == 1  # the outside world can drop a repeat
    assert looked == [1]  # its sibling ran once; its output was kept through both waits


def test_a_call_out_of_attempts_tells_the_model_how_often_and_over_how_long() -> None:
    pay, seen = flaky(fails=99)
    agent, kept, clock = agent_of(pay), Kept(), Clock()
    outcomes = [take(agent, kept, clock) for _ in range(3)]
    assert [type(o) for o in outcomes] == [Retry, Retry, Continue]
    error = output(outcomes[-1], "pay")
    assert error == {"error": "ConnectionResetError: connection reset by peer (tried 3 times "
                              "over 8 s)", "attempts": 3, "overS": 8.0}
    assert outcomes[-1].exhausted == ["pay"] and len(seen) == 3


def test_a_policy_may_fail_the_run_when_the_attempts_run_out() -> None:
    pay, _ = flaky(fails=99, policy=RetryPolicy(max_attempts=2, jitter=0, on_exhausted="fail"))
    agent, kept, clock = agent_of(pay), Kept(), Clock()
    assert isinstance(take(agent, kept, clock), Retry)
    failed = take(agent, kept, clock)
    assert isinstance(failed, Fail) and failed.code == "tool_failed"
    assert failed.message.startswith("tool 'pay' failed: ConnectionResetError")
    assert failed.detail is not None and failed.detail["attempts"] == 2
    assert failed.detail["tool"] == "pay" and failed.exhausted == ["pay"]


@pytest.mark.parametrize("why", ["a lasting error", "retries off for the tool",
                                 "retries off for the agent", "a store an older layby shares"])
def test_a_failure_not_tried_again_reaches_the_model_at_once(why: str) -> None:
    error: type[Exception] = ValueError if why == "a lasting error" else ConnectionResetError
    pay, seen = flaky(fails=1, error=error,
                      policy=None if why == "retries off for the tool" else "agent")
    agent = agent_of(pay, retry=None if why == "retries off for the agent" else QUICK)
    done = take(agent, Kept(), Clock(), retries=why != "a store an older layby shares")
    assert output(done, "pay")["error"].startswith(f"{error.__name__}: connection reset")
    assert len(seen) == 1


def test_a_tools_own_policy_wins_over_its_agents() -> None:
    pay, _ = flaky(fails=1, policy=RetryPolicy(max_attempts=2, initial_interval_s=7,
                                                  jitter=0))
    outcome = take(agent_of(pay, retry=None), Kept(), Clock())
    assert isinstance(outcome, Retry) and outcome.wait_s == 7


def test_retry_later_waits_as_long_as_the_tool_says_even_with_retries_off() -> None:
    asked = itertools.count(1)

    @tool(retry=None)
    def fetch(ctx: ToolContext) -> str:
        """Fetch a report that is not ready yet."""
        if next(asked) < 3:
            raise RetryLater(after_s=30, reason="the report is being built (429)")
        return f"report (attempt {ctx.attempt})"

    agent = Agent("reports", ScriptedModel(steps=[Reply(calls=[Call(name="fetch")]),
                                                  Reply(text="done")]), tools=(fetch,))
    kept, clock = Kept(), Clock()
    waits = [take(agent, kept, clock) for _ in range(2)]
    assert [w.wait_s for w in waits if isinstance(w, Retry)] == [30, 30]
    assert output(take(agent, kept, clock), "fetch") == "report (attempt 3)"


# -- an approval holds across attempts -----------------------------------------------------


def test_an_approved_call_is_tried_again_with_its_approval_and_never_asked_again() -> None:
    sent: list[tuple[int, str]] = []

    @tool(requires_approval=True)
    def transfer(ctx: ToolContext, amount: int) -> dict[str, Any]:
        """Send money."""
        sent.append((ctx.attempt, ctx.idempotency_key))
        if len(sent) == 1:
            raise ConnectionResetError("reset")
        return {"sent": amount}

    agent = Agent("bank", ScriptedModel(steps=[
        Reply(calls=[Call(name="transfer", input={"amount": 250})]), Reply(text="done")]),
        tools=(transfer,), tool_retry=QUICK)
    parked = model_turn(agent, Step(RUN, 1, [text_message("user", "go")]))
    assert isinstance(parked, Park) and sent == []
    [intr] = parked.interrupts
    specs = [Interrupt.model_validate_json(intr.model_dump_json(by_alias=True))]
    answers = {intr.id: ResumeEntry(interrupt_id=intr.id, status="resolved",
                                    payload=Approval(approved=True).model_dump())}

    def resume(a: Agent, step: Step) -> Outcome:
        return resume_turn(a, step, to_resume(specs, answers))

    kept, clock = Kept(), Clock()
    waiting = take(agent, kept, clock, step=resume, history=parked.messages)
    assert isinstance(waiting, Retry)
    done = take(agent, kept, clock, step=resume, history=parked.messages)
    assert output(done, "transfer") == {"sent": 250}  # not parked again: no second question
    assert [a for a, _ in sent] == [1, 2] and sent[0][1] == sent[1][1]
