"""Which run a worker's log lines are about: Celery's prerun and postrun signals set the ids
(`layby.broker_config.logs`) from the task's own arguments, or from a background job's header.

Every layby task takes ids as arguments (`run_id`, `notification_id`), so binding the
arguments to the task's signature finds them without each task repeating it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from celery import Task
from celery.signals import task_postrun, task_prerun

from layby.broker_config.logs import IDS, set_about
from layby.tasks.jobs import job_of


@lru_cache(maxsize=512)
def _signature(run: Callable[..., Any]) -> inspect.Signature:
    """A task's signature, read once a process (it was 4 % of a worker's step)."""
    return inspect.signature(run)


def _ids_in(task: Task[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    try:
        bound = _signature(task.run).bind_partial(*args, **kwargs).arguments
    except TypeError:  # the task will fail on its arguments; say which task it was anyway
        bound = {}
    return {k: v for k, v in bound.items() if k in IDS and isinstance(v, str)}


def connect() -> None:
    """Every task's log lines carry its ids (once per process)."""
    task_prerun.connect(_about_the_task, weak=False, dispatch_uid="layby.log_ids")
    task_postrun.connect(_forget_the_task, weak=False, dispatch_uid="layby.log_ids.end")


def _about_the_task(sender: Task[..., Any] | None = None, task_id: str | None = None,
                    args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None,
                    **_: Any) -> None:
    if sender is None:
        return
    ids = _ids_in(sender, tuple(args or ()), dict(kwargs or {}))
    set_about(**{**ids, **(job_of(sender) or {}), "task_id": task_id, "task_name": sender.name})


def _forget_the_task(**_: Any) -> None:
    set_about()
