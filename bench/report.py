"""What the benchmark reports: the figures (one dict, also written as JSON), the machine
they were measured on, and the table printed at the end."""

from __future__ import annotations

import math
import os
import platform
import statistics
from collections import Counter
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from bench.measure import ChainOutcome, LaybyOutcome

HOPS_EXPLAINED = ("layby.run_turn (first model turn, the tool interrupts: park) + "
                  "layby.resume_run (resume, then the final model turn inline: complete)")
LATENCY_CLOCK = ("Redis server clock, ms: `at` of run.resuming (written by the answer's "
                 "script) to `at` of the run.started that follows (written by the resume "
                 "task's claim script)")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q% of the values at or below it."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])


def distribution(values: Sequence[float]) -> dict[str, Any]:
    return {"count": len(values), "p50": percentile(values, 50),
            "p99": percentile(values, 99), "min": float(min(values)),
            "max": float(max(values)), "mean": round(statistics.fmean(values), 2)}


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def machine(info: dict[str, Any], config: dict[str, str],
            load_before: float | None) -> dict[str, Any]:
    """Facts about this machine and the server (`info`: INFO server; `config`: CONFIG GET).

    The 1-minute load averages before and after say whether other programs competed for
    the cores while the bench ran (its own parts add about one per busy core)."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), "")
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 0
    name = info.get("server_name", "redis")
    version = info.get("valkey_version") or info.get("redis_version")

    def version_of(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "?"

    return {"cores": os.cpu_count(), "usable_cores": usable, "cpu": model,
            "platform": platform.platform(), "python": platform.python_version(),
            "server": f"{name} {version}", "appendonly": config.get("appendonly"),
            "appendfsync": config.get("appendfsync"), "celery": version_of("celery"),
            "kombu": version_of("kombu"), "redis_py": version_of("redis"),
            "load_before": load_before, "load_after": load_average()}


def _combined(rounds: list[tuple[LaybyOutcome, ChainOutcome]]
              ) -> tuple[LaybyOutcome, ChainOutcome]:
    """All rounds as one measurement: the items and the wall times add up."""
    layby = LaybyOutcome(sum(r[0].runs for r in rounds), sum(r[0].wall_s for r in rounds),
                         [c for r in rounds for c in r[0].cycles])
    chains = ChainOutcome(sum(r[1].chains for r in rounds), rounds[0][1].hops,
                          sum(r[1].wall_s for r in rounds), sum(r[1].completed for r in rounds))
    return layby, chains


def _latency(outcome: LaybyOutcome) -> dict[str, Any] | None:
    found = [c.answer_to_continuation_ms for c in outcome.cycles
             if c.answer_to_continuation_ms is not None]
    return distribution(found) if found else None


def summarize(rounds: list[tuple[LaybyOutcome, ChainOutcome]], at_rest: LaybyOutcome,
              settings: dict[str, Any], facts: dict[str, Any], costs: dict[str, Any],
              baseline_at_rest: list[int]) -> dict[str, Any]:
    layby, baseline = _combined(rounds)
    cycle_times = [c.cycle_ms for c in layby.cycles if c.cycle_ms is not None]
    cycle_ms = distribution(cycle_times) if cycle_times else None
    hops_seen = Counter(c.claims for c in layby.cycles)
    return {
        "layby": {"runs": layby.runs, "completed": layby.completed,
                  "wall_s": round(layby.wall_s, 4), "cycles_per_s": round(layby.per_s, 2),
                  "hops_per_cycle": baseline.hops,
                  "hops_seen": {str(k): v for k, v in sorted(hops_seen.items())},
                  "hops_explained": HOPS_EXPLAINED,
                  "cycle_ms": cycle_ms},
        "baseline": {"chains": baseline.chains, "completed": baseline.completed,
                     "wall_s": round(baseline.wall_s, 4),
                     "chains_per_s": round(baseline.per_s, 2),
                     "hops_per_chain": baseline.hops},
        "ratio": round(layby.per_s / baseline.per_s, 4) if baseline.per_s else 0.0,
        "rounds": [{"cycles_per_s": round(lay.per_s, 2), "chains_per_s": round(ch.per_s, 2),
                    "ratio": round(lay.per_s / ch.per_s, 4) if ch.per_s else 0.0}
                   for lay, ch in rounds],
        "answer_to_continuation_ms": _latency(layby),
        "answer_to_continuation_at_rest_ms": _latency(at_rest),
        "baseline_publish_to_start_at_rest_ms": (distribution(baseline_at_rest)
                                                 if baseline_at_rest else None),
        "costs": costs,
        "at_rest": {"runs": at_rest.runs, "completed": at_rest.completed},
        "latency_clock": LATENCY_CLOCK,
        "settings": settings,
        "machine": facts,
    }


def scale_summary(levels: list[dict[str, Any]]) -> dict[str, Any]:
    """The levels' figures, and how the last compares with the first (1.0: flat): of each
    timing, the middle of its turn-by-turn ratios (the two levels' p50s of one turn, taken
    seconds apart), and the spread of those ratios."""
    first, last = levels[0], levels[-1]
    ratios, spread = {}, {}
    for key in ("list_first_page_ms", "list_deep_page_ms", "list_all_states_ms", "answer_ms",
                "answer_to_completed_ms", "park_time"):
        if key == "park_time":  # a park's time is the inverse of parks per second
            pairs = zip(last.get("parks_per_s_by_turn", []),
                        first.get("parks_per_s_by_turn", []), strict=False)
        else:
            pairs = zip(first.get(f"{key}_by_turn", []), last.get(f"{key}_by_turn", []),
                        strict=False)
        by_turn = [round(b / a, 3) for a, b in pairs if a and b]
        if by_turn:
            ratios[key] = round(statistics.median(by_turn), 3)
            spread[key] = by_turn
    return {"levels": levels, "last_over_first": ratios, "last_over_first_by_turn": spread}


def _scale_rows(parked: dict[str, Any]) -> list[tuple[str, str]]:
    nan = float("nan")
    rows = []
    for lv in parked["levels"]:
        ans = lv.get("answer_ms") or {}
        done = lv.get("answer_to_completed_ms") or {}
        rows.append((f"{lv['level']} parked", (
            f"{lv['parks_per_s']} parks/s; answer p50 {ans.get('p50', float('nan')):.2f} ms "
            f"(to completed {done.get('p50', float('nan')):.2f} ms); "
            f"list p50 first / deep / all states {lv['list_first_page_ms']['p50']:.2f} / "
            f"{lv['list_deep_page_ms']['p50']:.2f} / {lv['list_all_states_ms']['p50']:.2f} "
            f"ms; {lv['memory_per_parked_run']:.0f} B per parked run "
            f"({lv['memory_of_keys_per_run']:.0f} B in its keys, "
            f"{lv.get('rss_per_parked_run', nan):.0f} B of resident size; "
            f"history {lv['history_bytes']:.0f} B, budget "
            f"{lv['memory_budget']:.0f} B)"
            + (f"; {lv['announcements']} announced: {lv['deliveries']} delivered by "
               f"{lv['delivery_tasks']} tasks ({lv['duplicate_tasks']} duplicates)"
               if "announcements" in lv else "")
            + (f"; {lv['turn_messages']} step messages for {lv['turn_messages_needed']} "
               f"needed ({lv['duplicate_turn_messages']} copies)"
               if "turn_messages" in lv else "")
            + (f"; built by {lv['built_by']} at {lv['built_per_s']} runs/s"
               if lv.get("built_by") else ""))))
    if len(parked["levels"]) > 1:
        by_turn = parked.get("last_over_first_by_turn", {})
        rows.append(("last / first level", ", ".join(
            f"{k} {v:.2f}" + (f" ({min(by_turn[k]):.2f}–{max(by_turn[k]):.2f})"
                              if by_turn.get(k) else "")
            for k, v in parked["last_over_first"].items())))
    return rows


def _server_time(lay: dict[str, Any], base: dict[str, Any]) -> str:
    """The servers' main-thread CPU time per cycle, and what one primary carries at that
    cost: on a cluster, summed over its primaries, each one's share, and what these carry."""
    nan = float("nan")
    primaries = lay.get("primaries", 1)
    line = (f"{lay.get('server_us', nan)} µs of CPU per cycle (scripts "
            f"{lay.get('script_us', nan)} µs by the clock; the main thread busy "
            f"{lay.get('server_active_us', nan)} µs by the clock), "
            f"{base.get('server_us', nan)} µs per bare chain")
    if primaries > 1:
        shares = " / ".join(f"{us:g}" for us in lay.get("server_us_by_primary", {}).values())
        line += (f", summed over {primaries} primaries ({shares} µs each): at most "
                 f"{lay.get('per_s_per_primary', nan)} cycles/s per primary (1,000,000 µs ÷ "
                 f"{lay.get('server_us', nan)} µs), {lay.get('per_s_on_these_primaries', nan)} "
                 f"on these {primaries} (1,000,000 µs ÷ the busiest one's share)")
    else:
        line += (f": at most {lay.get('per_s_per_primary', nan)} cycles/s per primary "
                 f"(1,000,000 µs ÷ {lay.get('server_us', nan)} µs)")
    return line


