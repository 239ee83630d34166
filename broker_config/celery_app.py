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
"""

from __future__ import annotations

import sys
from typing import Any

from celery import Celery, signals
from kombu import Exchange, Queue

from layby.broker_config import logs, transport
from layby.broker_config.settings import Settings, get_settings, is_sentinel_url

transport.install()

TURNS = "layby.turns"
NOTIFY = "layby.notify"
SWEEP = "layby.sweep"
JOBS = "layby.jobs"
QUEUES = (TURNS, NOTIFY, SWEEP, JOBS)

START_RUN = "layby.start_run"
RUN_TURN = "layby.run_turn"
RESUME_RUN = "layby.resume_run"
SWEEP_TASK = "layby.sweep"
NOTIFY_TASK = "layby.notify.interrupts"
DELIVER_TASK = "layby.notify.deliver"

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def worker_queues(settings: Settings | None = None) -> list[str]:
    """What a worker reads by default: every layby queue but the sweeper's, and the intake."""
    settings = settings or get_settings()
    return [TURNS, JOBS, NOTIFY] + ([settings.intake_queue] if settings.intake_queue else [])


def celery_argv(log_format: str | None = None) -> list[str]:
    """`python -m celery -A broker_config`, the start of every worker, sweeper and Flower
    command line; without banners when logs are JSON, so every line of their output parses."""
    quiet = (log_format or get_settings().log_format) == "json"
    return [sys.executable, "-m", "celery", "-A", "layby.broker_config",
            *(["--quiet"] if quiet else [])]


def celery_config(settings: Settings) -> dict[str, object]:
    url = settings.resolved_redis_url() or DEFAULT_REDIS_URL
    exchange = Exchange("layby", type="direct")
    return {
        "broker_url": url,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        "broker_transport_options": {
            "visibility_timeout": settings.visibility_timeout_s,
            "socket_timeout": settings.redis_socket_timeout_s,
            "socket_connect_timeout": 10,
            "socket_keepalive": True,
            "health_check_interval": settings.redis_health_check_interval_s,
            "retry_on_timeout": True,
            **({"global_keyprefix": settings.broker_key_prefix}
               if settings.broker_key_prefix else {}),
            **({"master_name": settings.redis_sentinel_master,
                "sentinel_kwargs": settings.sentinel_kwargs()}
               if is_sentinel_url(url) else {}),
        },
        "task_acks_late": True,
        "task_retry_on_worker_lost": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "task_ignore_result": True,
        "task_serializer": "json",
        "accept_content": ["json"],
        "task_queues": [Queue(q, exchange, routing_key=q) for q in QUEUES]
                       + ([Queue(settings.intake_queue)] if settings.intake_queue else []),
        "task_default_queue": JOBS,
        "task_default_exchange": "layby",
        "task_default_routing_key": JOBS,
        "task_routes": {
            START_RUN: {"queue": TURNS, "routing_key": TURNS},
            RUN_TURN: {"queue": TURNS, "routing_key": TURNS},
            RESUME_RUN: {"queue": TURNS, "routing_key": TURNS},
            SWEEP_TASK: {"queue": SWEEP, "routing_key": SWEEP},
            "layby.notify.*": {"queue": NOTIFY, "routing_key": NOTIFY},
        },
        "beat_schedule": {
            "layby-sweep": {"task": SWEEP_TASK, "schedule": settings.sweep_interval_s,
                            "options": {"expires": max(5.0, settings.sweep_interval_s * 5)}},
        },
        "worker_hijack_root_logger": False,
    }


@signals.setup_logging.connect
def _configure_logs(loglevel: Any = None, **_: Any) -> None:
    # Connected, so Celery leaves logging to layby: workers, the sweeper and beat write
    # the same format as the gateway (text or JSON, with ids), at `-l`'s level.
    logs.configure(get_settings(), level=loglevel)


@signals.celeryd_init.connect
def _configure_logs_early(options: dict[str, Any] | None = None, **_: Any) -> None:
    # Before the worker's first warnings (running as root, say), which come ahead of its
    # logging setup and would otherwise be the one plain-text line in a JSON log.
    logs.configure(get_settings(), level=(options or {}).get("loglevel"))


def make_app(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    app = Celery("layby", include=["layby.tasks", *settings.task_modules])
    app.conf.update(celery_config(settings))
    return app


app = make_app()
