"""parking.keys is the exact list of the keys the store writes: a whole cycle of the store
on one prefix (every transition script, and every write the store makes itself), watched
with MONITOR, writes only keys of `KEY_SPECS`, each matched by exactly one spec. In the
sharded layout (format 2) it writes every one of them but those of earlier formats (0.1.0's
predecessors', which only migration 1 reads, and the legacy layout's); in the legacy layout
(a store of format 1, as layby 0.2.0 made it, until its switch) only those of the legacy
layout and those named alike in both, and every one of the legacy layout's. The module
docstring lists them as `table()` prints them; every key a `Keys` method names is one of
them.

A key is written when the server ran a command that changes it (its flags in COMMAND
GETKEYSANDFLAGS: RW, OW or RM): the commands of the scripts included, which MONITOR shows
one by one (client "lua"); the EVALSHA calls themselves are left out, as they name every
key a script is given, not those it writes. The monitor's output waits on the server until
it is read, after the cycle: no thread.

Out of scope: keys that other parts of layby write under the same prefix (the demo's
ledger, `<p>:demo:…`), and the broker's: Celery's queues (`layby.turns`, `layby.notify`)
are not under the prefix (layby's broker_key_prefix is '' by default); the store here is
one whose broker is elsewhere, so its transitions queue into its outbox.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis

from layby.parking import Announcements, Keys, formats, migrations
from layby.parking import keys as keys_module
from layby.parking.clock import iso
from layby.parking.keys import KEY_SPECS, KeySpec, ShardKeys, table
from layby.parking.migrations.m0001_versioned import old_keys
from layby.wire import InterruptState, RetryWait, Status, ToolRetry
from tests.store.conftest import (
    MESSAGES,
    OWNER,
    World,
    answer,
    handover,
    interrupt,
    note,
    park_event,
)

pytestmark = pytest.mark.store

# The commands that name the keys a script may touch, not those it writes.
SCRIPT_CALLS = frozenset({"EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO"})
WRITES = frozenset({"RW", "OW", "RM"})
_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ESCAPES = {"n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b", "\\": b"\\",
            '"': b'"'}


def _unquote(text: str) -> str:
    """One argument as MONITOR quotes it (sdscatrepr)."""
    out, i = bytearray(), 0
    while i < len(text):
        if text[i] != "\\":
            out += text[i].encode()
            i += 1
        elif text[i + 1] == "x":
            out.append(int(text[i + 2:i + 4], 16))
            i += 4
        else:
            out += _ESCAPES[text[i + 1]]
            i += 2
    return out.decode(errors="replace")


@contextmanager
def watching(client: redis.Redis) -> Iterator[list[list[str]]]:
    """The commands the server runs in the block (each as its arguments), filled in as the
    block ends."""
    commands: list[list[str]] = []
    sentinel = "test_keys: the cycle is over"
    with client.monitor() as monitor:
        yield commands
        client.echo(sentinel)
        while True:
            assert monitor.connection.can_read(timeout=10), "MONITOR went quiet"
            line = str(monitor.connection.read_response())
            args = [_unquote(a) for a in _ARG.findall(line.split("] ", 1)[1])]
            if args == ["ECHO", sentinel]:
                return
            commands.append(args)


def written_keys(client: redis.Redis, commands: list[list[str]], prefix: str) -> set[str]:
    """The keys under `prefix` that `commands` changed (and those tagged with the format
    key's name: the sharded layout's registry, `{<p>:format}:…`)."""
    found: set[str] = set()
    for args in commands:
        if args[0].upper() in SCRIPT_CALLS:
            continue
        try:
            named = client.execute_command("COMMAND GETKEYSANDFLAGS", *args)
        except redis.ResponseError:  # a command without keys (TIME, ECHO, MULTI, …)
            continue
        found |= {key for key, flags in named if WRITES & set(flags)
                  and key.startswith((f"{prefix}:", f"{{{prefix}:format}}:"))}
    return found


def specs_of(key: str, prefix: str) -> list[KeySpec]:
    return [spec for spec in KEY_SPECS if spec.regex(prefix).fullmatch(key)]


def _cycle(world: World) -> None:
    """Every write of the store, on `world`'s prefix: run_1 through a whole life with people
    (checkpoint, park with a plan, deliveries, hand-over, fold, expiry, approvals, the
    end), run_2 requeued and cancelled, run_3 failed, then the outbox, the workers, the
    sweeper's notes and a reply mail seen once; then what the store's format goes through
    (`_legacy_end`, `_sharded_end`)."""
    store = world.store
    lapsing = world.store_with(lease_ms=-1_000)  # its leases and beats lapse at once
    now = world.now()

    made = store.runs.create_run("run_1", "demo.agent", input="hi", messages=MESSAGES,
                                 metadata={"team": "a"}, idempotency_key="start-1")
    assert made.ok, made
    assert store.runs.claim("run_1", 1, OWNER).ok
    assert store.runs.renew("run_1", 1, OWNER)
    assert store.runs.save_checkpoint("run_1", 1, OWNER, "model", {"text": "hello"})
    assert store.runs.checkpoints("run_1", 1) == {"model": {"text": "hello"}}
    assert store.runs.advance("run_1", 1, OWNER, world.history(2),
                              {"from": 1, "historyTo": 2, "messages": []}, inline=True).ok

    # The park: int_a expires, int_b needs two approvals, int_c is answered by a rule.
    intrs = [interrupt("int_a", expires_ms=now - 1_000),
             interrupt("int_b", reviewers=["alice", "bob"]),
             interrupt("int_c").model_copy(update={"rule": "small"})]
    plan = Announcements(
        notes=[(note("ntf_1", "int_b", token="t1"), None),
               (note("ntf_2", "int_b", reviewer="bob", kind="reminder", token="t2"),
                now + 600_000),
               (note("ntf_3", "int_b", reviewer="carol", kind="escalation", level=1,
                     token="t3"), now - 1_000)],
        grants=[("ref_1", "grant one", 60_000)],
        handovers=[("int_b", handover("dave", "alice"))])
    parked = store.runs.park("run_1", 2, OWNER, world.history(3), intrs, park_event(intrs, 2, 3),
                             plan=plan, by_rule={"int_c": answer("int_c", channel="policy")})
    assert parked.ok and not parked.resumed, parked

    # Deliveries: one retried, failed and sent again by an operator; an escalation sent.
    verdict, sending = store.outbox.start_delivery("run_1", "ntf_1", deadline_ms=30_000,
                                                   max_attempts=5)
    assert verdict == "ok" and sending is not None
    assert store.outbox.finish_delivery("run_1", sending, "retry", error="421",
                                        retry_in_ms=0) == "ok"
    world.next_ms()
    verdict, sending = store.outbox.start_delivery("run_1", "ntf_1", deadline_ms=30_000,
                                                   max_attempts=5)
    assert verdict == "ok" and sending is not None
    assert store.outbox.finish_delivery("run_1", sending, "failed", error="bounced") == "ok"
    assert store.outbox.retry_notifications("run_1", ["ntf_1"])[0] == ["ntf_1"]
    verdict, escalation = store.outbox.start_delivery("run_1", "ntf_3", deadline_ms=30_000,
                                                      max_attempts=5)
    assert verdict == "ok" and escalation is not None
    assert store.outbox.finish_delivery("run_1", escalation, "sent") == "ok"
    # After a worker's death: what was queued is due now, and taken by the sweeper.
    assert store.outbox.redue_queued_notifications() >= 1
    assert ("run_1", "ntf_1") in store.outbox.claim_due_notifications()

    # A hand-over, with the new reviewer's request and grant.
    handed = store.answers.delegate("run_1", "int_b", handover("alice", "erin"), Announcements(
        notes=[(note("ntf_4", "int_b", reviewer="erin", token="t4"), None)],
        grants=[("ref_2", "grant two", 60_000)]))
    assert handed.ok, handed

    # The sweeper folds the parked run's events; they are read back.
    world.next_ms()
    assert world.store_with(fold_after_ms=0).lists.fold_parked() == 1
    assert store.runs.events("run_1") and store.runs.last_park("run_1") is not None

    # int_a expires (the run waits on), then int_b's two approvals resume the run.
    expired = answer("int_a", status="cancelled", payload=None, by="layby", channel="expiry",
                     state=InterruptState.EXPIRED)
    assert store.deadlines.due_deadlines() == [("run_1", "int_a")]
    assert store.answers.expire("run_1", expired, None).ok
    votes = {"int_b": 2}
    assert not store.answers.answer("run_1", [answer("int_b", by="alice")], votes=votes).resumed
    resumed = store.answers.answer("run_1", [answer("int_b", by="bob")], votes=votes, view=True)
    assert resumed.resumed and resumed.version is not None
    assert store.runs.claim("run_1", resumed.version, OWNER).ok
    assert store.runs.complete("run_1", resumed.version, OWNER, world.history(4), "done",
                               {"from": 3, "historyTo": 4}).ok

    # run_2: its worker dies, it is requeued, then cancelled; run_3 fails.
    for run_id in ("run_2", "run_3"):
        assert store.runs.create_run(run_id, "demo.agent", input="hi", messages=MESSAGES,
                                     metadata={}, idempotency_key=None).ok
    assert lapsing.runs.claim("run_2", 1, OWNER).ok
    assert store.deadlines.lapsed_leases() == ["run_2"]
    # (Its turn's outbox entry overdue at once, for the sweeper to publish below.)
    assert world.store_with(outbox_grace_ms=-1_000).runs.requeue("run_2").ok
    assert store.runs.cancel("run_2", "api:ops", "no longer needed").ok
    assert store.runs.claim("run_3", 1, OWNER).ok
    assert store.runs.fail("run_3", {"code": "boom", "message": "it broke"}, version=1,
                           owner=OWNER).ok

    # run_4: a tool call fails and waits to be tried again; due, the step is queued again
    # and completes, the call's attempts out (counted).
    assert store.runs.create_run("run_4", "demo.agent", input="hi", messages=MESSAGES,
                                 metadata={}, idempotency_key=None).ok
    assert store.runs.claim("run_4", 1, OWNER).ok
    wait = RetryWait(calls=[ToolRetry(tool_call_id="call_1", tool_name="pay", attempt=2,
                                      max_attempts=2, last_error="ConnectionError: reset",
                                      first_attempt_at=iso(now))], next_attempt_at=iso(now))
    assert store.runs.schedule_retry("run_4", 1, OWNER, wait, now - 1_000, wait.wire(),
                                     checkpoints={"model": {"text": "pay"}}, tools=["pay"]).ok
    assert store.deadlines.due_retries() == ["run_4"]
    assert store.runs.requeue("run_4").ok
    assert store.runs.claim("run_4", 1, OWNER).ok
    assert store.runs.complete("run_4", 1, OWNER, world.history(3), "paid",
                               {"from": 1, "historyTo": 3}, exhausted=["pay"]).ok

    # run_5, a tenant's (in the sharded layout, where alone tenants' runs are made): in its
    # tenant's own indexes, from its start to its end.
    if world.keys.shard_count is not None:
        assert store.runs.create_run("run_5", "demo.agent", input="hi", messages=MESSAGES,
                                     metadata={}, idempotency_key=None, tenant="acme",
                                     started_by="api:billing",
                                     audit=['{"caller":"api:billing","action":"start"}']).ok
        store.audit.record(['{"caller":"api:bolt","action":"read","outcome":"notfound"}'],
                           of="run_5")
        assert store.runs.revoke_tokens("run_5", "api:billing") is not None
        assert store.runs.claim("run_5", 1, OWNER).ok
        intrs = [interrupt("int_t")]
        assert store.runs.park("run_5", 1, OWNER, world.history(2), intrs, park_event(intrs)).ok
        world.next_ms()
        assert world.store_with(fold_after_ms=0).lists.fold_parked() == 1
        assert store.answers.answer("run_5", [answer("int_t")]).resumed
        assert store.runs.claim("run_5", 3, OWNER).ok
        assert store.runs.complete("run_5", 3, OWNER, world.history(4), "done",
                                   {"from": 3, "historyTo": 4}).ok

    # The outbox published and acked.
    entries = store.outbox.claim_outbox(retry_ms=30_000)
    assert entries
    store.outbox.hold_outbox([(entries[0].args[0], entries[0].id)])
    store.outbox.ack_outbox([(e.args[0], e.id) for e in entries])

    # Workers beat, one dies and is reaped, one stops cleanly.
    lapsing.processes.beat_worker("celery@a:1", "worker 1 0.2.0")
    store.processes.beat_worker("celery@b:2", "worker 1 0.2.0", hosting=["demo.agent@0123abcd4567"])
    assert [name for name, _, _ in store.processes.reap_workers()] == ["celery@a:1"]
    store.processes.forget_worker("celery@b:2")

    # The sweeper's notes, and a reply mail mailed back once.
    store.processes.note_server(first=True)
    store.processes.note_server()
    store.processes.note_server("a broker's run id", broker=True)
    store.deadlines.note_sweep()
    store.lists.prune_finished()
    assert store.marks.first_sight("mailed-back:<m1@example.com>", 60)
    store.marks.forget_sight("mailed-back:<m1@example.com>")

    assert {s for s in Status if store.all_runs.count(s)} == {
        Status.COMPLETED, Status.CANCELLED, Status.FAILED}
    assert {s for s in Status if store.runs_of("default").count(s)} == {
        Status.COMPLETED, Status.CANCELLED, Status.FAILED}


def _legacy_end(world: World) -> None:
    """Until now the store had no format (as 0.1.0 left it): `layby migrate` versions it
    (migration 1 alone); then a rolling deployment's switch to format 2, which gives it the
    shard count it will move to."""
    assert [r.number for r in migrations.migrate(world.client, world.keys, until=1)] == [1]
    assert formats.read(world.client, world.keys).version == 1
    assert world.store.processes.switch_format(2, shards=3) == ["switched"]


def _sharded_end(world: World) -> None:
    """`layby migrate` on a store of the newest format (its lock, and nothing to do), then
    a rolling deployment's switch to the next format."""
    assert migrations.migrate(world.client, world.keys) == []
    assert world.store.processes.switch_format(migrations.newest() + 1) == ["switched"]


