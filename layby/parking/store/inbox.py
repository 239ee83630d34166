"""The reviewers' inbox's reads: the open interrupts of many runs at once, with their
reviews, without their histories."""

from __future__ import annotations

from collections.abc import Sequence

from layby.parking import codecs
from layby.parking.store.core import Part
from layby.parking.store.fields import INTERRUPT, open_of, reviews_of
from layby.wire import InterruptView


class Inbox(Part):
    """The reviewers' inbox's reads (`store.inbox`)."""

    def open_interrupts(self, run_ids: Sequence[str]
                        ) -> list[tuple[str, str, list[InterruptView]]]:
        """(run id, agent, its open interrupts with their reviews) of each run of `run_ids`
        that waits: two round trips reading neither histories nor notifications, for
        lists over many runs (the reviewers' inbox)."""
        located = self.core.located(run_ids)
        pipe = self.redis.pipeline(transaction=False)
        for run_id, keys in zip(run_ids, located, strict=True):
            pipe.hmget(keys.run(run_id), "agent", "open")
        heads = [(run_id, keys, agent, sorted(open_of(open_ids)))
                 for run_id, keys, (agent, open_ids)
                 in zip(run_ids, located, pipe.execute(), strict=True)
                 if agent is not None and open_ids]
        if not heads:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for run_id, keys, _, open_ids in heads:
            pipe.hmget(keys.run(run_id), *[INTERRUPT + i for i in open_ids])
            pipe.hgetall(keys.review(run_id))
        replies = pipe.execute()
        found = []
        for at, (run_id, _, agent, open_ids) in enumerate(heads):
            specs, review = replies[2 * at], reviews_of(replies[2 * at + 1])
            found.append((run_id, agent, [
                InterruptView.of(codecs.interrupt(i, raw), None, True, review.get(i))
                for i, raw in zip(open_ids, specs, strict=True) if raw is not None]))
        return found
