"""Flower's configuration file for layby (`layby flower` passes it with --conf, so a stray
flowerconfig.py in the working directory is not read). It sets no secrets and no address:
those come from the environment (FLOWER_BASIC_AUTH, FLOWER_AUTH, FLOWER_OAUTH2_*) and the
command line. Its log lines take layby's format (text, or JSON lines).

The tasks page shows each task's arguments (`tasks_columns`). `format_task` keeps what
people type out of Flower's pages: layby's own messages carry ids
only, but another service's `send_task("layby.start_run", args=[agent, input])` carries the
user's request; the pages show its agent and run id only.
"""

from __future__ import annotations

import ast
from typing import Any

from layby.broker_config import Settings, logs

# Flower logs like every layby process (LAYBY_LOG_FORMAT): this file is read after tornado
# set up its own handler, which this replaces (tornado adds none when one is there).
logs.configure(Settings())

_REDACTED = "…"

# The tasks page shows each task's arguments: layby's are a run's ids and its agent
# (`broker_config.messages`), so an operator sees, and searches by, which run a step served.
tasks_columns = "name,uuid,state,args,received,runtime,worker"


def _literal(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None


def format_task(task: Any) -> Any:
    if getattr(task, "name", None) != "layby.start_run":
        return task
    args = _literal(task.args)
    kwargs = _literal(task.kwargs)
    agent = args[0] if isinstance(args, (list, tuple)) and args else None
    run_id = args[3] if isinstance(args, (list, tuple)) and len(args) > 3 else None
    if isinstance(kwargs, dict):
        agent = kwargs.get("agent", agent)
        run_id = kwargs.get("run_id", run_id)
    task.args = repr((agent, _REDACTED) if agent else (_REDACTED,))
    task.kwargs = repr({"run_id": run_id} if run_id else {})
    return task
