"""answer_interrupts.lua: answers recorded to open interrupts; the one that closes the last
moves interrupted → resuming and queues exactly one resume. Refusals ('conflict' with the
first answer, 'unknown', 'incomplete', 'again', 'finished', 'missing') change nothing;
an answer before the park ('early') is kept for it."""

from __future__ import annotations

import json

import pytest

from layby.parking import Announcements, Verdict
from layby.wire import Status
from tests.store.conftest import World, answer, handover, interrupt, note

pytestmark = pytest.mark.store

TWO = [interrupt("int_a"), interrupt("int_b")]


def _stored(world: World, run_id: str) -> dict[str, dict]:
    return {k: json.loads(v) for k, v in world.client.hgetall(world.keys.answers(run_id)).items()}


def test_an_answer_to_one_of_two_is_recorded_and_the_run_waits_on(world: World) -> None:
    later = world.now() + 600_000
    run = world.make("interrupted", interrupts=[interrupt("int_a", expires_ms=later),
                                                interrupt("int_b", expires_ms=later)])
    parked_at = int(world.run_hash(run.id)["updated_at"])
    a = answer("int_a", channel="email")
    done = world.store.answers.answer(run.id, [a])
    assert done.verdict is Verdict.OK and done.version == 2 and not done.resumed
    assert done.entries == () and done.at is not None
    assert _stored(world, run.id) == {"int_a": a.wire()}
    hash_ = world.run_hash(run.id)
    assert (hash_["status"], hash_["version"], hash_["open"]) == ("interrupted", "2", "int_b")
    # What the park waited on, written by the first answer before it changed `open`.
    assert hash_["waiting"] == "int_a int_b"
    assert hash_["updated_at"] == str(parked_at)  # an answer is not a change of state
    assert world.zset(world.shard.deadlines) == {"run_1 int_b": later}
    assert world.events(run.id)[-1] == ("interrupt.answered", 2, a.wire())
    assert done.event_id == world.client.xrevrange(world.keys.events(run.id), count=1)[0][0]
    stats = world.stats()
    assert stats["answers:email"] == 1 and stats["answer_latency_count"] == 1
    assert stats["answer_latency_le:10"] == 1  # answered within 10 s of the park
    assert world.indexes_of(run.id).keys() == {"interrupted"}


def test_the_answer_that_closes_the_last_interrupt_queues_one_resume(world: World) -> None:
    run = world.make("interrupted", interrupts=TWO)
    world.store.answers.answer(run.id, [answer("int_a")])
    done = world.store.answers.answer(run.id, [answer("int_b", by="bob")])
    assert done.ok and done.resumed and done.version == 3
    hash_ = world.run_hash(run.id)
    assert (hash_["status"], hash_["version"], hash_["open"], hash_["attempts"],
            hash_["waiting"]) == ("resuming", "3", "", "0", "int_a int_b")
    assert world.indexes_of(run.id) == {"resuming": int(hash_["updated_at"])}
    assert world.event_types(run.id)[-2:] == ["interrupt.answered", "run.resuming"]
    assert world.events(run.id)[-1] == ("run.resuming", 3, {})
    (entry,) = done.entries
    assert (entry.id, entry.task, entry.queue, entry.args) == (
        "run_1:resume:3", "layby.resume_run", "layby.turns", ["run_1", 3])
    assert [k for k in world.outbox() if ":resume:" in k] == ["run_1:resume:3"]


def test_answers_to_every_open_interrupt_at_once_resume_the_run(world: World) -> None:
    run = world.make("interrupted", interrupts=TWO)
    done = world.store.answers.answer(run.id, [answer("int_a"), answer("int_b")], require_all=True)
    assert done.resumed and done.version == 3
    assert world.event_types(run.id)[-3:] == ["interrupt.answered", "interrupt.answered",
                                              "run.resuming"]


def test_with_the_broker_on_the_server_the_resume_is_pushed(world: World) -> None:
    store = world.store_with(pushing=True)
    run = world.make("interrupted", store=store)
    done = store.answers.answer(run.id, [answer("int_a")])
    assert done.resumed and done.entries == ()
    assert world.queue("layby.turns")[-1] == ("layby.resume_run", ["run_1", 3],
                                              "run_1:resume:3")
    assert world.outbox() == {}