def _matched(world: World, commands: list[list[str]]) -> dict[KeySpec, set[str]]:
    """The keys the commands wrote, by the one spec each matches."""
    written = written_keys(world.client, commands, world.prefix)
    assert written, "MONITOR saw no write"
    matched: dict[KeySpec, set[str]] = {}
    for key in sorted(written):
        specs = specs_of(key, world.prefix)
        assert len(specs) == 1, f"{key} matches {[s.pattern for s in specs]}"
        matched.setdefault(specs[0], set()).add(key)
    return matched


def _of_the_sharded_layout(spec: KeySpec) -> bool:
    return "{<shard>}" in spec.pattern or "{<p>:format}" in spec.pattern


def test_a_whole_cycle_writes_every_key_of_the_list_and_no_other(sharded: World) -> None:
    formats.stamp(sharded.client, sharded.keys, migrations.newest(), 3)
    with watching(sharded.client) as commands:
        _cycle(sharded)
        _sharded_end(sharded)
    matched = _matched(sharded, commands)
    older = {spec.pattern for spec in KEY_SPECS if spec.migrated_by}
    assert not older & {spec.pattern for spec in matched}, "a key of an older format"
    assert [spec.pattern for spec in KEY_SPECS
            if not spec.migrated_by and spec not in matched] == []
    # Every state's index, and the transient copy of the events a park makes.
    written = set().union(*matched.values())
    assert {s for s in Status if any(shard.index(s) in written
                                     for shard in sharded.keys.shards)} == set(Status)
    assert f"{sharded.keys.events('run_1')}:compact" in written


