"""Tools that try again, tried as a new user would: their own agent module, in a project
folder of their own, next to nothing of layby's but the package, started with `layby up
--concurrency 1` and driven with `layby.Client`; a real bank on loopback that drops
connections (tests/support/bank.py). And what no user should notice: a worker SIGKILLed while a run
waits to retry, a cancel during the wait (a system of the test harness, its worker
killed by the test)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import layby
from layby.ops.embedded import EmbeddedRedis, free_port
from layby.wire import RunView, Status
from tests.support.bank import Ledger, flaky_bank
from tests.support.harness import LAYBY, ROOT, LaybySystem, wait_until, wait_up

pytestmark = pytest.mark.integration

# The user's module: a payment that needs approval and calls the bank (each attempt with the
# same idempotency key), a check on a service that is always down, and a job that asks to be
# tried again in 8 seconds (a 429's Retry-After).
PAYMENTS = '''
import os

import httpx

from layby import (Agent, Call, Case, Choose, Reply, RetryLater, RetryPolicy, ScriptedModel,
                   ToolContext, tool)

BANK = os.environ["BANK_URL"]


@tool(requires_approval=True,
      retry=RetryPolicy(max_attempts=5, initial_interval_s=2, backoff=2, jitter=0))
def charge(ctx: ToolContext, amount: int) -> dict:
    """Charge the customer's card."""
    reply = httpx.post(f"{BANK}/charge", json={"amount": amount},
                       headers={"Idempotency-Key": ctx.idempotency_key}, timeout=5)
    reply.raise_for_status()
    return {**reply.json(), "attempt": ctx.attempt}


@tool(retry=RetryPolicy(max_attempts=3, initial_interval_s=0.5, jitter=0))
def check_fraud(amount: int) -> dict:
    """Ask the fraud service (it is down)."""
    return httpx.post(os.environ["DOWN_URL"], json={"amount": amount}, timeout=2).json()


@tool
def export(ctx: ToolContext) -> str:
    """Export the day's payments; the exporter asks for 8 seconds first."""
    if ctx.attempt == 1:
        raise RetryLater(after_s=8, reason="exporter busy (429)")
    return f"exported on attempt {ctx.attempt}"


pay = Agent(name="payments.pay", tools=(charge,), model=ScriptedModel(steps=[
    Reply(calls=[Call(name="charge", input={"amount": 120})]),
    Choose(cases=[Case(tool="charge", declined=True, reply=Reply(text="Not charged."))],
           otherwise=Reply(text="Charged {charge[charged]} on attempt {charge[attempt]}.")),
]))

fraud = Agent(name="payments.fraud", tools=(check_fraud,), model=ScriptedModel(steps=[
    Reply(calls=[Call(name="check_fraud", input={"amount": 5})]),
    Reply(text="Fraud check unavailable: {check_fraud[error]}"),
]))

