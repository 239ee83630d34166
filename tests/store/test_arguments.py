"""The scripts' arguments go by name (lua/_args.lua reads them, parking.scripts.argv lays
them out): no script reads ARGV but through the reader, each reads its arguments before
anything else and names them in its header, and a call whose arguments do not fit is
refused, naming the script and the argument, before anything is written. What travels
inside a group (a stored record, an answer) is stored byte for byte."""

from __future__ import annotations

import re
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path

import pytest
import redis

from layby.parking import Announcements, Keys, Verdict, scripts
from layby.parking.codecs import stored_interrupt
from layby.parking.scripts import argv
from layby.parking.store.fields import dumps as _dumps
from tests.store.conftest import OWNER, World, answer, interrupt, note, park_event

pytestmark = pytest.mark.store

LUA = resources.files("layby.parking") / "lua"
READER = "_args.lua"
SCRIPTS = (*scripts.RUN_SCRIPTS, *scripts.STANDALONE_SCRIPTS, *scripts.FOLDING_SCRIPTS)
# How every script begins: `local A = args({names…}, {group names…})`.
ARGS_CALL = re.compile(r"local A = args\(\{([^}]*)\}(?:, \{([^}]*)\})?\)")


def _lua_files() -> list[Traversable]:
    return sorted((f for f in LUA.iterdir() if f.name.endswith(".lua")), key=lambda f: f.name)


def _declared(name: str) -> list[str]:
    """The arguments script `name` reads, in the order its `args` call names them (plain
    ones, then groups): the first is the one a call without arguments is refused for."""
    for line in (LUA / f"{name}.lua").read_text().splitlines():
        call = ARGS_CALL.fullmatch(line)
        if call:
            return re.findall(r"'(\w+)'", call[1]) + re.findall(r"'(\w+)'", call[2] or "")
    raise AssertionError(f"{name}.lua has no `local A = args(…)`")


def test_no_script_reads_argv_but_through_the_argument_reader() -> None:
    found = [f"{f.name}:{n}: {line.strip()}" for f in _lua_files() if f.name != READER
             for n, line in enumerate(f.read_text().splitlines(), 1)
             if re.search(r"\bARGV\b", line)]
    assert not found, "ARGV outside lua/_args.lua (arguments go by name):\n" + "\n".join(found)


def test_every_script_reads_its_arguments_first_and_names_them_in_its_header() -> None:
    assert sorted(f.name.removesuffix(".lua") for f in _lua_files()
                  if not f.name.startswith("_")) == sorted(SCRIPTS)
    for name in SCRIPTS:
        lines = (LUA / f"{name}.lua").read_text().splitlines()
        code = [line for line in lines if line.strip() and not line.startswith("--")]
        assert ARGS_CALL.fullmatch(code[0]), f"{name}.lua begins with {code[0]!r}"
        start = next(i for i, line in enumerate(lines) if line.startswith("-- Arguments: "))
        header = lines[start]
        for line in lines[start + 1:]:
            if not line.startswith("--   "):
                break
            header += line
        for arg in _declared(name):
            assert re.search(rf"\b{arg}\b", header), f"{name}.lua's header names {arg}"


# -- a call that does not fit is refused, and writes nothing ------------------------------


def _busy(world: World) -> None:
    """Something for every script to change, were it to run: a parked run with a
    notification due, an outbox entry, a worker whose beat lapsed."""
    world.make("interrupted", plan=Announcements(
        notes=[(note("ntf_1", "int_a"), world.now() - 1_000)]))
    world.store_with(lease_ms=-1_000).processes.beat_worker("celery@gone", "worker 1 0.2.0")
    assert world.outbox() and world.zset(world.shard.notify_due)


