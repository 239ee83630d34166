"""The reviewers' inbox's reads: the open interrupts of many runs at once, with their
reviews, without their histories; and the reviewers' request index, by which a reviewer's
waiting requests are found among any number of runs.

The index holds, per name an interrupt asks (`names_asked`: a reviewer's id, a group's
name, `DEFAULT_GROUP` for an interrupt that names nobody, at every escalation level, and
whoever a request was handed to), the waiting runs that ask it, in each shard
(`<p>:{<shard>}:asks:<name>`). The transitions keep it (lua/_prelude.lua `ask`, `unask`) in
the sharded layout; migration 2 puts in it the runs that waited in the legacy one
(`parking.migrations.asks`). Names are resolved to people when read, so that a change of
the directory's groups needs no rewrite.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from layby.generation.interrupts import Interrupt
from layby.parking import codecs
from layby.parking.store.core import Part
from layby.parking.store.fields import INTERRUPT, open_of, reviews_of
from layby.wire import InterruptView

# The name an interrupt that names nobody asks: the directory's default group, whichever it
# is when the inbox reads (the directory refuses a reviewer or a group named so).
DEFAULT_GROUP = "*"


def names_asked(interrupts: Iterable[Interrupt]) -> list[str]:
    """Every name `interrupts` ask, at any escalation level, each once."""
    found: dict[str, None] = {}
    for intr in interrupts:
        for names in (intr.reviewers, *(step.reviewers for step in intr.escalation or [])):
            found.update(dict.fromkeys(names or [DEFAULT_GROUP]))
    return list(found)


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

    def asking(self, names: Sequence[str], limit: int) -> tuple[list[str], bool]:
        """The waiting runs that ask any of `names` (`names_asked`), the most recently
        asked first, at most `limit`; and whether there were more. One round trip."""
        if not names:
            return [], False
        pipe = self.redis.pipeline(transaction=False)
        keys = [shard.keys.asks(name) for shard in self.core.shards for name in names]
        for key in keys:
            pipe.zrange(key, 0, limit - 1, desc=True, withscores=True)
            pipe.zcard(key)
        replies = pipe.execute()
        pages = [replies[i] for i in range(0, len(replies), 2)]
        more = any(replies[i] > limit for i in range(1, len(replies), 2))
        newest = heapq.merge(*pages, key=lambda pair: -pair[1])
        found = list(dict.fromkeys(run_id for run_id, _ in newest))
        return found[:limit], more or len(found) > limit