def _beside(one: dict[str, Any], lay: dict[str, Any]) -> str:
    """The one server measured in the cluster's rounds, and the cluster's primaries
    against it."""
    nan = float("nan")
    replicas = one.get("replicas", 0)
    like = {0: "no replica", 1: "a replica"}.get(replicas, f"{replicas} replicas")
    over = one.get("cluster_over_one_server")
    return (f"broker apart and {like}, as each primary has, each run followed by a read "
            f"of its own as there, in the same rounds: "
            f"{one.get('server_us', nan)} µs of CPU per cycle, at most "
            f"{one.get('per_s_per_primary', nan)} cycles/s; a primary of the cluster "
            f"{lay.get('per_s_per_primary', nan)}: "
            + (f"{over:.0%} of one server's" if over is not None else "not compared"))


def _by_process(cpu: dict[str, float]) -> str:
    """CPU µs by process as one line: each, then their sum."""
    if not cpu:
        return "not measured"
    return (", ".join(f"{name} {us:,.0f}" for name, us in cpu.items())
            + f" = {sum(cpu.values()):,.0f} µs")


def _by_route(routes: dict[str, Any]) -> str:
    us = routes["us_by_route"]
    return (", ".join(f"{route} {value:,.0f}" for route, value in us.items())
            + f" (the gateway's CPU a request, one at a time, {routes['requests']} of each; "
            f"a finished run's stream sent {routes['events_per_stream']:g} events; "
            "/healthz is the floor: uvicorn, the middleware, a thread, one PING)")


