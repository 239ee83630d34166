"""Migration 2, straight on a real Valkey: a store of format 1 in the legacy layout (as layby
0.2.0 leaves it: runs in every state, idempotency keys, grants, outbox entries, deadlines,
notifications due, counters, processes in the registry) switches to format 2; before its
layout instant every process keeps the legacy layout; from it on, a run of the legacy
layout is moved to the sharded one before anything is done with it, whatever scans the
shards reads the legacy one too, and a start retried and a token's grant find what was
written before; `layby migrate` (counted by a dry run, killed mid-way and run again) moves
the rest and leaves no key of the legacy layout, every run as it was. A store sharded from
the start (made on a cluster) has nothing to move."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
import redis
from redis.asyncio import Redis as AsyncRedis

from layby.parking import Announcements, Keys, Store, Verdict, events, formats, gauges, migrations
from layby.parking.keys import KEY_SPECS, KeySpec
from layby.parking.scripts import standalone
from layby.wire import RunView, Status
from tests.store.conftest import (
    MESSAGES,
    OWNER,
    World,
    answer,
    interrupt,
    note,
    pages,
)

pytestmark = pytest.mark.store

SHARDS = 3
OLD = "worker 1 0.2.0"
# The runs `_as_0_2_0_left_it` makes, by what they are.
QUEUED, RUNNING, PARKED, EXPIRING, UNPLANNED, RESUMING, DONE, CANCELLED, LAPSED = (
    "run_q", "run_r", "run_p", "run_x", "run_u", "run_s", "run_c", "run_k", "run_l")
EVERY = (QUEUED, RUNNING, PARKED, EXPIRING, UNPLANNED, RESUMING, DONE, CANCELLED, LAPSED)


def _as_0_2_0_left_it(world: World) -> None:
    """A store of format 1 in the legacy layout, as layby 0.2.0 (and this layby, while it
    writes format 1) leaves it: a run in every state, the broker elsewhere (the outbox holds
    what transitions queued), an idempotency key, a grant, deadlines, notifications due,
    counters, and a gateway of this layby in the registry."""
    world.client.hset(world.keys.format, "version", 1)
    store = world.store
    assert store.runs.create_run(QUEUED, "demo.agent", input="hi", messages=MESSAGES,
                                 metadata={"team": "a"}, idempotency_key="start-q").ok
    world.next_ms()
    world.make("running", RUNNING, store=world.store_with(lease_ms=600_000))  # (not lapsing)
    world.next_ms()
    now = world.now()
    world.make("interrupted", PARKED,
               interrupts=[interrupt("int_a", expires_ms=now + 600_000), interrupt("int_b")],
               plan=Announcements(
                   notes=[(note("ntf_1", "int_a", token="t1"), None),
                          (note("ntf_2", "int_a", reviewer="bob", kind="reminder",
                                token="t2"), now + 600_000)],
                   grants=[("ref_1", "grant one", 600_000)]))
    world.next_ms()
    world.make("interrupted", EXPIRING, interrupts=[interrupt("int_a", expires_ms=now - 1_000)])
    world.next_ms()
    world.stepped_then_parked_unplanned(UNPLANNED)  # its announcement task's outbox entry
    world.next_ms()
    world.make("resuming", RESUMING)
    world.next_ms()
    world.make("completed", DONE)
    world.next_ms()
    world.make("cancelled", CANCELLED)
    world.next_ms()
    # Its worker died: its lease lapsed.
    world.make("running", LAPSED, store=world.store_with(lease_ms=-1_000))
    store.processes.beat_worker("gateway h:1", "gateway 2 0.3.0")


def _views(store: Store) -> dict[str, RunView | None]:
    return {run_id: store.runs.view(run_id) for run_id in EVERY}


def _switched(world: World) -> None:
    """The switch to format 2 (no process of 0.2.0 left), with this layby's shard count."""
    assert world.store.processes.switch_format(2, shards=SHARDS) == ["switched"]
    state = formats.read(world.client, world.keys)
    assert (state.version, state.written, state.shards) == (1, 2, SHARDS)
    assert state.sharded_at is not None


