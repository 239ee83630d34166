"""`python -m bench`: start the parts, take both measurements, print the table, stop all.

Order within one run, on one server and one worker: warm-up layby runs (they also count
the task hops of a cycle), warm-up chains of that many hops, then rounds that alternate the
baseline and layby (ABBA), then layby runs one at a time for the latency at rest. With
`--parked`, the levels come first, each on a site of its own (`scale`), and the cycles are
measured on the deepest level's server and worker. With `--inbox`, none of that: the runs
are parked, then the inbox's read of them is measured against reading them whole (`inbox`),
with no worker.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import redis

from bench import BenchError, hooks
from bench.beside import Beside
from bench.beside import summary as beside_figures
from bench.processes import ROOT, Parts


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=(
        "layby interrupt cycles per second against a bare Celery chain with the same task "
        "hops, and answer-to-continuation latency, in one run on one Redis/Valkey."))
    p.add_argument("--runs", type=int, default=200,
                   help="N: layby runs, and as many Celery chains (default 200)")
    p.add_argument("--concurrency", type=int, default=2,
                   help="worker processes (celery worker -c), the same for both (default 2)")
    p.add_argument("--in-flight", type=int, default=None,
                   help="runs (and chains) kept going at once (default 4 x concurrency)")
    p.add_argument("--rounds", type=int, default=4,
                   help="split N into rounds that alternate baseline and layby, in ABBA "
                        "order (default 4)")
    p.add_argument("--warmup", type=int, default=20,
                   help="unmeasured runs and chains first (at least 1; default 20)")
    p.add_argument("--redis-url", default=None,
                   help="use this Redis/Valkey instead of starting an embedded Valkey (the "
                        "bench uses a key prefix of its own and deletes its keys after); "
                        "redis+cluster://host:port names a cluster (one node is enough), "
                        "which needs --broker-url")
    p.add_argument("--broker-url", default=None,
                   help="Celery's broker on this server (redis://, sentinel://, amqp://) "
                        "instead of the store's: task messages then go through the outbox "
                        "(the bench's queues under a prefix of their own on a Redis broker)")
    p.add_argument("--cluster", type=int, nargs="?", const=3, default=0, metavar="PRIMARIES",
                   help="start an embedded Valkey Cluster of this many primaries (3 if not "
                        "given), each with a replica, and a Valkey beside it for the broker "
                        "(unless --broker-url), and measure the cycles on it")
    p.add_argument("--replicas", type=int, default=None, metavar="N",
                   help="with --cluster: replicas of each primary (default 1); 0 measures "
                        "the cluster without the cost of feeding replicas, as one server "
                        "without a replica is measured")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="give up when nothing moves for this many seconds (default 120)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--http", action="store_true",
                   help="also drive N cycles through a gateway with layby.AsyncClient "
                        "(following each run's event stream) and report them beside the "
                        "direct path")
    p.add_argument("--http-transport", choices=("aiohttp", "httpx"), default=None,
                   help="with --http: the client's transport (default aiohttp's when the "
                        "`aiohttp` extra is installed, else httpx's own)")
    p.add_argument("--parked", default="",
                   help="first park this many runs (a comma-separated list: levels, each "
                        "on a server and worker of its own, measured side by side: parks/s, "
                        "answers, list pages, memory per parked run), then measure the "
                        "cycles on top of the deepest")
    p.add_argument("--burst", action="store_true",
                   help="with --parked: start each level's runs all at once and let the "
                        "worker park them (a burst, as from a service; about 175 parks/s "
                        "here), rather than take each to its park in the bench process "
                        "(about three times as fast, the same stored)")
    p.add_argument("--samples", type=int, default=None, metavar="N",
                   help="timed calls of each kind: list pages a turn with --parked (default "
                        "200), pages of each side with --tenants (default 300); fewer for a "
                        "quick look, more for steadier medians")
    p.add_argument("--inbox", type=int, nargs="?", const=20_000, default=0, metavar="N",
                   help="instead of the cycles: park N runs (20,000 if not given), all for "
                        "one reviewer, and measure what the reviewers' inbox costs per 1,000 "
                        "runs it looks through (store.inbox.open_interrupts) against reading them "
                        "whole (store.runs.views) in --rounds rounds (ABBA), and whole inbox pages "
                        "(waiting_for); no worker runs")
    p.add_argument("--tenants", type=int, nargs="?", const=20_000, default=0, metavar="N",
                   help="instead of the cycles: park N runs (20,000 if not given), a tenth by "
                        "each of ten tenants, and time a page of one tenant's waiting runs "
                        "against a page of every tenant's, the first and half way down; no "
                        "worker runs")
    p.add_argument("--traces", action="store_true",
                   help="instead of the cycles against Celery chains: the cycles with the "
                        "worker's traces off and on (OTLP/HTTP to a sink of the bench's), in "
                        "--rounds rounds (ABBA), and what tracing costs the worker")
    args = p.parse_args(argv)
    try:
        args.parked = sorted({int(x) for x in args.parked.split(",") if x.strip()})
    except ValueError:
        p.error("--parked takes whole numbers, comma-separated (e.g. 1000,100000)")
    if any(n < 1 for n in args.parked):
        p.error("--parked levels must be at least 1")
    from layby.broker_config.settings import is_cluster_url

    on_cluster = bool(args.cluster) or is_cluster_url(args.redis_url or "")
    if args.cluster and args.redis_url:
        p.error("--cluster starts a cluster of the bench's own: leave out --redis-url, or "
                "give your cluster's as --redis-url redis+cluster://host:port")
    if args.cluster < 0:
        p.error("--cluster takes a number of primaries, at least 1")
    if args.replicas is not None and (not args.cluster or args.replicas < 0):
        p.error("--replicas is for the bench's own cluster: give --cluster, and 0 or more "
                "replicas a primary")
    if args.replicas is None:
        args.replicas = 1
    if is_cluster_url(args.redis_url or "") and not args.broker_url:
        p.error("a store on a cluster needs its broker beside it (Celery's Redis transport "
                "cannot use a cluster): add --broker-url redis://host:port/0 (or "
                "sentinel://…, amqp://…), or use --cluster, which starts both")
    if (args.broker_url or on_cluster) and args.parked:
        p.error("--parked builds its levels on one server that is also their broker: leave "
                "out --parked with --broker-url or a cluster (they measure the cycles only)")
    if args.samples is not None and args.samples < 1:
        p.error("--samples takes a number of timed calls (of --parked or --tenants), at least 1")
    if args.samples is not None and not (args.parked or args.tenants):
        p.error("--samples sets the timed calls of --parked or --tenants: give one of them")
    if args.inbox < 0:
        p.error("--inbox takes a number of runs to park, at least 1")
    if args.tenants < 0 or 0 < args.tenants < 1000:
        p.error("--tenants takes a number of runs to park, at least 1,000 (ten tenants with "
                "a page each half way down)")
    if args.tenants and args.inbox:
        p.error("--tenants and --inbox are two benches: give one")
    if args.tenants and (args.parked or args.http or on_cluster or args.broker_url):
        p.error("--tenants measures the store's reads alone, on one server and without a "
                "worker: leave out --parked, --http, --broker-url and clusters")
    if args.inbox and (args.parked or args.http or on_cluster or args.broker_url):
        p.error("--inbox measures the store's reads alone, on one server and without a "
                "worker: leave out --parked, --http, --broker-url and clusters")
    if args.traces and (args.parked or args.inbox or args.tenants or args.http):
        p.error("--traces compares a worker with traces off and on: leave out --parked, "
                "--inbox, --tenants and --http")
    if args.burst and not args.parked:
        p.error("--burst is how --parked builds its levels: give --parked too")
    if min(args.runs, args.concurrency, args.rounds) < 1 or args.warmup < 0:
        p.error("--runs, --concurrency and --rounds must be at least 1, --warmup at least 0")
    args.in_flight = args.in_flight or 4 * args.concurrency
    if args.in_flight < 1:
        p.error("--in-flight must be at least 1")
    args.warmup = max(1, args.warmup)
    return args


def _terminate(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through `Parts`, which stops what it started


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        with Parts(args.redis_url, cluster=args.cluster, broker_url=args.broker_url,
                   replicas=args.replicas) as parts:
            result = (_inbox(parts, args) if args.inbox else
                      _tenants(parts, args) if args.tenants else
                      _traces(parts, args) if args.traces else _bench(parts, args))
    except KeyboardInterrupt:
        print("bench: interrupted; everything it started is stopped", file=sys.stderr)
        return 130
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    from bench.report import inbox_table, table, tenants_table
    from bench.traces import table as traces_table

    print(inbox_table(result) if args.inbox else
          tenants_table(result) if args.tenants else
          traces_table(result) if args.traces else table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"results written to {args.json}")
    return 0


def _bench(parts: Parts, args: argparse.Namespace) -> dict[str, Any]:
    assert parts.folder is not None and parts.redis_url is not None
    prefix = _prefix(parts)
    # Parked runs are announced to a reviewer by webhook: a park plans it, a task on the
    # notify queue delivers it (the bench checks each is queued once).
    sink = hooks.Sink() if args.parked else None
    env = _environment(parts, prefix, sink)
    # The runtime (built below) and the worker both read these.
    os.environ.update(env)
    from bench import costs, measure, report
    from layby.control import build

    load_before = report.load_average()
    rt = build()
    beside: Beside | None = None
    try:
        store = rt.store
        store.redis.ping()
        servers = costs.servers(store.redis)
    except Exception as exc:
        raise BenchError(f"cannot reach Redis at {parts.redis_url}: {exc}") from exc
    try:
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        worker = parts.start_worker(measure.WORKER_QUEUES, args.concurrency,
                                    {**os.environ, "PYTHONPATH": path})
        where = (f"an embedded cluster of {args.cluster} primaries" if args.cluster else
                 "an embedded Valkey" if parts.embedded else parts.redis_url)
        print(f"bench: worker started (-c {args.concurrency}) on {where}", file=sys.stderr)
        measure.wait_for_worker(store, worker.alive)

        levels = _levels(args, parts, rt, sink, path) if args.parked else []
        warm = measure.layby_cycles(rt, args.warmup, args.in_flight, args.timeout)
        hops = max(c.claims for c in warm.cycles)
        measure.celery_chains(store, args.warmup, hops, args.in_flight, args.timeout)
        print(f"bench: warmed up; a layby cycle takes {hops} task hops; measuring "
              f"{args.runs} chains and {args.runs} runs in {args.rounds} round(s), then "
              f"{args.runs} runs one at a time", file=sys.stderr)

        if args.cluster:
            beside = _beside(parts, args, path)
        rounds = []
        spent = {"layby": costs.Counters(), "baseline": costs.Counters(),
                 "beside": costs.Counters()}
        beside_completed = 0
        pid = worker.process.pid if worker.process is not None else None
        for n in measure.split(args.runs, args.rounds):
            # ABBA: the order flips every round, so a load that drifts (another program on
            # the machine, the append-only file growing) weighs on both sides alike
            first_chains = len(rounds) % 2 == 0
            if first_chains:
                chains, cost = costs.counted(servers, lambda: measure.celery_chains(
                    store, n, hops, args.in_flight, args.timeout), pid)  # noqa: B023  (called within this iteration)
                spent["baseline"] += cost
            elif beside is not None:
                beside_completed += _beside_round(beside, spent, n, args)
            cycles, cost = costs.counted(servers, lambda: measure.layby_cycles(
                rt, n, args.in_flight, args.timeout), pid)  # noqa: B023  (called within this iteration)
            spent["layby"] += cost
            if not first_chains:
                chains, cost = costs.counted(servers, lambda: measure.celery_chains(
                    store, n, hops, args.in_flight, args.timeout), pid)  # noqa: B023  (called within this iteration)
                spent["baseline"] += cost
            elif beside is not None:
                beside_completed += _beside_round(beside, spent, n, args)
            rounds.append((cycles, chains))
        at_rest = measure.layby_cycles(rt, args.runs, 1, args.timeout)
        over_http = None
        if args.http:
            over_http = _over_http(args, parts, rt, path)
        baseline_at_rest = measure.celery_latency(store, args.runs, args.timeout)
        # Untimed: which scripts and tasks a cycle takes, read off MONITOR.
        k = min(args.runs, 50)
        # Both sides name layby's scripts: in the bare chains' window they are the idle
        # worker's own (its heartbeat, a lease's renewal), never a cycle's.
        names = store.script_names()
        seen = {
            "layby": costs.under_monitor(servers, names, k, lambda: (
                measure.layby_cycles(rt, k, args.in_flight, args.timeout))),
            "baseline": costs.under_monitor(servers, names, k, lambda: measure.celery_chains(
                store, k, hops, args.in_flight, args.timeout)),
        }
        # Untimed too (every command logged): where the server's time goes, by script. More
        # cycles than MONITOR's, which costs more: a figure of 50 moved by a third from one
        # run to the next.
        slow = min(args.runs, 200)
        timed = {
            "layby": costs.under_slowlog(servers, names, slow, lambda: (
                measure.layby_cycles(rt, slow, args.in_flight, args.timeout))),
            "baseline": costs.under_slowlog(servers, names, slow, lambda: (
                measure.celery_chains(store, slow, hops, args.in_flight, args.timeout))),
        }
        completed = {"layby": sum(c.completed for c, _ in rounds),
                     "baseline": sum(ch.completed for _, ch in rounds)}
        cost_figures = {side: {**costs.per_item(spent[side], completed[side]),
                               **seen[side].summary(),
                               "server_us_by_script": timed[side]["by_script"],
                               "server_us_by_command": timed[side]["by_command"],
                               "server_calls_preempted": timed[side]["preempted"]}
                        for side in completed}

        settings = {"runs": args.runs, "concurrency": args.concurrency,
                    "in_flight": args.in_flight, "rounds": len(rounds),
                    "warmup": args.warmup,
                    "embedded": parts.embedded,
                    "malloc": _allocator(parts),
                    "cluster": args.cluster or None,
                    # As the cluster's map shows them (a cluster of the bench's, or one given).
                    "replicas": costs.replicas_each(store.redis),
                    "primaries": len(servers),
                    "redis": "embedded" if parts.embedded else parts.redis_url,
                    "redis_url": parts.redis_url,
                    "broker_url": parts.broker_url or parts.redis_url,
                    "worker": " ".join(worker.argv[1:]), "key_prefix": prefix}
        facts = _machine(servers[0], load_before)
        result = report.summarize(rounds, at_rest, settings, facts, cost_figures,
                                  baseline_at_rest)
        if levels:
            result["parked"] = report.scale_summary(levels)
        if over_http:
            result["http"] = over_http
        if beside is not None:
            result["beside"] = beside_figures(
                beside, spent["beside"], beside_completed,
                cost_figures["layby"].get("per_s_per_primary"))
        return result
    finally:
        if beside is not None:
            beside.stop()
        if sink is not None:
            sink.stop()
        if not parts.embedded or parts.broker_url:
            _stop_processes(parts)  # first, or they would write keys again
        if not parts.embedded:
            _delete_keys(rt, prefix)
        if args.broker_url and not rt.settings.broker_is_amqp:
            rt.celery.pool.force_close_all()  # its channels write kombu's tables as they close
            _delete_broker_keys(args.broker_url)


def _beside(parts: Parts, args: argparse.Namespace, path: str) -> Beside:
    """With `--cluster`: one server set up as each primary is, its worker warmed up
    (`beside`)."""
    assert parts.folder is not None
    print(f"bench: starting one server beside the cluster (broker apart, {args.replicas} "
          "replica(s)), measured in the same rounds", file=sys.stderr)
    beside = Beside(parts.folder / "beside", args.replicas)
    try:
        beside.start({**os.environ, "PYTHONPATH": path}, args.concurrency)
        beside.cycles(args.warmup, args.in_flight, args.timeout)
    except BaseException:
        beside.stop()
        raise
    return beside


def _beside_round(beside: Beside, spent: dict[str, Any], n: int,
                  args: argparse.Namespace) -> int:
    """One round's cycles on the server beside the cluster, its counters added to
    `spent`; how many completed."""
    from bench import costs

    assert beside.worker is not None and beside.worker.process is not None
    outcome, cost = costs.counted([beside.primary], lambda: beside.cycles(
        n, args.in_flight, args.timeout), beside.worker.process.pid)
    spent["beside"] += cost
    return int(outcome.completed)


def _traces(parts: Parts, args: argparse.Namespace) -> dict[str, Any]:
    """`--traces`: the cycles with the worker's traces off and on, side by side (`traces`)."""
    from bench import report, traces

    prefix = _prefix(parts)
    load_before = report.load_average()
    rt = _runtime(parts, _environment(parts, prefix, None))
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    print(f"bench: {args.runs} cycles in {args.rounds} round(s) a side, the worker's traces "
          "off and on", file=sys.stderr)
    try:
        figures = traces.run(parts, rt, {**os.environ, "PYTHONPATH": path}, runs=args.runs,
                             rounds=args.rounds, concurrency=args.concurrency,
                             in_flight=args.in_flight, warmup=args.warmup,
                             timeout_s=args.timeout)
        settings = {"runs": args.runs, "rounds": args.rounds, "concurrency": args.concurrency,
                    "in_flight": args.in_flight, "embedded": parts.embedded,
                    "redis": "embedded" if parts.embedded else parts.redis_url,
                    "key_prefix": prefix}
        return {"traces": figures, "settings": settings,
                "machine": _machine(rt.store.redis, load_before)}
    finally:
        _stop_processes(parts)
        if not parts.embedded:
            _delete_keys(rt, prefix)


