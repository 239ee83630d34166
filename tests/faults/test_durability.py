"""What must survive: a worker killed mid-turn, a restart of the Redis server, a commit whose
publish never happened, a job that ends before its run parks, stale duplicate messages, and
interrupts nobody answers. Real Valkey, real Celery workers, real HTTP."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from layby.broker_config import RESUME_RUN, RUN_TURN, Settings, make_celery
from layby.control.runtime import store_config
from layby.generation import text_message
from layby.ops.embedded import EmbeddedRedis
from layby.parking import Store
from layby.wire import Answer, InterruptState
from tests.support.harness import BASE_ENV, LaybySystem, wait_until

pytestmark = pytest.mark.integration

DURABLE_ENV = {
    "LAYBY_AGENT_MODULES": "layby.demo.agents,tests.support.agents,tests.support.agents_durability",
    "LAYBY_TASK_MODULES": "layby.demo.jobs,tests.support.agents_durability",
    "LAYBY_TEST_EXPIRY_S": "2",
}
OUTBOX_GRACE_S = float(BASE_ENV["LAYBY_OUTBOX_GRACE_S"])


@pytest.fixture(scope="module")
def durable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaybySystem]:
    """A system with the durability test agents and job, on a Valkey server of its own:
    nothing else reads its queues."""
    base = tmp_path_factory.mktemp("durable")
    server = EmbeddedRedis(base / "valkey").start()
    system = LaybySystem(server.url, base / "system", env_overrides=DURABLE_ENV)
    try:
        yield system.start()
    finally:
        system.stop()
        server.stop()


# -- helpers -------------------------------------------------------------------------------


def single_open(system: LaybySystem, run_id: str) -> dict[str, Any]:
    run = system.wait_status(run_id, "interrupted")
    waiting = system.open_interrupts(run)
    assert len(waiting) == 1, run["interrupts"]
    return waiting[0]


def transfers_of(system: LaybySystem, run_id: str) -> list[dict[str, Any]]:
    return [t for t in system.ledger()["transfers"] if t["run"] == run_id]


def calls_of(system: LaybySystem, run_id: str, tool: str) -> list[dict[str, Any]]:
    return [c for c in system.ledger()["calls"] if c["run"] == run_id and c["tool"] == tool]


def events(system: LaybySystem, run_id: str) -> list[dict[str, Any]]:
    """The run's events so far, as the SSE endpoint replays them."""
    with system.api() as api:
        reply = api.get(f"/v1/runs/{run_id}/events", params={"follow": "false"})
    assert reply.status_code == 200, reply.text
    return [json.loads(line[len("data: "):]) for line in reply.text.splitlines()
            if line.startswith("data: ")]


def event_types(system: LaybySystem, run_id: str) -> list[str]:
    return [e["type"] for e in events(system, run_id)]


def received(log: str, task: str, task_id_pattern: str) -> int:
    return len(re.findall(rf"Task {re.escape(task)}\[{task_id_pattern}\] received", log))


def returned(log: str, task_id: str) -> list[str]:
    """What the tasks with this id returned, as the worker logged it."""
    return re.findall(rf"\[{re.escape(task_id)}\] succeeded in [\d.]+s: '([\w.-]+)'", log)


def settings_of(system: LaybySystem) -> Settings:
    """The settings the system's processes run with."""
    return system.settings


@contextmanager
def sender(system: LaybySystem) -> Iterator[Any]:
    """A Celery app in the test process, publishing to the system's broker as it does."""
    app = make_celery(settings_of(system))
    try:
        yield app
    finally:
        app.close()


# -- a worker killed in the middle of a turn -----------------------------------------------