def _at_the_instant(world: World) -> Store:
    """The layout instant, now (instead of FRESH_S and a margin after the switch): the
    world's store is one that read the format since, as every process has by then."""
    world.client.hset(world.keys.format, "sharded_at", world.now())
    world.store = world.store_with()
    assert world.store.layout.moving
    return world.store


def _legacy_runs(world: World) -> set[str]:
    return {key.split("{")[1].split("}")[0]
            for key in world.client.scan_iter(match=f"{world.prefix}:{{*}}:run")
            if re.fullmatch(rf"{world.prefix}:\{{[^{{}}:]+\}}:run", key)}


def _keys_of_the_store(world: World) -> list[str]:
    return [*world.client.scan_iter(match=f"{world.prefix}:*"),
            *world.client.scan_iter(match=f"{{{world.prefix}:format}}:*")]


def _specs(key: str, prefix: str) -> list[KeySpec]:
    return [spec for spec in KEY_SPECS if spec.regex(prefix).fullmatch(key)]


def _of_the_legacy_layout(world: World) -> list[str]:
    return sorted(key for key in _keys_of_the_store(world)
                  if any(spec.migrated_by == 2 for spec in _specs(key, world.prefix)))


def _of_the_sharded_layout(world: World) -> list[str]:
    return sorted(key for key in _keys_of_the_store(world)
                  if any("{<shard>}" in spec.pattern or "{<p>:format}" in spec.pattern
                         for spec in _specs(key, world.prefix)))


def test_before_the_layout_instant_every_process_keeps_the_legacy_layout(
        world: World) -> None:
    _as_0_2_0_left_it(world)
    # A process of 0.2.0 alive: no switch.
    world.store.processes.beat_worker("celery@old:1", OLD)
    assert world.store.processes.switch_format(2, shards=SHARDS)[:2] == ["older", "celery@old:1"]
    assert formats.read(world.client, world.keys).shards is None
    world.store.processes.forget_worker("celery@old:1")
    before = world.now()
    _switched(world)
    state = formats.read(world.client, world.keys)
    assert state.sharded_at is not None
    delay = (formats.FRESH_S + formats.LAYOUT_MARGIN_S) * 1000
    assert before + delay <= state.sharded_at <= world.now() + delay
    # Every process learns the switch within FRESH_S, and keeps the legacy layout until
    # the instant, which is later: it knows where runs will go.
    store = world.store_with()
    assert store.layout == formats.Layout(Keys(world.prefix), next=Keys(world.prefix, SHARDS))
    assert store.writing == 2
    # Which keys a run is under takes a look in the store now (the gateway's event loop
    # asks a thread): no keys are settled.
    assert store.settled_keys() is None
    assert store.runs.create_run("run_n", "demo.agent", input="hi", messages=MESSAGES,
                                 metadata={}, idempotency_key=None).ok
    assert store.runs.claim(QUEUED, 1, OWNER).ok
    assert world.client.hget(world.keys.run(QUEUED), "status") == "running"
    assert world.client.exists(world.keys.run("run_n"))
    assert _of_the_sharded_layout(world) == []
    # A store made of format 1 with a shard count (one of this layby's on a cluster,
    # before migration 2) is sharded: no instant to wait for.
    sharded = formats.FormatState(1, 2, shards=SHARDS)
    assert formats.layout(sharded, "p", 0) == formats.Layout(Keys("p", SHARDS))