def _keys(world: World, name: str) -> list[str]:
    if name in scripts.RUN_SCRIPTS:
        return world.keys.for_scripts("run_1")
    if name in scripts.FOLDING_SCRIPTS:
        return [world.keys.run("run_1"), world.keys.events("run_1")]
    return {"claim_outbox": [world.shard.outbox, world.shard.outbox_entries],
            "ack_outbox": [world.shard.outbox, world.shard.outbox_entries],
            "claim_due_notifications": [world.shard.notify_due],
            "beat_worker": [world.keys.workers, world.keys.workers_about, world.keys.format],
            "reap_workers": [world.keys.workers, world.keys.workers_about],
            "switch_format": [world.keys.workers, world.keys.workers_about,
                              world.keys.format],
            "count_versions": [world.keys.run("run_1")],
            "move_run": [*world.keys.for_scripts("run_1"),
                         *Keys(world.prefix, 3).for_scripts("run_1")],
            "move_members": [world.shard.outbox, Keys(world.prefix, 3).shards[0].outbox],
            "move_key": [world.shard.grant("g"), Keys(world.prefix, 3).shards[0].grant("g")],
            "merge_stats": [world.shard.stats, Keys(world.prefix, 3).shards[0].stats],
            "record_audit": [Keys(world.prefix, 3).shards[0].audit],
            "index_asks": [world.keys.run("run_1"), world.shard.asks("alice")],
            "find_due": [world.shard.outbox, world.shard.notify_due]}[name]


@pytest.mark.parametrize("name", [s for s in SCRIPTS if _declared(s)])
def test_a_script_called_without_its_arguments_is_refused_and_writes_nothing(
        world: World, name: str) -> None:
    _busy(world)
    before = world.snapshot()
    with pytest.raises(redis.ResponseError,
                       match=rf"^{name}: argument {_declared(name)[0]} is missing"):
        world.store._scripts[name](keys=_keys(world, name), args=[])
    assert world.snapshot() == before


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_script_given_a_name_without_a_value_is_refused_and_writes_nothing(
        world: World, name: str) -> None:
    _busy(world)
    before = world.snapshot()
    given = [*argv(dict.fromkeys(_declared(name), "1")), "version"]
    with pytest.raises(redis.ResponseError,
                       match=rf"^{name}: an odd number of ARGV \({len(given)}\).*the last, "
                             "version, has no value"):
        world.store._scripts[name](keys=_keys(world, name), args=given)
    assert world.snapshot() == before


def test_a_park_without_its_plan_is_refused_and_the_claim_stands(world: World) -> None:
    world.make("running")
    before = world.snapshot()
    intr = interrupt("int_a")
    with pytest.raises(redis.ResponseError, match=r"^park_run: argument plan is missing"):
        world.store.run_script("park_run", "run_1", version=1, owner=OWNER, messages="[]",
                               event="{}", announce=False,
                               interrupts=[{"id": intr.id, "record": stored_interrupt(intr)}])
    assert world.snapshot() == before
    assert world.store.runs.renew("run_1", 1, OWNER)


def test_arguments_as_the_scripts_took_them_before_names_are_refused(world: World) -> None:
    """Positional ARGV (a caller of an older layby): the first name the script reads is
    missing, or the count is odd; nothing is read under the wrong name."""
    world.make("running")
    before = world.snapshot()
    script = world.store._scripts
    keys = world.keys.for_scripts("run_1")
    with pytest.raises(redis.ResponseError, match=r"^claim_run: argument version is missing"):
        script["claim_run"](keys=keys, args=["1", OWNER, "6000", "5"])
    with pytest.raises(redis.ResponseError, match=r"^renew_lease: an odd number of ARGV \(3\)"):
        script["renew_lease"](keys=keys, args=["1", OWNER, "6000"])
    assert world.snapshot() == before


def test_a_name_the_script_does_not_read_or_one_given_twice_is_refused(world: World) -> None:
    world.make("running")
    before = world.snapshot()
    with pytest.raises(redis.ResponseError,
                       match=r"^renew_lease: argument lease is not one it reads"):
        world.store.run_script("renew_lease", "run_1", version=1, owner=OWNER, lease_ms=6_000,
                               lease=6_000)
    with pytest.raises(redis.ResponseError, match=r"^renew_lease: argument owner is given twice"):
        world.store._scripts["renew_lease"](
            keys=world.keys.for_scripts("run_1"),
            args=["version", "1", "owner", OWNER, "owner", "worker-2", "lease_ms", "6000"])
    assert world.snapshot() == before