@pytest.mark.slow
def test_worker_killed_after_the_transfer_finishes_the_run_with_one_transfer(
        isolated: Any) -> None:
    visibility_s = 8.0  # above the lease (6 s) and the step (3 s), as in production
    # The lost-message sweep (its own test below) kept out of this one: on a loaded machine
    # the new worker may hold the requeued message past it, and a third copy would come.
    system = isolated(LAYBY_DEMO_TRANSFER_DELAY_S="3", LAYBY_LOST_MESSAGE_S="120",
                      LAYBY_VISIBILITY_TIMEOUT_S=str(int(visibility_s))).start()
    run_id = system.start_run("demo.transfer", "Send 250 to Bob")["id"]
    approval = single_open(system, run_id)
    assert system.answer(run_id, approval["id"], payload={"approved": True}).status_code == 200
    delivered = time.monotonic()

    # The money moved; the worker sleeps before the turn commits.
    wait_until(lambda: transfers_of(system, run_id), 15, every=0.05, what="the transfer")
    assert system.run(run_id)["status"] == "running"
    system.procs["worker"].kill()
    assert system.run(run_id)["status"] == "running"

    # Nothing acks the resume message now: kombu keeps it in its unacked hash and puts it
    # back only once it is older than the visibility timeout, when a worker starts (kombu's
    # restore at start) or at its periodic restore (every 100 s by default). Meanwhile
    # the run's lease lapses (6 s) and the sweeper requeues the step as a new message.
    # Starting the new worker after the visibility timeout makes it receive both copies:
    # one claims the run and runs the step again (the transfer is found in the ledger by its
    # idempotency key), the other finds the run busy or done and does nothing.
    system.wait_status(run_id, "queued", timeout=15)  # the sweeper requeued the run
    time.sleep(max(0.0, visibility_s + 0.5 - (time.monotonic() - delivered)))
    second = system.start_worker("worker2")

    done = system.wait_status(run_id, "completed", timeout=30)
    assert done["result"] == "Sent 250 to Bob."
    assert [(t["to"], t["amount"]) for t in transfers_of(system, run_id)] == [("Bob", 250)]
    assert "run.requeued" in event_types(system, run_id)
    finished = rf"\[{run_id}:\w+:\d+\] succeeded in [\d.]+s: '(\w+)'"
    wait_until(lambda: len(re.findall(finished, second.output())) >= 2, 10,
               what="the new worker to finish both messages")
    assert received(second.output(), RESUME_RUN, rf"{run_id}:resume:\d+") == 1  # by kombu
    # Requeued by the sweeper when the lease lapsed; and, when the dead worker's own beat
    # lapsed after that, once more as what it may have reserved (tasks.heartbeat): which
    # comes first is the machine's timing.
    turns = received(second.output(), RUN_TURN, rf"{run_id}:turn:\d+")
    assert turns in (1, 2)
    wait_until(lambda: len(re.findall(finished, second.output())) >= 1 + turns, 10,
               what="the new worker to finish every message")
    # Exactly one of them did the work; the others were refused without touching the run.
    outcomes = sorted(re.findall(finished, second.output()))
    assert outcomes.count("finish") == 1 and set(outcomes) <= {"busy", "finish", "stale"}, \
        outcomes


@pytest.mark.slow
def test_worker_killed_before_the_transfer_sends_it_once_after_recovery(
        isolated: Any) -> None:
    system = isolated(LAYBY_TEST_BEFORE_TRANSFER_S="3", **DURABLE_ENV).start()
    run_id = system.start_run("test.careful_transfer", "pay Dan")["id"]
    approval = single_open(system, run_id)
    assert system.answer(run_id, approval["id"], payload={"approved": True}).status_code == 200

    # The approved tool has started and waits before moving the money.
    wait_until(lambda: calls_of(system, run_id, "careful_transfer"), 15, every=0.05,
               what="the approved transfer to start")
    system.procs["worker"].kill()
    assert system.run(run_id)["status"] == "running"
    assert transfers_of(system, run_id) == []

    # The new worker starts at once, well within the visibility timeout (30 s): the killed
    # worker's message stays in kombu's unacked hash, and the run recovers through its lease
    # alone (the sweeper requeues it once the lease lapses, 6 s after the claim).
    system.start_worker("worker2")
    done = system.wait_status(run_id, "completed", timeout=30)
    assert done["result"] == "Sent 30 to Dan."
    assert [(t["to"], t["amount"]) for t in transfers_of(system, run_id)] == [("Dan", 30)]
    assert "run.requeued" in event_types(system, run_id)
    assert [i["state"] for i in done["interrupts"]] == ["resolved"]