def _inbox(parts: Parts, args: argparse.Namespace) -> dict[str, Any]:
    """`--inbox`: the runs parked at the bench's site, without a worker or a sweeper (the
    store's counters are the reads' alone), then the inbox's reads measured (`inbox`)."""
    from bench import inbox

    def measure(rt: Any) -> dict[str, Any]:
        where = "an embedded Valkey" if parts.embedded else parts.redis_url
        print(f"bench: parking {args.inbox} runs on {where}, then reading them as the "
              f"inbox does and whole, in {args.rounds} round(s)", file=sys.stderr)
        return {"inbox": inbox.measure(rt, args.inbox, args.rounds)}
    return _reads(parts, measure, {"inbox": args.inbox, "rounds": args.rounds})


def _tenants(parts: Parts, args: argparse.Namespace) -> dict[str, Any]:
    """`--tenants`: the runs parked by eleven tenants at the bench's site, without a worker
    or a sweeper, then one tenant's list pages timed against one index's (`tenants`)."""
    from bench import tenants

    def measure(rt: Any) -> dict[str, Any]:
        print(f"bench: parking {args.tenants} runs and {args.tenants} more of ten tenants, "
              "then reading list pages", file=sys.stderr)
        return {"tenant_lists": tenants.measure(rt, args.tenants, args.samples or tenants.SAMPLES)}
    return _reads(parts, measure, {"tenants": args.tenants})


