"""park_run.lua: running → interrupted, its interrupts written with the commit and announced
in the same step (or straight on to resuming when every new interrupt is answered already:
a background job that finished first, a policy rule); a duplicate park changes nothing."""

from __future__ import annotations

import json

import pytest

from layby.parking import Announcements, Verdict
from layby.parking.codecs import stored_interrupt
from layby.wire import Status
from tests.store.conftest import OWNER, World, answer, interrupt, note, park_event

pytestmark = pytest.mark.store


def _park(world: World, intrs: list, *, plan: Announcements | None = None,
          by_rule: dict | None = None, store=None):  # type: ignore[no-untyped-def]
    store = store or world.store
    return store.runs.park("run_1", 1, OWNER, world.history(2), intrs, park_event(intrs),
                           plan=plan if plan is not None else Announcements(), by_rule=by_rule)


def test_a_park_waits_on_its_interrupt_and_releases_the_claim(world: World) -> None:
    world.make("running")
    intr = interrupt("int_a")
    parked = _park(world, [intr])
    assert parked.verdict is Verdict.OK and parked.version == 2 and not parked.resumed
    assert (parked.entries, parked.planned, parked.dispatch) == ((), (), ())
    run = world.run_hash("run_1")
    assert (run["status"], run["version"], run["open"], run["noted"]) == (
        "interrupted", "2", "int_a", "0")
    assert run["i:int_a"] == stored_interrupt(intr)
    assert world.store.answers.interrupt("run_1", "int_a") == intr
    # A parked run keeps nothing of the claim (deleted, not emptied) and no `waiting`
    # while it is its open interrupts.
    for gone in ("lease_owner", "lease_until", "attempts", "checkpointed", "waiting"):
        assert gone not in run
    assert world.zset(world.shard.leases) == {}
    assert world.indexes_of("run_1") == {"interrupted": int(run["updated_at"])}
    assert world.events("run_1")[-1] == ("run.interrupted", 2, park_event([intr]))
    assert world.zset(world.shard.deadlines) == {}


def test_an_interrupt_that_expires_gets_a_deadline(world: World) -> None:
    world.make("running")
    at = world.now() + 3_600_000
    _park(world, [interrupt("int_a", expires_ms=at), interrupt("int_b")])
    assert world.zset(world.shard.deadlines) == {"run_1 int_a": at}
    assert world.run_hash("run_1")["open"] == "int_a int_b"


def test_a_park_drops_the_steps_checkpoints(world: World) -> None:
    world.make("running")
    world.store.runs.save_checkpoint("run_1", 1, OWNER, "tool:call_1", {"ok": True})
    _park(world, [interrupt("int_a")])
    assert not world.client.exists(world.keys.checkpoints("run_1"))


def test_a_park_without_a_plan_queues_the_announcement_task(world: World) -> None:
    world.make("running")
    parked = world.store.runs.park("run_1", 1, OWNER, world.history(2), [interrupt("int_a")],
                                   park_event([interrupt("int_a")]), plan=None)
    (entry,) = parked.entries
    assert (entry.id, entry.task, entry.queue, entry.args) == (
        "run_1:notify:2", "layby.notify.interrupts", "layby.notify", ["run_1", 2])
    assert world.outbox()["run_1:notify:2"][0] == entry.wire()


def test_with_the_broker_on_the_server_the_announcement_task_is_pushed_and_kept_till_acked(
        world: World) -> None:
    store = world.store_with(pushing=True, lost_message_ms=300_000)
    world.make("running", store=store)
    parked = store.runs.park("run_1", 1, OWNER, world.history(2), [interrupt("int_a")],
                             park_event([interrupt("int_a")]), plan=None)
    assert parked.ok and parked.entries == ()
    assert world.queue("layby.notify") == [
        ("layby.notify.interrupts", ["run_1", 2], "run_1:notify:2")]
    # The task acks its entry once it planned: till then it is due again only as late as a
    # lost message would be.
    (_, due), = [v for k, v in world.outbox().items() if k == "run_1:notify:2"]
    assert due >= world.now() + 290_000