def test_a_whole_cycle_of_a_store_of_format_1_writes_the_legacy_layouts_keys(
        world: World) -> None:
    with watching(world.client) as commands:
        _cycle(world)
        _legacy_end(world)
    matched = _matched(world, commands)
    assert not [spec.pattern for spec in matched
                if spec.migrated_by == 1 or _of_the_sharded_layout(spec)]
    assert [spec.pattern for spec in KEY_SPECS
            if spec.migrated_by == 2 and spec not in matched] == []
    written = set().union(*matched.values())
    assert {world.shard.index(s) for s in Status} <= written
    assert f"{world.keys.events('run_1')}:compact" in written


@pytest.mark.parametrize("shards", [None, 48])
def test_every_key_the_keys_methods_name_is_one_of_the_list(shards: int | None) -> None:
    keys = Keys("p", shards)
    named = [*keys.of_run("r"), *keys.for_scripts("r"), *old_keys(keys, "r"), keys.review("r"),
             keys.workers, keys.workers_about, keys.hosting, keys.server, keys.broker_server,
             keys.swept, keys.seen("mailed-back:x"), keys.format, keys.migrate_lock]
    for shard in keys.shards:
        named += [*(shard.index(s) for s in Status), shard.deadlines, shard.leases,
                  shard.outbox, shard.outbox_entries, shard.notify_due, shard.stats,
                  shard.queues, shard.fold_cursor, shard.idempotency("k:1"), shard.grant("g")]
    for key in named:
        assert len(specs_of(key, "p")) == 1, key
    # Of the layout they name: the sharded one's, or, in the legacy one, its own or those
    # named alike in both.
    for key in (*keys.for_scripts("r"), keys.workers):
        [spec] = specs_of(key, "p")
        assert _of_the_sharded_layout(spec) == (shards is not None), key
    # The lookalikes of other keys match none.
    for key in ("p:{r}:other", "p:index:unknown", "p:outbox:other", "q:stats", "p:{r}x:run"):
        assert specs_of(key, "p") == [], key


