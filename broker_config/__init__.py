"""layby.broker_config: layby's settings (`LAYBY_*`), and its Celery app, built by one function
(`make_celery`), with its queues, routes and task names. Nothing at import.

Workers, the sweeper and Flower find the built app with `celery -A layby.tasks.app`.
"""

from layby.broker_config.celery_app import (
    CELERY_ENTRY,
    SWEEPER_ENTRY,
    celery_argv,
    celery_config,
    make_celery,
    worker_queues,
)
from layby.broker_config.names import (
    DELIVER_TASK,
    JOBS,
    NOTIFY,
    NOTIFY_TASK,
    QUEUES,
    RESUME_RUN,
    RUN_TURN,
    SLACK_TASK,
    START_RUN,
    SWEEP,
    SWEEP_TASK,
    TURNS,
    pinned_queue,
)
from layby.broker_config.settings import Settings

__all__ = ["CELERY_ENTRY", "DELIVER_TASK", "JOBS", "NOTIFY", "NOTIFY_TASK", "QUEUES",
           "RESUME_RUN", "RUN_TURN", "SLACK_TASK", "START_RUN", "SWEEP", "SWEEPER_ENTRY",
           "SWEEP_TASK", "TURNS", "Settings", "celery_argv", "celery_config", "make_celery",
           "pinned_queue", "worker_queues"]
