"""find_due.lua (`store.deadlines.find_due`): where a sweep has anything to do, asked once.
Each of the sweep's reads (the outbox, due notifications, deadlines, retries, leases, runs
waiting past LAYBY_LOST_MESSAGE_S) is named with the shards that hold something due in it,
and no other; an idle sweep then reads no shard."""

from __future__ import annotations

import pytest
import redis

from layby.broker_config import Settings
from layby.ops.embedded import EmbeddedRedis
from layby.parking import Announcements
from layby.parking.clock import iso
from layby.parking.shards import shard_of
from layby.parking.store.deadlines import Due
from layby.wire import RetryWait, ToolRetry
from tests.store.conftest import OWNER, World, interrupt, note

pytestmark = pytest.mark.store

SHARDS = 3


def _in_shard(k: int, name: str) -> str:
    """A run id of shard `k` (of SHARDS)."""
    return next(f"run_{name}{n}" for n in range(1000) if shard_of(f"run_{name}{n}", SHARDS) == k)


def test_an_empty_store_has_nothing_due_anywhere(sharded: World) -> None:
    assert sharded.store.deadlines.find_due() == Due((), (), (), (), (), lost=False)


def test_each_read_is_named_with_the_shards_where_something_is_due(sharded: World) -> None:
    store, shards = sharded.store, sharded.store.shards
    # Shard 0: an interrupt past its deadline.
    sharded.make("interrupted", _in_shard(0, "expired"),
                 interrupts=[interrupt("int_a", expires_ms=1)])
    # Shards 1 and 2: a notification due each (a parked run's, with no deadline).
    for k in (1, 2):
        sharded.make("interrupted", _in_shard(k, "noted"), plan=Announcements(
            notes=[(note("ntf_1", "int_a"), sharded.now() - 1_000)]))
    # Shard 1: a claim whose lease lapsed.
    sharded.make("running", _in_shard(1, "lapsed"), store=sharded.store_with(lease_ms=-1_000))
    # Shard 2: a run whose task message is overdue for publishing (the broker elsewhere),
    # and a run parked whose interrupt expires in an hour (not due).
    sharded.make("queued", _in_shard(2, "unpublished"),
                 store=sharded.store_with(outbox_grace_ms=-1_000))
    sharded.make("interrupted", _in_shard(2, "later"),
                 interrupts=[interrupt("int_a", expires_ms=sharded.now() + 3_600_000)])
    due = store.deadlines.find_due()
    assert due == Due(outbox=(shards[2],), notifications=(shards[1], shards[2]),
                      deadlines=(shards[0],),
                      retries=(), leases=(shards[1],), lost=False)
    # What each read then finds there is what it finds reading every shard.
    expired = [(_in_shard(0, "expired"), "int_a")]
    assert store.deadlines.due_deadlines(shards=due.deadlines) == expired
    assert store.deadlines.due_deadlines() == expired
    assert store.deadlines.lapsed_leases(shards=due.leases) == [_in_shard(1, "lapsed")]
    assert store.deadlines.lapsed_leases() == [_in_shard(1, "lapsed")]
    # Runs waiting (queued) longer than the lost-message delay.
    assert sharded.store_with(lost_message_ms=0).deadlines.find_due().lost
    assert not sharded.store_with(lost_message_ms=60_000).deadlines.find_due().lost


def test_a_retry_is_due_in_its_shard_once_its_time_comes(sharded: World) -> None:
    store = sharded.store

    def retrying(run_id: str, due_ms: int) -> None:
        sharded.make("running", run_id)
        wait = RetryWait(calls=[ToolRetry(tool_call_id="call_1", tool_name="pay", attempt=2,
                                          max_attempts=5, last_error="ConnectionError: reset",
                                          first_attempt_at=iso(due_ms))],
                         next_attempt_at=iso(due_ms))
        assert store.runs.schedule_retry(run_id, 1, OWNER, wait, due_ms, wait.wire(),
                                         checkpoints={}, tools=["pay"]).ok

    retrying(_in_shard(1, "later"), sharded.now() + 60_000)
    assert store.deadlines.find_due().retries == ()
    retrying(_in_shard(2, "due"), sharded.now() - 1)
    assert store.deadlines.find_due().retries == (store.shards[2],)
    assert store.deadlines.due_retries(shards=(store.shards[2],)) == [_in_shard(2, "due")]


def test_an_idle_sweep_runs_two_scripts_where_it_ran_two_a_shard(
        store_server: EmbeddedRedis) -> None:
    """At 48 shards an idle pass ran a claim of the outbox and one of the due notifications
    in every shard (97 scripts, 539 commands); it now asks where anything is due and who
    stopped beating, and reads nothing else but the server's id."""
    from layby.control import build
    from layby.tasks.sweeper import sweep

    client = redis.Redis(port=store_server.port, db=8, decode_responses=True)
    client.flushdb()
    rt = build(Settings(redis_url=store_server.url.rsplit("/", 1)[0] + "/8"))
    assert len(rt.store.shards) == 48

    def calls() -> dict[str, int]:
        return {name.removeprefix("cmdstat_"): int(stat["calls"])
                for name, stat in client.info("commandstats").items()}

    try:
        sweep(rt)
        before = calls()
        sweep(rt)
        after = calls()
        ran = {name: n - before.get(name, 0) for name, n in after.items()
               if n != before.get(name, 0)}
        assert ran["evalsha"] == 2, ran
        # Beside the scripts (and the reads find_due makes inside its one call): the
        # server's id, the clock, the sweep's note that it swept.
        assert sum(n for name, n in ran.items()
                   if name not in ("evalsha", "zrangebyscore", "info")) <= 6, ran
    finally:
        rt.store.redis.close()
        client.flushdb()
        client.close()


def test_lags_that_do_not_fit_the_keys_are_refused(sharded: World) -> None:
    shard = sharded.store.shards[0].keys
    with pytest.raises(redis.ResponseError,
                       match=r"^find_due: lags has 1 values for 2 keys: give one lag per key"):
        sharded.store.call("find_due", [shard.outbox, shard.leases], lags=[0])