def _preempted(lay: dict[str, Any]) -> str:
    n = lay.get("server_calls_preempted", 0)
    return (f"; {n} call{'s' if n != 1 else ''} over 20 times {'their' if n != 1 else 'its'}"
            " kind's median left out: the machine stopped the server") if n else ""


def _cpu_row(lay: dict[str, Any], base: dict[str, Any]) -> str:
    """Each side's CPU per cycle (or chain) by process, and the inverse ratio of their
    totals: what the cycles/s ratio comes to when the machine is CPU-bound."""
    mine, theirs = lay.get("cpu_us_by_process", {}), base.get("cpu_us_by_process", {})
    line = f"layby: {_by_process(mine)}; bare chain: {_by_process(theirs)}"
    if mine and theirs and sum(mine.values()) > 0:
        over = sum(theirs.values()) / sum(mine.values())
        line += (f"; bare chain's total over layby's {over:.3f} (the ratio, where the cores "
                 "are the limit)")
    return line


def _where(s: dict[str, Any]) -> str:
    if s.get("cluster"):
        replicas = s.get("replicas", 1)
        each = {0: "without replicas", 1: "with a replica each"}.get(
            replicas, f"with {replicas} replicas each")
        return (f"an embedded cluster of {s['cluster']} primaries {each}, malloc "
                f"{s.get('malloc', '?')}; broker {s.get('broker_url')}")
    if s["embedded"]:
        return f"embedded, malloc {s.get('malloc', '?')}"
    if s.get("primaries", 1) > 1:
        return f"{s['redis']}, {s['primaries']} primaries; broker {s.get('broker_url')}"
    return str(s["redis"])


