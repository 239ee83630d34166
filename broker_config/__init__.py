"""broker_config: the Celery app, kombu queues and routes, and layby's settings.

`celery -A broker_config worker|beat|flower` finds the app here.
"""

from layby.broker_config.celery_app import (
    DELIVER_TASK,
    JOBS,
    NOTIFY,
    NOTIFY_TASK,
    QUEUES,
    RESUME_RUN,
    RUN_TURN,
    START_RUN,
    SWEEP,
    SWEEP_TASK,
    TURNS,
    app,
    celery_argv,
    make_app,
    worker_queues,
)
from layby.broker_config.settings import Settings, get_settings

__all__ = ["DELIVER_TASK", "JOBS", "NOTIFY", "NOTIFY_TASK", "QUEUES", "RESUME_RUN", "RUN_TURN", "START_RUN", "SWEEP",
           "SWEEP_TASK", "TURNS", "Settings", "app", "celery_argv", "get_settings", "make_app",
           "worker_queues"]
