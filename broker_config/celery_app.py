"""The Celery app: queues, routes and the settings that keep tasks from being lost.

Model turns, notifications, sweeps and background jobs each have their own queue, so a
sweep or a notification never waits behind model calls. Task names are public and stable:
other services enqueue by name with `send_task`, knowing only the broker URL: such a
message lands on Celery's default queue (`celery`, the intake), which the turns worker
reads too, and the broker's keys carry no prefix unless LAYBY_BROKER_KEY_PREFIX says so.

A `sentinel://…;sentinel://…` URL is kombu's Sentinel transport: the options below name the
primary (`master_name`) and how to reach the sentinels (`sentinel_kwargs`, whose password
Celery masks in `inspect conf` and Flower, as it masks the URL's). Both schemes run on
kombu's Redis transports with a fix that keeps a worker reconnecting after it loses the
broker mid-task (`broker_config.transport`).

Nothing here runs at import: `make_celery(settings)` builds the app (`layby.control.runtime.
build` calls it), and the Celery command line finds it in `layby.tasks.app`.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Any

from celery import Celery, signals
from kombu import Exchange, Queue

from layby.broker_config import logs, tracing, transport
from layby.broker_config.events import CONSUMER
from layby.broker_config.names import (
    JOBS,
    NOTIFY,
    QUEUES,
    RESUME_RUN,
    RUN_TURN,
    START_RUN,
    SWEEP,
    SWEEP_TASK,
    TURNS,
)
from layby.broker_config.settings import Settings, is_sentinel_url
from layby.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
# What `celery -A` loads in layby's worker, sweeper and Flower processes (it builds the app).
CELERY_ENTRY = "layby.tasks.app"
# The same app with the sweeper's clock: a worker started from it sweeps on its own clock
# (`layby sweeper`, `layby worker --beat`); one started from CELERY_ENTRY never does,
# whatever queues it reads, so a deployment has the one sweeper it starts.
SWEEPER_ENTRY = "layby.tasks.clock"


def worker_queues(settings: Settings) -> list[str]:
    """What a worker reads by default: every layby queue but the sweeper's, and the intake."""
    return [TURNS, JOBS, NOTIFY] + ([settings.intake_queue] if settings.intake_queue else [])


def celery_argv(settings: Settings, entry: str = CELERY_ENTRY) -> list[str]:
    """`python -m celery -A layby.tasks.app` (or the sweeper's entry), the start of every
    worker, sweeper and Flower command line; without banners when logs are JSON, so every
    line of their output parses."""
    quiet = settings.log_format == "json"
    return [sys.executable, "-m", "celery", "-A", entry, *(["--quiet"] if quiet else [])]


def celery_config(settings: Settings) -> dict[str, object]:
    url = settings.resolved_broker_url() or DEFAULT_REDIS_URL
    amqp = settings.broker_is_amqp
    # RabbitMQ's quorum queues are replicated and durable; Celery 5.5+ sees them and sends
    # countdowns (a user's task retrying later, say) through its native delayed delivery,
    # which binds topic exchanges only. A routing key is a queue's whole name either way.
    exchange = Exchange("layby", type="topic" if amqp else "direct")
    queue_arguments = {"x-queue-type": "quorum"} if amqp else None
    return {
        "broker_url": url,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        "broker_transport_options": _amqp_options() if amqp else _redis_options(settings, url),
        "task_acks_late": True,
        "task_retry_on_worker_lost": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        # Task events for Flower, one message a task (broker_config.events), unless a
        # deployment turns them off.
        "worker_send_task_events": settings.task_events,
        "task_send_sent_event": settings.task_events,
        "worker_consumer": CONSUMER,
        "task_ignore_result": True,
        "task_serializer": "json",
        "accept_content": ["json"],
        "task_queues": _task_queues(settings, exchange, queue_arguments),
        "task_default_queue": JOBS,
        "task_default_exchange": "layby",
        "task_default_exchange_type": exchange.type,
        # The queues made as they are named (pinned runs' `layby.turns@<version>`) are of
        # the same kind as the others.
        **({"task_create_missing_queue_type": "quorum"} if amqp else {}),
        "task_default_routing_key": JOBS,
        "task_routes": _task_routes(),
        # No beat schedule: the sweeper sweeps on its own clock (`layby.tasks`), so no task
        # goes through the broker, and into Flower's task list, every second.
        "worker_hijack_root_logger": False,
    }


def _task_queues(settings: Settings, exchange: Exchange,
                 queue_arguments: dict[str, str] | None) -> list[Queue]:
    """layby's queues, and the intake queue where one is set, all of one kind."""
    return ([Queue(q, exchange, routing_key=q, queue_arguments=queue_arguments)
             for q in QUEUES]
            + ([Queue(settings.intake_queue, queue_arguments=queue_arguments)]
               if settings.intake_queue else []))


def _task_routes() -> dict[str, dict[str, str]]:
    """The queues layby's own tasks go to, unless their sender names one."""
    return {
        START_RUN: {"queue": TURNS, "routing_key": TURNS},
        RUN_TURN: {"queue": TURNS, "routing_key": TURNS},
        RESUME_RUN: {"queue": TURNS, "routing_key": TURNS},
        SWEEP_TASK: {"queue": SWEEP, "routing_key": SWEEP},
        "layby.notify.*": {"queue": NOTIFY, "routing_key": NOTIFY},
    }


