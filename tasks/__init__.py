"""layby.tasks: layby's Celery tasks, thin: claim, call `layby.generation`, commit through
`layby.parking`, hand on. `register(runtime)` puts them on the runtime's Celery app; the
Celery command line finds that app in `layby.tasks.app`. Names are public and stable
(`layby.broker_config.names` lists them with their queues and arguments).

Other services enqueue runs with `send_task("layby.start_run", args=[agent, input])`; a run
id given as `run_id` lets them find it later. A redelivered `layby.start_run` does not
start a second run: the task id is its idempotency key.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import suppress
from typing import Any

from celery import Celery
from celery.signals import celeryd_after_setup, worker_init, worker_ready, worker_shutdown
from redis import RedisError

from layby.broker_config import (
    DELIVER_TASK,
    NOTIFY_TASK,
    RESUME_RUN,
    RUN_TURN,
    SLACK_TASK,
    START_RUN,
    SWEEP_TASK,
    TURNS,
)
from layby.broker_config.celery_app import worker_kind
from layby.control import Runtime, commands
from layby.notifier import delivery, planning, slack_messages
from layby.parking import migrations
from layby.parking.formats import FormatError
from layby.tasks import context, jobs
from layby.tasks.heartbeat import beat_worker
from layby.tasks.steps import advance
from layby.tasks.sweeper import sweep, tick


def register(rt: Runtime) -> Celery:
    """layby's tasks on `rt.celery`, the handlers that record background jobs' results, and
    the run ids on log lines. Returns the app."""
    app = rt.celery
    _step_tasks(rt)
    _notification_tasks(rt)
    jobs.connect(rt)
    context.connect()
    _refuse_an_unreadable_store(rt)
    _read_pinned_queues(rt)
    _beat_while_up(rt)
    # The reviewer policy, read now in the main process: pool children forked from it start
    # with these rules, so a rules file broken later leaves every child the rules it had.
    rt.reviewers.policy()
    return app


def _step_tasks(rt: Runtime) -> None:
    """The tasks of the turns and sweep queues: a run's start, its steps, the sweep."""
    app = rt.celery

    @app.task(name=START_RUN, bind=True)
    def start_run(self: Any, agent: str, input: Any = None,
                  metadata: dict[str, Any] | None = None, run_id: str | None = None) -> str:
        view, _ = commands.start_run(rt, agent, input=input, metadata=metadata, run_id=run_id,
                                     idempotency_key=f"celery:{self.request.id}")
        return view.id

    @app.task(name=RUN_TURN, bind=True)
    def run_turn(self: Any, run_id: str, version: int) -> str:
        return advance(rt, run_id, int(version), self.request.id)

    @app.task(name=RESUME_RUN, bind=True)
    def resume_run(self: Any, run_id: str, version: int) -> str:
        return advance(rt, run_id, int(version), self.request.id)

    @app.task(name=SWEEP_TASK, ignore_result=True)
    def sweep_task() -> dict[str, int]:
        return sweep(rt)


def _notification_tasks(rt: Runtime) -> None:
    """The tasks of the notify queue (`layby.notify.*`): a park's announcements planned,
    one notification delivered, a run's Slack messages brought up to date."""
    app = rt.celery

    @app.task(name=NOTIFY_TASK, bind=True)
    def notify_interrupts(self: Any, run_id: str, version: int) -> int:
        """Announce a parked run's interrupts to their reviewers (`version`: the park's).
        Its outbox entry (the task id) is acked only once planned: until then the sweeper
        publishes it again, and planning twice plans nothing new."""
        planned = planning.plan(rt.store, rt.settings, rt.reviewers, run_id)
        sent = delivery.dispatch(app, [(run_id, n) for n in planned])
        rt.store.outbox.ack_outbox([(run_id, self.request.id)])
        return sent

    @app.task(name=DELIVER_TASK)
    def deliver_notification(run_id: str, notification_id: str) -> str:
        return delivery.deliver(rt.store, rt.settings, rt.reviewers, run_id, notification_id)

    @app.task(name=SLACK_TASK)
    def update_slack(run_id: str, interrupt_ids: list[str], approval: bool = False) -> int:
        """Bring the run's Slack messages up to date after answers (on any channel)."""
        view = rt.store.runs.view(run_id)
        if view is None or not rt.settings.slack:
            return 0
        return slack_messages.refresh(rt.settings, rt.reviewers, view, interrupt_ids,
                             approval=approval)


