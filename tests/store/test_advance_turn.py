"""advance_turn.lua: running → queued (next turn queued) or running (the same worker takes
the next turn, its lease renewed); a duplicate or a worker without the claim changes
nothing."""

from __future__ import annotations

import json

import pytest

from layby.parking import Verdict
from layby.wire import Status
from tests.store.conftest import OWNER, World

pytestmark = pytest.mark.store

EVENT = {"from": 1, "historyTo": 2, "messages": [{"role": "model",
                                                  "content": [{"text": "message 1"}]}]}


def test_a_turn_committed_queues_the_next_at_the_next_version(world: World) -> None:
    world.make("running")
    world.store.runs.save_checkpoint("run_1", 1, OWNER, "model", {"text": "a"})
    done = world.store.runs.advance("run_1", 1, OWNER, world.history(2), EVENT, inline=False)
    assert done.verdict is Verdict.OK and done.version == 2
    run = world.run_hash("run_1")
    assert run["status"] == "queued" and run["version"] == "2"
    assert json.loads(run["messages"]) == [m.wire() for m in world.history(2)]
    # The claim is released (emptied, not deleted: one call fewer) and its checkpoints go.
    assert (run["lease_owner"], run["lease_until"], run["attempts"], run["checkpointed"],
            run["waiting"]) == ("", "0", "0", "", "")
    assert world.zset(world.shard.leases) == {}
    assert not world.client.exists(world.keys.checkpoints("run_1"))
    assert world.indexes_of("run_1") == {"queued": int(run["updated_at"])}
    assert world.events("run_1")[-1] == ("turn.committed", 2, EVENT)
    (entry,) = done.entries
    assert (entry.id, entry.task, entry.args) == ("run_1:turn:2", "layby.run_turn", ["run_1", 2])
    assert set(world.outbox()) == {"run_1:turn:1", "run_1:turn:2"}


def test_a_turn_committed_inline_keeps_the_run_and_renews_the_lease(world: World) -> None:
    world.make("running", store=world.store_with(lease_ms=-1_000))
    world.store_with(lease_ms=-1_000).runs.save_checkpoint("run_1", 1, OWNER, "model", {"t": 1})
    outbox = world.outbox()
    index = world.indexes_of("run_1")
    done = world.store.runs.advance("run_1", 1, OWNER, world.history(2), EVENT, inline=True)
    assert done.ok and done.version == 2 and done.entries == ()
    run = world.run_hash("run_1")
    assert (run["status"], run["version"], run["lease_owner"], run["attempts"]) == (
        "running", "2", OWNER, "0")
    assert int(run["lease_until"]) > world.now()
    assert world.zset(world.shard.leases) == {"run_1": int(run["lease_until"])}
    assert run["checkpointed"] == "" and not world.client.exists(world.keys.checkpoints("run_1"))
    assert world.indexes_of("run_1") == index
    assert world.outbox() == outbox
    assert world.events("run_1")[-1] == ("turn.committed", 2, EVENT)
    # The worker goes on at version 2 under the same claim.
    assert world.store.runs.renew("run_1", 2, OWNER)


def test_a_duplicate_commit_of_the_same_turn_is_stale_and_changes_nothing(
        world: World) -> None:
    world.make("running")
    assert world.store.runs.advance("run_1", 1, OWNER, world.history(2), EVENT, inline=True).ok
    before = world.snapshot()
    again = world.store.runs.advance("run_1", 1, OWNER, world.history(2), EVENT, inline=True)
    assert again.verdict is Verdict.STALE and again.status is Status.RUNNING
    assert world.snapshot() == before


def test_a_commit_by_a_worker_whose_claim_was_taken_over_is_stale(world: World) -> None:
    world.make("running", store=world.store_with(lease_ms=-1_000))
    assert world.store.runs.claim("run_1", 1, "worker-2").ok
    before = world.snapshot()
    late = world.store.runs.advance("run_1", 1, OWNER, world.history(2), EVENT, inline=False)
    assert late.verdict is Verdict.STALE
    assert world.snapshot() == before


def test_a_commit_for_a_missing_run_writes_nothing(world: World) -> None:
    done = world.store.runs.advance("run_x", 1, OWNER, world.history(2), EVENT, inline=False)
    assert done.verdict is Verdict.MISSING
    assert world.snapshot() == {}


def test_with_the_broker_on_the_server_the_next_turn_is_pushed(world: World) -> None:
    store = world.store_with(pushing=True)
    world.make("running", store=store)
    done = store.runs.advance("run_1", 1, OWNER, world.history(2), EVENT, inline=False)
    assert done.ok and done.entries == ()
    assert world.queue("layby.turns") == [("layby.run_turn", ["run_1", 1], "run_1:turn:1"),
                                          ("layby.run_turn", ["run_1", 2], "run_1:turn:2")]
    assert world.outbox() == {}
