"""The reviewers' inbox (`--inbox N`): what one look through the waiting runs costs, against
reading the same runs whole, in the same run on the same server.

N runs of `bench.approval` are parked with `fill` (each asks the default group, whose one
member is the bench's reviewer, announced by email: every parked request is theirs), their
events folded into their hashes as the sweeper folds a parked run's 30 s after its park
(`store.lists.fold_parked`, with the cutoff at now), and the server's append-only file rewrite, if
one started, waited out. Then, in R rounds whose order flips every round (ABBA), both sides
go over the same N runs, newest first, in chunks of 500 as `layby.inbox.waiting` does:

- the look-through: `store.inbox.open_interrupts` (what an inbox page reads of each waiting run:
  its `agent` and `open` fields, then its open interrupts' specs and its review hash);
- the baseline: `store.runs.views` (each run read whole, as the history and the API read them).

For each: the store's time in its commands (`INFO commandstats`, `usec` summed over every
command but the snapshots' own INFO; by the server's clock), the server main thread's CPU
time (`INFO cpu`, as the cycles' server time: the commands, and reading the requests and
writing the replies), the commands and the server's read events (`bench.costs`; a pipeline
of 500 commands takes several reads, so they are not round trips here), and
this process's wall and CPU time (it stands in for the gateway: the parsing of the replies
and the models built from them are the gateway's work). Figures are per 1,000 runs, summed
over the rounds; the ratios are look-through over whole, of the sums and round by round.

Last, a few whole inbox pages: `layby.inbox.waiting.waiting_for(rt, reviewer)`, which looks
through the `SCAN` (5,000) waiting runs most recently asked of the reviewer (found through
the reviewers' request index: here, every run), picks and orders the reviewer's requests,
and reads the `PAGE` (100) most urgent in full: what a page costs, the store and this
process.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import BenchError, costs, fill, scale
from bench.agents import AGENT
from layby.control import Runtime
from layby.inbox import waiting
from layby.parking import Store
from layby.wire import Status

REVIEWER = "bench-reviewer"
GROUP = "bench-reviewers"
PAGES = 5  # whole inbox pages timed, after the rounds
SIDES = ("look", "whole")


def directory(folder: Path) -> Path:
    """A reviewer directory whose default group is the bench's one reviewer (reached by
    email): every request of `bench.approval`, which names nobody, is theirs."""
    path = folder / "inbox-reviewers.toml"
    path.write_text(f'default_group = "{GROUP}"\n\n'
                    f'[reviewers.{REVIEWER}]\n'
                    f'name = "Bench Reviewer"\n'
                    f'email = "reviewer@bench.invalid"\n\n'
                    f'[groups]\n'
                    f'{GROUP} = ["{REVIEWER}"]\n')
    return path


def folded(store: Store) -> int:
    """Fold the events of every parked run into its hash now (the sweeper's own call, its
    cutoff at now rather than 30 s ago); returns how many were folded."""
    now = Store(store.redis, replace(store.config, fold_after_ms=0))
    now.writing = store.writing
    total = 0
    while done := now.lists.fold_parked():
        total += done
    return total


def _pass(servers: list[Any], read: Callable[[Sequence[str]], Sequence[Any]],
          run_ids: list[str]) -> tuple[dict[str, float], int]:
    """One side's read of `run_ids`, in chunks of the inbox's: what it cost, and how many
    runs it returned."""

    def go() -> int:
        return sum(len(read(run_ids[at:at + waiting._CHUNK]))
                   for at in range(0, len(run_ids), waiting._CHUNK))

    found, spent = _timed(servers, go)
    return spent, found


def _timed(servers: list[Any], call: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    """`call()`'s result and cost: the store's (its commands' time, its main thread's CPU,
    its read events, commands) and this process's (wall and CPU time, the snapshots of the
    server's counters left out)."""
    gc.collect()  # the garbage of what ran before is not this call's to collect
    took: dict[str, float] = {}

    def timed() -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        result = call()
        took["wall_ms"] = (time.perf_counter() - wall) * 1000
        took["cpu_ms"] = (time.process_time() - cpu) * 1000
        return result

    result, spent = costs.counted(servers, timed)
    return result, {
        "server_us": float(sum(us for name, us in spent.usec_by_command.items()
                               if name != "info")),
        "server_cpu_us": spent.cpu_us, "server_reads": float(spent.reads),
        "commands": float(spent.commands), **took}


