"""expire_interrupt.lua: an open interrupt past its deadline gets its expiry policy: an
answer (the run resumes when it was the last open one) or the failure of the run. Not due
yet: 'later'; answered meanwhile or the run gone: 'gone', the deadline dropped."""

from __future__ import annotations

import json

import pytest

from layby.parking import Verdict
from layby.wire import InterruptState, Status
from tests.store.conftest import World, answer, interrupt

pytestmark = pytest.mark.store

RETENTION_S = 7 * 24 * 3600


def _expired(iid: str) -> object:
    return answer(iid, status="cancelled", payload=None, by="layby", channel="expiry",
                  state=InterruptState.EXPIRED)


def _park_past_due(world: World, *ids: str, due_in_ms: int = -1_000) -> None:
    at = world.now() + due_in_ms
    world.make("interrupted", interrupts=[interrupt(i, expires_ms=at) for i in ids])


def test_an_interrupt_not_due_yet_is_left_for_later(world: World) -> None:
    _park_past_due(world, "int_a", due_in_ms=3_600_000)
    before = world.snapshot()
    assert world.store.answers.expire("run_1", _expired("int_a"), None).verdict is Verdict.LATER
    assert world.snapshot() == before


def test_the_last_open_interrupt_expired_with_an_answer_resumes_the_run(world: World) -> None:
    _park_past_due(world, "int_a")
    assert world.store.deadlines.due_deadlines() == [("run_1", "int_a")]
    expired = _expired("int_a")
    done = world.store.answers.expire("run_1", expired, None)
    assert done.verdict is Verdict.OK and done.resumed and done.version == 3
    assert json.loads(world.client.hget(world.keys.answers("run_1"), "int_a")) == expired.wire()
    run = world.run_hash("run_1")
    assert (run["status"], run["open"]) == ("resuming", "")
    assert world.zset(world.shard.deadlines) == {}
    assert world.event_types("run_1")[-2:] == ["interrupt.answered", "run.resuming"]
    assert world.stats()["answers:expiry"] == 1
    (entry,) = done.entries
    assert entry.args == ["run_1", 3] and entry.task == "layby.resume_run"


def test_an_expiry_with_others_still_open_records_its_answer_and_waits_on(
        world: World) -> None:
    at = world.now()
    world.make("interrupted", interrupts=[interrupt("int_a", expires_ms=at - 1_000),
                                          interrupt("int_b", expires_ms=at + 3_600_000)])
    done = world.store.answers.expire("run_1", _expired("int_a"), None)
    assert done.ok and not done.resumed and done.version == 2
    assert world.run_hash("run_1")["open"] == "int_b"
    assert list(world.zset(world.shard.deadlines)) == ["run_1 int_b"]


def test_an_expiry_whose_policy_fails_the_run_fails_it_and_drops_what_it_waited_on(
        world: World) -> None:
    at = world.now()
    world.make("interrupted", interrupts=[interrupt("int_a", expires_ms=at - 1_000),
                                          interrupt("int_b", expires_ms=at + 3_600_000)])
    error = {"code": "expired", "message": "nobody answered int_a in time"}
    expired = _expired("int_a")
    done = world.store.answers.expire("run_1", expired, error)
    assert done.verdict is Verdict.FAILED and done.version == 3
    run = world.run_hash("run_1")
    assert (run["status"], run["open"], json.loads(run["error"])) == ("failed", "", error)
    assert json.loads(world.client.hget(world.keys.answers("run_1"), "int_a")) == expired.wire()
    assert world.zset(world.shard.deadlines) == {}
    assert world.indexes_of("run_1").keys() == {"failed"}
    assert [(t, v) for t, v, _ in world.events("run_1")[-2:]] == [
        ("interrupt.answered", 2), ("run.failed", 3)]
    assert world.client.ttl(world.keys.run("run_1")) > RETENTION_S - 5


def test_an_interrupt_answered_before_its_expiry_is_gone_and_its_deadline_dropped(
        world: World) -> None:
    at = world.now()
    world.make("interrupted", interrupts=[interrupt("int_a", expires_ms=at - 1_000),
                                          interrupt("int_b")])
    world.store.answers.answer("run_1", [answer("int_a")], deadlines=set())  # left the deadline
    assert "run_1 int_a" in world.zset(world.shard.deadlines)
    before = world.snapshot()
    assert world.store.answers.expire("run_1", _expired("int_a"), None).verdict is Verdict.GONE
    after = world.snapshot()
    assert world.zset(world.shard.deadlines) == {}
    del before[world.shard.deadlines]
    assert after == before


def test_a_second_expiry_of_the_same_interrupt_is_gone_and_changes_nothing(
        world: World) -> None:
    _park_past_due(world, "int_a")
    assert world.store.answers.expire("run_1", _expired("int_a"), None).ok
    before = world.snapshot()
    assert world.store.answers.expire("run_1", _expired("int_a"), None).verdict is Verdict.GONE
    assert world.snapshot() == before
    assert world.run_hash("run_1")["status"] == Status.RESUMING


def test_the_deadline_of_a_run_that_is_gone_is_dropped(world: World) -> None:
    world.client.zadd(world.shard.deadlines, {"run_x int_a": world.now() - 1_000})
    assert world.store.answers.expire("run_x", _expired("int_a"), None).verdict is Verdict.GONE
    assert world.snapshot() == {}