nightly = Agent(name="payments.nightly", tools=(export,), model=ScriptedModel(steps=[
    Reply(calls=[Call(name="export")]),
    Reply(text="{export}"),
]))
'''


@dataclass
class Stack:
    base: str
    key: str
    log: Path
    bank: Ledger
    env: dict[str, str]
    project: Path

    def client(self) -> layby.Client:
        return layby.Client(self.base, api_key=self.key, timeout=30)

    def metrics(self) -> str:
        reply = httpx.get(f"{self.base}/metrics", timeout=10,
                          headers={"Authorization": f"Bearer {self.key}"})
        assert reply.status_code == 200, reply.text
        return reply.text

    def layby(self, *args: str) -> str:
        done = subprocess.run([LAYBY, *args], cwd=self.project, env=self.env, text=True,
                              capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout


def _project(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "payments.py").write_text(textwrap.dedent(PAYMENTS))
    return folder


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`layby up --concurrency 1` in the user's project folder, on their module and the
    demo agents."""
    project = _project(tmp_path_factory.mktemp("shop"))
    port = free_port()
    with flaky_bank() as (bank_url, bank):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("LAYBY_") and k != "PYTHONPATH"}
        env.update({"BANK_URL": bank_url, "DOWN_URL": f"http://127.0.0.1:{free_port()}/",
                    "LAYBY_AGENT_MODULES": "payments,layby.demo.agents",
                    "LAYBY_DATA_DIR": str(project / ".layby"),
                    "LAYBY_MAIL_CATCHER_PORT": str(free_port()),
                    "LAYBY_REPLY_LISTENER_PORT": str(free_port()),
                    "LAYBY_FLOWER_PORT": str(free_port())})
        log = project / "up.log"
        with open(log, "ab") as out:
            up = subprocess.Popen([LAYBY, "up", "--port", str(port), "--concurrency", "1"],
                                  cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_up(up, base, log)
            key = (project / ".layby" / "api_key").read_text().strip()
            yield Stack(base, key, log, bank, env, project)
        finally:
            up.send_signal(signal.SIGINT)
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)


def _events(client: layby.Client, run_id: str, kind: str) -> list[layby.Event]:
    return [e for e in client.events(run_id) if e.type == kind]


def test_an_approved_charge_survives_dropped_connections_and_is_made_once(
        stack: Stack) -> None:
    stack.bank.reset()
    stack.bank.down()  # until the run was seen waiting; its waits: 2 s, 4 s, 8 s, 16 s
    with stack.client() as client:
        run = client.wait(client.start("payments.pay", input="charge 120").id,
                          until={"interrupted"})
        [asked] = run.open_interrupts
        client.answer(run.id, asked.id, payload={"approved": True})

        # The first attempt meets a dropped connection: the run waits, saying for what.
        waiting = client.wait(run.id, until={"retrying"}, timeout=30)
        assert waiting.status is Status.RETRYING and waiting.retry is not None
        [call] = waiting.retry.calls
        assert (call.tool_name, call.attempt, call.max_attempts) == ("charge", 2, 5)
        assert call.last_error.startswith(("RemoteProtocolError", "ReadError", "ConnectError"))
        assert waiting.retry.next_attempt_at is not None
        listed = wait_until(lambda: (found := stack.layby("runs", "ls", "--status",
                                                          "retrying")) and run.id in found
                            and found, 20, what="the run listed as retrying")
        assert re.search(r"charge attempt [2-5] of 5 at ", listed), listed
        stack.bank.up()

        done = client.wait(run.id, timeout=60)
        assert done.status is Status.COMPLETED, done.error
        dropped = stack.bank.dropped
        assert 1 <= dropped <= 4
        assert done.result == f"Charged 120 on attempt {dropped + 1}."
        assert done.retry is None
        # Charged once, asked once: the reviewer's one approval carried every attempt.
        assert list(stack.bank.charges.values()) == [120]
        assert len(done.interrupts) == 1
        assert len(_events(client, run.id, "run.interrupted")) == 1
        assert len(_events(client, run.id, "run.retrying")) == dropped
    assert f'layby_tool_retries_total{{tool="charge"}} {float(dropped)}' in stack.metrics()


def test_a_tool_that_always_fails_stops_after_its_attempts_and_says_how_often(
        stack: Stack) -> None:
    with stack.client() as client:
        run = client.start("payments.fraud", input="check")
        done = client.wait(run.id, timeout=60)
    assert done.status is Status.COMPLETED
    assert done.result is not None and done.result.startswith(
        "Fraud check unavailable: ConnectError")
    assert "(tried 3 times over " in done.result
    assert 'layby_tool_retries_exhausted_total{tool="check_fraud"} 1.0' in stack.metrics()


def test_runs_started_during_another_runs_backoff_park_at_once(stack: Stack) -> None:
    with stack.client() as client:
        nightly = client.start("payments.nightly", input="export")
        waiting = client.wait(nightly.id, until={"retrying"}, timeout=30)
        assert waiting.retry is not None
        due = waiting.retry.next_attempt_at
        # The one worker process is free: no thread sleeps through the 8 seconds.
        started = time.monotonic()
        trivia = [client.start("demo.trivia", input="quiz me").id for _ in range(3)]
        parked = [client.wait(run_id, until={"interrupted"}, timeout=30) for run_id in trivia]
        took = time.monotonic() - started
        assert all(p.status is Status.INTERRUPTED for p in parked)
        still: RunView = client.get(nightly.id)
        assert still.status is Status.RETRYING and still.retry is not None, (took, due)
        done = client.wait(nightly.id, timeout=60)
    assert done.result == "exported on attempt 2"


# -- a system of the harness, its processes the test's to kill ------------------------


@pytest.fixture(scope="module")
def harnessed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LaybySystem, Ledger]]:
    base = tmp_path_factory.mktemp("retries")
    project = _project(base / "shop")
    server = EmbeddedRedis(base / "valkey").start()
    with flaky_bank() as (bank_url, bank):
        system = LaybySystem(server.url, base / "system", env_overrides={
            "PYTHONPATH": f"{ROOT}{os.pathsep}{project}", "BANK_URL": bank_url,
            "DOWN_URL": f"http://127.0.0.1:{free_port()}/",
            "LAYBY_AGENT_MODULES": "payments,layby.demo.agents"})
        try:
            yield system.start(), bank
        finally:
            system.stop()
            server.stop()


def _approved_then_waiting(system: LaybySystem, bank: Ledger) -> str:
    """A charge approved, its first try dropped; the bank stays down (`Ledger.up`)."""
    bank.reset()
    bank.down()
    run_id = system.start_run("payments.pay", "charge 120")["id"]
    [asked] = system.open_interrupts(system.wait_status(run_id, "interrupted"))
    assert system.answer(run_id, asked["id"], payload={"approved": True}).status_code == 200
    system.wait_status(run_id, "retrying")
    return run_id


def test_a_worker_killed_during_the_wait_changes_nothing(
        harnessed: tuple[LaybySystem, Ledger]) -> None:
    system, bank = harnessed
    run_id = _approved_then_waiting(system, bank)
    system.procs["worker"].kill()
    # The try is the store's: due while no worker lives, it waits for the next one.
    time.sleep(1.5)
    assert system.run(run_id)["status"] in ("retrying", "queued")
    bank.up()
    system.start_worker("worker2")
    done = system.wait_status(run_id, "completed", timeout=60)
    assert done["result"] == f"Charged 120 on attempt {bank.dropped + 1}."
    assert list(bank.charges.values()) == [120] and bank.requests == 1


def test_a_run_cancelled_while_it_waits_to_retry_is_never_tried_again(
        harnessed: tuple[LaybySystem, Ledger]) -> None:
    system, bank = harnessed
    run_id = _approved_then_waiting(system, bank)
    with system.api() as api:
        reply = api.post(f"/v1/runs/{run_id}/cancel", json={"reason": "wrong card"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["status"] == "cancelled" and "retry" not in reply.json()
    time.sleep(1)  # (a try under way as the cancel came has met the bank by then)
    tried = bank.dropped
    time.sleep(5)  # well past when its next try was due (2 s, 4 s, …)
    run = system.run(run_id)
    assert run["status"] == "cancelled" and run["error"]["message"] == "wrong card"
    assert bank.dropped == tried and bank.requests == 0 and bank.charges == {}
    bank.up()