def _refuse_an_unreadable_store(rt: Runtime) -> None:
    """A worker whose code cannot read the store's format exits before it takes a message
    (one line, exit code 2), rather than fail every task it is given."""

    def init(**_: Any) -> None:
        try:
            rt.store  # noqa: B018 (made, it has checked the format)
        except FormatError as exc:
            print(f"layby worker: error: {exc.message}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        except RedisError:
            pass  # away for now: the worker waits for it, and the store checks on first use

    worker_init.connect(init, weak=False, dispatch_uid=f"layby.format.{id(rt.celery)}")


def _takes_steps(app: Celery) -> bool:
    return TURNS in app.amqp.queues.consume_from


def _read_pinned_queues(rt: Runtime) -> None:
    """A worker that takes steps also reads the queues of the runs pinned to the versions
    it hosts (`layby.turns@<version>`), however its queues were chosen (`-Q`, `layby up`)."""

    def after_setup(sender: Any, instance: Any, **_: Any) -> None:
        if _takes_steps(instance.app):
            for name in rt.pinned_queues:
                instance.app.amqp.queues.select_add(name)

    celeryd_after_setup.connect(after_setup, weak=False,
                                dispatch_uid=f"layby.pinned.{id(rt.celery)}")


def _beat_while_up(rt: Runtime) -> None:
    """The worker's own heartbeat (`heartbeat.beat_worker`), from ready to shutdown; one
    that takes steps tells which agent versions it hosts with each beat."""
    stop = threading.Event()

    # The process id too: a worker started again under the same node name (by a supervisor)
    # is another process, and the dead one's beat must lapse.
    def ready(sender: Any, **_: Any) -> None:
        beat_worker(lambda: rt.store, f"{sender.hostname}:{os.getpid()}", migrations.newest(),
                    rt.settings.heartbeat_interval_s, stop,
                    hosting=rt.hosted if _takes_steps(sender.app) else None,
                    kind=worker_kind(sender.app))

    def shutdown(sender: Any, **_: Any) -> None:
        # A warm shutdown gives reserved messages back to the queue: nothing to reap.
        stop.set()
        with suppress(Exception):
            rt.store.processes.forget_worker(f"{sender.hostname}:{os.getpid()}")

    worker_ready.connect(ready, weak=False, dispatch_uid=f"layby.beat.{id(rt.celery)}")
    worker_shutdown.connect(shutdown, weak=False,
                            dispatch_uid=f"layby.beat.end.{id(rt.celery)}")


def sweep_on_own_clock(rt: Runtime) -> None:
    """The sweeper's clock (`sweeper.tick`) in this worker, from ready to shutdown: what the
    sweeper's entry (`layby.tasks.clock`) turns on, for the one worker a deployment sweeps
    in. Not on by reading the sweep queue: every worker started from `layby.tasks.app`
    would become a sweeper then."""
    stop = threading.Event()

    def ready(sender: Any, **_: Any) -> None:
        tick(rt, rt.settings.sweep_interval_s, stop)

    worker_ready.connect(ready, weak=False, dispatch_uid=f"layby.sweep.{id(rt.celery)}")
    worker_shutdown.connect(lambda **_: stop.set(), weak=False,
                            dispatch_uid=f"layby.sweep.end.{id(rt.celery)}")


__all__ = ["register", "sweep_on_own_clock"]
