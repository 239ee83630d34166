"""Tenants' lists (`--tenants N`): a page of one tenant's runs, in a store shared with other
tenants, against a page of a list as it read before there were tenants (one index holding
every run), in the same run on the same server.

N runs of `bench.approval` are parked with `fill` by a key of the default tenant (its
index holds N runs: the baseline, what the store's one list was), and N/10 by each of ten
more tenants' keys (`t0` … `t9`, each in indexes of its own). Then the same pages are read
in turn, one call of each side after the other (A B C A B C …), `--samples` times (300):

- `first`: the first page (50) of the waiting runs: `store.lists.list_page(INTERRUPTED, tenant=
  "t3")`, `…(tenant="default")` (the baseline), and `…()` every tenant's (an admin's list,
  which merges every tenant's indexes);
- `deep`: the page half way down each list (by its cursor).

A tenant's list must cost what a list cost before tenants: it reads its own index, never
every run filtered after reading. Figures: each page's wall time in ms (p50, p99) and the
store's time in its commands (`INFO commandstats`) per page, and each over the baseline's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench import BenchError, costs, fill, scale
from bench.agents import AGENT
from bench.report import distribution
from layby.access.rights import DEFAULT_RIGHTS, Identity
from layby.control import Runtime
from layby.parking import Store
from layby.parking.registries import cursor_of
from layby.wire import Status

TENANTS = 10
ONE = "t3"  # the tenant whose pages are read
# Whose list: one tenant's; the default tenant's, whose index holds N runs as the one list
# of the store held every run before tenants (the baseline); every tenant's (an admin's).
SIDES: dict[str, str | None] = {"tenant": ONE, "baseline": "default", "every": None}
SAMPLES = 300
LIMIT = 50


def measure(rt: Runtime, count: int, samples: int = SAMPLES) -> dict[str, Any]:
    store = rt.store
    share = count // TENANTS
    built = [fill.parked(rt, AGENT, count, label="the default tenant: ")]
    for n in range(TENANTS):
        who = Identity(f"api:bench-t{n}", f"t{n}", DEFAULT_RIGHTS)
        built.append(fill.parked(rt, AGENT, share, label=f"tenant t{n}: ", who=who))
    scale.persisted(store)
    totals = {name: (store.all_runs if tenant is None else store.runs_of(tenant)).count(
        Status.INTERRUPTED) for name, tenant in SIDES.items()}
    if totals != {"tenant": share, "baseline": count, "every": count + share * TENANTS}:
        raise BenchError(f"parked: {totals}; expected {share} of {ONE}, {count} of the "
                         f"default tenant and {count + share * TENANTS} in all")
    pages = {"first": {name: _page(store, tenant, None) for name, tenant in SIDES.items()},
             "deep": {name: _page(store, tenant, _half_way(store, tenant, totals[name]))
                      for name, tenant in SIDES.items()}}
    servers = costs.servers(store.redis)
    figures: dict[str, Any] = {}
    for name, sides in pages.items():
        for call in sides.values():
            call()  # warm, untimed
        took: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(samples):
            for side, call in sides.items():
                started = time.perf_counter()
                call()
                took[side].append((time.perf_counter() - started) * 1000)
        # The store's time apart from the wall's: its snapshots would be timed too.
        server = {side: _server_us(servers, call, samples) for side, call in sides.items()}
        shown = {side: {**distribution(took[side]), "server_us_per_page": server[side]}
                 for side in sides}
        figures[name] = {
            **shown,
            **{f"{side}_over_baseline": {
                "p50": round(shown[side]["p50"] / shown["baseline"]["p50"], 2),
                "server_us": round(server[side] / server["baseline"], 2)}
               for side in ("tenant", "every")},
        }
    return {"baseline_runs": count, "tenants": TENANTS, "tenant_runs": share,
            "built_per_s": built, "samples": samples, "limit": LIMIT, "pages": figures}


def _server_us(servers: list[Any], call: Callable[[], Any], samples: int) -> float:
    """The store's time in its commands (commandstats) per call, over `samples` calls."""
    def calls() -> None:
        for _ in range(samples):
            call()
    _, spent = costs.counted(servers, calls)
    return round(sum(spent.usec_by_command.values()) / samples, 1)


def _half_way(store: Store, tenant: str | None, total: int) -> str:
    runs = store.all_runs if tenant is None else store.runs_of(tenant)
    # Half way down, or as far as leaves a whole page after it.
    [(run_id, score)] = runs.newest(Status.INTERRUPTED, 1,
                                    offset=min(total // 2, total - LIMIT - 1))
    return cursor_of(run_id, score)


def _page(store: Store, tenant: str | None, cursor: str | None) -> Callable[[], Any]:
    def read() -> Any:
        runs, _ = store.lists.list_page(Status.INTERRUPTED, limit=LIMIT, cursor=cursor,
                                        tenant=tenant)
        if len(runs) != LIMIT:
            raise BenchError(f"a page of {tenant or 'every tenant'}'s waiting runs held "
                             f"{len(runs)}, not {LIMIT}")
        return runs
    return read
