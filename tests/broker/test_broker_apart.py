"""The broker beside the store (LAYBY_BROKER_URL): a Valkey server of its own for Celery's
queues, another for the runs. The store's transitions push no task message themselves;
each goes into the outbox and is published after the commit, and a copy published twice is
dropped by the claim. The core scenarios run here as they run on one server (the same
tests, given this module's `system`), and the broker's restart with its messages lost is
made good by the sweeper.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from layby.ops.embedded import EmbeddedRedis

# The same scenarios as on one server (collected here, they get this module's `system`).
from tests.support.core_scenarios import *  # noqa: F403
from tests.support.core_scenarios import beside
from tests.support.harness import LaybySystem, keys_of, wait_until

pytestmark = pytest.mark.integration


@dataclass
class Apart:
    broker: EmbeddedRedis  # a test may replace it (same port)
    store: EmbeddedRedis
    system: LaybySystem


@pytest.fixture(scope="module")
def apart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Apart]:
    root = tmp_path_factory.mktemp("apart")
    broker = EmbeddedRedis(root / "broker").start()
    setup = None
    try:
        with beside(root, broker.url) as (store, system):
            setup = Apart(broker, store, system)
            yield setup
    finally:
        (setup.broker if setup else broker).stop()


@pytest.fixture(scope="module")
def system(apart: Apart) -> LaybySystem:
    return apart.system


def _answer(system: LaybySystem, run_id: str, payload: object) -> None:
    run = system.wait_status(run_id, "interrupted")
    (waiting,) = system.open_interrupts(run)
    reply = system.answer(run_id, waiting["id"], payload=payload)
    assert reply.status_code == 200, reply.text


def test_each_server_holds_its_own_keys(apart: Apart) -> None:
    run_id = apart.system.start_run("demo.trivia", "quiz me")["id"]
    _answer(apart.system, run_id, "Jaws")
    assert apart.system.wait_status(run_id, "completed")["result"] == "Right! It was Jaws (1975)."
    store = redis.Redis.from_url(apart.store.url, decode_responses=True)
    broker = redis.Redis.from_url(apart.broker.url, decode_responses=True)
    # Celery's queues and bindings are on the broker alone; the runs on the store alone.
    assert not [k for k in store.scan_iter() if k.startswith(("layby.", "_kombu"))]
    assert any(k.startswith("_kombu.binding.layby") for k in broker.scan_iter())
    keys = keys_of(store, "layby")
    assert store.exists(keys.run(run_id))
    assert not list(broker.scan_iter("layby:*"))
    # Everything the transitions put in the outbox was published and acked.
    wait_until(lambda: not any(store.zcard(shard.outbox) for shard in keys.shards), 10,
               what="an empty outbox")


def test_doctor_names_the_broker(apart: Apart) -> None:
    done = apart.system.layby("doctor")
    line = next(x for x in done.stdout.splitlines() if " broker:" in x)
    assert line == f"OK      broker: Redis 127.0.0.1:{apart.broker.port} answers"


def test_the_sweeper_asks_the_broker_on_a_connection_it_keeps(apart: Apart) -> None:
    """Each sweep asks the broker's server its id (a restart or a failover may have lost
    task messages), on one connection kept from sweep to sweep: not a connection, a
    handshake and a login on the broker every sweep interval."""
    store = redis.Redis.from_url(apart.store.url, decode_responses=True)
    broker = redis.Redis.from_url(apart.broker.url, decode_responses=True)

    def swept() -> int:
        return int(store.get("layby:swept") or 0)

    def a_sweep() -> None:
        last = swept()
        wait_until(lambda: swept() > last, 10, what="a sweep")

    def connections() -> int:  # ever accepted, this client's own among them
        return int(broker.info("stats")["total_connections_received"])

    a_sweep()  # (the kept connection open)
    before, sweeps = connections(), 10
    for _ in range(sweeps):
        a_sweep()
    assert connections() - before < sweeps / 2, "a connection opened for each sweep"


def test_the_sweeper_sweeps_on_while_the_broker_is_away(apart: Apart) -> None:
    store = redis.Redis.from_url(apart.store.url, decode_responses=True)
    port, data = apart.broker.port, apart.broker.data_dir
    apart.broker.kill()
    try:
        time.sleep(2)  # every part has seen it go
        before = int(store.get("layby:swept") or 0)
        wait_until(lambda: int(store.get("layby:swept") or 0) > before + 1000, 10,
                   what="sweeps while the broker is away")
    finally:
        apart.broker = EmbeddedRedis(data, port=port).start()
    run_id = apart.system.start_run("demo.trivia", "quiz me")["id"]
    _answer(apart.system, run_id, "Jaws")
    assert apart.system.wait_status(run_id, "completed", timeout=30)["status"] == "completed"


def test_a_broker_that_lost_its_messages_is_made_good_by_the_sweeper(apart: Apart,
                                                                   tmp_path: Path) -> None:
    system = apart.system
    run_id = system.start_run("demo.trivia", "quiz me")["id"]
    run = system.wait_status(run_id, "interrupted")
    # No worker takes the resume: its message waits in the broker's queue …
    system.procs["worker"].stop()
    (waiting,) = system.open_interrupts(run)
    assert system.answer(run_id, waiting["id"], payload="Jaws").status_code == 200
    broker = redis.Redis.from_url(apart.broker.url)
    wait_until(lambda: broker.llen("layby.turns"), 10, what="the resume message queued")
    # … when the broker is replaced by an empty one (a failover to a replica that had not
    # got it yet): the message is gone, and the server's run id is another.
    port = apart.broker.port
    apart.broker.kill()
    apart.broker = EmbeddedRedis(tmp_path / "new-broker", port=port).start()
    system.start_again("worker")
    done = system.wait_status(run_id, "completed", timeout=30)
    assert done["result"] == "Right! It was Jaws (1975)."
    wait_until(lambda: "the broker is a new server" in system.procs["sweeper"].output(), 10,
               what="the sweeper's warning")


def test_doctor_says_a_broker_away_does_not_answer_without_its_password() -> None:
    from layby.broker_config import Settings, make_celery
    from layby.ops.doctor import check_broker

    for url, kind in (("redis://:s3cret@127.0.0.1:9/0", "Redis"),
                      ("amqp://guest:s3cret@127.0.0.1:9//", "RabbitMQ")):
        settings = Settings(redis_url="redis://127.0.0.1:6379/0", broker_url=url)
        found = check_broker(settings, make_celery(settings).conf)
        assert not found.ok
        assert found.line().startswith(f"PROBLEM broker: {kind} 127.0.0.1:9 does not answer")
        assert "fix LAYBY_BROKER_URL" in found.line() and "s3cret" not in found.line()
