"""finish_delivery.lua: what a send came to: sending → sent | retrying (due again after a
backoff) | failed (for good, the run stays parked). A sender whose send was taken over,
or a notification not sending, is 'stale' and changes nothing."""

from __future__ import annotations

import pytest

from layby.parking import Announcements
from layby.wire import Notification
from tests.store.conftest import World, note

pytestmark = pytest.mark.store

DATA = {"id": "ntf_1", "interruptId": "int_a", "reviewer": "alice", "channel": "email",
        "kind": "request", "attempts": 1}


def _sending(world: World, *, deadline_ms: int = 30_000) -> Notification:
    world.make("interrupted",
               plan=Announcements(notes=[(note("ntf_1", "int_a"), world.now() - 1_000)]))
    verdict, sending = world.store.outbox.start_delivery("run_1", "ntf_1", deadline_ms=deadline_ms,
                                                         max_attempts=5)
    assert verdict == "ok" and sending is not None
    return sending


def test_a_notification_sent_is_recorded_and_leaves_the_due_set(world: World) -> None:
    sending = _sending(world)
    before = world.now()
    assert world.store.outbox.finish_delivery("run_1", sending, "sent") == "ok"
    sent = world.notes("run_1")["ntf_1"]
    assert (sent.state, sent.attempts, sent.next_attempt_at) == ("sent", 1, None)
    # Sent at the first attempt, what most are: stored without state, attempts or due.
    assert set(world.raw_note("run_1", "ntf_1")) == {"i", "r", "c", "t", "ca", "sa"}
    assert sent.sent_at is not None
    raw = world.raw_note("run_1", "ntf_1")
    assert before <= raw["ca"] + raw["sa"] <= world.now()
    assert world.zset(world.shard.notify_due) == {}
    assert world.events("run_1")[-1] == ("notification.sent", 2, DATA)


def test_a_send_to_retry_is_due_again_after_its_backoff(world: World) -> None:
    sending = _sending(world)
    before = world.now()
    assert world.store.outbox.finish_delivery("run_1", sending, "retry", error="421 try later",
                                              retry_in_ms=60_000) == "ok"
    retrying = world.notes("run_1")["ntf_1"]
    assert (retrying.state, retrying.last_error) == ("retrying", "421 try later")
    due = world.zset(world.shard.notify_due)["run_1 ntf_1"]
    assert before + 60_000 <= due <= world.now() + 60_000
    assert world.events("run_1")[-1] == ("notification.retrying", 2,
                                         {**DATA, "error": "421 try later"})
    # Due again: its next attempt starts from there.
    world.client.zadd(world.shard.notify_due, {"run_1 ntf_1": world.now()})
    assert world.store.outbox.start_delivery("run_1", "ntf_1", deadline_ms=1, max_attempts=5)[0] \
        == "later"


def test_a_send_that_failed_for_good_is_recorded_and_counted(world: World) -> None:
    sending = _sending(world)
    assert world.store.outbox.finish_delivery("run_1", sending, "failed",
                                              error="550 no such user") == "ok"
    failed = world.notes("run_1")["ntf_1"]
    assert (failed.state, failed.last_error) == ("failed", "550 no such user")
    assert world.zset(world.shard.notify_due) == {}
    assert world.stats() == {"notifications_failed": 1}
    assert world.events("run_1")[-1] == ("notification.failed", 2,
                                         {**DATA, "error": "550 no such user"})
    assert world.run_hash("run_1")["status"] == "interrupted"


def test_the_outcome_of_a_send_taken_over_by_another_sender_is_stale(world: World) -> None:
    first = _sending(world, deadline_ms=-1_000)
    _, second = world.store.outbox.start_delivery("run_1", "ntf_1", deadline_ms=30_000,
                                                  max_attempts=5)
    assert second is not None and second.attempts == 2
    before = world.snapshot()
    assert world.store.outbox.finish_delivery("run_1", first, "failed", error="timeout") == "stale"
    assert world.snapshot() == before


def test_a_second_outcome_of_the_same_send_is_stale(world: World) -> None:
    sending = _sending(world)
    world.store.outbox.finish_delivery("run_1", sending, "sent")
    before = world.snapshot()
    assert world.store.outbox.finish_delivery("run_1", sending, "retry", error="x",
                                              retry_in_ms=1_000) == "stale"
    assert world.snapshot() == before


def test_the_outcome_for_a_notification_the_run_does_not_have_is_stale(world: World) -> None:
    sending = _sending(world)
    before = world.snapshot()
    assert world.store.outbox.finish_delivery("run_1", sending.model_copy(update={"id": "ntf_x"}),
                                              "sent") == "stale"
    assert world.snapshot() == before