def test_from_the_instant_a_run_of_the_legacy_layout_moves_before_it_is_touched(
        world: World) -> None:
    _as_0_2_0_left_it(world)
    before = _views(world.store)
    _switched(world)
    store = _at_the_instant(world)
    sharded = Keys(world.prefix, SHARDS)
    assert store.settled_keys() is None  # a run may be in either layout
    # A view moves it, and reads it as it was.
    assert store.runs.view(PARKED) == before[PARKED]
    assert not world.client.exists(world.keys.run(PARKED))
    assert world.client.exists(sharded.run(PARKED))
    # Its step claimed, committed, parked again; another answered, resumed, completed.
    claimed = store.runs.claim(QUEUED, 1, OWNER)
    assert claimed.ok and claimed.record is not None
    assert claimed.record.metadata == {"team": "a"}
    assert store.runs.park(RUNNING, 1, OWNER, world.history(3), [interrupt("int_z")],
                           {"from": 1, "historyTo": 3,
                            "interrupts": [{"id": "int_z", "reason": "input_required"}]}).ok
    assert store.answers.answer(PARKED, [answer("int_b")]).ok
    done = store.answers.answer(PARKED, [answer("int_a")])
    assert done.resumed and done.version == 3
    assert store.runs.claim(PARKED, 3, OWNER).ok
    assert store.runs.complete(PARKED, 3, OWNER, world.history(4), "done",
                               {"from": 3, "historyTo": 4}).ok
    assert store.runs.claim(RESUMING, 3, OWNER).ok
    assert store.runs.fail(RESUMING, {"code": "boom", "message": "it broke"}, version=3,
                           owner=OWNER).ok
    assert store.runs.cancel(UNPLANNED, "api:ops", "no longer needed").ok
    for run_id, status in ((QUEUED, "running"), (RUNNING, "interrupted"),
                           (PARKED, "completed"), (RESUMING, "failed"),
                           (UNPLANNED, "cancelled")):
        view = store.runs.view(run_id)
        assert view is not None and view.status == status, run_id
        assert not world.client.exists(world.keys.run(run_id)), run_id
        assert world.client.zscore(sharded.shard_of(run_id).index(Status(status)),
                                   run_id) is not None
    # The other runs are where they were, untouched.
    assert {DONE, CANCELLED, EXPIRING, LAPSED} <= _legacy_runs(world)
    # A new run is made in the sharded layout.
    assert store.runs.create_run("run_n", "demo.agent", input="hi", messages=MESSAGES,
                                 metadata={}, idempotency_key=None).ok
    assert world.client.exists(sharded.run("run_n"))
    assert not world.client.exists(world.keys.run("run_n"))


def test_move_run_moves_everything_of_a_run_at_once_and_once(world: World) -> None:
    _as_0_2_0_left_it(world)
    sharded = Keys(world.prefix, SHARDS)
    old, shard = world.keys.legacy, sharded.shard_of(PARKED)
    score = world.client.zscore(old.index(Status.INTERRUPTED), PARKED)
    deadline = world.client.zscore(old.deadlines, f"{PARKED} int_a")
    due = world.client.zscore(old.notify_due, f"{PARKED} ntf_2")
    # A delivery's entry is named by its notification (none is queued so today: the
    # sweeper queues deliveries from the notifications due).
    world.client.hset(old.outbox_entries, "ntf_1", json.dumps(
        {"id": "ntf_1", "task": "layby.notify.deliver", "queue": "layby.notify",
         "args": [PARKED, "ntf_1"]}))
    world.client.zadd(old.outbox, {"ntf_1": 1})
    entries = {e: world.client.hget(old.outbox_entries, e)
               for e in world.client.hkeys(old.outbox_entries) if e.startswith(PARKED)
               or e == "ntf_1"}
    assert {f"{PARKED}:turn:1", "ntf_1"} <= set(entries)
    run = world.run_hash(QUEUED)
    assert run["sent"].startswith("layby.turns ")
    move = standalone(world.client, "move_run")

    def moved(run_id: str) -> str:
        return str(move(keys=[*world.keys.for_scripts(run_id),
                              *sharded.for_scripts(run_id)])[0])

    assert moved(PARKED) == "moved"
    assert world.client.zscore(shard.index(Status.INTERRUPTED), PARKED) == score
    assert world.client.zscore(shard.deadlines, f"{PARKED} int_a") == deadline
    assert world.client.zscore(shard.notify_due, f"{PARKED} ntf_2") == due
    assert {e: world.client.hget(shard.outbox_entries, e) for e in entries} == entries
    assert all(world.client.zscore(shard.outbox, e) is not None for e in entries)
    for gone in (old.index(Status.INTERRUPTED), old.deadlines, old.notify_due):
        assert not [m for m in world.client.zrange(gone, 0, -1) if m.startswith(PARKED)]
    assert not [e for e in world.client.hkeys(old.outbox_entries) if e in entries]
    for part in ("run", "answers", "events"):
        assert not world.client.exists(getattr(world.keys, part)(PARKED))
    # Once: a second move finds it there; one of no run finds nothing.
    snapshot = world.snapshot()
    assert moved(PARKED) == "there" and moved("run_none") == "missing"
    assert world.snapshot() == snapshot
    # A finished run keeps what is left of its retention; a waiting one loses its number.
    ttl = world.client.pttl(world.keys.run(DONE))
    assert moved(DONE) == "moved"
    assert 0 < world.client.pttl(sharded.run(DONE)) <= ttl
    assert moved(QUEUED) == "moved"
    assert "sent" not in world.client.hgetall(sharded.run(QUEUED))
    assert world.client.hgetall(sharded.run(QUEUED)) == {k: v for k, v in run.items()
                                                          if k != "sent"}
    # A lease moves with its run.
    lease = world.client.zscore(old.leases, RUNNING)
    assert moved(RUNNING) == "moved"
    assert world.client.zscore(sharded.shard_of(RUNNING).leases, RUNNING) == lease