@pytest.mark.slow
def test_pool_process_killed_mid_turn_finishes_the_run_with_one_transfer(
        isolated: Any) -> None:
    """What the kernel's OOM killer does: the process running the turn dies, the worker's
    main process lives on and starts a new pool process."""
    system = isolated(LAYBY_DEMO_TRANSFER_DELAY_S="3").start()
    run_id = system.start_run("demo.transfer", "Send 120 to Ida")["id"]
    approval = single_open(system, run_id)
    assert system.answer(run_id, approval["id"], payload={"approved": True}).status_code == 200
    wait_until(lambda: transfers_of(system, run_id), 15, every=0.05, what="the transfer")
    worker = system.procs["worker"]
    assert worker.process is not None
    pool = subprocess.run(["pgrep", "-P", str(worker.process.pid)], capture_output=True,
                          text=True, check=True).stdout.split()
    assert len(pool) == system.worker_count
    for pid in pool:
        os.kill(int(pid), signal.SIGKILL)

    # Celery retries the lost task later (task_retry_on_worker_lost, after the task's
    # retry delay); the run does not wait for that: its lease lapses and the sweeper
    # requeues it.
    done = system.wait_status(run_id, "completed", timeout=30)
    assert done["result"] == "Sent 120 to Ida."
    assert [(t["to"], t["amount"]) for t in transfers_of(system, run_id)] == [("Ida", 120)]
    assert "run.requeued" in event_types(system, run_id)
    assert worker.process.poll() is None


# -- a restart of the Redis server while runs are parked -----------------------------------

ANSWERS: dict[str, dict[str, Any]] = {
    # by agent: interrupt's tool call id or tool name → payload
    "demo.trivia": {"ask_question": "Jaws"},
    "demo.transfer": {"transfer_funds": {"approved": True}},
    "demo.parallel": {"ask_question": "main", "transfer_funds": {"approved": True}},
    "demo.bbq": {"guests": "12", "diet": "vegan", "grill": "gas"},
    "demo.expiring": {},  # nobody answers: its deadline, kept in Redis too, ends it
}
INPUTS = {"demo.trivia": "quiz me", "demo.transfer": "Send 90 to Ann",
          "demo.parallel": "pay Carol", "demo.bbq": "Plan a BBQ",
          "demo.expiring": "ship it"}
RESULTS = {"demo.trivia": "Right! It was Jaws (1975).", "demo.transfer": "Sent 90 to Ann.",
           "demo.parallel": "Paying from main; transfer sent; balance was 1000.",
           "demo.bbq": "BBQ plan: 12 guests, vegan menu, on a gas grill. Light it an hour "
                       "before they arrive.",
           "demo.expiring": "The deployment was not approved in time (no answer before "}


def _parked(system: LaybySystem, run_ids: list[str]) -> dict[str, tuple[str, int, list[str]]]:
    out = {}
    for run_id in run_ids:
        run = system.run(run_id)
        out[run_id] = (run["status"], run["version"],
                       sorted(i["id"] for i in system.open_interrupts(run)))
    return out


def _answer_until_done(system: LaybySystem, run_id: str, agent: str) -> dict[str, Any]:
    while True:
        run = system.wait_status(run_id, "interrupted", "completed", timeout=40)
        if run["status"] == "completed":
            return run
        answers = ANSWERS[agent]
        if not answers:
            return system.wait_status(run_id, "completed", timeout=40)
        for intr in system.open_interrupts(run):
            payload = answers.get(intr["toolCallId"], answers.get(intr["toolName"]))
            reply = system.answer(run_id, intr["id"], payload=payload)
            assert reply.status_code == 200, reply.text
        wait_until(lambda: system.run(run_id)["version"] > run["version"] + 1  # noqa: B023  (waited for within this iteration)
                   or system.run(run_id)["status"] == "completed", 40,
                   what=f"run {run_id} to move past its answers")