def test_the_module_docstring_lists_the_keys_as_the_list_holds_them() -> None:
    assert keys_module.__doc__ is not None
    assert table() in keys_module.__doc__, (
        "layby/parking/keys.py's docstring must hold the list as `table()` prints it: "
        "python -c 'from layby.parking.keys import table; print(table())'\n" + table())
    assert len({spec.pattern for spec in KEY_SPECS}) == len(KEY_SPECS)


def test_the_legacy_layout_is_one_shard_named_as_before_shards() -> None:
    keys = Keys("p")
    assert keys.shards == (ShardKeys("p"),) and keys.shard_of("run_1") == keys.legacy
    # Every transition script's KEYS, to the letter (lua/_prelude.lua names them by place).
    assert keys.for_scripts("r") == [
        "p:{r}:run", "p:{r}:answers", "p:{r}:checkpoints", "p:{r}:events", "p:outbox",
        "p:outbox:entries", "p:leases", "p:deadlines", "p:index:queued", "p:index:running",
        "p:index:interrupted", "p:index:resuming", "p:index:completed", "p:index:failed",
        "p:index:cancelled", "p:notify:due", "p:stats", "p:{r}:review", "p:queues",
        "p:index:retrying", "p:retries"]
    shard = keys.legacy
    assert [shard.deadlines, shard.leases, shard.outbox, shard.outbox_entries,
            shard.notify_due, shard.stats, shard.queues, shard.fold_cursor,
            shard.idempotency("k"), shard.grant("g")] == [
        "p:deadlines", "p:leases", "p:outbox", "p:outbox:entries", "p:notify:due", "p:stats",
        "p:queues", "p:fold:cursor", "p:idem:k", "p:grant:g"]
