"""retry_notifications.lua: an operator sends failed notifications again: failed → pending,
attempts 0, delivered now, only while the run waits and the interrupt is open; anything
else is left as it is."""

from __future__ import annotations

import pytest

from layby.parking import Announcements
from tests.store.conftest import World, answer, interrupt, note

pytestmark = pytest.mark.store


def _failed(world: World, *ids: str, store=None) -> None:  # type: ignore[no-untyped-def]
    """A parked run (on int_a and int_b) whose notifications `ids` (ntf_a: int_a's, ntf_b:
    int_b's) failed for good."""
    store = store or world.store
    past = world.now() - 1_000
    world.make("interrupted", store=store, interrupts=[interrupt("int_a"), interrupt("int_b")],
               plan=Announcements(notes=[(note("ntf_a", "int_a"), past),
                                         (note("ntf_b", "int_b"), past)]))
    for nid in ids:
        _, sending = store.outbox.start_delivery("run_1", nid, deadline_ms=30_000, max_attempts=5)
        assert store.outbox.finish_delivery("run_1", sending, "failed", error="bounced") == "ok"


def test_failed_notifications_go_back_to_pending_and_are_delivered_now(world: World) -> None:
    _failed(world, "ntf_a", "ntf_b")
    before = world.now()
    retried, dispatch = world.store.outbox.retry_notifications("run_1")
    assert sorted(retried) == ["ntf_a", "ntf_b"] and sorted(dispatch) == ["ntf_a", "ntf_b"]
    for n in world.notes("run_1").values():
        assert (n.state, n.attempts, n.last_error) == ("pending", 0, None)
    due = world.zset(world.shard.notify_due)
    assert set(due) == {"run_1 ntf_a", "run_1 ntf_b"}
    assert all(before + 10_000 <= d <= world.now() + 10_000 for d in due.values())
    (event,) = [e for e in world.events("run_1") if e[0] == "notifications.retried"]
    assert event[1] == 2 and sorted(event[2]["ids"]) == ["ntf_a", "ntf_b"]
    # Its next send starts from its first attempt again.
    _, sending = world.store.outbox.start_delivery("run_1", "ntf_a", deadline_ms=30_000,
                                                   max_attempts=1)
    assert sending is not None and sending.attempts == 1


def test_only_the_notifications_named_are_retried(world: World) -> None:
    _failed(world, "ntf_a", "ntf_b")
    assert world.store.outbox.retry_notifications("run_1", ["ntf_b", "ntf_x"]) == (["ntf_b"],
                                                                                   ["ntf_b"])
    assert world.notes("run_1")["ntf_a"].state == "failed"


def test_a_failed_notification_of_an_answered_interrupt_stays_failed(world: World) -> None:
    _failed(world, "ntf_a", "ntf_b")
    world.store.answers.answer("run_1", [answer("int_a")])
    assert world.store.outbox.retry_notifications("run_1") == (["ntf_b"], ["ntf_b"])
    assert world.notes("run_1")["ntf_a"].state == "failed"


def test_with_nothing_failed_a_retry_changes_nothing(world: World) -> None:
    _failed(world)
    before = world.snapshot()
    assert world.store.outbox.retry_notifications("run_1") == ([], [])
    assert world.snapshot() == before


def test_a_run_that_no_longer_waits_has_nothing_retried(world: World) -> None:
    _failed(world, "ntf_a")
    world.store.answers.answer("run_1", [answer("int_a"), answer("int_b")])
    before = world.snapshot()
    assert world.store.outbox.retry_notifications("run_1") == ([], [])
    assert world.snapshot() == before


def test_with_the_broker_on_the_server_the_retried_deliveries_are_pushed(world: World) -> None:
    store = world.store_with(pushing=True)
    _failed(world, "ntf_a", store=store)
    assert store.outbox.retry_notifications("run_1") == (["ntf_a"], [])
    assert world.queue("layby.notify")[-1] == ("layby.notify.deliver", ["run_1", "ntf_a"],
                                               "ntf_a")
    assert world.zset(world.shard.notify_due)["run_1 ntf_a"] >= world.now() + 290_000