def _ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else 0.0


def measure(rt: Runtime, count: int, rounds: int, pages: int = PAGES) -> dict[str, Any]:
    """Park `count` runs at the site of `rt`, then measure the look-through against the
    whole read over them in `rounds` rounds (ABBA), then `pages` whole inbox pages."""
    store = rt.store
    built = fill.parked(rt, AGENT, count, label="inbox: ")
    folds = folded(store)
    scale.persisted(store)
    run_ids = [run_id for run_id, _ in store.all_runs.newest(Status.INTERRUPTED, count)]
    if len(run_ids) != count:
        raise BenchError(f"{len(run_ids)} of {count} runs parked")
    reviewer = rt.reviewers.directory().reviewers[REVIEWER]
    servers = costs.servers(store.redis)
    reads: dict[str, Callable[[Sequence[str]], Sequence[Any]]] = {
        "look": store.inbox.open_interrupts, "whole": store.runs.views}

    # Warm-up, untimed: a chunk of each, and a page.
    for read in reads.values():
        read(run_ids[:waiting._CHUNK])
    waiting.waiting_for(rt, reviewer)

    by_round: list[dict[str, dict[str, float]]] = []
    for k in range(rounds):
        took: dict[str, dict[str, float]] = {}
        for side in SIDES if k % 2 == 0 else tuple(reversed(SIDES)):
            took[side], found = _pass(servers, reads[side], run_ids)
            if found != count:
                raise BenchError(f"the {side} read of {count} parked runs found {found}")
        by_round.append(took)

    per = 1000 / (count * rounds)  # per 1,000 runs, over every round
    sides = {side: {key: round(sum(r[side][key] for r in by_round) * per, 3)
                    for key in by_round[0][side]} for side in SIDES}
    ratios = {key: _ratio(sides["look"][key], sides["whole"][key])
              for key in ("server_us", "server_cpu_us", "wall_ms", "cpu_ms")}
    ratios_by_round = {key: [_ratio(r["look"][key], r["whole"][key]) for r in by_round]
                       for key in ratios}

    shown = min(count, waiting.SCAN)
    page_costs = []
    for _ in range(pages):
        page, spent = _timed(servers, lambda: waiting.waiting_for(rt, reviewer))
        page_costs.append(spent)
        # Every parked request is the reviewer's: the page looked through all it reads.
        if (len(page.items), page.total, page.truncated) != (
                min(waiting.PAGE, shown), shown, count > waiting.SCAN):
            raise BenchError(f"an inbox page of {count} parked runs showed "
                             f"{len(page.items)} of {page.total} (truncated: "
                             f"{page.truncated})")
    middle = {key: round(statistics.median(c[key] for c in page_costs), 3)
              for key in page_costs[0]}
    return {
        "parked": count, "built_per_s": built, "folded": folds, "rounds": rounds,
        "chunk": waiting._CHUNK, "per_1000_runs": sides, "look_over_whole": ratios,
        "look_over_whole_by_round": ratios_by_round,
        "by_round": [{side: {k: round(v, 3) for k, v in r[side].items()} for side in SIDES}
                     for r in by_round],
        "page": {**middle, "pages": pages,
                 "wall_ms_by_page": [round(c["wall_ms"], 3) for c in page_costs],
                 "looked_through": shown, "shown": min(waiting.PAGE, shown),
                 "scan": waiting.SCAN, "truncated": count > waiting.SCAN},
    }
