"""start_delivery.lua: a notification due (pending, retrying, or sending past its send
deadline: the sender died) → sending with a new deadline; 'later' when it is not due,
'done' when it was sent, failed, skipped or is gone, skipped when its interrupt closed,
'failed' when it is out of attempts. Escalation levels are marked once."""

from __future__ import annotations

import pytest

from layby.parking import Announcements
from tests.store.conftest import World, answer, interrupt, note

pytestmark = pytest.mark.store


def _parked(world: World, *notes_: tuple, intrs: list | None = None) -> None:
    world.make("interrupted", interrupts=intrs,
               plan=Announcements(notes=[(n, at) for n, at in notes_]))


def _start(world: World, nid: str = "ntf_1", *, deadline_ms: int = 30_000,
           max_attempts: int = 5) -> tuple:
    return world.store.outbox.start_delivery("run_1", nid, deadline_ms=deadline_ms,
                                             max_attempts=max_attempts)


def test_a_pending_notification_due_now_starts_sending_under_a_deadline(world: World) -> None:
    _parked(world, (note("ntf_1", "int_a", token="secret"), world.now() - 1_000))
    before = world.now()
    verdict, sending = _start(world)
    assert verdict == "ok" and sending is not None
    assert (sending.state, sending.attempts, sending.reviewer, sending.token) == (
        "sending", 1, "alice", "secret")
    stored = world.raw_note("run_1", "ntf_1")
    assert stored["s"] == "sending" and "a" not in stored  # one attempt: left out
    due = world.zset(world.shard.notify_due)["run_1 ntf_1"]
    assert before + 30_000 <= due <= world.now() + 30_000 and stored["d"] == due


def test_a_notification_not_due_yet_goes_back_to_its_time(world: World) -> None:
    at = world.now() + 600_000
    _parked(world, (note("ntf_1", "int_a", kind="reminder"), at))
    # A sweep after a restart made it due now, in case its message was lost.
    world.client.zadd(world.shard.notify_due, {"run_1 ntf_1": world.now()})
    assert _start(world) == ("later", None)
    assert world.zset(world.shard.notify_due) == {"run_1 ntf_1": at}
    assert world.notes("run_1")["ntf_1"].state == "pending"


def test_a_send_in_flight_is_not_started_twice(world: World) -> None:
    _parked(world, (note("ntf_1", "int_a"), world.now() - 1_000))
    _start(world)
    before = world.snapshot()
    assert _start(world) == ("later", None)
    assert world.snapshot() == before


def test_a_send_whose_sender_died_is_taken_again_as_the_next_attempt(world: World) -> None:
    _parked(world, (note("ntf_1", "int_a"), world.now() - 1_000))
    _start(world, deadline_ms=-1_000)  # its send deadline passed: the sender is gone
    verdict, sending = _start(world)
    assert verdict == "ok" and sending is not None and sending.attempts == 2
    assert world.raw_note("run_1", "ntf_1")["a"] == 2


def test_a_sent_notification_is_done_and_a_late_copy_of_its_message_changes_nothing(
        world: World) -> None:
    _parked(world, (note("ntf_1", "int_a"), world.now() - 1_000))
    _, sending = _start(world)
    assert world.store.outbox.finish_delivery("run_1", sending, "sent") == "ok"
    before = world.snapshot()
    assert _start(world) == ("done", None)
    assert world.snapshot() == before


@pytest.mark.parametrize("state", ["failed", "skipped"])
def test_a_failed_or_skipped_notification_is_done_and_leaves_the_due_set(
        world: World, state: str) -> None:
    _parked(world, (note("ntf_1", "int_a"), world.now() - 1_000))
    if state == "failed":
        _, sending = _start(world)
        world.store.outbox.finish_delivery("run_1", sending, "failed", error="bounced")
    else:
        world.store.answers.answer("run_1", [answer("int_a")])  # skips what was not sent
    assert world.notes("run_1")["ntf_1"].state == state
    world.client.zadd(world.shard.notify_due, {"run_1 ntf_1": world.now()})  # a stray copy
    assert _start(world) == ("done", None)
    assert world.notes("run_1")["ntf_1"].state == state
    assert world.zset(world.shard.notify_due) == {}


