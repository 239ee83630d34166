"""What the sweeper reads: where anything is due at all, interrupts past their deadline,
retries due, leases lapsed, runs whose task message is lost or may have been reserved by a
dead worker, and when the sweeper last swept."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from redis.crc import key_slot

from layby.parking import pinning
from layby.parking.registries import Registry, Shard, due_in
from layby.parking.store.core import Part, on_cluster
from layby.wire import Status

# The lost-message check reads the oldest waiting runs this many at a time, up to this many
# pages (`waiting_too_long`).
LOST_SCAN_PAGE = 100
LOST_SCAN_PAGES = 10
# After a worker's death, runs within this many numbers of their queue's last claim are
# requeued (what it may have reserved, prefetched but not claimed; `maybe_reserved`):
# above a worker's concurrency times its prefetch (1). A message beyond is found later,
# once claims pass it, by the lost-message check.
RESERVED_HEADROOM = 100


@dataclass(frozen=True)
class Due:
    """Where a sweep has something to do (`Deadlines.find_due`): for each of its reads, the
    shards whose sorted set holds a member due; `lost`, whether a run waits past
    LAYBY_LOST_MESSAGE_S (its message may be lost)."""

    outbox: tuple[Shard, ...]
    notifications: tuple[Shard, ...]
    deadlines: tuple[Shard, ...]
    retries: tuple[Shard, ...]
    leases: tuple[Shard, ...]
    lost: bool


class Deadlines(Part):
    """What the sweeper reads (`store.deadlines`)."""

    def find_due(self) -> Due:
        """Where anything is due, in one round trip (`lua/find_due.lua`, a script a slot on
        a cluster, one on a server): a sweep with nothing to do then reads no shard. An
        idle pass at 48 shards read 336 sorted sets and ran 96 claims, 539 commands and
        8.7 ms of the sweeper's CPU every second; the sweeper was most of an idle
        deployment's CPU."""
        shards = self.core.shards
        kinds = ("outbox", "notifications", "deadlines", "retries", "leases")
        wanted: list[tuple[str, int, str, int]] = [
            (kind, i, key, 0) for i, shard in enumerate(shards)
            for kind, key in zip(kinds, (shard.keys.outbox, shard.keys.notify_due,
                                         shard.keys.deadlines, shard.keys.retries,
                                         shard.keys.leases), strict=True)]
        index = self.core.all_runs  # (every tenant's; `lost` is one flag, of no shard)
        wanted += [("lost", 0, key, self.config.lost_message_ms)
                   for status in (Status.QUEUED, Status.RESUMING) for key in index.sets[status]]
        groups: dict[int, list[tuple[str, int, str, int]]] = {}
        cluster = on_cluster(self.redis)
        for item in wanted:
            groups.setdefault(key_slot(item[2].encode()) if cluster else 0, []).append(item)

        def fill(pipe: object) -> None:
            for group in groups.values():
                self.core.call("find_due", [key for _, _, key, _ in group], client=pipe,
                               lags=[lag for _, _, _, lag in group])

        found: dict[str, list[Shard]] = {kind: [] for kind in (*kinds, "lost")}
        for group, positions in zip(groups.values(),
                                    self.core.pipelined(fill, "find_due"), strict=True):
            for position in positions:
                kind, i, _, _ = group[int(position) - 1]
                found[kind].append(shards[i])
        return Due(outbox=tuple(found["outbox"]), notifications=tuple(found["notifications"]),
                   deadlines=tuple(found["deadlines"]), retries=tuple(found["retries"]),
                   leases=tuple(found["leases"]), lost=bool(found["lost"]))

    def due_deadlines(self, limit: int = 200, shards: Sequence[Shard] | None = None
                      ) -> list[tuple[str, str]]:
        """(run id, interrupt id) of interrupts past their deadline, the longest past first
        (in `shards`, when given, rather than every shard)."""
        pairs = []
        for member, _ in self._due(lambda shard: shard.deadlines, shards, limit):
            run_id, _, interrupt_id = member.rpartition(" ")
            pairs.append((run_id, interrupt_id))
        return pairs

    def soonest_deadlines(self, limit: int = 1000) -> list[str]:
        """The runs whose interrupts expire soonest (past or not), the soonest first, each
        once: one round trip."""
        found = due_in([shard.deadlines for shard in self.core.shards], float("inf"), limit)
        return list(dict.fromkeys(member.rpartition(" ")[0] for member, _ in found))

    def due_retries(self, limit: int = 200, shards: Sequence[Shard] | None = None
                    ) -> list[str]:
        """Retrying runs whose next try is due, the longest due first."""
        return [run_id for run_id, _ in self._due(lambda shard: shard.retries, shards, limit)]

    def lapsed_leases(self, limit: int = 200, shards: Sequence[Shard] | None = None
                      ) -> list[str]:
        """Running runs whose claim lapsed, the longest lapsed first."""
        return [run_id for run_id, _ in self._due(lambda shard: shard.leases, shards, limit)]

    def _due(self, registry: Callable[[Shard], Registry], shards: Sequence[Shard] | None,
             limit: int) -> list[tuple[str, int]]:
        """What is due now in `registry` of `shards` (every shard's when None)."""
        chosen = self.core.shards if shards is None else shards
        if not chosen:
            return []
        return due_in([registry(shard) for shard in chosen], self.core.now_ms(), limit)

    def waiting(self, before_ms: int, limit: int = 200) -> list[str]:
        """Every run queued or resuming since before `before_ms`, a page at a time: a
        requeued run leaves the scan, its place in the index refreshed past it."""
        return self.core.all_runs.waiting_since_before((Status.QUEUED, Status.RESUMING), before_ms,
                                                       limit)

    def waiting_too_long(self, older_than_ms: int, limit: int = 200) -> list[str]:
        """Runs queued or resuming since before `older_than_ms` ago whose message is no
        longer in its queue: lost (a task that failed before its claim, a message purged).
        One whose message waits behind others is left to wait, however long the queue
        (`gone_from_queue`): a burst of 100,000 starts takes longer to drain than
        LAYBY_LOST_MESSAGE_S, and copies of its messages (45,000 once) slowed the parks
        behind them 30 times. The oldest first, a page at a time, until a page finds none:
        the oldest of a queue are the first its consumers reach. Messages a restart, a
        failover or a worker's death may have lost are requeued by their own checks."""
        return self._gone_oldest_first(self.core.now_ms() - older_than_ms, 0, limit)

    def maybe_reserved(self, limit: int = 1000) -> list[str]:
        """Waiting runs whose message a worker may have taken from its queue and not yet
        claimed (within RESERVED_HEADROOM numbers of the last claim, `gone_from_queue`),
        or lost: after a worker's death, what it may have held. The others wait in their
        queue, and a copy would only lengthen it."""
        return self._gone_oldest_first(self.core.now_ms(), RESERVED_HEADROOM, limit)

    def _gone_oldest_first(self, cutoff_ms: int, headroom: int, limit: int) -> list[str]:
        found: list[str] = []
        seen: set[str] = set()
        for _ in range(LOST_SCAN_PAGES):
            page = [r for r in self.core.all_runs.waiting_since_before(
                (Status.QUEUED, Status.RESUMING), cutoff_ms, LOST_SCAN_PAGE + len(seen))
                if r not in seen]
            if not page:
                break
            seen.update(page)
            gone = self.gone_from_queue(page, headroom)
            found.extend(gone)
            if not gone or len(found) >= limit:
                break
        return found[:limit]

    def gone_from_queue(self, run_ids: list[str], headroom: int = 0) -> list[str]:
        """Of the waiting `run_ids`, those whose task message is no longer in its queue.
        Each step's message took a number in its queue (the run's `sent`, lua/_prelude.lua)
        and each claim notes the highest it took (`queues`): a queue is taken in order, so
        a number a claim passed has left it, and so has every message of an empty queue
        (`queue_length`). With `headroom`, also those within that many numbers of the last
        taken: what a dead worker may have reserved and not yet claimed. A run queued by a
        layby before 0.3.0 has no number: it is gone once it is older than the oldest
        message of the turns queue (or when that is not known), as that layby did."""
        if not run_ids:
            return []
        # A queue's numbers are counted in each shard (`queues`): a run's against its own
        # (while the store moves, one still in the legacy layout against the legacy's).
        located = self.core.located(run_ids)
        shard_queues = [keys.shard_of(run_id).queues
                        for run_id, keys in zip(run_ids, located, strict=True)]
        wanted = list(dict.fromkeys(shard_queues))
        pipe = self.redis.pipeline(transaction=False)
        for key in wanted:
            pipe.hgetall(key)
        for run_id, keys in zip(run_ids, located, strict=True):
            pipe.hmget(keys.run(run_id), "sent", "updated_at")
        replies = pipe.execute()
        of_shard = dict(zip(wanted, replies[:len(wanted)], strict=True))
        fields = replies[len(wanted):]
        lengths: dict[str, int | None] = {}

        def empty(queue: str) -> bool:
            if queue not in lengths:
                lengths[queue] = self.queue_length(queue)
            return lengths[queue] == 0

        gone, unnumbered = [], []
        for run_id, key, (sent, updated_at) in zip(run_ids, shard_queues, fields, strict=True):
            progress = of_shard[key]
            queue, _, number = (sent or "").partition(" ")
            if not number.isdigit():
                unnumbered.append((run_id, updated_at))
            elif int(number) <= int(progress.get(f"{queue}:taken", 0)) + headroom or empty(queue):
                gone.append(run_id)
        if unnumbered:
            gone.extend(self._unnumbered_gone(unnumbered, headroom))
        return gone

    def _unnumbered_gone(self, unnumbered: list[tuple[str, str | None]],
                         headroom: int) -> list[str]:
        """Of the runs with no number (queued by a layby before 0.3.0; each with when it
        was last updated), those gone as that layby judged it: older than the oldest
        message of the turns queue, or all when that is not known or with `headroom`; but
        not the pinned runs still behind their version's queue (`not_behind_pinned`)."""
        oldest = self.oldest_queued_ms()
        pushed = (self.config.messages or {}).get("turn")
        return pinning.not_behind_pinned(self.core, pushed[0] if pushed else None, [
            run_id for run_id, updated_at in unnumbered
            if headroom or oldest is None or updated_at is None or int(updated_at) < oldest])

    def queue_length(self, queue: str) -> int | None:
        """How many messages wait in `queue` on the broker, or None when that is not known
        (`length_of_queue`, which the process's runtime sets, asks the broker; without it,
        only a broker that is this server is asked)."""
        if self.core.length_of_queue is not None:
            return self.core.length_of_queue(queue)
        pushed = (self.config.messages or {}).get("turn")
        if not pushed:
            return None
        prefix = pushed[0][:len(pushed[0]) - len(self.core.tasks.turn_queue)]
        return int(self.redis.llen(prefix + queue))

    def oldest_queued_ms(self) -> int | None:
        """When the oldest message still on the turns queue (the next to be taken) was
        pushed, if a transition script pushed it (its delivery tag ends with the moment);
        None when the queue is empty, the broker is another server, or the message does
        not say (one kombu published)."""
        pushed = (self.config.messages or {}).get("turn")
        if not pushed:
            return None
        # kombu's Redis transport LPUSHes and takes from the right: the oldest is the last
        # (and a message kombu restores is RPUSHed there, to be taken next).
        raw = self.redis.lindex(pushed[0], -1)
        if raw is None:
            return None
        try:  # the tag `push` in _queue.lua writes: "<task id>:<ms pushed>"
            tag = json.loads(raw)["properties"]["delivery_tag"]
            moment = str(tag).rsplit(":", 1)[1]
        except (ValueError, KeyError, TypeError, IndexError):
            return None
        return int(moment) if moment.isdigit() else None

    def note_sweep(self) -> None:
        """Note that a sweep just finished (the sweeper's liveness, by the server's clock)."""
        self.redis.set(self.core.keys.swept, self.core.now_ms())

    def last_sweep_ms(self) -> int | None:
        """When the sweeper last finished a sweep (server time, ms), or None: never."""
        raw = self.redis.get(self.core.keys.swept)
        return int(raw) if raw else None
