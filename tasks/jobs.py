"""Background jobs: any Celery task started by a tool, whose end answers the tool's interrupt.

The job is sent with a `layby_job` header naming its run and interrupt. When it ends on a
worker that loaded layby (success, or failure after its retries), the signal handlers below
record its result (or error) as the interrupt's answer, directly in Redis: the result never
travels in a task message. A job that ends before the run has parked leaves its answer
waiting; the park applies it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import redis

from celery import Task
from celery.signals import task_failure, task_success

from layby.broker_config import app
from layby.control import commands, runtime
from layby.generation.tools import JobRequest

log = logging.getLogger(__name__)
HEADER = "layby_job"


def start_job(request: JobRequest) -> None:
    app.send_task(request.task, args=list(request.args), kwargs=request.kwargs,
                  task_id=request.job_id,
                  headers={HEADER: {"run_id": request.run_id,
                                    "interrupt_id": request.interrupt_id}})


def job_of(task: Task | None) -> dict[str, str] | None:
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


def _record(sender: Task, job: dict[str, str], **outcome: Any) -> None:
    """The job's answer exists nowhere else: ride out a Redis failover before giving up."""
    try:
        code = runtime.through_failover(commands.answer_job, job["run_id"],
                                        job["interrupt_id"], task=sender.name, **outcome)
    except redis.RedisError:
        log.exception("could not record the end of job %s for run %s; the interrupt stays "
                      "open until its expiry", sender.name, job["run_id"])
        return
    log.info("job %s for run %s answered interrupt %s: %s", sender.name, job["run_id"],
             job["interrupt_id"], code)


@task_success.connect
def _job_succeeded(sender: Task | None = None, result: Any = None, **_: Any) -> None:
    job = job_of(sender)
    if sender is not None and job is not None:
        _record(sender, job, result=_plain(result))


@task_failure.connect
def _job_failed(sender: Task | None = None, exception: BaseException | None = None,
                **_: Any) -> None:
    job = job_of(sender)
    if sender is not None and job is not None:
        _record(sender, job, error=f"{type(exception).__name__}: {exception}")