@pytest.mark.skipif(sys.platform != "linux", reason="mimalloc is put in place on Linux")
def test_the_embedded_server_runs_on_mimalloc_and_its_data_outlives_a_rewrite_and_a_kill(
        tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "valkey").start()
    try:
        assert server.allocator == "mimalloc"
        client = redis.Redis.from_url(server.url)
        for start in range(0, 20_000, 1000):
            pipe = client.pipeline(transaction=False)
            for i in range(start, start + 1000):
                pipe.hset(f"run:{i}", mapping={"status": "interrupted",
                                               "messages": "x" * (i % 2000)})
            pipe.execute()
        client.delete(*[f"run:{i}" for i in range(0, 20_000, 2)])
        # A rewrite forks the server: its child allocates with mimalloc too.
        client.bgrewriteaof()
        wait_until(lambda: not int(client.info("persistence")["aof_rewrite_in_progress"])
                   and not int(client.info("persistence")["aof_rewrite_scheduled"]), 30,
                   what="the append-only file's rewrite")
        client.set("after", "the rewrite")
        time.sleep(1.5)  # appendfsync everysec
        port = server.port
        server.kill()
        server = EmbeddedRedis(server.data_dir, port=port, malloc="libc").start()
        assert server.allocator == "libc"
        client = redis.Redis.from_url(server.url)
        assert client.dbsize() == 10_001
        assert client.hget("run:19999", "messages") == b"x" * 1999
        assert client.get("after") == b"the rewrite"
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
def test_parked_runs_survive_a_restart_of_the_redis_server(tmp_path: Path, stop: str) -> None:
    server = EmbeddedRedis(tmp_path / "valkey").start()
    # The approval of demo.expiring lapses after the restart: the sweeper must be back.
    system = LaybySystem(server.url, tmp_path / "system",
                         env_overrides={"LAYBY_DEMO_EXPIRY_S": "12"})
    try:
        system.start()
        agents = {system.start_run(agent, text)["id"]: agent
                  for agent in INPUTS for text in (INPUTS[agent],) * 2}
        for run_id in agents:
            system.wait_status(run_id, "interrupted")
        # demo.expiring may expire at any time from here on; it is checked at the end.
        waiting = [r for r, a in agents.items() if a != "demo.expiring"]
        before = _parked(system, waiting)
        assert sum(len(ids) for _, _, ids in before.values()) == 10

        port = server.port
        if stop == "sigkill":
            time.sleep(1.5)  # appendfsync everysec: what is older than a second is on disk
            server.kill()
        else:
            server.stop()
        # While it is away the API says so (clients retry a 503), rather than failing.
        with system.api() as api:
            away = api.get(f"/v1/runs/{next(iter(agents))}")
        assert away.status_code == 503, away.text
        assert away.json()["error"]["code"] == "redis_unavailable"
        assert away.headers["retry-after"] == "1"
        time.sleep(1.0)  # let every client notice the server is gone
        server = EmbeddedRedis(server.data_dir, port=port).start()

        # Workers, sweeper and gateway reconnect by themselves; the parked runs are intact,
        # brought back by the append-only file alone (the server takes no snapshots).
        assert _parked(system, waiting) == before
        assert not list(server.data_dir.glob("*.rdb"))
        for run_id, agent in agents.items():
            done = _answer_until_done(system, run_id, agent)
            assert done["result"].startswith(RESULTS[agent]), (agent, done)
            expected = "expired" if agent == "demo.expiring" else "resolved"
            assert {i["state"] for i in done["interrupts"]} == {expected}
        transfers = [t for t in system.ledger()["transfers"] if t["run"] in agents]
        assert sorted(t["run"] for t in transfers) == sorted(
            r for r, a in agents.items() if a in ("demo.transfer", "demo.parallel"))
        # A run started after the restart goes through too.
        fresh = system.start_run("demo.trivia", "one more")["id"]
        assert _answer_until_done(system, fresh, "demo.trivia")["result"] == RESULTS[
            "demo.trivia"]
    finally:
        system.stop()
        server.stop()