def test_scans_read_the_legacy_shard_too_while_the_store_moves(world: World) -> None:
    _as_0_2_0_left_it(world)
    order = [run_id for page in pages(world.store.all_runs, None, 3) for run_id, _ in page]
    gauged = gauges.read(world.client, world.store.layout, (60,))
    _switched(world)
    store = _at_the_instant(world)
    # A new run, then runs moved: list pages merge both layouts, in the order they had.
    world.next_ms()
    assert store.runs.create_run("run_n", "demo.agent", input="hi", messages=MESSAGES,
                                 metadata={}, idempotency_key=None).ok
    store.runs.view(PARKED)
    store.runs.view(DONE)
    assert [run_id for page in pages(store.all_runs, None, 3)
            for run_id, _ in page] == ["run_n", *order]
    assert [s.id for s in store.lists.list_runs(Status.INTERRUPTED)] == [UNPLANNED, EXPIRING,
                                                                         PARKED]
    # /metrics sums the legacy shard's gauges and counters with the others'.
    now = gauges.read(world.client, store.layout, (60,))
    assert now.runs == {**gauged.runs, Status.QUEUED: gauged.runs[Status.QUEUED] + 1}
    assert now.stats == gauged.stats and now.deadlines == gauged.deadlines
    # The sweeper: a deadline past, a lease lapsed, the outbox, notifications due.
    assert store.deadlines.due_deadlines() == [(EXPIRING, "int_a")]
    assert store.answers.expire(EXPIRING, answer("int_a", status="cancelled", payload=None,
                                                 by="layby:expiry", channel="expiry"), None).ok
    assert store.deadlines.lapsed_leases() == [LAPSED]
    assert store.runs.requeue(LAPSED).ok
    assert world.client.exists(Keys(world.prefix, SHARDS).run(LAPSED))
    for shard in store.shards:  # (every entry overdue: past the grace time)
        waiting = world.client.zrange(shard.keys.outbox, 0, -1)
        if waiting:
            world.client.zadd(shard.keys.outbox, dict.fromkeys(waiting, 1))
    entries = store.outbox.claim_outbox(limit=100, retry_ms=60_000)
    runs = {e.args[0] for e in entries}
    assert {UNPLANNED, QUEUED, "run_n"} <= runs  # legacy and sharded
    store.outbox.ack_outbox([(e.args[0], e.id) for e in entries])
    assert all(world.client.zcard(shard.keys.outbox) == 0 for shard in store.shards)
    world.client.zadd(world.shard.notify_due, {f"{PARKED} ntf_2": 1}, xx=True)  # (moved)
    world.client.zadd(world.keys.legacy.notify_due, {f"{CANCELLED} ntf_9": 1})
    assert (CANCELLED, "ntf_9") in store.outbox.claim_due_notifications()


