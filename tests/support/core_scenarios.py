"""The core scenarios, to run again on another layout (a broker apart, RabbitMQ, a cluster):
a test module star-imports them and defines its own `system` fixture, which they then get
(started with `CORE_ENV` among its variables). Start → park → answer → complete; several
interrupts answered one at a time; an expiry; a quorum of two callers; a background job; a
cancel; list pages; an event stream followed to the end; `/metrics`; AG-UI's interrupt and
resume; a backlog older than LAYBY_LOST_MESSAGE_S left to drain, not copied (CORE_ENV sets
it low).
"""

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from layby.ops.embedded import EmbeddedCluster, EmbeddedRedis
from tests.http.test_agui import (
    test_parallel_resume_must_answer_both,
    test_transfer_pauses_then_resume_completes,
)
from tests.http.test_api import (
    test_cancel_of_a_finished_run_is_refused,
    test_event_stream_follows_a_run_to_its_end,
    test_list_runs_by_status,
)
from tests.journeys.test_demos import (
    test_bbq_asks_one_question_after_another,
    test_expiring_approval_ends_not_approved,
    test_parallel_resumes_only_when_both_are_answered,
    test_report_background_job_resumes_the_run,
    test_transfer_approved_executes_once,
    test_transfer_cancelled_sends_nothing,
    test_trivia_right_answer,
)
from tests.support.harness import API_KEY, LaybySystem, wait_until

VOTERS = ("lby_core-voter-one-0123456789", "lby_core-voter-two-0123456789")
# What a system the scenarios run on is started with: the lost-message wait at 2 s (a lost
# message, or a copy of one that was not, would show), and two more callers for a quorum.
CORE_ENV = {"LAYBY_LOST_MESSAGE_S": "2",
            "LAYBY_API_KEYS": f"{API_KEY},ops:{VOTERS[0]},billing:{VOTERS[1]}"}


@contextmanager
def beside(root: Path, broker_url: str) -> Iterator[tuple[EmbeddedRedis, LaybySystem]]:
    """A store of its own, and a system started on it (`CORE_ENV`) whose broker is
    `broker_url`; both stopped on the way out."""
    store = EmbeddedRedis(root / "store").start()
    system = LaybySystem(store.url, root / "system",
                         env_overrides={"LAYBY_BROKER_URL": broker_url, **CORE_ENV})
    try:
        yield store, system.start()
    finally:
        system.stop()
        store.stop()


@contextmanager
def on_a_cluster(root: Path, broker_url: str) -> Iterator[tuple[EmbeddedCluster, LaybySystem]]:
    """A Valkey Cluster of its own (3 primaries, 3 replicas), and a system started on it
    (`CORE_ENV`), one node named in its URL (the rest discovered), whose broker is
    `broker_url`; both stopped on the way out."""
    cluster = EmbeddedCluster(root / "cluster").start()
    system = LaybySystem(f"redis+cluster://{cluster.members[0].address}", root / "system",
                         env_overrides={"LAYBY_BROKER_URL": broker_url, **CORE_ENV})
    try:
        yield cluster, system.start()
    finally:
        system.stop()
        cluster.stop()


def test_a_backlog_older_than_the_lost_message_wait_is_not_copied(system: LaybySystem) -> None:
    system.procs["worker"].stop()
    try:
        ids = [system.start_run("demo.trivia", "quiz me")["id"] for _ in range(20)]
        # Sweeps see them waiting past LAYBY_LOST_MESSAGE_S, their messages in the queue.
        time.sleep(system.settings.lost_message_s + 3)
    finally:
        system.start_again("worker")
    for run_id in ids:
        system.wait_status(run_id, "interrupted")
        with system.api() as api:
            replay = api.get(f"/v1/runs/{run_id}/events", params={"follow": "false"}).text
        types = [json.loads(line[6:])["type"] for line in replay.splitlines()
                 if line.startswith("data: ")]
        assert types.count("run.started") == 1 and "run.requeued" not in types, types


def test_a_quorum_of_two_callers_completes_the_run_once(system: LaybySystem) -> None:
    run_id = system.start_run("test.quorum", "rocket")["id"]
    (launch,) = system.open_interrupts(system.wait_status(run_id, "interrupted"))
    assert launch["requiredApprovals"] == 2
    for n, key in enumerate(VOTERS):
        with system.api(key) as api:
            reply = api.post(f"/v1/runs/{run_id}/interrupts/{launch['id']}",
                             json={"status": "resolved", "payload": {"approved": True}})
        assert reply.status_code == 200, reply.text
        if n == 0:  # one approval of two: still waiting
            assert system.run(run_id)["status"] == "interrupted"
    done = system.wait_status(run_id, "completed")
    assert done["result"] == "Launched: rocket"
    (answered,) = done["interrupts"]
    assert [a["answeredBy"] for a in answered["approvals"]] == ["api:ops", "api:billing"]


def test_metrics_count_the_runs_in_every_state(system: LaybySystem) -> None:
    def listed(state: str) -> int:
        with system.api() as api:
            page = api.get("/v1/runs", params={"status": state, "limit": 200}).json()
        return len(page["runs"])

    for _ in range(3):
        system.wait_status(system.start_run("demo.trivia", "quiz me")["id"], "interrupted")

    def scraped() -> dict[str, float]:
        reply = httpx.get(f"{system.base_url}/metrics", timeout=30,
                          headers={"Authorization": f"Bearer {API_KEY}"})
        assert reply.status_code == 200, reply.text
        return {sample.labels["state"]: sample.value
                for family in text_string_to_metric_families(reply.text)
                for sample in family.samples if sample.name == "layby_runs"}

    assert scraped()["interrupted"] >= 3
    # Runs of earlier scenarios may still move on: the gauges and the lists agree once
    # they stand still.
    states = ("queued", "interrupted", "completed", "cancelled")
    wait_until(lambda: all(scraped()[s] == listed(s) for s in states), 20,
               what="/metrics to count what the lists hold")


__all__ = [
    "test_a_backlog_older_than_the_lost_message_wait_is_not_copied",
    "test_a_quorum_of_two_callers_completes_the_run_once",
    "test_bbq_asks_one_question_after_another",
    "test_cancel_of_a_finished_run_is_refused",
    "test_event_stream_follows_a_run_to_its_end",
    "test_expiring_approval_ends_not_approved",
    "test_list_runs_by_status",
    "test_metrics_count_the_runs_in_every_state",
    "test_parallel_resume_must_answer_both",
    "test_parallel_resumes_only_when_both_are_answered",
    "test_report_background_job_resumes_the_run",
    "test_transfer_approved_executes_once",
    "test_transfer_cancelled_sends_nothing",
    "test_transfer_pauses_then_resume_completes",
    "test_trivia_right_answer",
]