def test_with_slack_the_update_of_its_messages_is_in_the_outbox_with_the_answer(
        world: World) -> None:
    """The Slack update is written by the answer's own script, the broker on this server or
    not: a caller that dies after the commit leaves it for the sweeper to publish."""
    store = world.store_with(pushing=True)
    run = world.make("interrupted", store=store, interrupts=TWO)
    votes = {"int_a": 2}
    counted = store.answers.answer(run.id, [answer("int_a", by="alice")], votes=votes,
                                   slack=True)
    (update,) = counted.entries
    assert (update.task, update.queue, update.args) == (
        "layby.notify.slack", "layby.notify", ["run_1", ["int_a"], True])
    assert world.outbox() == {update.id: (update.wire(), world.outbox()[update.id][1])}
    store.outbox.ack_outbox([(run.id, update.id)])
    closing = store.answers.answer(run.id, [answer("int_a", by="bob"), answer("int_b")],
                                   votes=votes, slack=True)
    assert closing.resumed  # the resume pushed, the Slack update in the outbox
    assert [e.args for e in closing.entries] == [["run_1", ["int_a", "int_b"], True]]
    assert world.queue("layby.turns")[-1][0] == "layby.resume_run"
    # Without Slack (a job's answer), or refused: none.
    other = world.make("interrupted", "run_2", store=store)
    assert store.answers.answer(other.id, [answer("int_a")]).entries == ()
    refused = store.answers.answer(other.id, [answer("int_a")], slack=True)
    assert refused.verdict is Verdict.CONFLICT and refused.entries == ()
    assert [entry["args"][0] for entry, _ in world.outbox().values()] == ["run_1"]


def test_a_hand_over_a_cancel_and_an_expiry_queue_the_slack_update_too(world: World) -> None:
    handed = world.make("interrupted", "run_h")
    moved = world.store.answers.delegate(handed.id, "int_a", handover("alice", "bob"),
                                         slack=True)
    assert [(e.task, e.args) for e in moved.entries] == [  # (announcing the new reviewer)
        ("layby.notify.interrupts", ["run_h", 2]),
        ("layby.notify.slack", ["run_h", ["int_a"], False])]
    world.make("interrupted", "run_c", interrupts=TWO)
    cancelled = world.store.runs.cancel("run_c", "api:ops", "not needed", slack=True)
    assert [e.args for e in cancelled.entries] == [["run_c", ["int_a", "int_b"], False]]
    world.make("interrupted", "run_e", interrupts=[interrupt("int_a", expires_ms=1)])
    expired = world.store.answers.expire("run_e", answer("int_a"), None, slack=True)
    assert ["run_e", ["int_a"], False] in [e.args for e in expired.entries]
    assert {entry["args"][0] for entry, _ in world.outbox().values()
            if entry["task"] == "layby.notify.slack"} == {"run_h", "run_c", "run_e"}


def test_a_second_answer_is_a_conflict_with_the_first_and_changes_nothing(
        world: World) -> None:
    run = world.make("interrupted", interrupts=TWO)
    first = answer("int_a", by="alice")
    world.store.answers.answer(run.id, [first])
    before = world.snapshot()
    late = world.store.answers.answer(run.id, [answer("int_a", by="bob", payload="no")])
    assert late.verdict is Verdict.CONFLICT and late.interrupt_id == "int_a"
    assert late.first == first and late.status is Status.INTERRUPTED
    assert world.snapshot() == before


def test_an_answer_after_the_run_resumed_is_a_conflict_and_queues_no_second_resume(
        world: World) -> None:
    run = world.make("resuming")
    before = world.snapshot()
    late = world.store.answers.answer(run.id, [answer("int_a", by="bob")])
    assert late.verdict is Verdict.CONFLICT and late.status is Status.RESUMING
    assert world.snapshot() == before


def test_an_answer_to_an_interrupt_the_run_does_not_have_is_unknown(world: World) -> None:
    run = world.make("interrupted")
    before = world.snapshot()
    refused = world.store.answers.answer(run.id, [answer("int_zz")])
    assert refused.verdict is Verdict.UNKNOWN and refused.interrupt_id == "int_zz"
    assert world.snapshot() == before


def test_a_batch_with_one_bad_answer_records_none_of_them(world: World) -> None:
    run = world.make("interrupted", interrupts=TWO)
    before = world.snapshot()
    refused = world.store.answers.answer(run.id, [answer("int_a"), answer("int_zz")])
    assert refused.verdict is Verdict.UNKNOWN
    assert world.snapshot() == before