def _reads(parts: Parts, measure: Callable[[Any], dict[str, Any]],
           given: dict[str, Any]) -> dict[str, Any]:
    """A bench of the store's reads (`--inbox`, `--tenants`): a runtime at the bench's site
    whose reviewer directory is the inbox bench's, no worker; its keys deleted afterwards
    from a server that is not the bench's own."""
    from bench import inbox, report

    assert parts.folder is not None
    prefix = _prefix(parts)
    load_before = report.load_average()
    rt = _runtime(parts, {**_environment(parts, prefix, None), **_signing(),
                          "LAYBY_REVIEWERS_FILE": str(inbox.directory(parts.folder))})
    try:
        figures = measure(rt)
        settings = {**given, "embedded": parts.embedded, "malloc": _allocator(parts),
                    "redis": "embedded" if parts.embedded else parts.redis_url,
                    "redis_url": parts.redis_url, "key_prefix": prefix}
        return {**figures, "settings": settings,
                "machine": _machine(rt.store.redis, load_before)}
    finally:
        if not parts.embedded:
            _delete_keys(rt, prefix)


def _runtime(parts: Parts, env: dict[str, str]) -> Any:
    """The bench's runtime at its site, built from `env` (which its workers read too), its
    server checked to answer."""
    from layby.control import build

    assert parts.folder is not None and parts.redis_url is not None
    os.environ.update(env)
    rt = build()
    try:
        rt.store.redis.ping()
    except Exception as exc:
        raise BenchError(f"cannot reach Redis at {parts.redis_url}: {exc}") from exc
    return rt