def test_a_park_records_its_plan_and_dispatches_what_is_due_now(world: World) -> None:
    world.make("running")
    later = world.now() + 600_000
    plan = Announcements(notes=[(note("ntf_1", "int_a"), None),
                                (note("ntf_2", "int_a", kind="reminder"), later)],
                         grants=[("ref_1", "grant one", 60_000)])
    before = world.now()
    parked = _park(world, [interrupt("int_a")], plan=plan)
    assert parked.planned == ("ntf_1", "ntf_2") and parked.dispatch == ("ntf_1",)
    run = world.run_hash("run_1")
    assert "noted" not in run  # the run has notifications now: readers look
    notes = world.notes("run_1")
    assert (notes["ntf_1"].state, notes["ntf_1"].attempts, notes["ntf_1"].kind) == (
        "pending", 0, "request")
    assert notes["ntf_2"].kind == "reminder"
    assert world.raw_note("run_1", "ntf_1")["t"] == "tok"  # its token is kept beside it
    due = world.zset(world.shard.notify_due)
    assert due["run_1 ntf_2"] == later
    # Due now, dispatched by the caller: the sweeper's copy waits out the grace time.
    assert before + 10_000 <= due["run_1 ntf_1"] <= world.now() + 10_000
    assert world.store.answers.grant("ref_1") == "grant one"
    assert 0 < world.client.pttl(world.shard.grant("ref_1")) <= 60_000
    assert world.events("run_1")[-1] == ("notifications.planned", 2, {"ids": ["ntf_1", "ntf_2"]})


def test_with_the_broker_on_the_server_a_request_due_now_is_pushed(world: World) -> None:
    store = world.store_with(pushing=True)
    world.make("running", store=store)
    parked = _park(world, [interrupt("int_a")], store=store,
                   plan=Announcements(notes=[(note("ntf_1", "int_a"), None)]))
    assert parked.planned == ("ntf_1",) and parked.dispatch == ()
    assert world.queue("layby.notify") == [("layby.notify.deliver", ["run_1", "ntf_1"], "ntf_1")]
    assert world.zset(world.shard.notify_due)["run_1 ntf_1"] >= world.now() + 290_000


def test_an_answer_that_came_before_the_park_resumes_the_run_at_once(world: World) -> None:
    world.make("running")
    # A background job finished before its tool's turn committed.
    early = world.store.answers.answer("run_1", [answer("int_a", by="job", channel="job")],
                                       allow_early=True)
    assert early.verdict is Verdict.EARLY
    parked = _park(world, [interrupt("int_a", expires_ms=world.now() + 60_000)])
    assert parked.ok and parked.resumed and parked.version == 3
    run = world.run_hash("run_1")
    assert (run["status"], run["version"], run["open"], run["waiting"]) == (
        "resuming", "3", "", "int_a")
    assert world.indexes_of("run_1").keys() == {"resuming"}
    assert world.zset(world.shard.deadlines) == {}
    assert world.event_types("run_1")[-2:] == ["run.interrupted", "run.resuming"]
    assert [(t, v) for t, v, _ in world.events("run_1")[-2:]] == [
        ("run.interrupted", 2), ("run.resuming", 3)]
    (entry,) = parked.entries
    assert (entry.id, entry.task, entry.args) == ("run_1:resume:3", "layby.resume_run",
                                                  ["run_1", 3])
    claimed = world.store.runs.claim("run_1", 3, OWNER)
    assert claimed.record is not None and claimed.record.answers["int_a"].answered_by == "job"


def test_a_park_with_one_of_two_answered_early_waits_on_the_other(world: World) -> None:
    world.make("running")
    world.store.answers.answer("run_1", [answer("int_a", channel="job")], allow_early=True)
    parked = _park(world, [interrupt("int_a"), interrupt("int_b")])
    assert parked.ok and not parked.resumed and parked.version == 2
    run = world.run_hash("run_1")
    assert (run["status"], run["open"], run["waiting"]) == ("interrupted", "int_b",
                                                            "int_a int_b")