def _redis_options(settings: Settings, url: str) -> dict[str, Any]:
    # No `retry_on_timeout`: with it redis-py retries a failed read on a new connection,
    # and a pub/sub read (Celery's remote control) then waits with no timeout, stopping
    # the worker's event loop for good after the server dropped it (a restart, CLIENT
    # KILL). Without, the error reaches the consumer, which reconnects as a whole.
    return {
        "visibility_timeout": settings.visibility_timeout_s,
        "socket_timeout": settings.redis_socket_timeout_s,
        "socket_connect_timeout": 10,
        "socket_keepalive": True,
        "health_check_interval": settings.redis_health_check_interval_s,
        **({"global_keyprefix": settings.broker_key_prefix}
           if settings.broker_key_prefix else {}),
        **({"master_name": settings.resolved_broker_sentinel_master,
            "sentinel_kwargs": settings.sentinel_kwargs()}
           if is_sentinel_url(url) else {}),
    }


def _amqp_options() -> dict[str, Any]:
    # A publish returns once RabbitMQ has the message (publisher confirms): the outbox
    # entry is acked only after that.
    return {"confirm_publish": True}


def make_celery(settings: Settings) -> Celery:
    """layby's Celery app for `settings`: queues, routes, the loss guards, and the user's task
    modules (LAYBY_TASK_MODULES), imported when a worker starts. Registers no task (see
    `layby.tasks.register`)."""
    transport.install()
    app = Celery("layby", include=list(settings.task_modules))
    app.conf.update(celery_config(settings))
    if settings.broker_is_amqp:
        _declare_every_queue(app)
    return app


def _declare_every_queue(app: Celery) -> None:
    """On RabbitMQ, a worker declares every layby queue before its consumer starts: Celery's
    native delayed delivery binds them all, and fails on one nobody declared yet (the
    sweeper's, while no sweeper ever started)."""

    def declare(**_: Any) -> None:
        with app.connection_for_write() as conn:
            errors: tuple[type[BaseException], ...] = (
                *conn.connection_errors, *conn.channel_errors, OSError)
            try:
                # A channel of its own, one try: the default one would wait for ever.
                channel: Any = conn.channel()
                try:
                    for queue in app.amqp.queues.values():
                        queue(channel).declare()
                finally:
                    with contextlib.suppress(*errors):
                        channel.close()
            except errors as exc:  # the broker away: the consumer declares its own queues
                log.warning("could not declare layby's queues on the broker (%s)", exc)

    signals.worker_init.connect(declare, weak=False, dispatch_uid=f"layby.declare.{id(app)}")


def worker_kind(app: Any) -> str:
    """What a Celery worker of layby's is to the registry of processes, /metrics and traces:
    `sweeper` when it reads the sweep queue alone, else `worker`."""
    queues = getattr(getattr(app, "amqp", None), "queues", None)
    return "sweeper" if set(getattr(queues, "consume_from", None) or ()) == {SWEEP} \
        else "worker"


def trace_like_layby() -> None:
    """Workers and the sweeper trace when the OTEL_* variables ask (`tracing`): set up as
    the worker starts, before its pool forks (the SDK's exporter thread starts again in each
    child), with Celery's instrumentation continuing each message's trace."""

    def start(sender: Any = None, **_: Any) -> None:
        try:
            traced = tracing.configure(worker_kind(getattr(sender, "app", None)))
        except ConfigError as exc:
            # `layby worker` refused this before it started Celery; a worker started by
            # `celery -A` directly runs on, untraced, and says why once.
            log.error("traces off: %s", exc.message)
            return
        if traced:
            tracing.instrument_celery()

    def flush(**_: Any) -> None:
        # A pool child leaves through os._exit, past the SDK's atexit: the spans it still
        # holds are sent now, or never.
        tracing.flush()

    signals.worker_init.connect(start, weak=False, dispatch_uid="layby.traces")
    signals.worker_process_shutdown.connect(flush, weak=False,
                                            dispatch_uid="layby.traces.flush")
    signals.worker_shutdown.connect(flush, weak=False, dispatch_uid="layby.traces.flush.main")


def log_like_layby(settings: Settings) -> None:
    """Workers, the sweeper and beat write the same format as the gateway (text or JSON,
    with ids), at `-l`'s level: connected, Celery leaves logging to layby. For processes
    Celery's command line starts (`layby.tasks.app`); a library user's process keeps its
    own logging."""

    def configure(loglevel: Any = None, **_: Any) -> None:
        logs.configure(settings, level=loglevel)

    def configure_early(options: dict[str, Any] | None = None, **_: Any) -> None:
        # Before the worker's first warnings (running as root, say), which come ahead of
        # its logging setup and would otherwise be the one plain-text line in a JSON log.
        logs.configure(settings, level=(options or {}).get("loglevel"))

    signals.setup_logging.connect(configure, weak=False, dispatch_uid="layby.logs")
    signals.celeryd_init.connect(configure_early, weak=False, dispatch_uid="layby.logs.early")
