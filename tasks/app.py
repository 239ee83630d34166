"""The Celery app of layby's worker, sweeper and Flower processes: `celery -A layby.tasks.app`
(what `layby worker`, `layby sweeper` and `layby flower` run).

Celery's command line finds its app by importing a module, so this one builds it at import,
from the LAYBY_* settings: it is a process's entry point, and nothing else imports it.
"""

from layby.broker_config.celery_app import log_like_layby, trace_like_layby
from layby.control import build
from layby.tasks import register

runtime = build()
log_like_layby(runtime.settings)
trace_like_layby()
app = register(runtime)