def table(result: dict[str, Any]) -> str:
    lay, base, s, m = result["layby"], result["baseline"], result["settings"], result["machine"]
    nan = float("nan")
    lat = result["answer_to_continuation_ms"] or {}
    rest = result["answer_to_continuation_at_rest_ms"] or {}
    base_rest = result["baseline_publish_to_start_at_rest_ms"] or {}
    lay_cost, base_cost = result["costs"]["layby"], result["costs"]["baseline"]
    cyc = lay["cycle_ms"] or {}
    spread = [r["ratio"] for r in result["rounds"]]
    rows = [
        ("layby interrupt cycles/s", f"{lay['cycles_per_s']:.1f}  ({lay['completed']}/"
                                     f"{lay['runs']} in {lay['wall_s']:.2f} s)"),
        ("bare Celery chains/s", f"{base['chains_per_s']:.1f}  "
                                 f"({base['completed']}/{base['chains']} in "
                                 f"{base['wall_s']:.2f} s)"),
        ("ratio layby / baseline", f"{result['ratio']:.3f}  (rounds: "
                                   f"{', '.join(f'{x:.3f}' for x in spread)})"),
        ("task hops per cycle", f"{lay['hops_per_cycle']}  (runs by hops seen: "
                                f"{lay['hops_seen']})"),
        ("answer → continuation p50", f"{lat.get('p50', nan):.0f} ms under load "
                                      f"({s['in_flight']} in flight), "
                                      f"{rest.get('p50', nan):.0f} ms one at a time"),
        ("answer → continuation p99", f"{lat.get('p99', nan):.0f} ms under load, "
                                      f"{rest.get('p99', nan):.0f} ms one at a time"),
        ("publish → start (bare Celery)", f"{base_rest.get('p50', nan):.0f} / "
                                          f"{base_rest.get('p99', nan):.0f} ms p50 / p99, "
                                          "one at a time"),
        ("server time", _server_time(lay_cost, base_cost)),
        ("CPU per cycle by process", _cpu_row(lay_cost, base_cost)),
        ("server µs by script", ", ".join(
            f"{name} {us:g}" for name, us in lay_cost.get("server_us_by_script", {}).items())
            + "; by command, those scripts call included: " + ", ".join(
                f"{name} {us:g}" for name, us in
                list(lay_cost.get("server_us_by_command", {}).items())[:6])
            + " (per cycle, each command's own execution, from the slow log"
            + _preempted(lay_cost) + ")"),
        ("client round trips", f"{lay_cost.get('round_trips', nan)} per cycle, "
                               f"{base_cost.get('round_trips', nan)} per bare chain"),
        ("server commands", f"{lay_cost.get('commands', nan)} per cycle, "
                            f"{base_cost.get('commands', nan)} per bare chain (Lua's "
                            "included)"),
        ("EVALSHA per cycle", f"{lay_cost.get('evalsha', nan)}: " + ", ".join(
            f"{name} {n:g}" for name, n in lay_cost.get("evalsha_by_script", {}).items())
            + (f" (and {sum(lay_cost['evalsha_not_layby'].values()):g} of kombu's or "
               "another's)" if lay_cost.get("evalsha_not_layby") else "")),
        ("Celery tasks per cycle", f"{lay_cost.get('tasks_per_cycle', nan)}: " + ", ".join(
            f"{name} {n:g}" for name, n in lay_cost.get("tasks_by_name", {}).items())
            + f" ({lay_cost.get('task_messages_pushed_by_scripts', 0):g} pushed by "
              "transition scripts); per bare chain "
              f"{base_cost.get('tasks_per_cycle', nan)}"),
        ("PUBLISH (task events)", f"{lay_cost.get('publish', nan)} per cycle, "
                                  f"{base_cost.get('publish', nan)} per bare chain"),
        ("whole cycle p50 / p99", f"{cyc.get('p50', nan):.0f} / {cyc.get('p99', nan):.0f} ms "
                                  "under load"),
        ("N (runs = chains)", str(s["runs"])),
        ("worker concurrency", f"{s['concurrency']} (prefork); in flight: {s['in_flight']}; "
                               f"rounds: {s['rounds']}"),
        ("machine", f"{m['cores']} cores ({m['usable_cores']} usable) {m['cpu']}".rstrip()),
        ("load average (1 min)", f"{m['load_before']} before, {m['load_after']} after"),
        ("Python / Celery / kombu", f"{m['python']} / {m['celery']} / {m['kombu']}"),
        ("server", f"{m['server']}, appendonly {m['appendonly']}, appendfsync "
                   f"{m['appendfsync']} (" + _where(s) + ")"),
    ]
    if result.get("http"):
        h = result["http"]
        rows.append((f"over HTTP (layby.AsyncClient, {h.get('transport', 'httpx')})", (
            f"{h['cycles_per_s']:.1f} cycles/s ({h['completed']}/{h['runs']}) against "
            f"{h['direct_cycles_per_s']:.1f} direct in rounds between them: "
            f"{h['over_direct']:.3f} (rounds: {', '.join(f'{x:.3f}' for x in h['rounds'])}); "
            f"{h.get('round_trips', 0)} round trips and {h.get('commands', 0)} commands per "
            "cycle")))
        rows.append(("CPU per cycle over HTTP", (
            f"{_by_process(h.get('cpu_us_by_process', {}))}; direct, in the rounds between: "
            f"{_by_process(h.get('direct_cpu_us_by_process', {}))}")))
        if h.get("gateway_by_route"):
            rows.append(("gateway µs by route", _by_route(h["gateway_by_route"])))
    if result.get("beside"):
        rows.append(("one server beside it", _beside(result["beside"], lay_cost)))
    if result.get("parked"):
        rows += _scale_rows(result["parked"])
    width = max(len(k) for k, _ in rows)
    lines = [f"  {k.ljust(width)}  {v}" for k, v in rows]
    notes = [f"  hops: {HOPS_EXPLAINED}",
             "  latency clock: " + LATENCY_CLOCK]
    return "\n".join(["layby bench", *lines, *notes])


