"""What a cycle costs the server, counted by the server itself.

Around every measured batch, one snapshot of `INFO stats` and `INFO commandstats`:
`total_reads_processed` counts the read events of client connections (one per request, or
per pipeline: a client round trip), `total_commands_processed` every command the server
ran, those inside Lua scripts included. A batch's deltas over its cycles (or chains) are
the figures; the snapshots' own INFO calls are taken out. Idle traffic in the batch (the
worker's BRPOP timeouts, heartbeats) counts against whichever side ran, in proportion to
its wall time, which is fair: a slower side idles longer.

What a cycle costs the server in time: its main thread's active time (`INFO cpu`,
`used_active_time_main_thread`, Valkey 8: the time it spent on anything but waiting for
clients; on a server without it, its main thread's CPU time), scripts and the commands
they call included, and of it the scripts' own (`INFO commandstats`: EVALSHA's `usec`, the
commands a script calls included). (Summing commandstats' `usec` over every command would
count a script's commands twice: in the script's and in their own.) A primary's main thread
is one core: 1,000,000 µs over the µs a cycle costs is the most cycles a second one primary
can carry.

What the counters cannot say (which script, which task) comes from a separate pass of a
few cycles under MONITOR, untimed: EVALSHA by script name (the store's scripts' SHA1s)
and the Celery task messages pushed (LPUSH of a task message to a queue, by task name,
whether a client or a transition script pushed it).
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis import Redis

# One snapshot is one pipeline of three INFO commands: one read, three commands.
SNAPSHOT_READS, SNAPSHOT_COMMANDS = 1, 3
SCRIPT_COMMANDS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")


@dataclass
class Counters:
    reads: int = 0
    commands: int = 0
    by_command: Counter[str] = field(default_factory=Counter)
    usec_by_command: Counter[str] = field(default_factory=Counter)
    busy_us: float = 0.0  # the main thread's active time

    def __sub__(self, other: Counters) -> Counters:
        by = Counter(self.by_command)
        by.subtract(other.by_command)
        by["info"] -= SNAPSHOT_COMMANDS
        usec = Counter(self.usec_by_command)
        usec.subtract(other.usec_by_command)
        return Counters(self.reads - other.reads - SNAPSHOT_READS,
                        self.commands - other.commands - SNAPSHOT_COMMANDS,
                        +by, +usec, self.busy_us - other.busy_us)

    def __add__(self, other: Counters) -> Counters:
        return Counters(self.reads + other.reads, self.commands + other.commands,
                        self.by_command + other.by_command,
                        self.usec_by_command + other.usec_by_command,
                        self.busy_us + other.busy_us)


def snapshot(client: Redis) -> Counters:
    pipe = client.pipeline(transaction=False)
    pipe.info("stats")
    pipe.info("commandstats")
    pipe.info("cpu")
    stats, commandstats, cpu = pipe.execute()
    busy = cpu.get("used_active_time_main_thread")
    if busy is None:  # Redis: the main thread's CPU time
        busy = (float(cpu.get("used_cpu_user_main_thread", 0))
                + float(cpu.get("used_cpu_sys_main_thread", 0)))
    return Counters(int(stats["total_reads_processed"]), int(stats["total_commands_processed"]),
                    Counter({name.removeprefix("cmdstat_"): int(v["calls"])
                             for name, v in commandstats.items()}),
                    Counter({name.removeprefix("cmdstat_"): int(v["usec"])
                             for name, v in commandstats.items()}),
                    float(busy) * 1_000_000)


def counted(client: Redis, measure: Callable[[], Any]) -> tuple[Any, Counters]:
    """`measure()`'s result, and what the server did meanwhile."""
    before = snapshot(client)
    result = measure()
    return result, snapshot(client) - before


def per_item(counters: Counters, items: int) -> dict[str, Any]:
    if items <= 0:
        return {}
    top = counters.by_command.most_common(12)
    server_us = counters.busy_us / items
    return {"server_us": round(server_us, 1),
            "script_us": round(sum(counters.usec_by_command[c] for c in SCRIPT_COMMANDS)
                               / items, 1),
            "per_s_per_primary": round(1_000_000 / server_us) if server_us > 0 else None,
            "round_trips": round(counters.reads / items, 1),
            "commands": round(counters.commands / items, 1),
            "evalsha": round(counters.by_command.get("evalsha", 0) / items, 2),
            "publish": round(counters.by_command.get("publish", 0) / items, 2),
            "top_commands": {name: round(n / items, 2) for name, n in top}}


# A task message as redis-py reads MONITOR's line: kombu's JSON, with the task protocol's
# headers ("task": name) in clear (the body may be base64).
_TASK_NAME = re.compile(r'"task": ?"([^"\\]+)"')


@dataclass
class Accounting:
    """What one MONITOR pass saw: script calls by name, task messages by task name."""

    cycles: int
    scripts: Counter[str] = field(default_factory=Counter)
    tasks: Counter[str] = field(default_factory=Counter)
    pushed_by_scripts: int = 0

    def summary(self) -> dict[str, Any]:
        n = max(1, self.cycles)
        return {"cycles": self.cycles,
                "evalsha_by_script": {k: round(v / n, 2)
                                      for k, v in sorted(self.scripts.items())},
                "tasks_by_name": {k: round(v / n, 2) for k, v in sorted(self.tasks.items())},
                "tasks_per_cycle": round(sum(self.tasks.values()) / n, 2),
                "task_messages_pushed_by_scripts": round(self.pushed_by_scripts / n, 2)}


def under_monitor(client: Redis, script_names: dict[str, str], cycles: int,
                  run: Callable[[], Any]) -> Accounting:
    """Run `run()` (which takes `cycles` cycles) with MONITOR on; `script_names` maps each
    script's SHA1 to its name."""
    seen = Accounting(cycles)
    stop = threading.Event()
    ready = threading.Event()

    def watch() -> None:
        with client.monitor() as monitor:
            ready.set()
            conn = monitor.connection
            while not stop.is_set() or conn.can_read(timeout=0.2):
                if not conn.can_read(timeout=0.2):
                    continue
                line = monitor.next_command()
                _note(seen, line, script_names)

    thread = threading.Thread(target=watch, name="bench monitor", daemon=True)
    thread.start()
    ready.wait(10)
    try:
        run()
    finally:
        stop.set()
        thread.join(30)
    return seen


def _note(seen: Accounting, line: dict[str, Any], script_names: dict[str, str]) -> None:
    command = str(line.get("command", ""))
    verb, _, rest = command.partition(" ")
    verb = verb.upper()
    if verb == "EVALSHA":
        sha = rest.split(" ", 1)[0]
        seen.scripts[script_names.get(sha, sha[:12])] += 1
    elif verb in ("LPUSH", "RPUSH"):
        names = _TASK_NAME.findall(command)
        if names:
            seen.tasks[names[0]] += 1
            if line.get("client_type") == "lua":
                seen.pushed_by_scripts += 1
