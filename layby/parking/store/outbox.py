"""Notifications and the outbox: notifications planned for a parked run, due, delivered
(started, sent, to retry, failed) and retried; and the outbox of task messages a
transition leaves to publish when the broker is another server (claimed, held, acked)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

from layby.parking import results
from layby.parking.keys import Keys, ShardKeys
from layby.parking.records import Announcements, OutboxEntry
from layby.parking.registries import Shard, due_in
from layby.parking.store.core import Part
from layby.parking.store.fields import (
    NOTE,
    dumps,
    first_scan,
    notification_of,
    notifications_of,
    one_field,
    scanned_fields,
    stored_note,
)
from layby.wire import Notification, Status


class Outbox(Part):
    """Notifications and the outbox (`store.outbox`)."""

    def plan_notifications(self, run_id: str, plan: Announcements) -> tuple[list[str],
                                                                               list[str]]:
        """Record `plan` for a parked run. Returns the ids that were not planned before, and
        those of them whose delivery the caller must queue (the broker elsewhere)."""
        given, grant_keys = plan_args(plan)
        planned, dispatch = self.core.run_script("plan_notifications", run_id, plan=given,
                                                 extra_keys=grant_keys)
        return [str(x) for x in planned], [str(x) for x in dispatch]

    def claim_due_notifications(self, limit: int = 100, retry_ms: int = 10_000,
                                shards: Sequence[Shard] | None = None) -> list[tuple[str, str]]:
        """Queue the deliveries of notifications due to be sent, at most `limit` a shard
        (a script each, every shard's, or those of `shards`, in one round trip:
        `_each_shard`); returns (run id, notification id) of those the caller must queue
        itself (the broker elsewhere)."""
        def claim(pipe: Any, shard: ShardKeys) -> None:
            self.core.call("claim_due_notifications", [shard.notify_due], client=pipe,
                           limit=limit, retry_ms=retry_ms)

        return [cast("tuple[str, str]", tuple(m.split(" ", 1)))
                for raw in self._each_shard("claim_due_notifications", claim, shards)
                for m in raw]

    def _each_shard(self, script: str, queue: Callable[[Any, ShardKeys], None],
                    shards: Sequence[Shard] | None) -> list[Any]:
        """`script`, queued by `queue` for every shard, in one pipeline: the sweeper's clock
        claims every second, and a round trip a shard was 96 of them at 48 shards with
        nothing due. Each claim stands alone: one whose node had lost its scripts (NOSCRIPT
        after a restart) is sent again with the others, which then find what they claimed
        already claimed, its entries published at their claim's end (`retry_ms`)."""
        chosen = self.core.shards if shards is None else shards
        if not chosen:
            return []

        def fill(pipe: Any) -> None:
            for shard in chosen:
                queue(pipe, shard.keys)
        return self.core.pipelined(fill, script)

    def redue_queued_notifications(self) -> int:
        """Notifications whose delivery was queued (due again only once a lost message would
        be), made due now: after a store restart or a worker's death, their messages may be
        gone. One that is not due yet goes back to its time when its delivery starts."""
        now = self.core.now_ms()
        redued = 0
        for shard in self.core.shards:
            key = shard.keys.notify_due
            members = cast("list[str]", self.redis.zrangebyscore(
                key, f"({now}", now + self.config.lost_message_ms))
            if members:
                self.redis.zadd(key, dict.fromkeys(members, now), xx=True)
            redued += len(members)
        return redued

    def start_delivery(self, run_id: str, notification_id: str, *, deadline_ms: int,
                       max_attempts: int) -> tuple[str, Notification | None]:
        reply = self.core.run_script(
            "start_delivery", run_id, notification_id=notification_id, deadline_ms=deadline_ms,
            max_attempts=max_attempts, run_id=run_id)
        if reply[0] == "ok":
            return "ok", notification_of(notification_id, reply[1])
        return str(reply[0]), None

    def finish_delivery(self, run_id: str, note: Notification, outcome: str, *,
                        error: str = "", retry_in_ms: int = 0, message: str = "") -> str:
        """Record a send's outcome: "sent", "retry" (in `retry_in_ms`) or "failed"; a sent
        one with where its `message` is (a Slack post's "<channel>/<ts>"), if given."""
        reply = self.core.run_script(
            "finish_delivery", run_id, notification_id=note.id, outcome=outcome, error=error[:2000],
            retry_ms=retry_in_ms, run_id=run_id, attempts=note.attempts, message=message[:200])
        return str(reply[0])

    def retry_notifications(self, run_id: str, notification_ids: list[str] | None = None
                            ) -> tuple[list[str], list[str]]:
        """Failed notifications of a parked run (those named, or all) back to pending with
        their attempts reset, delivered now. Returns the ids retried, and those of them
        whose delivery the caller must queue (the broker elsewhere)."""
        retried, dispatch = self.core.run_script("retry_notifications", run_id,
                                                 ids=notification_ids or [])
        return [str(x) for x in retried], [str(x) for x in dispatch]

    def notifications(self, run_id: str) -> list[Notification]:
        keys = self.core.keys_of(run_id)
        return notifications_of(scanned_fields(self.redis, keys, run_id, NOTE,
                                               first_scan(self.redis, keys, run_id, NOTE)))

    def notifications_of_parked(self, page: int = 500) -> Iterator[tuple[str, list[Notification]]]:
        """(run id, its notifications) of every parked run that has some, a page of the
        index at a time (one round trip a page, the same cost at any depth)."""
        cursor: str | None = None
        while True:
            scored, cursor = self.core.all_runs.page(Status.INTERRUPTED, page, cursor)
            located = self.core.located([run_id for run_id, _ in scored])
            pipe = self.redis.pipeline(transaction=False)
            for (run_id, _), keys in zip(scored, located, strict=True):
                first_scan(pipe, keys, run_id, NOTE)
            found = pipe.execute()
            for (run_id, _), keys, scanned in zip(scored, located, found, strict=True):
                notes = scanned_fields(self.redis, keys, run_id, NOTE, scanned)
                if notes:
                    yield run_id, notifications_of(notes)
            if cursor is None:
                return

    def notification(self, run_id: str, notification_id: str) -> Notification | None:
        raw = one_field(self.redis, self.core.keys_of(run_id), run_id, NOTE, notification_id)
        return notification_of(notification_id, raw) if raw else None

    def claim_outbox(self, limit: int = 100, retry_ms: int = 10_000,
                     shards: Sequence[Shard] | None = None) -> list[OutboxEntry]:
        """Outbox entries due to be published, each claimed for `retry_ms`: at most `limit`
        a shard (a script each, every shard's, or those of `shards`, in one round trip)."""
        def claim(pipe: Any, shard: ShardKeys) -> None:
            self.core.call("claim_outbox", [shard.outbox, shard.outbox_entries], client=pipe,
                           limit=limit, retry_ms=retry_ms)

        return [entry for raw in self._each_shard("claim_outbox", claim, shards)
                for entry in results.entries_of(raw)]

    def _by_shard(self, entries: Sequence[tuple[str, str]]) -> dict[ShardKeys, list[str]]:
        """Outbox entry ids, given as (run id, entry id), by the shard that holds them (the
        run's: an entry's id does not always name its run, a delivery's is the
        notification's); while the store moves to the sharded layout, every one may still
        be in the legacy shard too (its run not moved yet)."""
        layout = self.core.layout
        found: dict[ShardKeys, list[str]] = {}
        for run_id, entry_id in entries:
            found.setdefault(layout.keys.shard_of(run_id), []).append(entry_id)
        if layout.legacy is not None and entries:
            found[layout.legacy.legacy] = [entry_id for _, entry_id in entries]
        return found

    def hold_outbox(self, entries: Sequence[tuple[str, str]]) -> None:
        """Entries published, as (run id, entry id), whose task acks them itself once
        done: due again only if the message was lost (LAYBY_LOST_MESSAGE_S), not after the
        grace time, so that one still queued is not published again."""
        if entries:
            due = self.core.now_ms() + self.config.lost_message_ms
            for shard, ids in self._by_shard(entries).items():
                self.redis.zadd(shard.outbox, dict.fromkeys(ids, due), xx=True)

    def ack_outbox(self, entries: Sequence[tuple[str, str]]) -> None:
        """Forget published entries, given as (run id, entry id)."""
        for shard, ids in self._by_shard(entries).items():
            self.core.call("ack_outbox", [shard.outbox, shard.outbox_entries], ids=ids)

    def overdue_outbox(self, older_than_ms: int = 0, limit: int = 200
                       ) -> list[tuple[str, int]]:
        """(entry id, ms overdue) of outbox entries due to be published more than
        `older_than_ms` ago, most overdue first. A read: nothing is claimed."""
        now = self.core.now_ms()
        found = due_in([shard.outbox for shard in self.core.shards], now - older_than_ms, limit)
        return [(entry_id, now - score) for entry_id, score in found]


def plan_args(plan: Announcements
              ) -> tuple[dict[str, Any], Callable[[Keys], tuple[str, ...]]]:
    """`plan` as the scripts read it (`record_plan` in lua/_prelude.lua), and the keys
    of its grants in a layout, in the same order: each in the shard of its ref (refs are
    drawn in the run's: `fits_with`), where `grant` looks."""
    refs = [ref for ref, _, _ in plan.grants]
    return ({"notes": [{"id": note.id, "record": dumps(stored_note(note)), "at": at}
                       for note, at in plan.notes],
             "grants": [{"grant": grant, "ttl_ms": max(1000, ttl_ms)}
                        for _, grant, ttl_ms in plan.grants],
             "handovers": [{"interrupt_id": interrupt_id, "reviewer": handover.reviewer,
                            "record": dumps(handover.wire())}
                           for interrupt_id, handover in plan.handovers]},
            lambda keys: tuple(keys.shard_of(ref).grant(ref) for ref in refs))