def _inbox_side(side: dict[str, Any]) -> str:
    return (f"store {side['server_us'] / 1000:.2f} ms in its commands, "
            f"{side['server_cpu_us'] / 1000:.2f} ms of its main thread's CPU; this process "
            f"{side['wall_ms']:.1f} ms wall, {side['cpu_ms']:.1f} ms CPU; "
            f"{side['commands']:.0f} commands")


def inbox_table(result: dict[str, Any]) -> str:
    """The table of `--inbox`: the look-through and the whole read per 1,000 runs, their
    ratios (round by round in brackets), and whole inbox pages."""
    ib, s, m = result["inbox"], result["settings"], result["machine"]
    look, whole = ib["per_1000_runs"]["look"], ib["per_1000_runs"]["whole"]
    ratios, by_round = ib["look_over_whole"], ib["look_over_whole_by_round"]
    page = ib["page"]
    names = {"server_us": "store's commands", "server_cpu_us": "store's CPU",
             "wall_ms": "wall", "cpu_ms": "this process's CPU"}
    walls = page["wall_ms_by_page"]
    rows = [
        ("parked runs", f"{ib['parked']} of bench.approval, each request the one reviewer's "
                        f"(built by fill at {ib['built_per_s']} runs/s; {ib['folded']} runs' "
                        "events folded)"),
        ("look-through, per 1,000", _inbox_side(look)
         + f"  (store.inbox.open_interrupts, {ib['chunk']} runs a call)"),
        ("read whole, per 1,000", _inbox_side(whole)
         + f"  (store.runs.views, {ib['chunk']} runs a call: the baseline)"),
        ("look-through / whole", ", ".join(
            f"{names[k]} {v:.3f} (rounds: {', '.join(f'{x:.3f}' for x in by_round[k])})"
            for k, v in ratios.items())),
        ("one inbox page", (
            f"waiting_for: {page['wall_ms']:.1f} ms wall (middle of {page['pages']}: "
            f"{min(walls):.1f}–{max(walls):.1f}), {page['cpu_ms']:.1f} ms CPU here; store "
            f"{page['server_us'] / 1000:.2f} ms in its commands, "
            f"{page['server_cpu_us'] / 1000:.2f} ms of CPU, {page['commands']:.0f} commands; "
            f"looked through {page['looked_through']} of {ib['parked']} waiting runs "
            f"(it reads the newest {page['scan']}), showed {page['shown']} read whole"
            + ("; says more wait than it looks through" if page["truncated"] else ""))),
        ("rounds", f"{ib['rounds']} (ABBA), each side over all {ib['parked']} runs, newest "
                   "first"),
        *_setting_rows(m, s),
    ]
    return _titled("layby bench: the reviewers' inbox", rows)


