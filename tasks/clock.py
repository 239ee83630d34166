"""The Celery app of the sweeper: `celery -A layby.tasks.clock worker -Q layby.sweep -P solo`
(what `layby sweeper` and `layby worker --beat` run). It is `layby.tasks.app`'s app with the
sweeper's clock on: a worker started from here sweeps every LAYBY_SWEEP_INTERVAL_S, from
ready to shutdown. A process's entry point, as `layby.tasks.app` is; nothing imports it.
"""

from layby.tasks import sweep_on_own_clock
from layby.tasks.app import app, runtime

sweep_on_own_clock(runtime)

__all__ = ["app"]