def test_interrupts_a_policy_rule_answers_are_answered_in_the_park(world: World) -> None:
    world.make("running")
    rule_answer = answer("int_a", by="policy", channel="policy")
    intr = interrupt("int_a").model_copy(update={"rule": "small-refunds"})
    parked = _park(world, [intr, interrupt("int_b")], by_rule={"int_a": rule_answer})
    assert parked.ok and not parked.resumed
    assert world.run_hash("run_1")["open"] == "int_b"
    assert json.loads(world.client.hget(world.keys.answers("run_1"), "int_a")) == \
        rule_answer.wire()
    assert world.stats() == {"answers:policy": 1, "auto_answers:small-refunds": 1}
    assert ("interrupt.auto_answered", 2, rule_answer.wire()) in world.events("run_1")


def test_a_park_all_of_whose_interrupts_a_rule_answers_resumes_at_once(world: World) -> None:
    world.make("running")
    intr = interrupt("int_a").model_copy(update={"rule": "trusted"})
    parked = _park(world, [intr], by_rule={"int_a": answer("int_a", channel="policy")})
    assert parked.resumed and parked.version == 3
    assert world.run_hash("run_1")["status"] == Status.RESUMING
    assert world.run_hash("run_1")["noted"] == "0"
    assert world.event_types("run_1")[-3:] == ["run.interrupted", "interrupt.auto_answered",
                                               "run.resuming"]


def test_a_park_stores_the_earlier_steps_events_without_the_messages_the_history_holds(
        world: World) -> None:
    """A step's messages are a field of their own beside its event's data: a park drops
    the field, and leaves any event's data as it was (one whose data holds a "messages" of
    its own, an answer's payload say, included)."""
    world.make("running")
    added = [{"role": "model", "content": [{"text": "message 1"}]}]
    world.store.runs.advance("run_1", 1, OWNER, world.history(2),
                             {"from": 1, "historyTo": 2, "messages": added}, inline=True)
    key = world.keys.events("run_1")
    [(_, committed)] = [e for e in world.client.xrange(key)
                        if e[1]["type"] == "turn.committed"]
    assert committed == {"type": "turn.committed", "version": "2",
                         "data": '{"from":1,"historyTo":2}', "messages": json.dumps(
                             added, separators=(",", ":"))}
    theirs = '{"from":0,"historyTo":1,"messages":["the reviewer\'s own"]}'
    world.client.xadd(key, {"type": "custom", "version": 2, "data": theirs})
    world.store.runs.park("run_1", 2, OWNER, world.history(3), [interrupt("int_a")],
                          park_event([interrupt("int_a")], 2, 3), plan=Announcements())
    stored = world.events("run_1")
    assert ("turn.committed", 2, {"from": 1, "historyTo": 2}) in stored
    assert not [f for _, f in world.client.xrange(key) if "messages" in f]
    assert [f["data"] for _, f in world.client.xrange(key) if f["type"] == "custom"] == [
        theirs]
    # Readers get them back whole, from the run's history.
    read = {e.type: e.data for e in world.store.runs.events("run_1")}
    assert read["turn.committed"]["messages"] == added
    assert read["run.interrupted"]["messages"] == [
        {"role": "user", "content": [{"text": "message 2"}]}]


def test_a_duplicate_park_is_stale_and_changes_nothing(world: World) -> None:
    world.make("running")
    _park(world, [interrupt("int_a")], plan=Announcements(notes=[(note("ntf_1", "int_a"),
                                                                   None)]))
    before = world.snapshot()
    again = _park(world, [interrupt("int_a")], plan=Announcements(
        notes=[(note("ntf_1", "int_a"), None)]))
    assert again.verdict is Verdict.STALE and again.status is Status.INTERRUPTED
    assert world.snapshot() == before


def test_a_park_by_a_worker_without_the_claim_is_stale(world: World) -> None:
    world.make("running")
    before = world.snapshot()
    late = world.store.runs.park("run_1", 1, "worker-2", world.history(2), [interrupt("int_a")],
                                 {}, plan=Announcements())
    assert late.verdict is Verdict.STALE
    assert world.snapshot() == before


def test_a_park_of_a_missing_run_writes_nothing(world: World) -> None:
    assert _park(world, [interrupt("int_a")]).verdict is Verdict.MISSING
    assert world.snapshot() == {}