@contextmanager
def _to_restart(tmp_path: Path
                ) -> Iterator[tuple[LaybySystem, Store, Callable[[], EmbeddedRedis]]]:
    """A system on a Valkey of its own (LAYBY_LOST_MESSAGE_S 300 s, so only a requeue
    after the restart brings a lost message's run on in time), its store, and `restart`:
    the server killed once its append-only file has the last writes (appendfsync
    everysec; the sweeper has seen the server by then), then started again on the same
    port and data."""
    servers = [EmbeddedRedis(tmp_path / "valkey").start()]
    system = LaybySystem(servers[0].url, tmp_path / "system",
                         env_overrides={"LAYBY_LOST_MESSAGE_S": "300"})

    def restart() -> EmbeddedRedis:
        store.redis.close()
        time.sleep(2)
        old = servers[-1]
        old.kill()
        servers.append(EmbeddedRedis(old.data_dir, port=old.port).start())
        return servers[-1]

    try:
        system.start()
        store = _store(system)
        yield system, store, restart
    finally:
        system.stop()
        servers[-1].stop()


@pytest.mark.slow
def test_a_worker_whose_broker_connections_are_cut_goes_on_consuming(tmp_path: Path) -> None:
    # The server closes every connection but its own (a proxy's idle timeout, a restart):
    # the worker's pub/sub connection (Celery's remote control) too. With redis-py retrying
    # the read on a new connection, where a pub/sub read waits with no timeout, the worker's
    # event loop stopped for good (once in ~100 restarts; every time this way): layby's
    # broker connections do not retry, and the consumer reconnects as a whole.
    server = EmbeddedRedis(tmp_path / "valkey").start()
    system = LaybySystem(server.url, tmp_path / "system", worker_count=1)
    try:
        system.start()
        first = system.start_run("demo.trivia", "quiz me")["id"]
        system.wait_status(first, "interrupted")
        client = redis.Redis.from_url(server.url)
        for kind in ("pubsub", "normal"):
            assert client.client_kill_filter(_type=kind, skipme=True) >= 1
        time.sleep(1.0)
        second = system.start_run("demo.trivia", "quiz me")["id"]
        system.wait_status(second, "interrupted", timeout=20)
        for run_id in (first, second):
            _answer_until_done(system, run_id, "demo.trivia")
        assert "Connection to broker lost" in system.procs["worker"].output()
    finally:
        system.stop()
        server.stop()


@pytest.mark.slow
def test_after_a_store_restart_a_run_whose_message_was_lost_goes_on_at_once(
        tmp_path: Path) -> None:
    """A run queued whose task message the store lost (its last writes before a crash or a
    failover): once the store is back, the sweeper sees a new server and queues the step
    again at once, not after LAYBY_LOST_MESSAGE_S."""
    with _to_restart(tmp_path) as (system, store, restart):
        run_id = _lost_message_run(store)
        restart()
        back = time.monotonic()

        single_open(system, run_id)
        assert time.monotonic() - back < 30
        assert "run.requeued" in event_types(system, run_id)
        assert "the store is a new server" in system.procs["sweeper"].output()


@pytest.mark.slow
def test_a_restart_the_sweeper_was_not_up_for_is_seen_by_the_sweeper_that_comes_next(
        tmp_path: Path) -> None:
    """The store fails over (or restarts) while no sweeper has seen it: one that starts
    afterwards, knowing nothing of the server before, still sees another server than the
    data was written on, and requeues the run whose message was lost."""
    with _to_restart(tmp_path) as (system, store, restart):
        run_id = _lost_message_run(store)
        sweeper = system.procs["sweeper"]
        sweeper.kill()
        restart()
        sweeper.start(system.env)
        back = time.monotonic()

        single_open(system, run_id)
        assert time.monotonic() - back < 30
        assert "run.requeued" in event_types(system, run_id)
        assert "the store is a new server" in sweeper.output()