def _machine(server: redis.Redis, load_before: float | None) -> dict[str, Any]:
    """The machine's and the server's facts (`report.machine`)."""
    from bench import report

    try:
        config = server.config_get("append*")
    except redis.exceptions.ResponseError:  # CONFIG is often disabled on managed servers
        config = {}
    return report.machine(server.info("server"), config, load_before)


# The prefix of the bench's queues on a broker given with `--broker-url` (a server of the
# user's: they are deleted at the end).
BROKER_PREFIX = f"laybybench-{uuid.uuid4().hex[:8]}"


def _prefix(parts: Parts) -> str:
    """The key prefix of a site: on a server of the bench's own, layby's default, so that
    what a run holds is what it holds in a deployment as shipped (a longer prefix makes
    every key name longer: about 0.1 KB more a parked run with `laybybench-<8 hex>`); on a
    server given with `--redis-url`, one of its own, so its keys can be found and deleted."""
    return "layby" if parts.embedded else f"laybybench-{uuid.uuid4().hex[:8]}"


def _allocator(parts: Parts) -> str | None:
    """The malloc of the bench's own server (of a cluster's first node)."""
    server = parts.server
    members = getattr(server, "members", None)
    if members:
        server = members[0].server
    return getattr(server, "allocator", None)


def _environment(parts: Parts, prefix: str, sink: hooks.Sink | None) -> dict[str, str]:
    """The LAYBY_* settings of a site: its server, its key prefix (on a shared server, the
    broker's keys under it too), its broker when not the store's server (under a prefix of
    the bench's on a server the user gave), the bench's agents and tasks, and with `sink`,
    the reviewer its runs announce to."""
    assert parts.folder is not None and parts.redis_url is not None
    env = {"LAYBY_REDIS_URL": parts.redis_url, "LAYBY_KEY_PREFIX": prefix,
           "LAYBY_BROKER_KEY_PREFIX": "" if parts.embedded else f"{prefix}:broker:",
           "LAYBY_INTAKE_QUEUE": "",
           "LAYBY_AGENT_MODULES": "bench.agents", "LAYBY_TASK_MODULES": "bench.tasks",
           "LAYBY_DATA_DIR": str(parts.folder / "data")}
    if parts.broker_url:
        # On a server of the user's, the queues under a prefix of the bench's own.
        env.update({"LAYBY_BROKER_URL": parts.broker_url,
                    "LAYBY_BROKER_KEY_PREFIX": "" if parts.broker is not None
                    else f"{BROKER_PREFIX}:broker:"})
    if sink is not None:
        env.update({"LAYBY_REVIEWERS_FILE": str(hooks.directory(parts.folder, sink.url)),
                    **_signing()})
    return env


