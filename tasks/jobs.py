"""Background jobs: any Celery task started by a tool, whose end answers the tool's interrupt.

The job is sent with a `layby_job` header naming its run and interrupt. When it ends on a
worker that runs layby's app (success, or failure after its retries), the signal handlers
connected by `connect` record its result (or error) as the interrupt's answer, directly in
Redis: the result never travels in a task message. A job that ends before the run has
parked leaves its answer waiting; the park applies it. Jobs are plain Celery tasks in the
user's modules (`@shared_task(name=…)`), which import nothing of layby.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import redis
from celery import Celery, Task
from celery.signals import task_failure, task_success

from layby.control import Runtime, commands
from layby.generation.tools import JobRequest
from layby.parking.failover import through_failover

log = logging.getLogger(__name__)
HEADER = "layby_job"


def starter(app: Celery) -> Any:
    """What a step hands tools to start jobs with (`ctx.start_job`)."""

    def start_job(request: JobRequest) -> None:
        app.send_task(request.task, args=list(request.args), kwargs=request.kwargs,
                      task_id=request.job_id,
                      headers={HEADER: {"run_id": request.run_id,
                                        "interrupt_id": request.interrupt_id}})

    return start_job


def job_of(task: Task[..., Any] | None) -> dict[str, str] | None:
    if task is None or task.request is None:
        return None
    found = getattr(task.request, HEADER, None) or (task.request.headers or {}).get(HEADER)
    return found if isinstance(found, dict) else None


def _plain(value: Any) -> Any:
    """JSON data as stored; a result that is not JSON is kept as its text."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return repr(value)


def connect(rt: Runtime) -> None:
    """Record the end of every job that runs on `rt.celery`."""

    def record(sender: Task[..., Any], job: dict[str, str], **outcome: Any) -> None:
        # The job's answer exists nowhere else: ride out a Redis failover before giving up.
        try:
            code = through_failover(commands.answer_job, rt, job["run_id"],
                                    job["interrupt_id"], task=sender.name, **outcome)
        except redis.RedisError:
            log.exception("could not record the end of job %s for run %s; the interrupt "
                          "stays open until its expiry", sender.name, job["run_id"])
            return
        log.info("job %s for run %s answered interrupt %s: %s", sender.name, job["run_id"],
                 job["interrupt_id"], code)

    def ours(sender: Task[..., Any] | None) -> dict[str, str] | None:
        job = job_of(sender)
        return job if job is not None and getattr(sender, "app", None) is rt.celery else None

    def succeeded(sender: Task[..., Any] | None = None, result: Any = None, **_: Any) -> None:
        job = ours(sender)
        if sender is not None and job is not None:
            record(sender, job, result=_plain(result))

    def failed(sender: Task[..., Any] | None = None, exception: BaseException | None = None,
               **_: Any) -> None:
        job = ours(sender)
        if sender is not None and job is not None:
            record(sender, job, error=f"{type(exception).__name__}: {exception}")

    # Once per app: registering a runtime's tasks again must not record every job twice.
    task_success.connect(succeeded, weak=False, dispatch_uid=f"layby.jobs.{id(rt.celery)}")
    task_failure.connect(failed, weak=False, dispatch_uid=f"layby.jobs.{id(rt.celery)}")
