"""The core scenarios, to run again on another layout (a broker apart, RabbitMQ, a cluster):
a test module star-imports them and defines its own `system` fixture, which they then get.
Start → park → answer → complete; several interrupts answered one at a time; an expiry; a
background job; a cancel; list pages; AG-UI's interrupt and resume; a backlog older than
LAYBY_LOST_MESSAGE_S left to drain, not copied (the importing module's system sets it low).
"""

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from layby.ops.embedded import EmbeddedRedis
from tests.harness import LaybySystem
from tests.test_agui import (
    test_parallel_resume_must_answer_both,
    test_transfer_pauses_then_resume_completes,
)
from tests.test_api import test_cancel_of_a_finished_run_is_refused, test_list_runs_by_status
from tests.test_demos import (
    test_bbq_asks_one_question_after_another,
    test_expiring_approval_ends_not_approved,
    test_parallel_resumes_only_when_both_are_answered,
    test_report_background_job_resumes_the_run,
    test_transfer_approved_executes_once,
    test_transfer_cancelled_sends_nothing,
    test_trivia_right_answer,
)


@contextmanager
def beside(root: Path, broker_url: str) -> Iterator[tuple[EmbeddedRedis, LaybySystem]]:
    """A store of its own, and a system started on it whose broker is `broker_url`, its
    lost-message wait at 2 s (a lost message, or a copy of one that was not, would show);
    both stopped on the way out."""
    store = EmbeddedRedis(root / "store").start()
    system = LaybySystem(store.url, root / "system",
                         env_overrides={"LAYBY_BROKER_URL": broker_url,
                                        "LAYBY_LOST_MESSAGE_S": "2"})
    try:
        yield store, system.start()
    finally:
        system.stop()
        store.stop()


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


__all__ = ["test_a_backlog_older_than_the_lost_message_wait_is_not_copied",
           "test_bbq_asks_one_question_after_another", "test_cancel_of_a_finished_run_is_refused",
           "test_expiring_approval_ends_not_approved", "test_list_runs_by_status",
           "test_parallel_resume_must_answer_both",
           "test_parallel_resumes_only_when_both_are_answered",
           "test_report_background_job_resumes_the_run", "test_transfer_approved_executes_once",
           "test_transfer_cancelled_sends_nothing", "test_transfer_pauses_then_resume_completes",
           "test_trivia_right_answer"]
