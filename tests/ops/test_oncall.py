"""`layby ops`, as the person on call uses it against a real system: list what is stuck
(a run whose task message was lost, a parked run whose notification failed), fix it
(requeue, send the notification again), purge finished runs, read a run's full history."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import redis

from layby.broker_config import TURNS
from layby.wire import Status
from tests.ops.test_cli import layby
from tests.support.harness import LaybySystem, keys_of, wait_until
from tests.support.reviewers import SmtpServer, WebhookReceiver, reviewed_system


def _stuck(system: LaybySystem) -> list[dict]:
    done = layby(system, "ops", "stuck", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_run_whose_message_was_lost_is_listed_then_requeued(
        isolated: Callable[..., LaybySystem]) -> None:
    # Long enough that the "not yet" checks below run within it on a busy machine.
    lost_after_s = 15
    system = isolated(LAYBY_LOST_MESSAGE_S=str(lost_after_s)).start()
    # No worker and no sweeper: nothing takes the message, nothing requeues it by itself.
    system.procs["worker"].stop()
    system.procs["sweeper"].stop()
    run_id = system.start_run("demo.trivia", "Ask me a movie question")["id"]
    client = redis.Redis.from_url(system.redis_url)
    wait_until(lambda: client.llen(TURNS), 10, what="the task message in the broker")
    client.delete(TURNS)  # the broker lost it
    assert all(f["runId"] != run_id for f in _stuck(system))  # not yet: within that time

    findings = wait_until(lambda: [f for f in _stuck(system) if f["runId"] == run_id],
                          lost_after_s + 10, every=0.5, what="the run listed as stuck")
    (finding,) = findings
    assert finding["kind"] == "waiting_too_long", finding
    assert finding["detail"]["status"] == "queued"
    assert "task message is no longer in its queue: lost" in finding["problem"]
    assert f"layby runs requeue {run_id}" in finding["fix"]
    text = layby(system, "ops", "stuck")
    assert text.returncode == 0, text.stderr
    assert f"{run_id}  waiting_too_long" in text.stdout
    assert "fix: layby runs requeue" in text.stdout

    requeued = layby(system, "ops", "requeue-stuck")
    assert requeued.returncode == 0, requeued.stderr
    assert f"{run_id}  requeued  (waiting_too_long)" in requeued.stdout
    assert "1 run(s) requeued" in requeued.stdout
    assert all(f["runId"] != run_id for f in _stuck(system))  # its wait starts again

    system.start_worker()
    assert system.wait_status(run_id, "interrupted", timeout=40)["status"] == "interrupted"
    answered = layby(system, "runs", "answer", run_id, "--text", "Jaws")
    assert answered.returncode == 0, answered.stderr
    system.wait_status(run_id, "completed", timeout=40)

    events = layby(system, "runs", "events", run_id, "--json")
    assert events.returncode == 0, events.stderr
    kinds = [json.loads(line)["type"] for line in events.stdout.splitlines()]
    assert kinds[0] == "run.created" and kinds[-1] == "run.completed", kinds
    assert "run.requeued" in kinds and "interrupt.answered" in kinds
    readable = layby(system, "runs", "events", run_id, "--text")
    lines = readable.stdout.splitlines()
    assert len(lines) == len(kinds)
    assert "run.requeued" in lines[kinds.index("run.requeued")]
    assert '"payload": "Jaws"' in lines[kinds.index("interrupt.answered")]


def test_a_failed_notification_is_listed_then_sent_again(
        isolated: Callable[..., LaybySystem], tmp_path: Path) -> None:
    hooks = WebhookReceiver()  # nobody listens on its port yet
    rs = reviewed_system(isolated(), tmp_path / "reviewed", SmtpServer(), hooks,
                         LAYBY_NOTIFY_ATTEMPTS="1")
    system = rs.system
    try:
        run_id = rs.start_run("test.named", "hookbot")["id"]
        rs.parked(run_id)

        def failed() -> list[dict]:
            return [f for f in _stuck(system) if f["runId"] == run_id
                    and f["kind"] == "notification_failed"]

        (finding,) = wait_until(failed, 30, every=0.5, what="the failed notification")
        assert finding["detail"]["reviewer"] == "hookbot"
        assert finding["detail"]["channel"] == "webhook"
        assert finding["fix"] == f"layby ops retry-notifications {run_id}"
        note_id = finding["detail"]["notificationId"]

        hooks.start()
        retried = layby(system, "ops", "retry-notifications", run_id)
        assert retried.returncode == 0, retried.stderr
        assert f"{run_id}  {note_id}  sent again" in retried.stdout
        (delivery,) = hooks.wait_for(run_id, timeout=30)
        assert delivery.verified and delivery.headers["webhook-id"] == note_id
        note = wait_until(lambda: [n for n in system.run(run_id)["notifications"]
                                   if n["id"] == note_id and n["state"] == "sent"], 20,
                          what="the notification sent")[0]
        assert note["attempts"] == 1
        assert not failed()
        again = layby(system, "ops", "retry-notifications", run_id)
        assert "no failed notification to retry" in again.stdout
        kinds = [json.loads(line)["type"] for line in
                 layby(system, "runs", "events", run_id).stdout.splitlines()]
        assert kinds.index("notification.failed") < kinds.index("notifications.retried") \
            < kinds.index("notification.sent")
    finally:
        hooks.stop()


def test_retry_and_purge_refuse_or_report_clearly(system: LaybySystem) -> None:
    neither = layby(system, "ops", "retry-notifications")
    assert neither.returncode == 2 and "give a RUN_ID or --all" in neither.stderr
    unknown = layby(system, "ops", "retry-notifications", "run_nobody_made")
    assert unknown.returncode == 1 and "no run 'run_nobody_made'" in unknown.stderr
    everyone = layby(system, "ops", "retry-notifications", "--all")
    assert everyone.returncode == 0, everyone.stderr

    dry = layby(system, "ops", "purge", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("would purge: ") and "completed" in dry.stdout
    done = layby(system, "ops", "purge")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("purged ")


def test_purge_drops_finished_runs_past_retention(
        isolated: Callable[..., LaybySystem]) -> None:
    system = isolated(LAYBY_RETENTION_S="3").start()
    system.procs["sweeper"].stop()  # or it prunes first
    run_id = system.start_run("test.loop", "go round")["id"]
    system.wait_status(run_id, "failed")
    client = redis.Redis.from_url(system.redis_url, decode_responses=True)
    failed = keys_of(client, "layby").shard_of(run_id).index(Status.FAILED)
    assert client.zscore(failed, run_id) is not None
    wait_until(lambda: "1 failed" in layby(system, "ops", "purge", "--dry-run").stdout,
               15, every=0.5, what="the run past retention")
    done = layby(system, "ops", "purge")
    assert done.returncode == 0, done.stderr
    assert "purged 1 index entry" in done.stdout
    assert client.zscore(failed, run_id) is None
    assert "would purge: 0 completed, 0 failed, 0 cancelled" in layby(
        system, "ops", "purge", "--dry-run").stdout
