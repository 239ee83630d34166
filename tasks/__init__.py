"""tasks: layby's Celery tasks, thin. Their names are public and stable.

| name               | queue        | arguments                                   |
|--------------------|--------------|---------------------------------------------|
| layby.start_run    | layby.turns  | agent, input, metadata?, run_id?            |
| layby.run_turn     | layby.turns  | run_id, version                             |
| layby.resume_run   | layby.turns  | run_id, version                             |
| layby.sweep        | layby.sweep  | (none)                                      |
| layby.notify.interrupts | layby.notify | run_id, version (plans the announcements) |
| layby.notify.deliver    | layby.notify | run_id, notification_id                   |

Other services enqueue runs with `send_task("layby.start_run", args=[agent, input])`; a run
id given as `run_id` lets them find it later. A redelivered `layby.start_run` does not
start a second run: the task id is its idempotency key.
"""

from __future__ import annotations

from typing import Any

from layby.broker_config import (
    DELIVER_TASK,
    NOTIFY_TASK,
    RESUME_RUN,
    RUN_TURN,
    START_RUN,
    SWEEP_TASK,
    app,
)
from layby.control import commands, runtime
from layby.notifier import delivery, planning
from layby.tasks import context as _context  # noqa: F401  (log lines carry the run's ids)
from layby.tasks import jobs as _jobs  # noqa: F401  (connects the job signal handlers)
from layby.tasks.steps import advance
from layby.tasks.sweeper import sweep as _sweep


@app.task(name=START_RUN, bind=True)
def start_run(self: Any, agent: str, input: Any = None, metadata: dict[str, Any] | None = None,
              run_id: str | None = None) -> str:
    view, _ = commands.start_run(agent, input=input, metadata=metadata, run_id=run_id,
                                 idempotency_key=f"celery:{self.request.id}")
    return view.id


@app.task(name=RUN_TURN, bind=True)
def run_turn(self: Any, run_id: str, version: int) -> str:
    return advance(run_id, int(version), self.request.id)


@app.task(name=RESUME_RUN, bind=True)
def resume_run(self: Any, run_id: str, version: int) -> str:
    return advance(run_id, int(version), self.request.id)


@app.task(name=SWEEP_TASK, ignore_result=True)
def sweep() -> dict[str, int]:
    return _sweep()


@app.task(name=NOTIFY_TASK, bind=True)
def notify_interrupts(self: Any, run_id: str, version: int) -> int:
    """Announce a parked run's interrupts to their reviewers (`version`: the park's). Its
    outbox entry (the task id) is acked only once planned: until then the sweeper publishes
    it again, and planning twice plans nothing new."""
    sent = delivery.dispatch([(run_id, n) for n in planning.plan(run_id)])
    runtime.store().ack_outbox([self.request.id])
    return sent


@app.task(name=DELIVER_TASK)
def deliver_notification(run_id: str, notification_id: str) -> str:
    return delivery.deliver(run_id, notification_id)
