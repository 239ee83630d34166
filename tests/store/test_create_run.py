"""create_run.lua: (nothing) → queued, version 1, its first turn queued; a second start
with the same idempotency key or run id is refused with the run that has it."""

from __future__ import annotations

import json

import pytest

from layby.generation.messages import text_message
from layby.parking import Verdict
from tests.store.conftest import MESSAGES, World

pytestmark = pytest.mark.store


def test_a_new_run_is_queued_at_version_1_with_its_first_turn_in_the_outbox(
        world: World) -> None:
    before = world.now()
    made = world.store.runs.create_run("run_1", "demo.agent", input="hi", messages=MESSAGES,
                                       metadata={}, idempotency_key=None)
    assert made.verdict is Verdict.OK and made.version == 1 and made.run_id == "run_1"
    assert made.at is not None and made.at >= before
    run = world.run_hash("run_1")
    assert run == {"agent": "demo.agent", "version": "1", "status": "queued",
                   "messages": json.dumps([m.wire() for m in MESSAGES], separators=(",", ":")),
                   "created_at": str(made.at), "updated_at": str(made.at), "open": "",
                   "noted": "0", "checkpointed": "",
                   # The first message of layby.turns (the lost-message check's number).
                   "sent": "layby.turns 1"}
    assert world.indexes_of("run_1") == {"queued": made.at}
    assert world.events("run_1") == [("run.created", 1, {"agent": "demo.agent"})]
    assert made.event_id == world.client.xrange(world.keys.events("run_1"))[0][0]
    # The broker is elsewhere: the turn is an outbox entry, returned to publish and due for
    # the sweeper once the grace time has passed.
    (entry,) = made.entries
    assert (entry.id, entry.task, entry.queue, entry.args) == (
        "run_1:turn:1", "layby.run_turn", "layby.turns", ["run_1", 1])
    assert world.outbox() == {"run_1:turn:1": (entry.wire(), made.at + 10_000)}
    # A new run expires with nothing: it lives until retention after it ends.
    assert world.client.pttl(world.keys.run("run_1")) == -1


def test_an_input_other_than_the_first_message_and_metadata_are_stored(world: World) -> None:
    made = world.store.runs.create_run("run_1", "demo.agent", input={"city": "Oslo"},
                                       messages=[text_message("user", "weather?")],
                                       metadata={"team": "ops"}, idempotency_key=None)
    assert made.ok
    run = world.run_hash("run_1")
    assert json.loads(run["input"]) == {"city": "Oslo"}
    assert json.loads(run["metadata"]) == {"team": "ops"}
    view = world.store.runs.view("run_1")
    assert view is not None and view.input == {"city": "Oslo"} and view.metadata == {"team": "ops"}


def test_an_idempotency_key_names_the_run_for_its_lifetime(world: World) -> None:
    made = world.store.runs.create_run("run_1", "demo.agent", input="hi", messages=MESSAGES,
                                       metadata={}, idempotency_key="order-7")
    assert made.ok
    key = world.shard.idempotency("order-7")
    assert world.client.get(key) == "run_1"
    assert 24 * 3600 - 5 <= world.client.ttl(key) <= 24 * 3600


def test_a_second_start_with_the_same_idempotency_key_changes_nothing(world: World) -> None:
    world.store.runs.create_run("run_1", "demo.agent", input="hi", messages=MESSAGES,
                                metadata={}, idempotency_key="order-7")
    before = world.snapshot()
    again = world.store.runs.create_run("run_2", "demo.agent", input="hi", messages=MESSAGES,
                                        metadata={}, idempotency_key="order-7")
    assert again.verdict is Verdict.EXISTS and again.run_id == "run_1"
    assert world.snapshot() == before
    assert not world.client.exists(world.keys.run("run_2"))


def test_a_second_start_of_the_same_run_id_changes_nothing(world: World) -> None:
    world.make("running")
    before = world.snapshot()
    again = world.store.runs.create_run("run_1", "other.agent", input="hello", messages=MESSAGES,
                                        metadata={}, idempotency_key=None)
    assert again.verdict is Verdict.EXISTS and again.run_id == "run_1"
    assert world.snapshot() == before


def test_with_the_broker_on_the_server_the_first_turn_is_pushed_not_put_in_the_outbox(
        world: World) -> None:
    store = world.store_with(pushing=True)
    made = store.runs.create_run("run_1", "demo.agent", input="hi", messages=MESSAGES,
                                 metadata={}, idempotency_key=None)
    assert made.ok and made.entries == ()
    assert world.queue("layby.turns") == [("layby.run_turn", ["run_1", 1], "run_1:turn:1")]
    assert world.outbox() == {}
