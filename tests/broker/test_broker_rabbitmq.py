"""RabbitMQ as the broker (LAYBY_BROKER_URL=amqp://…), from Debian's package: layby's queues
are quorum queues, publishes wait for the broker's confirm, and the core scenarios run as
they run on one Valkey server (the same tests, given this module's `system`). The store is
a Valkey server of its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from amqp.exceptions import PreconditionFailed
from kombu import Connection

from layby.ops.embedded import EmbeddedRedis

# The same scenarios as on one server (collected here, they get this module's `system`).
from tests.support.core_scenarios import *  # noqa: F403
from tests.support.core_scenarios import beside
from tests.support.harness import LaybySystem
from tests.support.rabbit import Rabbit, running

pytestmark = pytest.mark.integration


@dataclass
class WithRabbit:
    rabbit: Rabbit
    store: EmbeddedRedis
    system: LaybySystem


@pytest.fixture(scope="module")
def with_rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WithRabbit]:
    root = tmp_path_factory.mktemp("rabbit")
    with running(root / "rabbit") as rabbit, beside(root, rabbit.url) as (store, system):
        yield WithRabbit(rabbit, store, system)


@pytest.fixture(scope="module")
def system(with_rabbit: WithRabbit) -> LaybySystem:
    return with_rabbit.system


def test_layby_queues_are_quorum_queues(with_rabbit: WithRabbit) -> None:
    run_id = with_rabbit.system.start_run("demo.trivia", "quiz me")["id"]
    with_rabbit.system.wait_status(run_id, "interrupted")
    with Connection(with_rabbit.rabbit.url) as conn:
        for queue in ("layby.turns", "layby.notify", "layby.jobs", "celery"):
            # RabbitMQ refuses a declare whose kind differs from the queue's (406).
            conn.channel().queue_declare(queue, durable=True, auto_delete=False,
                                         arguments={"x-queue-type": "quorum"})
            with pytest.raises(PreconditionFailed, match="x-queue-type"):
                conn.channel().queue_declare(queue, durable=True, auto_delete=False,
                                             arguments={"x-queue-type": "classic"})


def test_doctor_names_rabbitmq(with_rabbit: WithRabbit) -> None:
    done = with_rabbit.system.layby("doctor")
    lines = [x for x in done.stdout.splitlines() if " broker:" in x or "visibility" in x]
    assert lines == [f"OK      broker: RabbitMQ 127.0.0.1:{with_rabbit.rabbit.port} answers"]


@pytest.mark.slow
def test_runs_answered_as_rabbitmq_is_killed_finish_once(with_rabbit: WithRabbit) -> None:
    # Answers commit while RabbitMQ is away (their resumes wait in the outbox) or just
    # before it dies (in a quorum queue, confirmed: kept): every run finishes once.
    system, rabbit = with_rabbit.system, with_rabbit.rabbit
    runs = [system.start_run("demo.transfer", f"Send {10 + i} to Ann")["id"] for i in range(8)]
    parked = {r: system.wait_status(r, "interrupted") for r in runs}
    for i, run_id in enumerate(runs):
        if i == 4:
            rabbit.kill()
        (waiting,) = system.open_interrupts(parked[run_id])
        reply = system.answer(run_id, waiting["id"], payload={"approved": True})
        assert reply.status_code == 200, reply.text
    time.sleep(2)
    rabbit.start()
    for i, run_id in enumerate(runs):
        assert system.wait_status(run_id, "completed", timeout=60)["result"] == (
            f"Sent {10 + i} to Ann.")
    transfers = [t["run"] for t in system.ledger()["transfers"] if t["run"] in runs]
    assert sorted(transfers) == sorted(runs)