@pytest.mark.slow
def test_a_run_the_requeue_after_a_restart_could_not_take_is_requeued_at_the_next_sweeps(
        tmp_path: Path) -> None:
    """The requeue after a restart (or a failover) meets an error on one run (here a
    record it cannot read, WRONGTYPE; at a failover, the new primary still settling): the
    other runs go on, and that one is tried again at the next sweeps instead of waiting
    for LAYBY_LOST_MESSAGE_S."""
    with _to_restart(tmp_path) as (system, store, restart):
        troubled, fine = _lost_message_run(store), _lost_message_run(store)
        key = store.keys.run(troubled)
        store.redis.rename(key, key + ":aside")
        store.redis.set(key, "not a run")
        server = restart()

        single_open(system, fine)  # the pass went on past the run it could not requeue
        sweeper = system.procs["sweeper"]
        wait_until(lambda: troubled in sweeper.output(), 30, what="the failed requeue logged")
        with redis.Redis.from_url(server.url) as r:
            r.delete(key)
            r.rename(key + ":aside", key)
        healed = time.monotonic()
        single_open(system, troubled)
        assert time.monotonic() - healed < 30
        assert "run.requeued" in event_types(system, troubled)


# -- the outbox ----------------------------------------------------------------------------


def _lost_message_run(store: Store) -> str:
    """A run created and queued whose task message is gone: its outbox entry acked as if
    published, and never published."""
    run_id = f"run_{uuid.uuid4().hex}"
    created = store.runs.create_run(run_id, "demo.trivia", input="quiz me",
                                    messages=[text_message("user", "quiz me")], metadata={},
                                    idempotency_key=None)
    store.outbox.ack_outbox([(run_id, e.id) for e in created.entries])
    return run_id


def _store(system: LaybySystem) -> Store:
    """The store as the system's processes see it, built in the test process."""
    client = redis.Redis.from_url(system.redis_url, decode_responses=True)
    return Store(client, store_config(settings_of(system)))


def _outbox_size(store: Store) -> int:
    return sum(shard.outbox.count() for shard in store.shards)


def test_commits_whose_publish_never_happened_are_published_by_the_sweeper(
        durable: LaybySystem) -> None:
    store = _store(durable)
    run_id = f"run_{uuid.uuid4().hex}"
    started = time.monotonic()
    created = store.runs.create_run(run_id, "demo.trivia", input="quiz me",
                                    messages=[text_message("user", "quiz me")], metadata={},
                                    idempotency_key=None)
    assert created.ok and len(created.entries) == 1  # and never published here
    assert durable.run(run_id)["status"] == "queued"
    assert _outbox_size(store) == 1

    question = single_open(durable, run_id)
    # The sweeper leaves an entry alone for the grace time (its publisher may still be at it).
    assert time.monotonic() - started >= OUTBOX_GRACE_S - 0.5
    wait_until(lambda: _outbox_size(store) == 0, 10, what="the outbox to empty")

    # The answer that closes the interrupt commits the resume; nobody publishes it.
    answered = store.answers.answer(run_id, [Answer(
        interrupt_id=question["id"], status="resolved", payload="Jaws",
        state=InterruptState.RESOLVED, answered_by="test", channel="test",
        answered_at="2025-01-01T00:00:00.000Z")])
    assert answered.ok and len(answered.entries) == 1
    assert durable.run(run_id)["status"] == "resuming"
    done = durable.wait_status(run_id, "completed", timeout=20)
    assert done["result"] == "Right! It was Jaws (1975)."
    wait_until(lambda: _outbox_size(store) == 0, 10, what="the outbox to empty")
    store.redis.close()


def test_a_run_whose_message_was_lost_after_the_outbox_ack_is_requeued(
        durable: LaybySystem) -> None:
    """A broker that lost its last second, or a task that failed before it claimed the run:
    the outbox entry is gone and so is the message. The sweeper finds the run waiting past
    LAYBY_LOST_MESSAGE_S and queues its step again."""
    store = _store(durable)
    run_id = _lost_message_run(store)
    assert _outbox_size(store) == 0
    lost_after_s = float(settings_of(durable).lost_message_s)
    started = time.monotonic()
    single_open(durable, run_id)
    assert time.monotonic() - started >= lost_after_s - 1
    assert "run.requeued" in event_types(durable, run_id)
    store.redis.close()


