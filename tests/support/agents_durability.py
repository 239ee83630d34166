"""Agents, tools and a background job for tests/faults/test_durability.py.

Systems load them with `LAYBY_AGENT_MODULES=…,tests.support.agents_durability` (the agents)
and `LAYBY_TASK_MODULES=layby.demo.jobs,tests.support.agents_durability` (the job task, so
workers know it).
Delays and expiries come from environment variables the tests set, read when a tool runs.
"""

from __future__ import annotations

import os
import time
from functools import cache

from celery import shared_task
from redis import Redis

from layby.broker_config import Settings
from layby.control.connections import redis_client
from layby.demo import ledger
from layby.generation import (
    BACKGROUND_JOB,
    CONFIRMATION,
    Agent,
    Ask,
    Call,
    Case,
    Choose,
    JobRequest,
    OnExpire,
    Reply,
    ScriptedModel,
    ToolContext,
    ToolInterrupt,
    interrupt_tool,
    tool,
)
from layby.parking import Keys, formats

QUICK_JOB = "test.quick_job"


def _seconds(name: str, default: str) -> float:
    return float(os.environ.get(name, default))


@cache
def _store() -> tuple[Redis, Keys]:
    settings = Settings()
    client = redis_client(settings)
    return client, formats.keys_of(client, settings.key_prefix)


@shared_task(name=QUICK_JOB)
def quick_job(label: str) -> dict:
    """A background job that ends at once."""
    return {"label": label, "done": True}


@tool
def early_job(ctx: ToolContext, label: str) -> dict:
    """Starts a job the way `ctx.start_job` does, but interrupts for it only once the job's
    answer is recorded: the job ends before the park commits."""
    assert ctx.jobs is not None
    job_id = f"job-{ctx.interrupt_id}"
    ctx.jobs(JobRequest(QUICK_JOB, (label,), {}, ctx.run_id, ctx.interrupt_id, job_id))
    client, keys = _store()
    deadline = time.monotonic() + 20
    while not client.hexists(keys.answers(ctx.run_id), ctx.interrupt_id):
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} did not answer within 20 s")
        time.sleep(0.05)
    raise ToolInterrupt(Ask(f"waiting for background job {QUICK_JOB}", BACKGROUND_JOB, None,
                            {"jobId": job_id, "task": QUICK_JOB}))


@tool
def careful_transfer(ctx: ToolContext, to: str, amount: int) -> dict:
    """A transfer that, once approved, marks that it started (in the ledger's calls) and
    waits before moving the money, so a test can stop its worker in between."""
    if not ctx.restarted:
        ctx.interrupt(f"Send {amount} to {to}?", reason=CONFIRMATION,
                      response_schema={"type": "object"})
    if not (ctx.resumed or {}).get("approved"):
        return {"status": "not_approved"}
    ledger.record("calls", ctx.idempotency_key, {"run": ctx.run_id, "tool": "careful_transfer"})
    time.sleep(_seconds("LAYBY_TEST_BEFORE_TRANSFER_S", "0"))
    entry = ledger.record("transfers", ctx.idempotency_key,
                          {"run": ctx.run_id, "to": to, "amount": amount})
    return {"status": "sent", "to": to, "amount": amount, "id": entry["key"]}


@tool
def approve_or_fail(ctx: ToolContext, action: str) -> dict:
    """An approval that fails the run when nobody answers in time."""
    if not ctx.restarted:
        ctx.interrupt(f"Approve {action}?", response_schema={"type": "object"},
                      expires_in=_seconds("LAYBY_TEST_EXPIRY_S", "2"),
                      on_expire=OnExpire(action="fail"))
    return {"done": action}


@interrupt_tool(output=str)
def pick_size(item: str) -> Ask:
    """Asks for a size; at expiry the default ("medium") answers."""
    return Ask(message=f"Which size of {item}?",
               response_schema={"type": "string", "enum": ["small", "medium", "large"]},
               expires_in=_seconds("LAYBY_TEST_EXPIRY_S", "2"),
               on_expire=OnExpire(action="resolve", payload="medium"))


early = Agent(name="test.early_job", tools=(early_job,), model=ScriptedModel(steps=[
    Reply(calls=[Call(name="early_job", input={"label": "{input}"})]),
    Reply(text="Job {early_job[label]} done: {early_job[done]}."),
]))

careful = Agent(name="test.careful_transfer", tools=(careful_transfer,), model=ScriptedModel(
    steps=[
        Reply(calls=[Call(name="careful_transfer", input={"to": "Dan", "amount": 30})]),
        Choose(cases=[Case(tool="careful_transfer", field="status", equals="sent",
                           reply=Reply(text="Sent {careful_transfer[amount]} to "
                                            "{careful_transfer[to]}."))],
               otherwise=Reply(text="Nothing was sent.")),
    ]))

expiring_fail = Agent(name="test.expiry_fail", tools=(approve_or_fail,), model=ScriptedModel(
    steps=[
        Reply(calls=[Call(name="approve_or_fail", input={"action": "purge"})]),
        Reply(text="Done: {approve_or_fail[done]}."),
    ]))

expiring_default = Agent(name="test.expiry_default", tools=(pick_size,), model=ScriptedModel(
    steps=[
        Reply(calls=[Call(name="pick_size", input={"item": "pizza"})]),
        Reply(text="Ordering a {pick_size} pizza."),
    ]))


@tool
def slow_work(ctx: ToolContext, label: str) -> dict:
    """Work that takes longer than a lease (LAYBY_TEST_SLOW_S, 15 s): each start is a call
    in the ledger (under its own key, so a second start shows), then it sleeps."""
    ledger.record("calls", f"{ctx.idempotency_key}:{time.time()}",
                  {"run": ctx.run_id, "tool": "slow_work", "pid": os.getpid()})
    time.sleep(_seconds("LAYBY_TEST_SLOW_S", "15"))
    return {"label": label, "done": True}


slow = Agent(name="test.slow", tools=(slow_work,), model=ScriptedModel(steps=[
    Reply(calls=[Call(name="slow_work", input={"label": "{input}"})]),
    Reply(text="Slow work {slow_work[label]} done."),
]))