def _signing() -> dict[str, str]:
    """What a site whose runs announce to reviewers needs: keys to sign their tokens, and
    an address for the links (nothing listens there: the bench follows no link)."""
    return {"LAYBY_TOKEN_KEYS": f"bench:{uuid.uuid4().hex}{uuid.uuid4().hex}",
            "LAYBY_PUBLIC_URL": "http://127.0.0.1:9"}


@contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    """`os.environ` is `env` inside (settings are read from it), as it was after."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _levels(args: argparse.Namespace, parts: Parts, rt: Any, sink: hooks.Sink | None,
            path: str) -> list[dict[str, Any]]:
    """The parked levels, side by side (`scale`): the deepest on the bench's own server
    and worker, each other level on a site of its own (an embedded server unless
    `--redis-url` is given, then a key prefix of its own there; a worker, a sweeper and a
    reviewer), stopped once measured. Sweepers run while runs are parked: a queued
    delivery one queued again would show as a duplicate."""
    from bench import measure, scale
    from layby.control import build

    with ExitStack() as stack:
        sites = []
        for level in args.parked[:-1]:
            extra = stack.enter_context(Parts(args.redis_url))
            reviewer = hooks.Sink()
            stack.callback(reviewer.stop)
            prefix = _prefix(extra)
            env = {**os.environ, **_environment(extra, prefix, reviewer), "PYTHONPATH": path}
            with _environ(env):
                site_rt = build()
            if not extra.embedded:
                stack.callback(_delete_keys, site_rt, prefix)
                stack.callback(_stop_processes, extra)
            worker = extra.start_worker(measure.WORKER_QUEUES, args.concurrency, env)
            measure.wait_for_worker(site_rt.store, worker.alive)
            extra.start_sweeper(env)
            sites.append(scale.Site(level, site_rt, reviewer, burst=args.burst,
                                    worker=worker.nodename))
        # Each app built made itself Celery's current one, which the baseline's `hop` is
        # sent with: the bench's own is again.
        rt.celery.set_current()
        sweeper = parts.start_sweeper({**os.environ, "PYTHONPATH": path})
        sites.append(scale.Site(args.parked[-1], rt, sink, burst=args.burst,
                                worker=parts.worker.nodename if parts.worker else ""))
        print(f"bench: parking runs to {', '.join(map(str, args.parked))} (one site each), "
              "then measuring them side by side", file=sys.stderr)
        levels = scale.side_by_side(sites, args.timeout, args.samples or scale.SAMPLES)
    sweeper.stop()
    scale.persisted(rt.store)
    return levels


def _over_http(args: argparse.Namespace, parts: Parts, rt: Any, path: str) -> dict[str, Any]:
    """The cycles through a gateway, in rounds that alternate with the direct path's (ABBA,
    as the baseline's do): the ratio compares what ran under the same load."""
    from bench import costs, http, measure, routes

    key = uuid.uuid4().hex
    url = parts.start_gateway({**os.environ, "LAYBY_API_KEYS": key, "PYTHONPATH": path})
    transport = args.http_transport or http.default_transport()
    http.cycles(url, key, args.warmup, args.in_flight, args.timeout, transport)
    servers = costs.servers(rt.store.redis)
    spent, done, wall, direct_done, direct_wall, rounds = costs.Counters(), 0, 0.0, 0, 0.0, []
    spent_direct = costs.Counters()
    assert parts.worker is not None and parts.worker.process is not None
    assert parts.gateway is not None and parts.gateway.process is not None
    worker_pid, gateway_pid = parts.worker.process.pid, parts.gateway.process.pid
    for i, n in enumerate(measure.split(args.runs, args.rounds)):
        def over() -> Any:
            return http.cycles(url, key, n, args.in_flight, args.timeout, transport)  # noqa: B023  (called within this iteration)

        def direct() -> Any:
            return measure.layby_cycles(rt, n, args.in_flight, args.timeout)  # noqa: B023  (called within this iteration)

        order = (direct, over) if i % 2 == 0 else (over, direct)
        got: dict[str, Any] = {}
        for step in order:
            if step is over:
                got["http"], cost = costs.counted(servers, over, worker_pid, gateway_pid)
                spent += cost
            else:
                got["direct"], cost = costs.counted(servers, step, worker_pid)
                spent_direct += cost
        done += got["http"].completed
        wall += got["http"].wall_s
        direct_done += got["direct"].completed
        direct_wall += got["direct"].wall_s
        rounds.append(round(got["http"].per_s / got["direct"].per_s, 4)
                      if got["direct"].per_s else 0.0)
    per_s = done / wall if wall else 0.0
    direct_per_s = direct_done / direct_wall if direct_wall else 0.0
    # Untimed: what each of a cycle's requests costs the gateway, one at a time.
    by_route = routes.by_route(url, key, gateway_pid, min(args.runs, 300), args.timeout)
    return {"runs": args.runs, "completed": done, "wall_s": round(wall, 4),
            "gateway_by_route": by_route,
            "transport": transport, "cycles_per_s": round(per_s, 2),
            "direct_cycles_per_s": round(direct_per_s, 2),
            "over_direct": round(per_s / direct_per_s, 3) if direct_per_s else 0.0,
            "rounds": rounds, **costs.per_item(spent, done),
            "direct_cpu_us_by_process": costs.per_item(spent_direct, direct_done).get(
                "cpu_us_by_process", {})}