def test_a_resume_that_leaves_interrupts_open_is_incomplete_and_changes_nothing(
        world: World) -> None:
    run = world.make("interrupted", interrupts=TWO)
    before = world.snapshot()
    refused = world.store.answers.answer(run.id, [answer("int_a")], require_all=True)
    assert refused.verdict is Verdict.INCOMPLETE
    assert refused.still_open == ("int_a", "int_b")
    assert world.snapshot() == before


def test_an_answer_for_a_missing_run_writes_nothing(world: World) -> None:
    assert world.store.answers.answer("run_x", [answer("int_a")]).verdict is Verdict.MISSING
    assert world.snapshot() == {}


def test_a_jobs_answer_before_the_park_is_kept_and_the_first_one_stands(
        world: World) -> None:
    world.make("running")
    first = answer("int_a", by="job", payload={"rows": 1}, channel="job")
    assert world.store.answers.answer("run_1", [first], allow_early=True).verdict is Verdict.EARLY
    assert world.store.answers.answer("run_1", [answer("int_a", by="job", payload={"rows": 2})],
                                      allow_early=True).verdict is Verdict.EARLY
    assert _stored(world, "run_1") == {"int_a": first.wire()}
    run = world.run_hash("run_1")
    assert (run["status"], run["version"], run["open"]) == ("running", "1", "")
    assert world.event_types("run_1") == ["run.created", "run.started"]


def test_a_jobs_early_answer_for_a_finished_run_is_refused(world: World) -> None:
    run = world.make("cancelled")
    before = world.snapshot()
    refused = world.store.answers.answer(run.id, [answer("int_a")], allow_early=True)
    assert refused.verdict is Verdict.FINISHED and refused.status is Status.CANCELLED
    assert world.snapshot() == before


def test_an_answer_skips_the_unsent_notifications_of_its_interrupt_only(
        world: World) -> None:
    later = world.now() + 600_000
    run = world.make("interrupted", interrupts=TWO, plan=Announcements(notes=[
        (note("ntf_a", "int_a"), later), (note("ntf_b", "int_b"), later)]))
    world.store.answers.answer(run.id, [answer("int_a")])
    notes = world.notes(run.id)
    assert (notes["ntf_a"].state, notes["ntf_b"].state) == ("skipped", "pending")
    assert world.zset(world.shard.notify_due) == {"run_1 ntf_b": later}


def test_approvals_count_once_per_reviewer_and_the_last_needed_closes(world: World) -> None:
    run = world.make("interrupted")
    votes = {"int_a": 2}
    first = world.store.answers.answer(run.id, [answer("int_a", by="alice")], votes=votes)
    assert first.ok and not first.resumed and first.version == 2
    assert world.run_hash(run.id)["open"] == "int_a"
    assert world.events(run.id)[-1] == ("interrupt.approved", 2, {
        "interruptId": "int_a", "by": "alice", "approvals": 1, "requiredApprovals": 2})
    review = world.client.hgetall(world.keys.review(run.id))
    assert review["approvals:int_a"] == "1"
    assert json.loads(review["approval:int_a:alice"]) == answer("int_a", by="alice").wire()
    assert world.client.hget(world.keys.answers(run.id), "int_a") is None
    # The same reviewer again: refused with the approval given, and nothing moves.
    before = world.snapshot()
    again = world.store.answers.answer(run.id, [answer("int_a", by="alice")], votes=votes)
    assert again.verdict is Verdict.AGAIN and again.interrupt_id == "int_a"
    assert again.first == answer("int_a", by="alice")
    assert world.snapshot() == before
    last = world.store.answers.answer(run.id, [answer("int_a", by="bob")], votes=votes)
    assert last.resumed and last.version == 3
    assert world.client.hget(world.keys.review(run.id), "approvals:int_a") == "2"
    assert _stored(world, run.id)["int_a"]["answeredBy"] == "bob"


def test_a_decline_closes_an_interrupt_that_needs_several_approvals(world: World) -> None:
    run = world.make("interrupted")
    world.store.answers.answer(run.id, [answer("int_a", by="alice")], votes={"int_a": 2})
    # A decline is an ordinary answer (not a vote): it closes the interrupt on its own.
    done = world.store.answers.answer(run.id, [answer("int_a", status="cancelled", by="carol")])
    assert done.resumed and done.version == 3
    assert _stored(world, run.id)["int_a"]["status"] == "cancelled"
    assert world.client.hget(world.keys.review(run.id), "approvals:int_a") == "1"
