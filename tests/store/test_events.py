"""fold_events.lua and read_events.lua: the events of a run parked a while move out of their
stream into the run's hash, and are read back as the stream held them, folded ones first,
then the new stream's. 'kept' when an entry cannot be folded, 'none' when there is nothing
to fold or the run is not parked."""

from __future__ import annotations

import pytest

from layby.parking import Announcements
from layby.parking import events as run_events
from layby.parking.scripts import argv
from tests.store.conftest import OWNER, World, answer, interrupt, note

pytestmark = pytest.mark.store


def _fold(world: World, run_id: str = "run_1", keep: int = 2000) -> str:
    """The sweeper's fold, as it comes: long after the run's newest event (a fold in that
    very millisecond leaves the stream be: the last tests here)."""
    world.next_ms()
    return world.store.call("fold_events", [world.keys.run(run_id), world.keys.events(run_id)],
                            keep=keep)


def _answering(iid: str) -> list[str]:
    """answer_interrupts' arguments for one answer, as store.answers.answer lays them out."""
    return argv({"require_all": False, "allow_early": False, "answers": [
        {"id": iid, "answer": answer(iid).model_dump_json(by_alias=True), "need": 1,
         "deadline": True}], "audit": [], "slack": False, "trace": ""})


def _stored(world: World, run_id: str = "run_1", after: str = "0-0",
            count: int = 500) -> list:
    return run_events.stored(world.client, world.keys.events(run_id), after, count)


def _parked_with_history(world: World) -> None:
    """A parked run whose stream has every kind of event a park leaves: created, started,
    a step, the park, a plan, a notification sent, an answer (with spaces and quotes)."""
    world.make("running")
    world.store.runs.advance("run_1", 1, OWNER, world.history(2),
                             {"from": 1, "historyTo": 2, "messages": []}, inline=True)
    intrs = [interrupt("int_a"), interrupt("int_b", reason="confirmation")]
    world.store.runs.park("run_1", 2, OWNER, world.history(3), intrs,
                          {"from": 2, "historyTo": 3,
                           "interrupts": [{"id": i.id, "reason": i.reason} for i in intrs]},
                          plan=Announcements(notes=[(note("ntf_1", "int_a"), world.now() - 1_000)]))
    _, sending = world.store.outbox.start_delivery("run_1", "ntf_1", deadline_ms=30_000,
                                                   max_attempts=5)
    world.store.outbox.finish_delivery("run_1", sending, "sent")
    world.store.answers.answer("run_1", [answer("int_b", payload={"note": 'say "yes", then go'})])


def test_a_parked_runs_events_fold_into_its_hash_and_read_back_as_they_were(
        world: World) -> None:
    _parked_with_history(world)
    stream = world.client.xrange(world.keys.events("run_1"))
    as_read = world.store.runs.events("run_1")
    assert [e.type for e in as_read] == [
        "run.created", "run.started", "turn.committed", "run.interrupted",
        "notifications.planned", "notification.sent", "interrupt.answered"]
    assert _fold(world) == "folded"
    assert not world.client.exists(world.keys.events("run_1"))
    assert world.run_hash("run_1")["events"].count("\n") == len(stream) - 1
    assert _stored(world) == [(eid, fields) for eid, fields in stream]
    assert world.store.runs.events("run_1") == as_read


def test_events_after_a_fold_go_to_a_new_stream_read_after_the_folded_ones(
        world: World) -> None:
    _parked_with_history(world)
    folded = _stored(world)
    _fold(world)
    world.next_ms()
    world.store.answers.answer("run_1", [answer("int_a")])
    after = _stored(world)
    assert after[:len(folded)] == folded
    assert [f["type"] for _, f in after[len(folded):]] == ["interrupt.answered", "run.resuming"]
    assert world.client.xlen(world.keys.events("run_1")) == 2


def test_a_second_fold_appends_to_the_first(world: World) -> None:
    world.make("interrupted", interrupts=[interrupt("int_a"), interrupt("int_b")])
    assert _fold(world) == "folded"
    world.next_ms()
    world.store.answers.answer("run_1", [answer("int_a")])
    whole = _stored(world)
    assert _fold(world) == "folded"
    assert _stored(world) == whole
    assert not world.client.exists(world.keys.events("run_1"))


def test_reading_after_an_id_pages_through_folded_and_streamed_events(world: World) -> None:
    world.make("interrupted", interrupts=[interrupt("int_a"), interrupt("int_b")])
    _fold(world)
    world.next_ms()
    world.store.answers.answer("run_1", [answer("int_a")])
    whole = _stored(world)
    assert len(whole) == 4
    # A page across the fold's edge, and one from its last id on.
    assert _stored(world, after=whole[1][0], count=2) == whole[2:4]
    assert _stored(world, after=whole[0][0], count=1) == whole[1:2]
    assert _stored(world, after=whole[3][0]) == []
    # A Last-Event-ID of its time alone stands for its sequence 0.
    for eid, _ in whole:
        ms = eid.split("-")[0]
        assert _stored(world, after=ms) == _stored(world, after=f"{ms}-0")


def test_past_the_most_a_run_keeps_the_oldest_folded_events_go(world: World) -> None:
    _parked_with_history(world)
    whole = _stored(world)
    assert _fold(world, keep=3) == "folded"
    assert _stored(world) == whole[-3:]


def test_a_run_not_parked_has_nothing_folded(world: World) -> None:
    world.make("running")
    before = world.snapshot()
    assert _fold(world) == "none"
    assert world.snapshot() == before