def test_a_group_that_is_not_json_is_refused(world: World) -> None:
    world.make("interrupted")
    before = world.snapshot()
    with pytest.raises(redis.ResponseError,
                       match=r"^answer_interrupts: argument answers is not a JSON array"):
        world.store.run_script("answer_interrupts", "run_1", require_all=False, allow_early=False,
                               answers="int_a", slack=False, trace="")
    assert world.snapshot() == before


# -- what travels inside a group -----------------------------------------------------------

AWKWARD = 'say "yes" \\ then / go: é, 😀, \u2028, a\nnewline, \x01'


def test_records_inside_a_group_are_stored_byte_for_byte(world: World) -> None:
    """An interrupt's record and a rule's answer go inside the park's `interrupts`, an early
    answer inside `answers`: each is stored as Python wrote it (quotes, backslashes,
    non-ASCII, control characters, numbers cjson would print as 1e+19)."""
    world.make("running")
    intr = interrupt("int_a").model_copy(update={
        "message": AWKWARD, "metadata": {"big": 12_345_678_901_234_567_890, "small": 1e-7}})
    ruled = interrupt("int_r").model_copy(update={"rule": "small-orders"})
    by_rule = {"int_r": answer("int_r", payload={"note": AWKWARD, "big": 2**64},
                               channel="policy")}
    parked = world.store.runs.park("run_1", 1, OWNER, world.history(2), [intr, ruled],
                                   park_event([intr, ruled]), plan=Announcements(),
                                   by_rule=by_rule)
    assert parked.ok, parked
    held = world.run_hash("run_1")
    assert held["i:int_a"] == stored_interrupt(intr)
    assert held["i:int_r"] == stored_interrupt(ruled)
    answers = world.client.hgetall(world.keys.answers("run_1"))
    assert answers["int_r"] == _dumps(by_rule["int_r"].wire())
    early = answer("int_later", payload={"text": AWKWARD, "n": 10**20})
    assert world.store.answers.answer("run_1", [early], allow_early=True).verdict is Verdict.EARLY
    assert world.client.hget(world.keys.answers("run_1"), "int_later") == _dumps(early.wire())


# -- the layout, in Python ---------------------------------------------------------------


def test_argv_lays_out_names_and_values() -> None:
    assert argv({"version": 3, "owner": "w-1", "keep_lease": True, "announce": False,
                 "ids": ["a", "b"], "plan": {"notes": [{"id": "n_1", "at": None}],
                                             "grants": []}}) == [
        "version", "3", "owner", "w-1", "keep_lease", "1", "announce", "0",
        "ids", '["a","b"]', "plan", '{"notes":[{"id":"n_1"}],"grants":[]}']
    assert argv({"note": {"text": "é\"\\"}}) == ["note", '{"text":"é\\"\\\\"}']
    with pytest.raises(TypeError, match="owner"):
        argv({"owner": None})


def test_every_script_is_flagged_and_one_that_writes_nothing_runs_on_a_full_server(
        tmp_path: Path) -> None:
    # `#!lua` (a cluster then refuses a script reaching another slot than its keys'), and
    # `flags=no-writes` on those that only read: with a shebang, a script is taken for one
    # that writes unless it says so, and a full server (`noeviction`) would refuse it.
    from layby.ops.embedded import EmbeddedRedis

    server = EmbeddedRedis(tmp_path / "valkey").start()
    try:
        client = redis.Redis(port=server.port, decode_responses=True)
        client.hset("p:{r}:run", mapping={"agent": "a", "agent_version": "v1"})
        client.config_set("maxmemory", int(client.info("memory")["used_memory"]) // 2)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.set("more", "x")
        counted = scripts.standalone(client, "count_versions")(keys=["p:{r}:run"])
        assert counted == ["a", "v1", "", 1]
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            scripts.standalone(client, "ack_outbox")(keys=["p:outbox", "p:outbox:entries"],
                                                     args=argv({"ids": ["e"]}))
        client.config_set("maxmemory", 0)
        client.close()
    finally:
        server.stop()