def test_runs_whose_messages_still_wait_in_the_queue_are_not_taken_for_lost(
        tmp_path: Path) -> None:
    """A burst of starts can take longer to drain than LAYBY_LOST_MESSAGE_S. A run whose
    message is still in the queue waits its turn: the sweeper does not queue a copy (which
    would only lengthen the queue); a run whose message left the queue without a claim is
    sought once a later message of its queue was claimed (its task failed before its
    claim), or at once when a worker died (it may have held it)."""
    server = EmbeddedRedis(tmp_path / "valkey").start()
    try:
        settings = Settings(redis_url=server.url)
        store = Store(redis.Redis.from_url(server.url, decode_responses=True),
                      store_config(settings, make_celery(settings)))
        run_ids = []
        for i in range(5):  # nobody takes them: no worker
            run_ids.append(f"run_{uuid.uuid4().hex}")
            created = store.runs.create_run(run_ids[-1], "demo.trivia", input=f"quiz {i}",
                                            messages=[text_message("user", f"quiz {i}")],
                                            metadata={}, idempotency_key=None)
            assert created.ok and not created.entries  # pushed by the script itself
            time.sleep(0.005)  # one moment each: the queue's order is the runs' order
        time.sleep(0.01)
        assert store.deadlines.waiting_too_long(0) == []

        queue = store.config.messages["turn"][0]
        taken = [json.loads(store.redis.rpop(queue)) for _ in range(3)]
        assert [json.loads(m["body"])[0][0] for m in taken] == run_ids[:3]
        assert store.deadlines.waiting_too_long(0) == []  # a live worker may be about to claim them
        assert store.deadlines.maybe_reserved()[:3] == run_ids[:3]  # a dead one may have held them
        assert store.runs.claim(run_ids[2], 1, "worker-1").ok
        assert sorted(store.deadlines.waiting_too_long(0)) == sorted(run_ids[:2])

        store.redis.delete(queue)  # the server lost them all
        assert sorted(store.deadlines.waiting_too_long(0)) == sorted(run_ids[:2] + run_ids[3:])
        store.redis.close()
    finally:
        server.stop()


# -- a background job that ends before its run parks ---------------------------------------


def test_job_that_ends_before_the_park_still_answers_it(durable: LaybySystem) -> None:
    run_id = durable.start_run("test.early_job", "nightly")["id"]
    done = durable.wait_status(run_id, "completed", timeout=30)
    assert done["result"] == "Job nightly done: True."
    [job] = done["interrupts"]
    assert job["reason"] == "layby:background_job"
    assert job["state"] == "resolved"
    assert job["answer"]["channel"] == "job"
    assert job["answer"]["answeredBy"] == "job:test.quick_job"
    assert job["answer"]["payload"] == {"label": "nightly", "done": True}
    # The answer was recorded before the interrupt was even created.
    assert job["answer"]["answeredAt"] <= job["createdAt"]
    types = event_types(durable, run_id)
    assert types.index("run.interrupted") + 1 == types.index("run.resuming")


# -- stale duplicate messages --------------------------------------------------------------


def test_stale_duplicate_messages_change_nothing(durable: LaybySystem) -> None:
    paid = durable.start_run("demo.transfer", "Send 40 to Zed")["id"]
    approval = single_open(durable, paid)
    assert durable.answer(paid, approval["id"], payload={"approved": True}).status_code == 200
    paid_done = durable.wait_status(paid, "completed")
    transfer_version = next(e["version"] for e in events(durable, paid)
                            if e["type"] == "run.resuming")
    parked_id = durable.start_run("demo.trivia", "quiz me")["id"]
    single_open(durable, parked_id)
    parked = durable.run(parked_id)

    duplicates = [(RESUME_RUN, paid, transfer_version), (RUN_TURN, paid, transfer_version),
                  (RUN_TURN, parked_id, 1), (RUN_TURN, parked_id, parked["version"])]
    sent = []
    with sender(durable) as client:
        for task, run_id, version in duplicates:
            task_id = f"dup-{uuid.uuid4().hex}"
            for _ in range(2):  # the same message twice, as a redelivery would bring it
                client.send_task(task, args=[run_id, version], task_id=task_id)
            sent.append(task_id)

    worker = durable.procs["worker"]
    wait_until(lambda: all(len(returned(worker.output(), t)) == 2 for t in sent), 20,
               what="the worker to take every duplicate")
    assert {t: returned(worker.output(), t) for t in sent} == {
        t: ["stale", "stale"] for t in sent}
    assert durable.run(paid) == paid_done
    assert durable.run(parked_id) == parked
    assert len(transfers_of(durable, paid)) == 1