def test_a_start_retried_and_a_grant_find_what_was_written_before_the_move(
        world: World) -> None:
    _as_0_2_0_left_it(world)
    _switched(world)
    # Before the instant, a process a round trip ahead moved the queued run: one that is
    # not there yet still finds it, and its transitions work.
    behind = world.store_with()
    assert behind.layout.next is not None
    world.client.hset(world.keys.format, "sharded_at", world.now())
    ahead = world.store_with()
    assert ahead.runs.view(QUEUED) is not None  # moved
    assert behind.layout.next is not None  # (it has not read the format again)
    assert behind.runs.view(QUEUED) is not None
    assert behind.runs.claim(QUEUED, 1, OWNER).ok
    assert ahead.runs.status_of(QUEUED)[0] is Status.RUNNING
    store = _at_the_instant(world)
    for retried in (store, behind):
        again = retried.runs.create_run(retried.runs.new_run_id("start-q"), "demo.agent",
                                        input="hi", messages=MESSAGES, metadata={},
                                        idempotency_key="start-q")
        assert again.verdict is Verdict.EXISTS and again.run_id == QUEUED
        # A run id given again (AG-UI's, a task's) is not made twice either.
        given = retried.runs.create_run(DONE, "demo.agent", input="hi", messages=MESSAGES,
                                        metadata={}, idempotency_key=None)
        assert given.verdict is Verdict.EXISTS
    assert store.answers.grant("ref_1") == "grant one"
    assert store.answers.grant("ref_none") is None


def test_a_follower_of_a_run_that_moves_goes_on_where_it_is(world: World) -> None:
    """A run followed (server-sent events) while the store moves: the follower finds its
    events where the run went, and misses none."""
    _as_0_2_0_left_it(world)
    _switched(world)
    legacy = world.store_with()
    key = legacy.keys_of(PARKED).events(PARKED)
    assert key == world.keys.events(PARKED)
    seen = [e.id for e in legacy.runs.events(PARKED)]
    mover: list[Store] = []

    async def follow() -> list[str]:
        given = world.client.connection_pool.connection_kwargs
        client = AsyncRedis(host=given["host"], port=given["port"], db=given.get("db", 0),
                            decode_responses=True)

        async def where() -> str:
            return (mover[0] if mover else legacy).keys_of(PARKED).events(PARKED)

        found: list[str] = []
        try:
            async for event in events.follow(client, key, seen[-1], where=where):
                if event is None:
                    continue
                found.append(event.type)
                if event.type == "run.resuming":
                    return found
        finally:
            await client.aclose()
        return found

    async def scenario() -> list[str]:
        task = asyncio.ensure_future(follow())
        await asyncio.sleep(0.3)
        mover.append(_at_the_instant(world))
        await asyncio.to_thread(mover[0].answers.answer, PARKED, [answer("int_a"), answer("int_b")])
        return await asyncio.wait_for(task, 10)

    found = asyncio.run(scenario())
    assert found == ["interrupt.answered", "interrupt.answered", "run.resuming"]
    assert not world.client.exists(key)