def test_a_run_with_no_stream_left_has_nothing_folded(world: World) -> None:
    world.make("interrupted")
    _fold(world)
    before = world.snapshot()
    assert _fold(world) == "none"
    assert world.snapshot() == before


def test_a_stream_with_an_entry_the_fold_cannot_hold_is_kept_as_it_is(world: World) -> None:
    world.make("interrupted")
    # An entry with a field besides type, version and data (one of 0.1.0's predecessors
    # may have `at`, which nothing reads).
    world.client.xadd(world.keys.events("run_1"), {"type": "custom", "version": 2,
                                                    "data": "{}", "at": 1})
    before = world.snapshot()
    assert _fold(world) == "kept"
    assert world.snapshot() == before


def test_the_sweeper_folds_the_runs_parked_long_enough_from_where_it_stopped(
        world: World) -> None:
    world.make("interrupted", "run_1")
    world.make("running", "run_2")
    world.make("interrupted", "run_3")
    sweeping = world.store_with(fold_after_ms=0)
    assert world.store_with(fold_after_ms=3_600_000).lists.fold_parked() == 0
    assert sweeping.lists.fold_parked() == 2
    assert not world.client.exists(world.keys.events("run_1"), world.keys.events("run_3"))
    assert world.client.exists(world.keys.events("run_2"))
    assert int(world.client.get(world.shard.fold_cursor)) == world.indexes_of("run_3")[
        "interrupted"]
    assert sweeping.lists.fold_parked() == 0


def test_an_event_in_the_millisecond_of_a_fold_is_read_after_the_folded_ones(
        world: World) -> None:
    """A fold deletes the stream, and a stream made again numbers its entries from the
    time alone: a fold in the millisecond of the newest event leaves the stream be, so the
    next event's id still comes after every folded one."""
    world.make("interrupted", interrupts=[interrupt("int_a"), interrupt("int_b")])
    world.next_ms()
    # Three calls in one moment (MULTI runs them at one server time, as calls a
    # millisecond apart do): an answer, the sweeper's fold, the next answer.
    fold = world.store._scripts["fold_events"]
    pipe = world.client.pipeline(transaction=True)
    answer_script = world.store._scripts["answer_interrupts"]
    keys = world.keys.for_scripts("run_1")
    for iid in ("int_a", None, "int_b"):
        if iid is None:
            fold(keys=[world.keys.run("run_1"), world.keys.events("run_1")],
                 args=argv({"keep": 2000}), client=pipe)
        else:
            answer_script(keys=keys, args=_answering(iid), client=pipe)
    replies = pipe.execute()
    assert replies[1] == "kept" and replies[2][5] == "1"
    whole = _stored(world)
    ids = [eid for eid, _ in whole]
    assert ids == sorted(set(ids), key=lambda i: tuple(map(int, i.split("-"))))
    # A follower that has read up to the first answer reads the second, and the resume.
    seen = next(eid for eid, f in whole if f["type"] == "interrupt.answered")
    assert [f["type"] for _, f in _stored(world, after=seen)] == ["interrupt.answered",
                                                                  "run.resuming"]


def test_a_fold_a_millisecond_after_the_newest_event_folds_and_later_events_follow(
        world: World) -> None:
    world.make("interrupted", interrupts=[interrupt("int_a"), interrupt("int_b")])
    answer_script = world.store._scripts["answer_interrupts"]
    keys = world.keys.for_scripts("run_1")
    world.next_ms()
    answer_script(keys=keys, args=_answering("int_a"))
    world.next_ms()
    fold = world.store._scripts["fold_events"]
    assert fold(keys=[world.keys.run("run_1"), world.keys.events("run_1")],
                args=argv({"keep": 2000})) == "folded"
    seen = _stored(world)[-1][0]
    answer_script(keys=keys, args=_answering("int_b"))
    assert [f["type"] for _, f in _stored(world, after=seen)] == ["interrupt.answered",
                                                                  "run.resuming"]


def test_a_fold_drops_a_steps_messages_which_readers_take_from_the_history(
        world: World) -> None:
    """A run parked without a plan (the announcement task plans it) keeps its stream as
    it was, a step's messages in their field; folded, they go, as a park drops them, and
    readers take them from the history: the same events."""
    added = world.stepped_then_parked_unplanned()
    assert [f for _, f in world.client.xrange(world.keys.events("run_1")) if "messages" in f]
    before = world.store.runs.events("run_1")
    assert [e.data["messages"] for e in before if e.type == "turn.committed"] == [added]
    assert _fold(world) == "folded"
    assert "message 1" not in world.run_hash("run_1")["events"]
    assert world.store.runs.events("run_1") == before


def test_a_pages_timeline_stops_at_its_limit_and_says_the_rest_is_left_out(
        world: World) -> None:
    """The answer page and the inbox read at most so many of a run's events (a long loop's
    run has thousands); the command reads them all."""
    from layby.control.timeline import of_run

    world.make("interrupted", interrupts=[interrupt("int_a"), interrupt("int_b")])
    keys = world.keys.for_scripts("run_1")
    for iid in ("int_a", "int_b"):
        world.next_ms()
        world.store._scripts["answer_interrupts"](keys=keys, args=_answering(iid))
    whole = of_run(world.store, "run_1")
    assert [e.what for e in whole][-3:] == ["answered", "answered", "resuming"]
    cut = of_run(world.store, "run_1", max_events=2)
    assert [e.what for e in cut][:-1] == [e.what for e in whole][:2]
    assert cut[-1].what == "more" and "layby runs show RUN --timeline" in cut[-1].detail
    assert of_run(world.store, "run_1", max_events=len(whole) + 5) == whole