# -- expiry policies -----------------------------------------------------------------------


def test_expiry_with_policy_fail_fails_the_run(durable: LaybySystem) -> None:
    run_id = durable.start_run("test.expiry_fail", "purge old data")["id"]
    failed = durable.wait_status(run_id, "failed", timeout=20)
    [intr] = failed["interrupts"]
    assert intr["expiresAt"]
    assert failed["error"]["code"] == "interrupt_expired"
    assert intr["id"] in failed["error"]["message"]
    assert "expired" in failed["error"]["message"]
    assert intr["state"] == "expired"
    assert intr["answer"]["channel"] == "expiry"
    assert intr["answer"]["answeredAt"] >= intr["expiresAt"]
    late = durable.answer(run_id, intr["id"], payload={"ok": True})
    assert late.status_code == 409
    assert durable.run(run_id)["status"] == "failed"


def test_expiry_with_policy_resolve_uses_the_default(durable: LaybySystem) -> None:
    run_id = durable.start_run("test.expiry_default", "order dinner")["id"]
    done = durable.wait_status(run_id, "completed", timeout=20)
    assert done["result"] == "Ordering a medium pizza."
    [intr] = done["interrupts"]
    assert intr["expiresAt"]
    assert intr["state"] == "expired"
    assert intr["answer"]["answeredAt"] >= intr["expiresAt"]
    assert intr["answer"]["status"] == "resolved"
    assert intr["answer"]["payload"] == "medium"
    assert intr["answer"]["channel"] == "expiry"


# -- a step longer than its lease, and one whose worker dies -------------------------------


def test_a_slow_step_keeps_its_claim_while_its_worker_lives(durable: LaybySystem) -> None:
    """A 15 s tool under a 6 s lease: the worker's heartbeat keeps the claim; nobody else
    runs the step, and it commits once."""
    run_id = durable.start_run("test.slow", "ledger-1")["id"]
    done = durable.wait_status(run_id, "completed", timeout=60)
    assert done["result"] == "Slow work ledger-1 done."
    assert len(calls_of(durable, run_id, "slow_work")) == 1
    kinds = event_types(durable, run_id)
    assert "run.requeued" not in kinds
    assert kinds.count("run.started") == 1  # one claim, one step, no second worker


def test_a_dead_workers_step_runs_again_within_seconds(isolated: Any) -> None:
    """SIGKILL the worker running a slow step (its whole process group: main process and
    pool children): the heartbeat stops, the lease lapses, the sweeper requeues, and the
    other worker takes the step up, well within 10 s of the kill."""
    system = isolated(**DURABLE_ENV, LAYBY_TEST_SLOW_S="12").start()
    spare = system.start_worker("spare")
    run_id = system.start_run("test.slow", "killed")["id"]
    first = wait_until(lambda: calls_of(system, run_id, "slow_work"), 20, every=0.05,
                       what="the slow step to start")
    child = int(first[0]["pid"])
    parent = int(subprocess.run(["ps", "-o", "ppid=", "-p", str(child)], capture_output=True,
                                text=True, check=True).stdout.strip())
    holder = next(p for p in (system.procs["worker"], spare)
                  if p.process is not None and p.process.pid == parent)
    killed_at = time.time()
    holder.kill()

    def taken_up_again() -> float | None:
        # The lapsed lease requeues the run (running → queued); the spare claims it: the
        # run's second start.
        starts = [e for e in events(system, run_id) if e["type"] == "run.started"]
        return _epoch(starts[1]["at"]) - killed_at if len(starts) > 1 else None

    waited = wait_until(taken_up_again, 30, every=0.2, what="the step to run again")
    assert waited < 10, waited
    done = system.wait_status(run_id, "completed", timeout=60)
    assert done["result"] == "Slow work killed done."
    assert len(calls_of(system, run_id, "slow_work")) == 2  # the killed start, and this one


def _epoch(at: str) -> float:
    return datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()