def test_layby_migrate_moves_the_rest_and_leaves_no_key_of_the_legacy_layout(
        world: World) -> None:
    _as_0_2_0_left_it(world)
    for n in range(20):  # runs enough for the scan to be killed mid-way
        world.make("interrupted", f"run_{n:02}")
    # beats in the legacy registry
    world.store.processes.beat_worker("gateway h:2", "gateway 2 0.3.0")
    before = {run_id: world.store.runs.view(run_id) for run_id in (*EVERY, "run_05")}
    counters = gauges.read(world.client, world.store.layout, (60,)).stats
    _switched(world)
    store = _at_the_instant(world)
    assert store.runs.view(PARKED) == before[PARKED]  # one moved already
    legacy = _legacy_runs(world)
    assert len(legacy) == len(EVERY) - 1 + 20

    snapshot = world.snapshot()
    [counted] = migrations.dry_run(world.client, world.keys)
    assert world.snapshot() == snapshot
    # The runs, the idempotency key, the grant (moved by the scan); the counters, the
    # registry and the queue numbers (by its end); and the parked run moved already, put in
    # the reviewers' request index (a dry run cannot foresee the moves of the others).
    assert counted.number == 2 and counted.changed == len(legacy) + 2 + 3 + 1

    class Killed(Exception):
        pass

    def die_once_a_batch_moved_runs(count: int) -> None:
        # Killed once a run moved, not at the first change: the scan may meet the grant or
        # the idempotency key first, and a batch of the server's keys may hold none of this
        # store's at all (the other tests').
        if len(_legacy_runs(world)) < len(legacy):
            raise Killed

    with pytest.raises(Killed):
        migrations.migrate(world.client, world.keys, batch=5,
                           progress=die_once_a_batch_moved_runs)
    state = formats.read(world.client, world.keys)
    assert (state.version, state.migrating) == (1, 2)
    left = _legacy_runs(world)
    assert 0 < len(left) < len(legacy), (left, legacy)
    # Meanwhile the store serves both.
    assert store.runs.view("run_05") == before["run_05"]

    [report] = migrations.migrate(world.client, world.keys, batch=5)
    assert report.finished and report.number == 2
    assert report.changed >= len(legacy) + 2
    state = formats.read(world.client, world.keys)
    assert (state.version, state.writing, state.shards, state.sharded_at) == (2, None, SHARDS,
                                                                               None)
    assert _of_the_legacy_layout(world) == []
    assert all(_specs(key, world.prefix) for key in _keys_of_the_store(world))
    assert migrations.migrate(world.client, world.keys) == []  # nothing pending

    after = world.store_with()
    assert after.layout == formats.Layout(Keys(world.prefix, SHARDS))
    assert after.settled_keys() == after.keys_of("run_05") == Keys(world.prefix, SHARDS)
    assert {run_id: after.runs.view(run_id) for run_id in before} == before
    assert gauges.read(world.client, after.layout, (60,)).stats == counters
    assert after.answers.grant("ref_1") == "grant one"
    again = after.runs.create_run(after.runs.new_run_id("start-q"), "demo.agent", input="hi",
                                  messages=MESSAGES, metadata={}, idempotency_key="start-q")
    assert again.run_id == QUEUED
    # The registry of processes merged into the sharded layout's (leases as they were).
    assert set(world.client.zrange(after.keys.workers, 0, -1)) == {"gateway h:1",
                                                                   "gateway h:2"}
    assert set(world.client.hgetall(after.keys.workers_about)) == {"gateway h:1",
                                                                   "gateway h:2"}
    # What waited in the legacy shard waits in its run's.
    assert after.deadlines.due_deadlines() == [(EXPIRING, "int_a")]
    assert after.deadlines.lapsed_leases() == [LAPSED]
    sharded = Keys(world.prefix, SHARDS)
    for run_id in (QUEUED, UNPLANNED):
        shard = sharded.shard_of(run_id)
        waiting = [e for e in world.client.zrange(shard.outbox, 0, -1)
                   if e.startswith(f"{run_id}:")]
        assert waiting and world.client.hget(shard.outbox_entries, waiting[0])
    assert [s.id for s in after.lists.list_runs(Status.INTERRUPTED, limit=3)] == [
        "run_19", "run_18", "run_17"]
    # Every run still waiting is in the reviewers' request index (its interrupts name
    # nobody: the default group's), as a run parked since is.
    waiting = {run_id for run_id, _ in after.all_runs.newest(Status.INTERRUPTED, 100)}
    assert len(waiting) == 23
    assert set(after.inbox.asking(["*"], 100)[0]) == waiting


