"""What a cycle costs the server, counted by the server itself.

Around every measured batch, one snapshot of `INFO stats` and `INFO commandstats`:
`total_reads_processed` counts the read events of client connections (one per request, or
per pipeline: a client round trip), `total_commands_processed` every command the server
ran, those inside Lua scripts included. A batch's deltas over its cycles (or chains) are
the figures; the snapshots' own INFO calls are taken out. Idle traffic in the batch (the
worker's BRPOP timeouts, heartbeats) counts against whichever side ran, in proportion to
its wall time, which is fair: a slower side idles longer.

What a cycle costs the server in time: its main thread's CPU time (`INFO cpu`,
`used_cpu_user_main_thread` + `used_cpu_sys_main_thread`), scripts and the commands they
call included, and of it the scripts' own (`INFO commandstats`: EVALSHA's `usec`, the
commands a script calls included). (Summing commandstats' `usec` over every command would
count a script's commands twice: in the script's and in their own.) Beside it, the main
thread's active time (`used_active_time_main_thread`, Valkey 8: the time it spent on
anything but waiting for clients, by the clock): on a machine whose cores are shared (the
worker, the bench, another tenant) it also counts the moments the thread waited for a core
while busy, so it overstates what the work costs a core of its own (3.4 times its CPU time
once, under a load average of 9 on 2 cores). A primary's main thread is one core:
1,000,000 µs over the CPU µs a cycle costs is the most cycles a second one primary can
carry. (`usec` of commandstats is also by the clock.)

On a Redis or Valkey Cluster every figure is summed over its primaries (`servers`: a client
of each, from the cluster's own map of its slots): the counters are each primary's own,
and a cycle's transitions land on the primary of its run's shard. The main thread's time
is also kept primary by primary, to show how evenly a cycle's cost is spread. Replicas are
not counted: what a primary spends replicating to them is in its own time.

What a cycle costs each process, in CPU time: the bench's own (the client: starting runs,
following their events, answering; or publishing chains and waiting for them), the
worker's main process (Celery's consumer: the broker's reads, kombu's acks, task events)
and its pool (the tasks), from their `cpu_times` around the batch, beside the server's main
thread. When the machine is CPU-bound (the bench's 2 cores), the ratio of cycles to chains a
second is about the inverse ratio of these totals: where a cycle's extra CPU is spent is
where its throughput goes.

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

import psutil
from redis import Redis
from redis.cluster import RedisCluster

# One snapshot is one pipeline of three INFO commands: one read, three commands.
SNAPSHOT_READS, SNAPSHOT_COMMANDS = 1, 3
SCRIPT_COMMANDS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")


def servers(client: Redis | RedisCluster) -> list[Redis]:
    """The servers whose counters a figure sums: the one server, or each primary of a
    cluster (a client of that node alone, as the cluster's client reaches it)."""
    if isinstance(client, RedisCluster):
        return [client.get_redis_connection(node)  # type: ignore[no-untyped-call]
                for node in sorted(client.get_primaries(),  # type: ignore[no-untyped-call]
                                   key=lambda n: (n.host, n.port))]
    return [client]


def replicas_each(client: Redis | RedisCluster) -> int | None:
    """How many replicas each primary has, by one node's account of the cluster (`CLUSTER
    NODES`; None: one server, whose replicas, if any, the bench does not look for). Not by
    redis-py's map: it comes from `CLUSTER SLOTS`, which leaves out a replica the node
    takes as failed or still loading (seen: a cluster formed with a replica each, on a
    busy machine, reported "without replicas")."""
    if not isinstance(client, RedisCluster):
        return None
    nodes = client.cluster_nodes().values()  # type: ignore[no-untyped-call]
    live = [n for n in nodes if "fail" not in n["flags"].split(",")]
    primaries = {n["node_id"] for n in live if "master" in n["flags"] and n["slots"]}
    replicas = [n for n in live if "slave" in n["flags"] and n["master_id"] in primaries]
    return round(len(replicas) / max(1, len(primaries)))


def name_of(client: Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"


@dataclass
class Counters:
    reads: int = 0
    commands: int = 0
    by_command: Counter[str] = field(default_factory=Counter)
    usec_by_command: Counter[str] = field(default_factory=Counter)
    cpu_us: float = 0.0  # the main thread's CPU time, summed over the servers
    active_us: float | None = 0.0  # its active time (None: a server that does not say)
    cpu_us_by_server: Counter[str] = field(default_factory=Counter)  # host:port → µs
    servers: int = 1  # how many servers a snapshot read (its own INFO calls are taken out)
    process_us: Counter[str] = field(default_factory=Counter)  # PROCESSES → CPU µs

    def __sub__(self, other: Counters) -> Counters:
        by = Counter(self.by_command)
        by.subtract(other.by_command)
        by["info"] -= SNAPSHOT_COMMANDS * self.servers
        usec = Counter(self.usec_by_command)
        usec.subtract(other.usec_by_command)
        cpu = Counter(self.cpu_us_by_server)
        cpu.subtract(other.cpu_us_by_server)
        spent = Counter(self.process_us)
        spent.subtract(other.process_us)
        return Counters(self.reads - other.reads - SNAPSHOT_READS * self.servers,
                        self.commands - other.commands - SNAPSHOT_COMMANDS * self.servers,
                        +by, +usec, self.cpu_us - other.cpu_us,
                        _either(self.active_us, other.active_us, float.__sub__), cpu,
                        self.servers, spent)

    def __add__(self, other: Counters) -> Counters:
        cpu = Counter(self.cpu_us_by_server)
        cpu.update(other.cpu_us_by_server)
        spent = Counter(self.process_us)
        spent.update(other.process_us)  # (not `+`, which drops a process that spent none)
        return Counters(self.reads + other.reads, self.commands + other.commands,
                        self.by_command + other.by_command,
                        self.usec_by_command + other.usec_by_command,
                        self.cpu_us + other.cpu_us,
                        _either(self.active_us, other.active_us, float.__add__), cpu,
                        max(self.servers, other.servers), spent)


def _either(a: float | None, b: float | None, op: Callable[[float, float], float]
            ) -> float | None:
    return None if a is None or b is None else op(float(a), float(b))


def snapshot(clients: list[Redis]) -> Counters:
    """The counters of every server in `clients`, summed (one pipeline each)."""
    total = Counters(servers=len(clients))
    for client in clients:
        pipe = client.pipeline(transaction=False)
        pipe.info("stats")
        pipe.info("commandstats")
        pipe.info("cpu")
        stats, commandstats, cpu = pipe.execute()
        if "used_cpu_user_main_thread" in cpu:
            cpu_s = float(cpu["used_cpu_user_main_thread"]) + float(
                cpu["used_cpu_sys_main_thread"])
        else:  # a server without threads of its own to tell apart: the process's
            cpu_s = float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
        active = cpu.get("used_active_time_main_thread")
        total.reads += int(stats["total_reads_processed"])
        total.commands += int(stats["total_commands_processed"])
        total.by_command.update({name.removeprefix("cmdstat_"): int(v["calls"])
                                 for name, v in commandstats.items()})
        total.usec_by_command.update({name.removeprefix("cmdstat_"): int(v["usec"])
                                      for name, v in commandstats.items()})
        total.cpu_us += cpu_s * 1_000_000
        total.active_us = (None if active is None or total.active_us is None
                           else total.active_us + float(active) * 1_000_000)
        total.cpu_us_by_server[name_of(client)] += cpu_s * 1_000_000
    return total


# The processes whose CPU a batch counts, beside the server's: this one, the gateway (with
# --http), the worker's main process and its pool.
PROCESSES = ("bench", "gateway", "worker main", "worker pool")


def process_cpu_us(worker_pid: int | None, gateway_pid: int | None = None) -> Counter[str]:
    """CPU µs used so far by this process (all its threads), the gateway's, the worker's
    main process and its pool's processes (a child that left meanwhile is not counted: the
    pool keeps its children for the bench's length)."""
    spent: Counter[str] = Counter()
    spent["bench"] = _cpu_us(psutil.Process())
    if gateway_pid is not None:
        own, children = _tree_us(gateway_pid)
        spent["gateway"] = own + children
    if worker_pid is not None:
        spent["worker main"], spent["worker pool"] = _tree_us(worker_pid)
    return spent


def _tree_us(pid: int) -> tuple[float, float]:
    """CPU µs of process `pid` and of its children; nothing for one that is gone (the
    bench then stops on the cycles that no longer move, and says so)."""
    try:
        process = psutil.Process(pid)
        children = process.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0.0, 0.0
    return _cpu_us(process), sum(_cpu_us(child) for child in children)


def _cpu_us(process: psutil.Process) -> float:
    try:
        times = process.cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return (times.user + times.system) * 1_000_000


def counted(clients: list[Redis], measure: Callable[[], Any], worker_pid: int | None = None,
            gateway_pid: int | None = None) -> tuple[Any, Counters]:
    """`measure()`'s result, and what the servers (and with `worker_pid`, this process, the
    worker's and the gateway's) did meanwhile."""
    before = snapshot(clients)
    before.process_us = process_cpu_us(worker_pid, gateway_pid)
    result = measure()
    after = snapshot(clients)
    after.process_us = process_cpu_us(worker_pid, gateway_pid)
    return result, after - before


def per_item(counters: Counters, items: int) -> dict[str, Any]:
    if items <= 0:
        return {}
    top = counters.by_command.most_common(12)
    server_us = counters.cpu_us / items
    by_primary = {name: round(us / items, 1)
                  for name, us in sorted(counters.cpu_us_by_server.items())}
    busiest = max(by_primary.values(), default=0.0)
    return {"server_us": round(server_us, 1),
            "server_active_us": (round(counters.active_us / items, 1)
                                 if counters.active_us is not None else None),
            "script_us": round(sum(counters.usec_by_command[c] for c in SCRIPT_COMMANDS)
                               / items, 1),
            # One primary's main thread is one core: 1,000,000 µs a second, over what a
            # cycle costs the servers in all (on a cluster, summed over the primaries;
            # spread evenly, P primaries carry P times as many).
            "per_s_per_primary": round(1_000_000 / server_us) if server_us > 0 else None,
            "primaries": counters.servers,
            "server_us_by_primary": by_primary,
            # What these primaries carry before the busiest one's core is full.
            "per_s_on_these_primaries": round(1_000_000 / busiest) if busiest > 0 else None,
            "round_trips": round(counters.reads / items, 1),
            "commands": round(counters.commands / items, 1),
            # CPU µs a cycle (or chain) by process, the server's main thread among them.
            "cpu_us_by_process": ({**{name: round(counters.process_us[name] / items, 1)
                                      for name in PROCESSES if name in counters.process_us},
                                   "server": round(server_us, 1)}
                                  if counters.process_us else {}),
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
    # Scripts that are not layby's, by SHA1 prefix: kombu's own (its Redis transport
    # refreshes its bindings with a script now and then), sent by the worker.
    other_scripts: Counter[str] = field(default_factory=Counter)
    tasks: Counter[str] = field(default_factory=Counter)
    pushed_by_scripts: int = 0

    def summary(self) -> dict[str, Any]:
        n = max(1, self.cycles)
        return {"cycles": self.cycles,
                "evalsha_by_script": {k: round(v / n, 2)
                                      for k, v in sorted(self.scripts.items())},
                "evalsha_not_layby": {k: round(v / n, 2)
                                      for k, v in sorted(self.other_scripts.items())},
                "tasks_by_name": {k: round(v / n, 2) for k, v in sorted(self.tasks.items())},
                "tasks_per_cycle": round(sum(self.tasks.values()) / n, 2),
                "task_messages_pushed_by_scripts": round(self.pushed_by_scripts / n, 2)}


def under_monitor(clients: list[Redis], script_names: dict[str, str], cycles: int,
                  run: Callable[[], Any]) -> Accounting:
    """Run `run()` (which takes `cycles` cycles) with MONITOR on every server of `clients`;
    `script_names` maps each script's SHA1 to its name."""
    seen = Accounting(cycles)
    stop = threading.Event()
    lock = threading.Lock()

    def watch(client: Redis, ready: threading.Event) -> None:
        with client.monitor() as monitor:
            ready.set()
            conn = monitor.connection
            while not stop.is_set() or conn.can_read(timeout=0.2):
                if not conn.can_read(timeout=0.2):
                    continue
                line = monitor.next_command()
                with lock:
                    _note(seen, line, script_names)

    threads = []
    for client in clients:
        ready = threading.Event()
        thread = threading.Thread(target=watch, args=(client, ready), name="bench monitor",
                                  daemon=True)
        thread.start()
        ready.wait(10)
        threads.append(thread)
    try:
        run()
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    return seen


def _note(seen: Accounting, line: dict[str, Any], script_names: dict[str, str]) -> None:
    command = str(line.get("command", ""))
    verb, _, rest = command.partition(" ")
    verb = verb.upper()
    if verb == "EVALSHA":
        sha = rest.split(" ", 1)[0].strip('"')
        if sha in script_names:
            seen.scripts[script_names[sha]] += 1
        else:
            seen.other_scripts[sha[:12]] += 1
    elif verb in ("LPUSH", "RPUSH"):
        names = _TASK_NAME.findall(command)
        if names:
            seen.tasks[names[0]] += 1
            if line.get("client_type") == "lua":
                seen.pushed_by_scripts += 1


def under_slowlog(clients: list[Redis], script_names: dict[str, str], cycles: int,
                  run: Callable[[], Any]) -> dict[str, dict[str, float]]:
    """Run `run()` (which takes `cycles` cycles) with every server's slow log taking every
    command (`slowlog-log-slower-than 0`), then read it back: the server's own time of each
    command's execution (µs, by the clock: no network, no queueing, a blocked BRPOP's wait
    left out), per cycle, by script (EVALSHA, named) and by command. The server logs the
    commands a script calls too, each as its own entry: a command's figure counts its calls
    from scripts with the rest (their time is in their script's as well). Calls the machine
    stopped are left out (`not_preempted`), and counted: `preempted`. The slow log's
    settings are put back after."""
    saved = []
    for client in clients:
        saved.append(client.config_get("slowlog-*"))
        client.config_set("slowlog-max-len", 1_000_000)
        client.slowlog_reset()
        client.config_set("slowlog-log-slower-than", 0)
    entries: list[dict[str, Any]] = []
    try:
        run()
    finally:
        for client, settings in zip(clients, saved, strict=True):
            client.config_set("slowlog-log-slower-than",
                              settings.get("slowlog-log-slower-than", "10000"))
            entries += client.slowlog_get(-1)
            client.slowlog_reset()
            client.config_set("slowlog-max-len", settings.get("slowlog-max-len", "128"))
    calls: dict[tuple[bool, str], list[int]] = {}
    for entry in entries:
        words = _words(entry.get("command", ""))
        if not words or words[0] in ("CONFIG", "SLOWLOG"):
            continue
        if words[0] in ("EVALSHA", "EVALSHA_RO") and len(words) > 1:
            kind = (True, script_names.get(words[1], words[1][:12]))
        else:
            kind = (False, words[0])
        calls.setdefault(kind, []).append(entry["duration"])
    by_script: Counter[str] = Counter()
    by_command: Counter[str] = Counter()
    preempted = 0
    for (is_script, name), durations in calls.items():
        kept = not_preempted(durations)
        preempted += len(durations) - len(kept)
        (by_script if is_script else by_command)[name] += sum(kept)
    n = max(1, cycles)
    return {"by_script": {k: round(v / n, 1) for k, v in by_script.most_common()},
            "by_command": {k: round(v / n, 1) for k, v in by_command.most_common(12)},
            "preempted": preempted}


def not_preempted(durations: list[int]) -> list[int]:
    """The calls of one script or command, without those the machine stopped: the slow log
    times a call by the clock, so one during which this shared VM took the server off its
    core for a time slice reads 10 to 100 ms, where the rest take 0.1. Over 50 cycles one
    such call counted 500 µs a cycle to whichever script it fell in. A call over 20 times
    its kind's median, and over 2 ms, is taken as that, and left out."""
    ordered = sorted(durations)
    limit = max(2_000, 20 * ordered[len(ordered) // 2])
    return [d for d in durations if d <= limit]


def _words(command: Any) -> list[str]:
    text = command.decode(errors="replace") if isinstance(command, bytes) else str(command)
    words = text.split(" ", 2)
    return [words[0].upper(), *words[1:2]] if words and words[0] else []