def _stop_processes(parts: Parts) -> None:
    for process in (parts.gateway, parts.sweeper, parts.worker):
        if process is not None:
            process.stop()


def _delete_keys(rt: Any, prefix: str) -> None:
    """On a server the bench did not start, leave nothing of its own behind: on a cluster,
    on any of its primaries (each scanned, its keys deleted one by one: keys of several
    slots cannot go in one command)."""
    from bench import costs

    try:
        for server in costs.servers(rt.store.redis):
            pipe = server.pipeline(transaction=False)
            for key in server.scan_iter(match=f"{prefix}:*", count=1000):
                pipe.unlink(key)
                if len(pipe) >= 1000:
                    pipe.execute()
            pipe.execute()
    except Exception as exc:  # noqa: BLE001  (do not hide the error that brought us here)
        print(f"bench: could not delete the keys under {prefix}: {exc}", file=sys.stderr)


def _delete_broker_keys(url: str) -> None:
    """The bench's queues and kombu's tables on a Redis broker given with `--broker-url`,
    by a client of its own: a channel of the app's would write its tables again as it
    closes."""
    if not url.startswith(("redis://", "rediss://")):
        print(f"bench: the broker's keys under {BROKER_PREFIX} are left on a Sentinel "
              "broker; delete them with redis-cli", file=sys.stderr)
        return
    try:
        with redis.Redis.from_url(url) as client:
            for key in client.scan_iter(match=f"{BROKER_PREFIX}:broker:*", count=1000):
                client.delete(key)
    except Exception as exc:  # noqa: BLE001  (do not hide the error that brought us here)
        print(f"bench: could not delete the broker's keys under {BROKER_PREFIX}: {exc}",
              file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
