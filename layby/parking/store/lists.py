"""Lists of runs: pages newest first (by state, tenant, agent version), their summaries,
and the indexes' upkeep (parked runs' events folded, finished runs pruned)."""

from __future__ import annotations

from typing import Any, cast

from layby.parking import pinning, registries
from layby.parking.clock import iso
from layby.parking.keys import DEFAULT_TENANT, Keys, ShardKeys
from layby.parking.registries import cursor_of
from layby.parking.store.core import Part
from layby.parking.store.fields import open_of, retry_of
from layby.wire import RunSummary, Status


class Lists(Part):
    """Lists of runs and their indexes' upkeep (`store.lists`)."""

    def list_runs(self, status: Status | None = None, *, limit: int = 50,
                  offset: int = 0) -> list[RunSummary]:
        """Newest first; all states when `status` is None."""
        return self.summaries(self.core.all_runs.newest(status, limit, offset))

    def list_page(self, status: Status | None = None, *, limit: int = 50,
                  cursor: str | None = None, offset: int = 0,
                  agent_version: str | None = None, tenant: str | None = None
                  ) -> tuple[list[RunSummary], str | None]:
        """A page of runs, newest first, `offset` runs after `cursor` (or after the top),
        and the next page's cursor (None at the end). Raises `BadCursor` for a cursor the
        store did not make. With `tenant`, that tenant's runs alone, read from its own
        indexes (None: every tenant's). With `agent_version`, only runs started on that
        version: see `pinning.page_of_version`."""
        runs = self.core.all_runs if tenant is None else self.core.runs_of(tenant)
        if agent_version is not None:
            return pinning.page_of_version(self.core, self.summaries, runs, status, limit,
                                           cursor, offset, agent_version)
        if offset and cursor is None:
            scored = runs.newest(status, limit + 1, offset)
            after = cursor_of(*scored[limit - 1]) if len(scored) > limit else None
            return self.summaries(scored[:limit]), after
        scored, after = runs.page(status, limit + offset, cursor)
        scored = scored[offset:]
        if after is not None and scored:
            after = cursor_of(*scored[-1])
        return self.summaries(scored), after

    def summaries(self, scored: list[tuple[str, int]]) -> list[RunSummary]:
        """The runs of (run id, score)s as lists show them; runs gone past retention left
        out."""
        found = self.core.fields_of_runs([run_id for run_id, _ in scored], "agent", "status",
                                         "version", "created_at", "updated_at", "open",
                                         "agent_version", "retry", "tenant")
        out = []
        for (run_id, _), fields in zip(scored, found, strict=True):
            raw = cast("list[str]", fields)
            if raw[0] is not None:  # expired after retention; the sweeper prunes the index
                out.append(RunSummary(id=run_id, agent=raw[0], status=Status(raw[1]),
                                      version=int(raw[2]),
                                      open_interrupts=len(open_of(raw[5])),
                                      created_at=iso(raw[3]), updated_at=iso(raw[4]),
                                      agent_version=raw[6], retry=retry_of(raw[7]),
                                      tenant=raw[8] or DEFAULT_TENANT))
        return out

    def retention_cutoff_ms(self) -> int:
        """Finished runs that ended before this are past retention."""
        return self.core.now_ms() - self.config.retention_s * 1000

    def fold_parked(self, limit: int = 5000) -> int:
        """Fold the events of runs parked `fold_after_ms` ago or more into their hashes
        (lua/fold_events.lua), in the order they parked, each shard's from where its last
        pass stopped (its `fold:cursor`), at most `limit` a shard; returns how many were
        folded. A run parked again later comes round again: its place in the index is its
        last park."""
        cutoff = self.core.now_ms() - self.config.fold_after_ms
        tenants = self.core.tenants()
        indexes = [(family, runs) for shard, runs in self.core.layout.scanned
                   for family in registries.families([shard], tenants)]
        # Every index's cursor, then every index's due runs: two round trips a sweep
        # however many shards and tenants (one each a shard cost the sweeper's clock
        # about 100 round trips a second at 48 shards, with nothing to fold).
        pipe = self.redis.pipeline(transaction=False)
        for family, _ in indexes:
            pipe.get(family.fold_cursor)
        cursors = cast("list[str | None]", pipe.execute()) if indexes else []
        pipe = self.redis.pipeline(transaction=False)
        for (family, _), start in zip(indexes, cursors, strict=True):
            pipe.zrangebyscore(family.index(Status.INTERRUPTED), start or "-inf", cutoff,
                               start=0, num=limit, withscores=True)
        due = cast("list[list[tuple[str, float]]]", pipe.execute()) if indexes else []
        return sum(self._fold_shard(family, runs, found, limit)
                   for (family, runs), found in zip(indexes, due, strict=True) if found)

    def _fold_shard(self, shard: ShardKeys, runs: Keys, found: list[tuple[str, float]],
                    limit: int) -> int:
        """Fold `found`, runs `shard` indexes (a shard's own, or a tenant's in it: each has
        its cursor) parked long enough, their keys those of layout `runs` (the legacy
        shard's, while the store moves, folded where they are: one moved meanwhile is
        found not parked there, and comes round at its next park)."""
        folded = 0
        for at in range(0, len(found), 200):
            def fill(pipe: Any, page: list[tuple[str, float]] = found[at:at + 200]) -> None:
                for run_id, _ in page:
                    self.core.call("fold_events", [runs.run(run_id), runs.events(run_id)],
                                   client=pipe, keep=self.config.events_max)

            folded += sum(reply == "folded"
                          for reply in self.core.pipelined(fill, "fold_events"))
        # The next pass starts at this page's last time again (runs parked in the same ms
        # may be past the page; folding twice finds nothing), or past it when the whole
        # page was that one ms.
        last = int(found[-1][1])
        self.redis.set(shard.fold_cursor,
                       last + 1 if len(found) == limit and int(found[0][1]) == last else last)
        return folded

    def prune_finished(self) -> int:
        """Drop index entries of finished runs whose keys have expired."""
        return self.core.all_runs.prune_finished_before(self.retention_cutoff_ms())