def _setting_rows(m: dict[str, Any], s: dict[str, Any]) -> list[tuple[str, str]]:
    """The machine and the server a table's figures were taken on."""
    return [
        ("machine", f"{m['cores']} cores ({m['usable_cores']} usable) {m['cpu']}".rstrip()),
        ("load average (1 min)", f"{m['load_before']} before, {m['load_after']} after"),
        ("Python / redis-py", f"{m['python']} / {m['redis_py']}"),
        ("server", f"{m['server']}, appendonly {m['appendonly']}, appendfsync "
                   f"{m['appendfsync']} (" + _where(s) + ")"),
    ]


def _titled(title: str, rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join([title, *(f"  {k.ljust(width)}  {v}" for k, v in rows)])


def tenants_table(result: dict[str, Any]) -> str:
    """The table of `--tenants`: one tenant's list pages against every tenant's."""
    t, s, m = result["tenant_lists"], result["settings"], result["machine"]

    def side(f: dict[str, Any]) -> str:
        return (f"p50 {f['p50']:.2f} ms, p99 {f['p99']:.2f} ms; store "
                f"{f['server_us_per_page']:.0f} µs in its commands")

    rows = [("parked runs", f"{t['baseline_runs']} of bench.approval by the default "
                            f"tenant, {t['tenant_runs']} by each of {t['tenants']} more")]
    for name, what in (("first", "the first page"), ("deep", "the page half way down")):
        f = t["pages"][name]
        rows += [(f"{what}, one tenant's", side(f["tenant"])),
                 (f"{what}, one index (before)", side(f["baseline"]) + "  (the baseline)"),
                 (f"{what}, every tenant's", side(f["every"]) + "  (an admin's)"),
                 (f"{what}, over the baseline", ", ".join(
                     f"{who} wall p50 {f[who + '_over_baseline']['p50']:.2f}, store "
                     f"{f[who + '_over_baseline']['server_us']:.2f}"
                     for who in ("tenant", "every")))]
    rows += [
        ("pages", f"{t['limit']} runs each, {t['samples']} of each, in turn (A B C A B C …)"),
        *_setting_rows(m, s),
    ]
    return _titled("layby bench: tenants' lists", rows)