def test_a_store_sharded_from_the_start_has_nothing_to_move(sharded: World) -> None:
    """A store of format 1 made on a cluster (its shard count, no layout instant): migration
    2 has no key to look at, and sets the version; its waiting runs are in the reviewers'
    request index already."""
    formats.stamp(sharded.client, sharded.keys, 1, SHARDS)
    sharded.make("interrupted")
    sharded.client.hset(sharded.keys.format, "writing", 2)
    scanned: list[int] = []
    [counted] = migrations.dry_run(sharded.client, sharded.keys, progress=scanned.append)
    # Only its waiting run looked at, in the reviewers' request index already.
    assert (counted.seen, counted.changed, scanned) == (1, 0, [])
    snapshot = {k: v for k, v in sharded.snapshot().items() if k != sharded.keys.format}
    [report] = migrations.migrate(sharded.client, sharded.keys, progress=scanned.append)
    assert (report.number, report.seen, report.changed, scanned) == (2, 1, 0, [])
    assert {k: v for k, v in sharded.snapshot().items() if k != sharded.keys.format} \
        == snapshot
    assert formats.read(sharded.client, sharded.keys).version == 2
    assert sharded.store_with().runs.view("run_1") is not None


def test_an_unversioned_store_of_0_1_0_is_migrated_on_to_the_sharded_layout(
        world: World) -> None:
    """No process serves a store without a version: migration 2 gives it a shard count and
    moves it at once, after migration 1."""
    world.make("interrupted", interrupts=[interrupt("int_a", expires_ms=world.now() + 60_000)])
    before = world.store.runs.view("run_1")
    reports = migrations.migrate(world.client, world.keys, shards=SHARDS)
    assert [r.number for r in reports] == [1, 2]
    assert _of_the_legacy_layout(world) == []
    store = world.store_with()
    assert store.runs.view("run_1") == before
    assert store.layout == formats.Layout(Keys(world.prefix, SHARDS))


def test_the_layout_instant_is_read_with_the_servers_clock(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process reads the instant against the server's clock and switches at it by its
    own, without reading the format again (`Store.layout`)."""
    monkeypatch.setattr(formats, "FRESH_S", 60.0)  # (no read again: the instant alone)
    _as_0_2_0_left_it(world)
    world.client.hset(world.keys.format, mapping={
        "writing": 2, "shards": SHARDS, "sharded_at": world.now() + 300})
    store = world.store_with()
    assert store.layout.next is not None
    seen = []
    while not store.layout.moving:
        seen.append(world.now())
        assert len(seen) < 10_000
    assert world.now() >= int(world.client.hget(world.keys.format, "sharded_at") or 0) - 50
    assert store.runs.view(QUEUED) is not None and not world.client.exists(world.keys.run(QUEUED))


def test_a_client_error_while_reading_the_format_keeps_the_layout(world: World) -> None:
    store = world.store_with()
    layout = store.layout
    broken = Store(redis.Redis(port=1, socket_connect_timeout=0.2), store.config)
    assert broken.layout == layout  # away: the layout configured, asked again later


def test_a_migration_begun_before_the_layout_instant_waits_for_it(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the instant processes may still make runs in the legacy layout: a migration
    does not begin its scan until it came (`layby migrate` waits a margin longer)."""
    monkeypatch.setattr(formats, "FRESH_S", 0.3)
    monkeypatch.setattr(formats, "LAYOUT_MARGIN_S", 0.2)
    _as_0_2_0_left_it(world)
    _switched(world)
    at = formats.read(world.client, world.keys).sharded_at or 0
    assert at > world.now()
    migrations.migrate(world.client, world.keys)
    assert _of_the_legacy_layout(world) == []
    done = int(world.client.hget(world.keys.format, "m2:done") or 0)
    assert done >= at
