"""Loads the Lua transition scripts in `lua/`, each registered once per client.

Run scripts get the shared prelude (`lua/_prelude.lua`) and the KEYS layout it documents;
scripts on global keys only (outbox, due notifications, live workers) stand alone.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from redis import Redis
from redis.commands.core import Script

RUN_SCRIPTS = ("create_run", "claim_run", "renew_lease", "save_checkpoint", "advance_turn",
               "park_run", "complete_run", "fail_run", "cancel_run", "answer_interrupts",
               "expire_interrupt", "requeue_run", "plan_notifications", "start_delivery",
               "finish_delivery", "retry_notifications", "delegate_interrupt")
# Scripts on global keys only, without the prelude.
STANDALONE_SCRIPTS = ("claim_outbox", "ack_outbox", "claim_due_notifications",
                      "beat_worker", "reap_workers")

# Upper bounds (seconds) of the latency histograms the scripts count in `stats`: park →
# answer (people: seconds to days), last answer → a worker taking the run up (queues).
LATENCY_BUCKETS_S: dict[str, tuple[float, ...]] = {
    "answer": (10, 60, 300, 900, 3600, 14400, 86400, 604800),
    "resume": (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
}


def _lua_buckets() -> str:
    return "{" + ", ".join(f"{what} = {{{', '.join(repr(b) for b in bounds)}}}"
                           for what, bounds in LATENCY_BUCKETS_S.items()) + "}"


@cache
def _source(name: str) -> str:
    return (resources.files("layby.parking") / "lua" / f"{name}.lua").read_text()


def source(name: str, *, events_max: int, outbox_grace_ms: int) -> str:
    if name in STANDALONE_SCRIPTS:
        return _source(name)
    prelude = (_source("_prelude").replace("__EVENTS_MAX__", str(events_max))
               .replace("__OUTBOX_GRACE_MS__", str(outbox_grace_ms))
               .replace("__LATENCY_BUCKETS_S__", _lua_buckets()))
    return prelude + "\n" + _source(name)


def register(client: Redis, *, events_max: int, outbox_grace_ms: int) -> dict[str, Script]:
    return {name: client.register_script(source(name, events_max=events_max,
                                                outbox_grace_ms=outbox_grace_ms))
            for name in (*RUN_SCRIPTS, *STANDALONE_SCRIPTS)}
