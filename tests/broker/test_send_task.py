"""Another service starts runs by task name, with its own bare Celery app: no layby code,
no settings, only the broker URL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import celery
import pytest

from tests.support import sse
from tests.support.harness import LaybySystem, wait_until


@pytest.fixture
def foreign(system: LaybySystem) -> Iterator[celery.Celery]:
    app = celery.Celery("billing-service", broker=system.redis_url)
    yield app
    app.close()


def _get(system: LaybySystem, run_id: str) -> dict | None:
    with system.api() as api:
        reply = api.get(f"/v1/runs/{run_id}")
    if reply.status_code == 404:
        return None
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_send_task_by_name_starts_a_run(system: LaybySystem, foreign: celery.Celery) -> None:
    run_id = f"run_from_celery_{uuid.uuid4().hex[:8]}"
    sent = foreign.send_task("layby.start_run", args=["demo.trivia", "hi"],
                             kwargs={"run_id": run_id, "metadata": {"from": "billing"}})
    wait_until(lambda: _get(system, run_id), 20, what=f"run {run_id} to appear")
    parked = system.wait_status(run_id, "interrupted")
    assert parked["agent"] == "demo.trivia"
    assert parked["metadata"] == {"from": "billing"}
    assert parked["messages"][0]["content"][0]["text"] == "hi"
    (question,) = system.open_interrupts(parked)
    assert system.answer(run_id, question["id"], payload="Jaws").status_code == 200
    assert system.wait_status(run_id, "completed")["result"].startswith("Right!")
    assert sent.id  # Celery's id for the message: also the run's idempotency key


def test_the_same_message_twice_makes_one_run(system: LaybySystem,
                                              foreign: celery.Celery) -> None:
    # Without a run id: only the task id (the message's identity) can tell them apart.
    tag = uuid.uuid4().hex
    task_id = f"billing-{tag}"
    for _ in range(2):  # as a redelivery, or a sender retrying after a timeout, would
        foreign.send_task("layby.start_run", args=["demo.trivia", "hi"],
                          kwargs={"metadata": {"tag": tag}}, queue="layby.turns",
                          task_id=task_id)
    wait_until(lambda: _handled(system, task_id) >= 2, 20, what="both messages handled")

    with system.api() as api:
        listed = api.get("/v1/runs", params={"limit": 100}).json()["runs"]
        mine = [r["id"] for r in listed if r["agent"] == "demo.trivia"
                and (api.get(f"/v1/runs/{r['id']}").json().get("metadata") or {}).get("tag")
                == tag]
    assert len(mine) == 1, mine
    system.wait_status(mine[0], "interrupted")

    # The same with a run id: the second message finds the run the first one made.
    run_id = f"run_from_celery_{tag[:8]}"
    again = f"billing-again-{tag}"
    for _ in range(2):
        foreign.send_task("layby.start_run", args=["demo.trivia", "hi"],
                          kwargs={"run_id": run_id}, queue="layby.turns", task_id=again)
    wait_until(lambda: _handled(system, again) >= 2, 20, what="both messages handled")
    parked = system.wait_status(run_id, "interrupted")
    assert len(parked["interrupts"]) == 1
    events = [e["event"] for e in sse.history(system, run_id)]
    assert events.count("run.created") == 1 and events.count("run.interrupted") == 1, events


def _handled(system: LaybySystem, task_id: str) -> int:
    """How many deliveries of the task the worker finished, by its log."""
    return system.procs["worker"].output().count(f"layby.start_run[{task_id}] succeeded")