def test_a_notification_the_run_does_not_have_is_gone_from_the_due_set(world: World) -> None:
    _parked(world)
    world.client.zadd(world.shard.notify_due, {"run_1 ntf_x": world.now()})
    assert world.store.run_script("start_delivery", "run_1", notification_id="ntf_x",
                                  deadline_ms=30_000, max_attempts=5,
                                  run_id="run_1") == ["done", "gone"]
    assert world.zset(world.shard.notify_due) == {}


def test_a_send_for_an_interrupt_answered_meanwhile_is_skipped_not_sent(world: World) -> None:
    _parked(world, (note("ntf_1", "int_a"), world.now() - 1_000))
    _start(world, deadline_ms=-1_000)  # its sender died while sending
    world.store.answers.answer("run_1", [answer("int_a", by="bob")])
    assert world.notes("run_1")["ntf_1"].state == "sending"  # an answer skips unsent ones
    assert world.store.run_script("start_delivery", "run_1", notification_id="ntf_1",
                                  deadline_ms=30_000, max_attempts=5,
                                  run_id="run_1") == ["done", "skipped"]
    assert world.notes("run_1")["ntf_1"].state == "skipped"
    assert world.zset(world.shard.notify_due) == {}


def test_a_notification_out_of_attempts_fails_for_good_and_the_run_stays_parked(
        world: World) -> None:
    _parked(world, (note("ntf_1", "int_a"), world.now() - 1_000))
    _start(world, deadline_ms=-1_000, max_attempts=1)
    assert _start(world, max_attempts=1) == ("failed", None)
    failed = world.notes("run_1")["ntf_1"]
    assert failed.state == "failed" and failed.attempts == 1
    assert failed.last_error == ("gave up after 1 attempts; the last never finished "
                                 "(the sender stopped)")
    assert world.zset(world.shard.notify_due) == {}
    assert world.stats()["notifications_failed"] == 1
    assert world.events("run_1")[-1] == ("notification.failed", 2, {
        "id": "ntf_1", "interruptId": "int_a", "reviewer": "alice", "channel": "email",
        "kind": "request", "attempts": 1, "error": failed.last_error})
    assert world.run_hash("run_1")["status"] == "interrupted"


def test_the_first_escalation_of_a_level_to_go_out_marks_the_level_once(world: World) -> None:
    past = world.now() - 1_000
    _parked(world, (note("ntf_1", "int_a", reviewer="carol", kind="escalation", level=1), past),
            (note("ntf_2", "int_a", reviewer="dave", kind="escalation", level=1), past))
    assert _start(world, "ntf_1")[0] == "ok"
    reached = world.client.hgetall(world.keys.review("run_1"))
    world.next_ms()
    assert _start(world, "ntf_2")[0] == "ok"
    review = world.client.hgetall(world.keys.review("run_1"))
    # When the level was reached: its first request's start, not moved by the next.
    assert review == reached and list(review) == ["escalated:int_a:1"]
    assert int(review["escalated:int_a:1"]) >= past
    assert world.stats() == {"escalations:1": 1}
    assert [d for t, _, d in world.events("run_1") if t == "interrupt.escalated"] == [
        {"interruptId": "int_a", "level": 1}]
    assert world.store.runs.view("run_1").interrupts[0].escalation_level == 1


def test_two_interrupts_notifications_are_told_apart(world: World) -> None:
    past = world.now() - 1_000
    _parked(world, (note("ntf_1", "int_a"), past), (note("ntf_2", "int_b"), past),
            intrs=[interrupt("int_a"), interrupt("int_b")])
    world.store.answers.answer("run_1", [answer("int_a")])
    assert _start(world, "ntf_1") == ("done", None)
    assert _start(world, "ntf_2")[0] == "ok"
