"""`layby.testing.serve`, the kit users test their own agents with: Valkey, a worker, the
sweeper and the gateway in one test process, started once and reused."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from layby import Status
from layby.testing import LaybyServer, serve


@pytest.fixture(scope="module")
def kit() -> Iterator[LaybyServer]:
    with serve(["layby.demo.agents"], ["layby.demo.jobs"]) as server:
        yield server


def test_an_approval_is_asked_answered_and_the_run_finishes(kit: LaybyServer) -> None:
    client = kit.client
    run = client.wait(client.start("demo.transfer", input="Send 30 to Ann").id,
                      until={"interrupted"}, timeout=30)
    client.answer(run.id, run.open_interrupts[0].id, payload={"approved": True})
    assert client.wait(run.id, timeout=30).result == "Sent 30 to Ann."


def test_a_background_job_answers_its_interrupt_in_the_kits_worker(
        kit: LaybyServer, caplog: pytest.LogCaptureFixture) -> None:
    client = kit.client
    caplog.set_level(logging.INFO)
    run = client.start("demo.report", input="quarterly numbers")
    done = client.wait(run.id, timeout=60)
    assert done.status is Status.COMPLETED, done.error
    assert done.result.startswith("Report on quarterly numbers: 3 findings")
    [job] = done.interrupts
    assert job.answer is not None and job.answer.answered_by == "job:demo.compile_report"
    # The job's end was recorded by the worker's signal handler, which said so, once.
    recorded = [r.getMessage() for r in caplog.records if r.name == "layby.tasks.jobs"]
    assert recorded == [f"job demo.compile_report for run {run.id} answered interrupt "
                        f"{job.id}: ok"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_the_kits_sweeper_applies_an_expiry(kit: LaybyServer) -> None:
    client = kit.client
    run = client.start("demo.expiring", input="ship it")
    started = time.monotonic()
    done = client.wait(run.id, timeout=60)  # the demo's approval expires after 5 s
    assert done.status is Status.COMPLETED
    assert "not approved in time" in (done.result or "")
    assert time.monotonic() - started >= 4
    assert done.interrupts[0].answer.channel == "expiry"
