"""The audit trail in the store: entries that change no run recorded, and pages of it
(`parking.audit` reads them)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from layby.parking import audit
from layby.parking.store.core import Part


class Audit(Part):
    """The audit trail (`store.audit`)."""

    def record(self, entries: Sequence[str], *, of: str) -> None:
        """Keep audit entries that change no run (a refusal, a run token minted) in the
        audit trail of the shard of `of` (a run's id, or a caller's), in the sharded layout
        (a store still moving from 0.2.0's keeps none)."""
        keys = self.core.keys
        if entries and keys.shard_count is not None:
            self.core.call("record_audit", [keys.shard_of(of).audit],
                           keep_ms=self.config.audit_keep_ms, entries=list(entries))

    def page(self, *, run: str | None = None,
             keep: Callable[[dict[str, Any]], bool] = lambda _: True,
             since_ms: int | None = None, cursor: str | None = None, limit: int = 100
             ) -> tuple[list[dict[str, Any]], str | None]:
        """A page of the audit trail, newest first (`parking.audit.page`): a run's alone
        (its shard's), or every shard's, with the entries `keep` takes."""
        shards = self.core.keys.shards
        only = self.core.keys.shard_number(run) if run is not None else None
        return audit.page(self.redis, shards, only=only, since_ms=since_ms, cursor=cursor,
                          limit=limit, keep=(lambda e: e.get("run") == run and keep(e))
                          if run is not None else keep)
