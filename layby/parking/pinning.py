"""The store's reads by agent version: a page of the runs started on one version (the list's
filter), and the runs whose step waits on a pinned version's queue (which the sweeper must
not take for lost). Kept apart from `store`, whose parts (`lists`, `deadlines`) call them.

A run records the version of its agent it started on in its hash (`agent_version`), and,
when its agent pins, `pinned`: its turns and resumes then go to `<turns queue>@<version>`
(`lua/_prelude.lua:enqueue`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from layby.parking.registries import RunIndex, cursor_of
from layby.wire import RunSummary, Status


class RunFields(Protocol):
    """What these reads take of the store (`parking.store.Store` is one): its server, and
    runs' fields read where each run is."""

    redis: Any

    def fields_of_runs(self, run_ids: Sequence[str], *fields: str
                       ) -> list[list[str | None]]: ...


# Runs of the index one page of a list by agent version reads at most.
VERSION_SCAN = 5000


def page_of_version(store: RunFields, summaries: Callable[[list[tuple[str, int]]],
                                                          list[RunSummary]],
                    runs: RunIndex, status: Status | None, limit: int, cursor: str | None,
                    offset: int, agent_version: str) -> tuple[list[RunSummary], str | None]:
    """Runs of `runs` started on `agent_version`, newest first, `offset` of them skipped: the
    index read from `cursor` on, each run's version looked at, until `limit` are found or
    VERSION_SCAN runs were read. Its cost is bounded, so a page may hold fewer than `limit`
    runs (none, even) and still have a next cursor: follow it to read on (the skipping ends
    with the page)."""
    found: list[tuple[str, int]] = []
    skip = offset
    scanned = 0
    while True:
        scored, after = runs.page(status, min(VERSION_SCAN, 500, max(limit, 100)), cursor)
        versions = [version for version, in store.fields_of_runs(
            [run_id for run_id, _ in scored], "agent_version")]
        for item, version in zip(scored, versions, strict=True):
            scanned += 1
            if version == agent_version and skip:
                skip -= 1
            elif version == agent_version:
                found.append(item)
                if len(found) == limit:
                    return summaries(found), cursor_of(*item)
        if after is None:
            return summaries(found), None
        cursor = after
        if scanned >= VERSION_SCAN:
            return summaries(found), cursor


def not_behind_pinned(store: RunFields, turns: str | None, run_ids: list[str]) -> list[str]:
    """`run_ids` but the pinned runs whose version's queue (`<turns>@<version>`) holds
    messages: theirs may wait there for as long as no worker hosts that version, and a
    copy each sweep would only lengthen it. (Known only when the broker is the store's
    server: `turns`, the turns queue the scripts push to, is None otherwise.)"""
    if not turns or not run_ids:
        return run_ids
    queues = {run_id: f"{turns}@{version}"
              for run_id, (pinned, version) in zip(
                  run_ids, store.fields_of_runs(run_ids, "pinned", "agent_version"),
                  strict=True)
              if pinned == "1" and version}
    if not queues:
        return run_ids
    names = sorted(set(queues.values()))
    pipe = store.redis.pipeline(transaction=False)
    for name in names:
        pipe.llen(name)
    waiting = {name for name, length in zip(names, pipe.execute(), strict=True) if length}
    return [run_id for run_id in run_ids if queues.get(run_id) not in waiting]
