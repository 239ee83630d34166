"""The Redis store of runs: every state change is one Lua script (see `lua/`), reads are plain.

Each transition method returns a small result. When the broker is the store's server (the
config carries the task messages, made by `layby.broker_config.messages`), a transition
queues the task that follows it in the same script; otherwise `entries` are outbox entries
the caller must publish and then `ack_outbox`. The store never talks to Celery: it knows
Redis, and the messages come made.

With `min_replicas_ack`, the transitions someone is told about (`ACKNOWLEDGED`) are
followed by WAIT on the same connection, so what was acknowledged survives a failover.

A transition writes its run's shard (`shard_of`); the reads that scan the indexes, the
deadlines, the leases, the outbox or the due notifications read every shard (`shards`) and
merge them by score.

Where the runs are is the store's layout (`layout`, `parking.formats.Layout`), read again
from its format key at least every `formats.FRESH_S`. While a store of format 1 moves to
the sharded layout, a run still in the legacy one is moved (lua/move_run.lua) before
anything is done with it (`keys_of`), the legacy shard is scanned as one more, and reads
of many runs at once read each where it is (`_located`); before its layout instant, a
transition that does not find its run looks in the sharded layout too (`Layout.next`).
"""

from __future__ import annotations

import json
import secrets
import string
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, TypeVar, cast

from redis import Redis, RedisCluster, RedisError
from redis.exceptions import AskError, MovedError, NoScriptError, TryAgainError

from layby.generation.interrupts import Interrupt
from layby.generation.messages import Message, dump_messages, load_messages
from layby.parking import (
    audit,
    codecs,
    events,
    formats,
    pinning,
    registries,
    results,
    scripts,
)
from layby.parking import shards as sharding
from layby.parking.clock import iso
from layby.parking.formats import Layout
from layby.parking.keys import DEFAULT_TENANT, Keys, ShardKeys
from layby.parking.records import Announcements, OutboxEntry, Ownership, RunRecord
from layby.parking.registries import RunIndex, Shard, cursor_of, due_in, now_ms
from layby.parking.results import Transition, Verdict
from layby.parking.scripts import QueuedTask, ScriptSettings
from layby.wire import (
    Answer,
    Delegation,
    Escalated,
    Event,
    InterruptView,
    Notification,
    RetryWait,
    Review,
    RunSummary,
    RunView,
    Status,
)

# A generated run id: `run_` and 22 characters drawn evenly from the 62 letters and digits
# (131 random bits; a uuid4, `run_` and 32 hex digits before, has 122). A parked run holds
# its id three times for as long as it waits (its hash's name, its place in the index, its
# token's grant): the 14 characters fewer took 38 B off a parked run at 100,000 parked and
# 28 B at 1,000,000 (bench, `--parked`; docs/sizing.md).
# Case matters in it, as in any run id (Redis keys, URL paths and task ids keep it); what
# must survive a mail server changing its case, `reply+<token>@…`, holds a token
# (lowercase base32), never a run id. A caller may still choose its own (1 to 128 letters,
# digits, `_`, `-`, `.`: control.commands.RUN_ID).
RUN_ID_ALPHABET = string.digits + string.ascii_uppercase + string.ascii_lowercase
RUN_ID_CHARS = 22


def generated_run_id() -> str:
    """A fresh run id, `run_` and RUN_ID_CHARS random letters and digits."""
    return "run_" + "".join(secrets.choice(RUN_ID_ALPHABET) for _ in range(RUN_ID_CHARS))


@dataclass(frozen=True)
class TaskNames:
    """The Celery tasks and queues the transitions queue work for, as the outbox entries
    name them (`layby.broker_config.names` defines them; the store knows Redis, not the
    broker)."""

    turn_task: str
    resume_task: str
    turn_queue: str
    notify_task: str
    notify_queue: str
    deliver_task: str

    def queued(self, messages: Mapping[str, tuple[str, str]] | None) -> dict[str, QueuedTask]:
        """The tasks as the scripts queue them, by kind; `messages` (kind → queue key,
        message template) when the broker is the store's server."""
        named = {"turn": (self.turn_task, self.turn_queue),
                 "resume": (self.resume_task, self.turn_queue),
                 "notify": (self.notify_task, self.notify_queue),
                 "deliver": (self.deliver_task, self.notify_queue)}
        return {kind: QueuedTask(task, queue, *(messages or {}).get(kind, (None, None)))
                for kind, (task, queue) in named.items()}


# How long a transition waits for a slot it touches to finish moving to another node
# (TRYAGAIN: some of its keys are there, some not yet; nothing ran), and its first pause.
SLOT_MOVE_WAIT_S = 10.0
SLOT_MOVE_PAUSE_S = 0.02

_T = TypeVar("_T")


def _while_slots_move(call: Callable[[], _T]) -> _T:
    """`call()`, again while a cluster answers TRYAGAIN (a slot's keys half moved, as
    `valkey-cli --cluster reshard` moves them: its scripts and MULTIs wait until the slot is
    whole again), pausing longer each time, up to SLOT_MOVE_WAIT_S."""
    deadline = time.monotonic() + SLOT_MOVE_WAIT_S
    pause = SLOT_MOVE_PAUSE_S
    while True:
        try:
            return call()
        except TryAgainError:
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.5)


def on_cluster(client: object) -> bool:
    """Whether `client` is a cluster's (redis-py's RedisCluster, which has the commands of
    a server's client but answers some, INFO say, node by node)."""
    return isinstance(client, RedisCluster)


@dataclass(frozen=True)
class StoreConfig:
    tasks: TaskNames
    prefix: str = "layby"
    # None: the one-shard layout of a store made on one server; a number: the sharded
    # layout (`parking.keys.Keys`) of a store made on a cluster. As its format key says.
    shards: int | None = None
    retention_s: int = 7 * 24 * 3600
    idempotency_ttl_s: int = 24 * 3600
    lease_ms: int = 6_000  # a claim lapses this long after its worker's last heartbeat
    lost_message_ms: int = 300_000  # queued or resuming this long: its message may be lost
    events_max: int = 2000
    fold_after_ms: int = 30_000  # a parked run's events are folded into its hash this late
    outbox_grace_ms: int = 10_000
    max_attempts: int = 5
    audit_keep_ms: int = 90 * 86_400_000  # the audit trail's retention
    min_replicas_ack: int = 0  # WAIT for this many replicas after ACKNOWLEDGED transitions
    replica_ack_timeout_ms: int = 1000
    # By task kind (turn, resume, notify, deliver): the queue's key and the message to push,
    # when the broker is the store's server; None: transitions fill the outbox instead.
    messages: Mapping[str, tuple[str, str]] | None = field(default=None, compare=False)

    @property
    def pushes_tasks(self) -> bool:
        return bool(self.messages)


# The lost-message check reads the oldest waiting runs this many at a time, up to this many
# pages (`Store.waiting_too_long`).
LOST_SCAN_PAGE = 100
# How old a process's idea of which tenants have runs in which shard may be (`tenants`): a
# new tenant's first runs reach the scans of every run this late at most.
TENANTS_FRESH_S = 5.0
LOST_SCAN_PAGES = 10
# After a worker's death, runs within this many numbers of their queue's last claim are
# requeued (what it may have reserved, prefetched but not claimed; `Store.maybe_reserved`):
# above a worker's concurrency times its prefetch (1). A message beyond is found later,
# once claims pass it, by the lost-message check.
RESERVED_HEADROOM = 100

# Transitions whose outcome is told to someone (a 202, an answer taken, a reviewer asked, a
# result): lost at a failover, the caller would have been told something that is not so.
# The others are redone by the sweeper or a redelivery if lost.
ACKNOWLEDGED = frozenset({"create_run", "park_run", "answer_interrupts", "expire_interrupt",
                          "delegate_interrupt",
                          "complete_run", "fail_run", "cancel_run",
                          # a try scheduled: on a replica too before its worker moves on, so
                          # a failover in the wait keeps the attempt it counted
                          "schedule_retry"})
# First elements of the replies of scripts that wrote something.
WROTE = frozenset({"created", "ok", "failed", "early"})
# The replies of run scripts that found no run to act on (or nothing of it): before a
# store's layout instant, the run may have been moved by a process whose idea of the
# instant is a round trip ahead (`Store._run`).
NOT_FOUND = frozenset({"missing", "gone", "stale"})
# Runs this process knows are out of the legacy layout (moved, or made in the sharded one),
# at most (a run never moves back; forgetting costs one more `move_run` call).
MOVED_KEPT = 50_000

ExtraKeys = tuple[str, ...] | Callable[[Keys], Sequence[str]]


class NotReplicated(RedisError):
    """A transition was written on the primary, but fewer replicas than `min_replicas_ack`
    confirmed it in time: a failover now could lose it. The write stands on the primary,
    where a retry finds it (an answer already recorded, the run of an idempotency key)."""


# The client decodes replies (decode_responses=True: `layby.control.connections`), so they
# are str; redis-py's annotations cannot know that and say `bytes | str`: hence the casts
# on plain reads below. Script and pipeline replies are lists of whatever the script or
# the commands sent back (list[Any]).


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _found_nothing(reply: list[Any]) -> bool:
    """Whether a run script's reply says it found no run, or nothing of it, to act on."""
    if not reply:
        return False
    return (reply[0] in NOT_FOUND or reply[:2] == ["done", "gone"]
            or reply == [[], []])


class Store:
    def __init__(self, client: Redis, config: StoreConfig) -> None:
        self.redis = client
        self.config = config
        self.tasks = config.tasks
        # The layout the config names (as the store's format key said when the process
        # started), kept while the store has no format key (a store's own tests).
        self._configured = Layout(Keys(self.config.prefix, self.config.shards))
        self._layout = self._configured
        # When (monotonic) the format key behind `_layout` was read, and when its layout
        # instant comes (read it again then).
        self._layout_at, self._layout_until = float("-inf"), float("inf")
        self._of_layout: dict[Layout, tuple[tuple[Shard, ...], RunIndex]] = {}
        # The tenants with runs in each shard (`tenants`), and the index of every run they
        # make (`runs`).
        self._tenants: dict[str, frozenset[str]] = {}
        self._tenants_read = float("-inf")
        self._every: dict[Layout, tuple[dict[str, frozenset[str]], RunIndex]] = {}
        self._moved: set[str] = set()
        # How many messages wait in a queue on the broker (the runtime asks it): None, only a
        # broker that is this server is asked (`queue_length`).
        self.length_of_queue: Callable[[str], int | None] | None = None
        self._writing = formats.FIRST
        self._scripts = scripts.register(client, ScriptSettings(
            events_max=config.events_max, outbox_grace_ms=config.outbox_grace_ms,
            lost_message_ms=config.lost_message_ms,
            tasks=config.tasks.queued(config.messages), audit_keep_ms=config.audit_keep_ms))

    # -- where the runs are ----------------------------------------------------------------

    @property
    def layout(self) -> Layout:
        """The store's layout (`parking.formats.Layout`), its format key read again when
        this process's view of it is older than `formats.FRESH_S`, or its layout instant
        came: a switch reaches every process within that, pool children too (a beat brings
        it sooner)."""
        now = time.monotonic()
        if now - self._layout_at > formats.FRESH_S or now >= self._layout_until:
            self._read_format()
        return self._layout

    def _read_format(self) -> None:
        began = self._layout_at = time.monotonic()
        try:
            if on_cluster(self.redis):  # (TIME has no key; a store on a cluster never moves)
                raw, now = self.redis.hmget(self.keys_format, *formats.FIELDS), 0
            else:
                pipe = self.redis.pipeline(transaction=False)
                pipe.hmget(self.keys_format, *formats.FIELDS)
                pipe.time()
                raw, clock = pipe.execute()
                now = formats.server_ms(clock)
        except RedisError:
            return  # away: the last one known, asked again later
        self._learn(formats.parsed(cast("list[str | None]", raw)), now, began)

    def _learn(self, state: formats.FormatState, now_ms: int, began: float) -> None:
        """Take the store's format as read at `began` (monotonic), when the server's clock
        said `now_ms`."""
        self._layout_at = began
        if state.written is not None:
            self._writing = state.written
        if state.version is None and state.shards is None:
            return  # no format key: the layout configured
        layout = formats.layout(state, self.config.prefix, now_ms)
        self._layout_until = float("inf")
        if layout.next is not None and state.sharded_at is not None:
            # The instant by this process's clock, as the server's said it when asked.
            self._layout_until = began + (state.sharded_at - now_ms) / 1000
        self._layout = layout

    @property
    def keys_format(self) -> str:
        """The format key: named the same in every layout."""
        return self._configured.keys.format

    @property
    def keys(self) -> Keys:
        """The keys of the layout transitions write, and new runs are made in."""
        return self.layout.keys

    def _of(self, layout: Layout) -> tuple[tuple[Shard, ...], RunIndex]:
        found = self._of_layout.get(layout)
        if found is None:
            found = self._of_layout[layout] = (
                tuple(Shard.of(self.redis, keys) for keys in layout.shards),
                RunIndex(self.redis, *layout.shards))
        return found

    @property
    def shards(self) -> tuple[Shard, ...]:
        """Every shard a scan reads: the layout's, and the legacy one (last) while the store
        moves to the sharded layout."""
        return self._of(self.layout)[0]

    @property
    def runs(self) -> RunIndex:
        """Every run's index at once, every tenant's, in every scanned shard: what scans of
        every run read (the sweeper, gauges, an admin's list), merged by score."""
        layout = self.layout
        tenants = self.tenants()
        if not tenants:
            return self._of(layout)[1]
        found = self._every.get(layout)
        if found is None or found[0] != tenants:
            found = self._every[layout] = (tenants, RunIndex(
                self.redis, *registries.families(layout.shards, tenants)))
        return found[1]

    def runs_of(self, tenant: str) -> RunIndex:
        """A tenant's runs alone: its own indexes in every shard (`default`'s are the
        shards' own)."""
        if tenant == DEFAULT_TENANT:
            return self._of(self.layout)[1]
        return RunIndex(self.redis, *(shard.of_tenant(tenant) for shard in self.layout.shards))

    def tenants(self) -> dict[str, frozenset[str]]:
        """The tenants other than `default` with runs in each shard (by the shard's keys'
        base), read again every TENANTS_FRESH_S at most: a scan of every run reads their
        indexes too."""
        now = time.monotonic()
        if now - self._tenants_read >= TENANTS_FRESH_S:
            self._tenants = registries.tenants_in(self.redis, self.layout.shards)
            self._tenants_read = now
        return self._tenants

    def shard_of(self, run_id: str) -> Shard:
        """The shard of the run's transitions."""
        return self.shards[self.keys.shard_number(run_id)]

    def fits_with(self, run_id: str) -> Callable[[str], bool] | None:
        """Which refs of grants a transition of the run may write (`Keys.fits_with`)."""
        return self.keys.fits_with(run_id)

    def keys_of(self, run_id: str) -> Keys:
        """The keys the run is under: those of the layout, once it is moved there when it
        is still in the legacy one (while the store moves to the sharded layout). Between
        the switch and the layout instant (seconds), one not in the legacy layout is looked
        for in the sharded one: a process a round trip ahead may have moved it."""
        layout = self.layout
        if layout.legacy is not None and run_id not in self._moved:
            self._move(layout, [run_id])
        elif layout.next is not None and not self.redis.exists(layout.keys.run(run_id)):
            return layout.next
        return layout.keys

    def _move(self, layout: Layout, run_ids: Sequence[str]) -> None:
        """Move the runs still in the legacy layout to `layout.keys` (one round trip)."""
        legacy = layout.legacy
        assert legacy is not None
        todo = [run_id for run_id in dict.fromkeys(run_ids) if run_id not in self._moved]
        if not todo:
            return

        def fill(pipe: Any) -> None:
            for run_id in todo:
                self._queue(pipe, "move_run", [*legacy.for_scripts(run_id),
                                               *layout.keys.for_scripts(run_id)], [])

        for run_id, reply in zip(todo, self._pipelined(fill, "move_run"), strict=True):
            if reply[0] != "missing":  # (one made later by a late process may be legacy)
                if len(self._moved) >= MOVED_KEPT:
                    self._moved.clear()
                self._moved.add(run_id)

    def _located(self, run_ids: Sequence[str]) -> list[Keys]:
        """The layout each run is in now, without moving any (a read of many runs reads
        each where it is): while the store moves, one round trip asks which are still in
        the legacy layout. (One moved meanwhile reads as gone.)"""
        layout = self.layout
        legacy = layout.legacy
        unknown = [r for r in run_ids if r not in self._moved] if legacy is not None else []
        if legacy is None or not unknown:
            return [layout.keys] * len(run_ids)
        pipe = self.redis.pipeline(transaction=False)
        for run_id in unknown:
            pipe.exists(legacy.run(run_id))
        there = {run_id for run_id, found in zip(unknown, pipe.execute(), strict=True)
                 if found}
        return [legacy if run_id in there else layout.keys for run_id in run_ids]

    @property
    def writing(self) -> int:
        """The format records are written in: the store's (`parking.formats`), read again
        with its layout (`layout`)."""
        self.layout  # noqa: B018  (read again when it is time)
        return self._writing

    @writing.setter
    def writing(self, format: int) -> None:
        self._writing = format

    def script_names(self) -> dict[str, str]:
        """Each script's SHA1 (as EVALSHA names it) and its name: for MONITOR's readers."""
        return {script.sha: name for name, script in self._scripts.items()}

    def _run(self, name: str, run_id: str, /, *, extra_keys: ExtraKeys = (),
             under: Keys | None = None, **named: Any) -> list[Any]:
        """Run script `name` on the run's keys (`keys_of`: moved first while the store moves
        to the sharded layout) and `extra_keys` after them (or those it names in a layout),
        given `named` (`scripts.argv`). Before the store's layout instant, a run the script
        does not find in the legacy layout is looked for in the sharded one: a process a
        round trip ahead may have moved it. `under`: the layout to run it in, as it is (a
        new run's)."""
        keys = under or self.keys_of(run_id)
        reply = self._run_on(name, run_id, keys, extra_keys, named)
        later = self._layout.next
        if later is not None and later != keys and _found_nothing(reply) \
                and not self.redis.exists(keys.run(run_id)):
            reply = self._run_on(name, run_id, later, extra_keys, named)
        return reply

    def _run_on(self, name: str, run_id: str, layout: Keys, extra_keys: ExtraKeys,
                named: Mapping[str, Any]) -> list[Any]:
        extra = extra_keys(layout) if callable(extra_keys) else extra_keys
        keys = [*layout.for_scripts(run_id), *extra]
        args = scripts.argv(named)
        wanted = self.config.min_replicas_ack
        if not wanted or name not in ACKNOWLEDGED:
            replied: list[Any] = _while_slots_move(
                lambda: self._scripts[name](keys=keys, args=args))
            return replied
        # WAIT counts the replicas that have this connection's writes: same pipeline (on a
        # cluster, on the connection to the node of the run's slot).
        def fill(pipe: Any) -> None:
            self._queue(pipe, name, keys, args)
            pipe.wait(wanted, self.config.replica_ack_timeout_ms)

        reply: list[Any]
        acked: int
        reply, acked = self._pipelined(fill, name, on_node_of=keys[0])
        if acked < wanted and reply and reply[0] in WROTE:
            raise NotReplicated(
                f"{name} for run {run_id} is written on the primary, but {acked} of the "
                f"{wanted} replica(s) asked for confirmed it within "
                f"{self.config.replica_ack_timeout_ms} ms (LAYBY_REDIS_MIN_REPLICAS_ACK): a "
                "failover now could lose it; check the replicas (`layby doctor`)")
        return reply

    def _call(self, name: str, keys: list[str], /, *, client: Any = None, **named: Any) -> Any:
        """Run script `name`, one of global keys (or of a run's hash and events alone), on
        `keys`, given `named` (`scripts.argv`); queued on pipeline `client` when given (run
        by `_pipelined`)."""
        if client is not None:
            return self._queue(client, name, keys, scripts.argv(named))
        return self._scripts[name](keys=keys, args=scripts.argv(named))

    def _queue(self, pipe: Any, name: str, keys: Sequence[str], args: Sequence[Any]) -> None:
        """Queue script `name` on `pipe` by its SHA1 alone. (redis-py's Script objects ask
        the server whether it has them before every pipeline, and a cluster's pipelines
        refuse them: `_pipelined` loads a script the server lacks, and sends again.)"""
        pipe.execute_command("EVALSHA", self._scripts[name].sha, len(keys), *keys, *args)

    def _pipelined(self, fill: Callable[[Any], None], *names: str,
                   transaction: bool = False, on_node_of: str | None = None) -> list[Any]:
        """A pipeline (a MULTI with `transaction`) that `fill` queues, scripts `names` among
        its commands, executed; sent once more after loading them when the server had lost
        one (a restart, a failover, a flush: NOSCRIPT, which writes nothing). On a cluster,
        `on_node_of` sends it over one connection to the node that serves that key (a
        cluster's pipeline may spread commands without keys, WAIT, over others); a node
        that no longer serves it (MOVED: nothing ran) has the slots looked up again, and
        one whose slot is moving (ASK: the keys are at the node it goes to) is left for
        that node, asked with ASKING, for the next try."""
        node = on_node_of if on_cluster(self.redis) else None
        tries = 4  # NOSCRIPT, MOVED or ASK, in any order, then the one that works
        asked: Redis | None = None  # the node an ASK named, for the next try alone
        for attempt in range(1, tries + 1):
            client = self.redis if node is None else (asked or self._node_client(node))

            def execute(client: Any = client, asking: bool = asked is not None) -> list[Any]:
                pipe = client.pipeline(transaction=transaction)
                if asking:  # the slot is moving, and these keys are at the node it goes to
                    pipe.execute_command("ASKING")
                fill(pipe)
                replies: list[Any] = pipe.execute()
                return replies[1:] if asking else replies

            try:
                return _while_slots_move(execute)
            except NoScriptError:
                if attempt == tries:
                    raise
                for name in names:
                    client.script_load(self._scripts[name].script)
            except MovedError:  # (an AskError too: first)
                if attempt == tries:
                    raise
                cast("RedisCluster", self.redis).nodes_manager.initialize()
            except AskError as exc:
                cluster = cast("RedisCluster", self.redis)
                found = cluster.get_node(host=exc.host, port=exc.port)  # type: ignore[no-untyped-call]
                if attempt == tries or found is None:
                    raise
                asked = cluster.get_redis_connection(found)
                continue
            asked = None
        raise AssertionError("unreachable")

    def _node_client(self, key: str) -> Redis:
        cluster = cast("RedisCluster", self.redis)
        return cluster.get_redis_connection(cluster.get_node_from_key(key))  # type: ignore[no-untyped-call]

    # -- transitions -------------------------------------------------------------------

    def new_run_id(self, idempotency_key: str | None = None) -> str:
        """A fresh run id; with `idempotency_key`, one in the shard that key names (in the
        sharded layout the key is written by the run's creation, in the run's shard: a
        retry with the key, under another fresh id, must look in the same one)."""
        keys = self.keys
        while True:
            run_id = generated_run_id()
            if idempotency_key is None or len(keys.shards) == 1 or (
                    keys.shard_number(run_id)
                    == sharding.shard_of(idempotency_key, len(keys.shards))):
                return run_id

    def create_run(self, run_id: str, agent: str, *, input: Any, messages: list[Message],
                   metadata: dict[str, Any], idempotency_key: str | None,
                   agent_version: str | None = None, pinned: bool = False,
                   tenant: str = DEFAULT_TENANT, started_by: str | None = None,
                   audit: Sequence[str] = ()) -> Transition:
        """`agent_version`: the version the run starts on; `pinned`: its steps go to that
        version's queue, for the workers that host it. `tenant`: whose run it is (its lists'
        and who may see it); `started_by`: the caller that started it, kept when four eyes
        may apply. While the store is between layouts, the run's id and its idempotency key
        are looked for in the other one too."""
        layout = self.layout
        other = layout.legacy or layout.next

        def extra(keys: Keys) -> tuple[str, ...]:
            # Without one, no key: an empty name would be a key of another cluster slot.
            found = [keys.shard_of(run_id).idempotency(idempotency_key)] \
                if idempotency_key else []
            elsewhere = layout.keys if keys != layout.keys else other
            if elsewhere is not None:  # (in the sharded layout, in the key's own shard)
                found.append(elsewhere.run(run_id))
                if idempotency_key:
                    found.append(elsewhere.shard_of(idempotency_key)
                                 .idempotency(idempotency_key))
            return tuple(found)

        # An input that is the first message's text is read back from there: a prompt is
        # not kept twice for as long as the run lives.
        stored_input = "" if len(messages) == 1 and _first_text(messages) == input \
            else _dumps(input)
        # No metadata is written as none (the script stores none).
        stored_metadata = codecs.RUN_METADATA.encode(metadata, self.writing) if metadata \
            else "{}"
        reply = self._run("create_run", run_id, run_id=run_id, agent=agent, input=stored_input,
                          messages=_dumps(dump_messages(messages)), metadata=stored_metadata,
                          idempotency_ttl_s=self.config.idempotency_ttl_s,
                          agent_version=agent_version or "",
                          pinned=bool(pinned and agent_version),
                          keyed=bool(idempotency_key), elsewhere=other is not None,
                          tenant="" if tenant == DEFAULT_TENANT else tenant,
                          by=started_by or "", audit=list(audit), extra_keys=extra,
                          under=layout.keys)
        if reply[0] == "created" and tenant != DEFAULT_TENANT:
            self._tenants_read = float("-inf")  # scans of every run read it from now on
        return results.created(reply, run_id)

    def claim(self, run_id: str, version: int, owner: str,
              hosted: Sequence[str] = ()) -> Transition:
        """Claim the run's step at `version`; when it applies, `record` holds all the step
        needs (messages, metadata, this version's checkpoints, a parked turn's interrupts
        and answers). A run pinned to an agent version not in `hosted` (`<agent>@<version>`)
        is refused, ELSEWHERE, with nothing written."""
        reply = self._run("claim_run", run_id, version=version, owner=owner,
                          lease_ms=self.config.lease_ms, max_attempts=self.config.max_attempts,
                          hosts="\n".join(hosted))
        return results.claimed(reply, run_id, version)

    def renew(self, run_id: str, version: int, owner: str) -> bool:
        """The heartbeat of the worker holding the claim: False when the claim is not its
        own any more (the step must not commit)."""
        reply = self._run("renew_lease", run_id, version=version, owner=owner,
                          lease_ms=self.config.lease_ms)
        return bool(reply[0] == "ok")

    def save_checkpoint(self, run_id: str, version: int, owner: str, name: str,
                        value: Any) -> bool:
        reply = self._run("save_checkpoint", run_id, version=version, owner=owner, field=name,
                          value=_dumps(value), lease_ms=self.config.lease_ms)
        return bool(reply[0] == "ok")

    def checkpoints(self, run_id: str, version: int) -> dict[str, Any]:
        raw = cast("dict[str, str]", self.redis.hgetall(self.keys_of(run_id).checkpoints(run_id)))
        if raw.get("v") != str(version):
            return {}
        return {k: json.loads(v) for k, v in raw.items() if k != "v"}

    def advance(self, run_id: str, version: int, owner: str, messages: list[Message],
                event: dict[str, Any], *, inline: bool,
                exhausted: Sequence[str] = ()) -> Transition:
        """Commit a turn that goes on. `event`: the step's, as readers get it (`_event`).
        `exhausted` (here and in the other commits): the tools whose calls ran out of
        attempts in the step, counted for /metrics."""
        data, added = _event(event)
        reply = self._run("advance_turn", run_id, version=version, owner=owner,
                          messages=_dumps(dump_messages(messages)), event=data, added=added,
                          keep_lease=inline, lease_ms=self.config.lease_ms,
                          exhausted=list(exhausted))
        return results.committed(reply)

    def schedule_retry(self, run_id: str, version: int, owner: str, wait: RetryWait,
                       due_ms: int, event: dict[str, Any], *, checkpoints: Mapping[str, Any],
                       tools: Sequence[str]) -> Transition:
        """The step's failed tool calls wait to be tried again: the run is `retrying` until
        `due_ms`, when the sweeper queues the step again at `version` (`due_retries`,
        `requeue`). `checkpoints`: what the step holds that is not saved yet (saved now);
        `tools`: the tool of each call tried again (counted for /metrics)."""
        reply = self._run("schedule_retry", run_id, version=version, owner=owner,
                          retry=_dumps(wait.wire()), due_ms=due_ms, event=_dumps(event),
                          checkpoints={k: _dumps(v) for k, v in checkpoints.items()},
                          tools=list(tools))
        return results.scheduled(reply, version)

    def park(self, run_id: str, version: int, owner: str, messages: list[Message],
             interrupts: list[Interrupt], event: dict[str, Any], *,
             plan: Announcements | None = None,
             by_rule: dict[str, Answer] | None = None,
             exhausted: Sequence[str] = (), audit: Sequence[str] = ()) -> Transition:
        """Park the run on `interrupts` and record `plan`, the announcements of those that
        wait on people (None: queue the announcement task to plan them). `by_rule`: the
        answers policy rules give (by interrupt id), recorded in the park."""
        parked: list[dict[str, Any]] = []
        for intr in interrupts:
            expires = None
            if intr.expires_at:
                moment = datetime.fromisoformat(intr.expires_at.replace("Z", "+00:00"))
                expires = int(moment.timestamp() * 1000)
            auto = (by_rule or {}).get(intr.id)
            parked.append({"id": intr.id, "record": codecs.stored_interrupt(intr),
                           "expires": expires, "auto": _dumps(auto.wire()) if auto else None,
                           "rule": intr.rule})
        given, grant_keys = self._plan(plan or Announcements())
        # A park's event is stored without messages, as the earlier steps' events of a
        # parked run are: the history holds them (parking.events fills them in).
        data, _ = _event(event)
        reply = self._run("park_run", run_id, version=version, owner=owner,
                          messages=_dumps(dump_messages(messages)), event=data,
                          announce=plan is None, interrupts=parked, plan=given,
                          exhausted=list(exhausted), audit=list(audit),
                          extra_keys=grant_keys)
        return results.committed(reply)

    def complete(self, run_id: str, version: int, owner: str, messages: list[Message],
                 result: str, event: dict[str, Any],
                 exhausted: Sequence[str] = ()) -> Transition:
        data, added = _event(event)
        reply = self._run("complete_run", run_id, version=version, owner=owner,
                          messages=_dumps(dump_messages(messages)), result=result,
                          event=data, added=added, retention_s=self.config.retention_s,
                          exhausted=list(exhausted))
        return results.committed(reply)

    def fail(self, run_id: str, error: dict[str, Any], *, version: int | None = None,
             owner: str | None = None, messages: list[Message] | None = None,
             exhausted: Sequence[str] = ()) -> Transition:
        reply = self._run("fail_run", run_id, version="" if version is None else version,
                          owner=owner or "", error=_dumps(error),
                          messages="" if messages is None else _dumps(dump_messages(messages)),
                          retention_s=self.config.retention_s, exhausted=list(exhausted))
        return results.committed(reply)

    def cancel(self, run_id: str, by: str, reason: str | None,
               audit: Sequence[str] = ()) -> Transition:
        data = {"code": "cancelled", "message": reason or "cancelled", "by": by}
        reply = self._run("cancel_run", run_id, event=_dumps(data),
                          retention_s=self.config.retention_s, audit=list(audit))
        return results.committed(reply)

    def answer(self, run_id: str, answers: list[Answer], *, require_all: bool = False,
               allow_early: bool = False, votes: dict[str, int] | None = None,
               deadlines: set[str] | None = None, view: bool = False,
               audit: Sequence[str] = ()) -> Transition:
        """Record answers. `votes`: the interrupts whose answer here is an approval counted
        toward several, with the approvals each needs (each reviewer's counts once).
        `deadlines`: the interrupts that expire, when the caller knows (None: any may).
        With `view`, the result's `view` is the run as the answers left it, read in the
        same round trip."""
        given: list[dict[str, Any]] = []
        for a in answers:
            need = (votes or {}).get(a.interrupt_id, 1)
            given.append({"id": a.interrupt_id, "answer": _dumps(a.wire()), "need": need,
                          "voter": a.answered_by if need > 1 else None,
                          "deadline": deadlines is None or a.interrupt_id in deadlines})
        named: dict[str, Any] = {"require_all": require_all, "allow_early": allow_early,
                                 "answers": given, "audit": list(audit)}
        if not view or self.config.min_replicas_ack:
            return results.committed(self._run("answer_interrupts", run_id, **named))
        reply, read = self._run_then_read("answer_interrupts", run_id, named, self._read_view)
        return replace(results.committed(reply), view=self._view_of(run_id, *read))

    def _run_then_read(self, name: str, run_id: str, named: Mapping[str, Any],
                       read: Any) -> tuple[list[Any], list[Any]]:
        """A transition and reads after it, in one round trip and one moment (MULTI): the
        reads see what it wrote. (Not with `min_replicas_ack`: its WAIT is not for MULTI.)"""
        layout = self.keys_of(run_id)
        keys = layout.for_scripts(run_id)

        def fill(pipe: Any) -> None:
            self._queue(pipe, name, keys, scripts.argv(named))
            read(pipe, layout, run_id)

        reply, *found = self._pipelined(fill, name, transaction=True)
        return reply, found

    def delegate(self, run_id: str, interrupt_id: str, handover: Delegation,
                 plan: Announcements | None = None) -> Transition:
        """Hand an open interrupt from `handover.reviewer` to `handover.to`, recording
        `plan`, the new reviewer's announcements (None: queue the announcement task to plan
        them). AGAIN: handed on before."""
        given, grant_keys = self._plan(plan or Announcements())
        reply = self._run("delegate_interrupt", run_id, interrupt_id=interrupt_id,
                          reviewer=handover.reviewer, handover=_dumps(handover.wire()),
                          announce=plan is None, plan=given, extra_keys=grant_keys)
        if reply[0] == Verdict.AGAIN:
            return Transition(Verdict.AGAIN, interrupt_id=interrupt_id)
        return results.committed(reply)

    def expire(self, run_id: str, answer: Answer, fail_error: dict[str, Any] | None) -> Transition:
        reply = self._run("expire_interrupt", run_id, interrupt_id=answer.interrupt_id,
                          answer=_dumps(answer.wire()),
                          fail_error=_dumps(fail_error) if fail_error else "",
                          retention_s=self.config.retention_s)
        return results.committed(reply)

    def requeue(self, run_id: str, *, owner: str = "") -> Transition:
        """Queue the run's pending step again. `owner`: '' once its lease lapsed (or its
        retry is due), '*' now."""
        reply = self._run("requeue_run", run_id, owner=owner)
        return results.requeued(reply)

    # -- notifications -------------------------------------------------------------------

    def _plan(self, plan: Announcements
              ) -> tuple[dict[str, Any], Callable[[Keys], tuple[str, ...]]]:
        """`plan` as the scripts read it (`record_plan` in lua/_prelude.lua), and the keys
        of its grants in a layout, in the same order: each in the shard of its ref (refs are
        drawn in the run's: `fits_with`), where `grant` looks."""
        refs = [ref for ref, _, _ in plan.grants]
        return ({"notes": [{"id": note.id, "record": _dumps(_stored(note)), "at": at}
                           for note, at in plan.notes],
                 "grants": [{"grant": grant, "ttl_ms": max(1000, ttl_ms)}
                            for _, grant, ttl_ms in plan.grants],
                 "handovers": [{"interrupt_id": interrupt_id, "reviewer": handover.reviewer,
                                "record": _dumps(handover.wire())}
                               for interrupt_id, handover in plan.handovers]},
                lambda keys: tuple(keys.shard_of(ref).grant(ref) for ref in refs))

    def plan_notifications(self, run_id: str, plan: Announcements) -> tuple[list[str],
                                                                               list[str]]:
        """Record `plan` for a parked run. Returns the ids that were not planned before, and
        those of them whose delivery the caller must queue (the broker elsewhere)."""
        given, grant_keys = self._plan(plan)
        planned, dispatch = self._run("plan_notifications", run_id, plan=given,
                                      extra_keys=grant_keys)
        return [str(x) for x in planned], [str(x) for x in dispatch]

    def claim_due_notifications(self, limit: int = 100,
                                retry_ms: int = 10_000) -> list[tuple[str, str]]:
        """Queue the deliveries of notifications due to be sent, at most `limit` a shard
        (one script each); returns (run id, notification id) of those the caller must
        queue itself (the broker elsewhere)."""
        found: list[tuple[str, str]] = []
        for shard in self.shards:
            raw = self._call("claim_due_notifications", [shard.keys.notify_due], limit=limit,
                             retry_ms=retry_ms)
            found.extend(tuple(m.split(" ", 1)) for m in raw)
        return found

    def redue_queued_notifications(self) -> int:
        """Notifications whose delivery was queued (due again only once a lost message would
        be), made due now: after a store restart or a worker's death, their messages may be
        gone. One that is not due yet goes back to its time when its delivery starts."""
        now = self.now_ms()
        redued = 0
        for shard in self.shards:
            key = shard.keys.notify_due
            members = cast("list[str]", self.redis.zrangebyscore(
                key, f"({now}", now + self.config.lost_message_ms))
            if members:
                self.redis.zadd(key, dict.fromkeys(members, now), xx=True)
            redued += len(members)
        return redued

    def start_delivery(self, run_id: str, notification_id: str, *, deadline_ms: int,
                       max_attempts: int) -> tuple[str, Notification | None]:
        reply = self._run("start_delivery", run_id, notification_id=notification_id,
                          deadline_ms=deadline_ms, max_attempts=max_attempts, run_id=run_id)
        if reply[0] == "ok":
            return "ok", _notification(notification_id, reply[1])
        return str(reply[0]), None

    def finish_delivery(self, run_id: str, note: Notification, outcome: str, *,
                        error: str = "", retry_in_ms: int = 0, message: str = "") -> str:
        """Record a send's outcome: "sent", "retry" (in `retry_in_ms`) or "failed"; a sent
        one with where its `message` is (a Slack post's "<channel>/<ts>"), if given."""
        reply = self._run("finish_delivery", run_id, notification_id=note.id, outcome=outcome,
                          error=error[:2000], retry_ms=retry_in_ms, run_id=run_id,
                          attempts=note.attempts, message=message[:200])
        return str(reply[0])

    def retry_notifications(self, run_id: str, notification_ids: list[str] | None = None
                            ) -> tuple[list[str], list[str]]:
        """Failed notifications of a parked run (those named, or all) back to pending with
        their attempts reset, delivered now. Returns the ids retried, and those of them
        whose delivery the caller must queue (the broker elsewhere)."""
        retried, dispatch = self._run("retry_notifications", run_id,
                                      ids=notification_ids or [])
        return [str(x) for x in retried], [str(x) for x in dispatch]

    def notifications(self, run_id: str) -> list[Notification]:
        keys = self.keys_of(run_id)
        return _notifications(self._fields(keys, run_id, NOTE,
                                           self._scan(self.redis, keys, run_id, NOTE)))

    def notifications_of_parked(self, page: int = 500) -> Iterator[tuple[str, list[Notification]]]:
        """(run id, its notifications) of every parked run that has some, a page of the
        index at a time (one round trip a page, the same cost at any depth)."""
        cursor: str | None = None
        while True:
            scored, cursor = self.runs.page(Status.INTERRUPTED, page, cursor)
            located = self._located([run_id for run_id, _ in scored])
            pipe = self.redis.pipeline(transaction=False)
            for (run_id, _), keys in zip(scored, located, strict=True):
                self._scan(pipe, keys, run_id, NOTE)
            found = pipe.execute()
            for (run_id, _), keys, scanned in zip(scored, located, found, strict=True):
                notes = self._fields(keys, run_id, NOTE, scanned)
                if notes:
                    yield run_id, _notifications(notes)
            if cursor is None:
                return

    def notification(self, run_id: str, notification_id: str) -> Notification | None:
        raw = self._field(self.keys_of(run_id), run_id, NOTE, notification_id)
        return _notification(notification_id, raw) if raw else None

    def grant(self, ref: str) -> str | None:
        """The grant `ref` names, in the shard of `ref` itself: one read (refs are drawn
        to land in their run's shard, `Keys.fits_with`; a token names no run). While the
        store is between layouts, in the other one's too."""
        layout = self.layout
        found = cast("str | None", self.redis.get(layout.keys.shard_of(ref).grant(ref)))
        other = layout.legacy or layout.next
        if found is None and other is not None:
            found = cast("str | None", self.redis.get(other.shard_of(ref).grant(ref)))
        return found

    def first_sight(self, what: str, ttl_s: int) -> bool:
        """True the first time `what` is seen within `ttl_s` (a webhook-id, a mail)."""
        return bool(self.redis.set(self.keys.seen(what), "1", nx=True, ex=ttl_s))

    def tally(self, what: str, window_s: int) -> int:
        """How often `what` was seen in the window that began at its first sight, this one
        included: a rate limit's count, one round trip."""
        key = self.keys.seen(what)
        pipe = self.redis.pipeline(transaction=True)
        pipe.incr(key)
        pipe.expire(key, window_s, nx=True)
        count, _ = pipe.execute()
        return int(count)

    def forget_sight(self, what: str) -> None:
        self.redis.delete(self.keys.seen(what))

    def has_seen(self, what: str) -> bool:
        """Whether `what` was seen (by `first_sight`) and not yet forgotten."""
        return bool(self.redis.exists(self.keys.seen(what)))

    def note_since(self, what: str, ttl_s: int) -> int:
        """Note that `what` holds from now on (the server's clock, ms), for `ttl_s`: a
        reviewer's sessions ended early. Returns when."""
        now = self.now_ms()
        self.redis.set(self.keys.seen(what), str(now), ex=max(1, ttl_s))
        return now

    def noted_since(self, what: str) -> int | None:
        """Since when `what` holds (`note_since`), or None."""
        found = cast("str | None", self.redis.get(self.keys.seen(what)))
        return int(found) if found and found.isdigit() else None

    # -- outbox --------------------------------------------------------------------------

    def claim_outbox(self, limit: int = 100, retry_ms: int = 10_000) -> list[OutboxEntry]:
        """Outbox entries due to be published, each claimed for `retry_ms`: at most `limit`
        a shard (one script each)."""
        found: list[OutboxEntry] = []
        for shard in self.shards:
            raw = self._call("claim_outbox", [shard.keys.outbox, shard.keys.outbox_entries],
                             limit=limit, retry_ms=retry_ms)
            found.extend(results.entries_of(raw))
        return found

    def _by_shard(self, entries: Sequence[tuple[str, str]]) -> dict[ShardKeys, list[str]]:
        """Outbox entry ids, given as (run id, entry id), by the shard that holds them (the
        run's: an entry's id does not always name its run, a delivery's is the
        notification's); while the store moves to the sharded layout, every one may still
        be in the legacy shard too (its run not moved yet)."""
        layout = self.layout
        found: dict[ShardKeys, list[str]] = {}
        for run_id, entry_id in entries:
            found.setdefault(layout.keys.shard_of(run_id), []).append(entry_id)
        if layout.legacy is not None and entries:
            found[layout.legacy.legacy] = [entry_id for _, entry_id in entries]
        return found

    def hold_outbox(self, entries: Sequence[tuple[str, str]]) -> None:
        """Entries published, as (run id, entry id), whose task acks them itself once
        done: due again only if the message was lost (LAYBY_LOST_MESSAGE_S), not after the
        grace time, so that one still queued is not published again."""
        if entries:
            due = self.now_ms() + self.config.lost_message_ms
            for shard, ids in self._by_shard(entries).items():
                self.redis.zadd(shard.outbox, dict.fromkeys(ids, due), xx=True)

    def ack_outbox(self, entries: Sequence[tuple[str, str]]) -> None:
        """Forget published entries, given as (run id, entry id)."""
        for shard, ids in self._by_shard(entries).items():
            self._call("ack_outbox", [shard.outbox, shard.outbox_entries], ids=ids)

    def overdue_outbox(self, older_than_ms: int = 0, limit: int = 200
                       ) -> list[tuple[str, int]]:
        """(entry id, ms overdue) of outbox entries due to be published more than
        `older_than_ms` ago, most overdue first. A read: nothing is claimed."""
        now = self.now_ms()
        found = due_in([shard.outbox for shard in self.shards], now - older_than_ms, limit)
        return [(entry_id, now - score) for entry_id, score in found]

    def now_ms(self) -> int:
        return now_ms(self.redis)

    # -- reads -----------------------------------------------------------------------------

    def answerable(self, run_id: str) -> tuple[RunRecord | None, list[Interrupt],
                                               dict[str, Answer], set[str]]:
        """What an answer is checked against, in one round trip: the run, its interrupts,
        their answers and which are open. (The answer's script checks again what can have
        changed since: no transaction needed here.)"""
        keys = self.keys_of(run_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(keys.run(run_id), "agent", "status", "version", "metadata", "open",
                   "tenant", "by")
        self._scan(pipe, keys, run_id, INTERRUPT)
        pipe.hgetall(keys.answers(run_id))
        raw, specs, answers = pipe.execute()
        record = None if raw[0] is None else RunRecord(
            run_id, raw[0], Status(raw[1]), int(raw[2]), [], codecs.metadata(raw[3]),
            tenant=raw[5] or DEFAULT_TENANT, started_by=raw[6])
        return (record, *_interrupts(self._fields(keys, run_id, INTERRUPT, specs), answers,
                                     _open(raw[4])))

    def interrupts(self, run_id: str) -> tuple[list[Interrupt], dict[str, Answer], set[str]]:
        keys = self.keys_of(run_id)

        def fill(pipe: Any) -> None:
            pipe.hget(keys.run(run_id), "open")
            self._scan(pipe, keys, run_id, INTERRUPT)
            pipe.hgetall(keys.answers(run_id))

        open_field, specs, answers = self._pipelined(fill, transaction=True)
        return _interrupts(self._fields(keys, run_id, INTERRUPT, specs), answers,
                           _open(open_field))

    # The run's interrupts and notifications are fields of its hash (`INTERRUPT`, `NOTE`),
    # beside its history: they are scanned for, not read with all of it.

    def _scan(self, client: Any, keys: Keys, run_id: str, prefix: str) -> Any:
        """The first HSCAN of the run's `prefix` fields (queued, on a pipeline)."""
        return client.hscan(keys.run(run_id), 0, match=prefix + "*", count=SCAN_COUNT)

    def _fields(self, keys: Keys, run_id: str, prefix: str,
                scanned: tuple[int, dict[str, str]]) -> dict[str, str]:
        """Id → JSON of the run's `prefix` fields, from a first HSCAN reply on (a large hash
        can take more than one)."""
        cursor, found = int(scanned[0]), scanned[1]
        # A cluster's MULTI hands HSCAN's reply back raw: its fields and values in a list.
        fields = found if isinstance(found, dict) else dict(zip(found[::2], found[1::2],
                                                               strict=True))
        while cursor:
            cursor, more = cast("tuple[int, dict[str, str]]", self.redis.hscan(
                keys.run(run_id), cursor, match=prefix + "*", count=SCAN_COUNT))
            fields.update(more)
        return {name[len(prefix):]: value for name, value in fields.items()}

    def _field(self, keys: Keys, run_id: str, prefix: str, item_id: str) -> str | None:
        """One interrupt's or notification's JSON (None when the run has no such one)."""
        return cast("str | None", self.redis.hget(keys.run(run_id), prefix + item_id))

    def reviews(self, run_id: str) -> dict[str, Review]:
        """How people review each of the run's interrupts (only those under a policy, or
        handed on, have anything)."""
        return _reviews(cast("dict[str, str]", self.redis.hgetall(
            self.keys_of(run_id).review(run_id))))

    def interrupt(self, run_id: str, interrupt_id: str) -> Interrupt | None:
        raw = self._field(self.keys_of(run_id), run_id, INTERRUPT, interrupt_id)
        return codecs.interrupt(interrupt_id, raw) if raw else None

    def view(self, run_id: str) -> RunView | None:
        # One round trip, and one moment: the run, its interrupts and its notifications.
        keys = self.keys_of(run_id)
        return self._view_of(run_id, *self._pipelined(
            lambda pipe: self._read_view(pipe, keys, run_id), transaction=True))

    def views(self, run_ids: Sequence[str]) -> list[RunView]:
        """The runs of `run_ids` that still exist, in that order: one round trip (two while
        the store moves to the sharded layout), each run read at one moment."""
        if not run_ids:
            return []

        def fill(pipe: Any) -> None:
            for run_id, keys in zip(run_ids, self._located(run_ids), strict=True):
                self._read_view(pipe, keys, run_id)
        replies = self._pipelined(fill)
        found = (self._view_of(run_id, *replies[3 * at:3 * at + 3])
                 for at, run_id in enumerate(run_ids))
        return [view for view in found if view is not None]

    def open_interrupts(self, run_ids: Sequence[str]
                        ) -> list[tuple[str, str, list[InterruptView]]]:
        """(run id, agent, its open interrupts with their reviews) of each run of `run_ids`
        that waits: two round trips reading neither histories nor notifications, for
        lists over many runs (the reviewers' inbox)."""
        located = self._located(run_ids)
        pipe = self.redis.pipeline(transaction=False)
        for run_id, keys in zip(run_ids, located, strict=True):
            pipe.hmget(keys.run(run_id), "agent", "open")
        heads = [(run_id, keys, agent, sorted(_open(open_ids)))
                 for run_id, keys, (agent, open_ids)
                 in zip(run_ids, located, pipe.execute(), strict=True)
                 if agent is not None and open_ids]
        if not heads:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for run_id, keys, _, open_ids in heads:
            pipe.hmget(keys.run(run_id), *[INTERRUPT + i for i in open_ids])
            pipe.hgetall(keys.review(run_id))
        replies = pipe.execute()
        found = []
        for at, (run_id, _, agent, open_ids) in enumerate(heads):
            specs, review = replies[2 * at], _reviews(replies[2 * at + 1])
            found.append((run_id, agent, [
                InterruptView.of(codecs.interrupt(i, raw), None, True, review.get(i))
                for i, raw in zip(open_ids, specs, strict=True) if raw is not None]))
        return found

    def _read_view(self, pipe: Any, keys: Keys, run_id: str) -> None:
        pipe.hgetall(keys.run(run_id))
        pipe.hgetall(keys.answers(run_id))
        pipe.hgetall(keys.review(run_id))

    def _view_of(self, run_id: str, raw: dict[str, str], given: dict[str, str],
                 review: dict[str, str]) -> RunView | None:
        if not raw:
            return None
        specs, answers, open_ids = _interrupts(_prefixed(raw, INTERRUPT), given,
                                               _open(raw.get("open")))
        reviews = _reviews(review)
        messages = load_messages(json.loads(raw["messages"]))
        input = json.loads(raw["input"]) if "input" in raw else _first_text(messages)
        return RunView(
            id=run_id, agent=raw["agent"], status=Status(raw["status"]),
            version=int(raw["version"]), agent_version=raw.get("agent_version"),
            pinned=raw.get("pinned") == "1", input=input,
            messages=messages,
            interrupts=[InterruptView.of(s, answers.get(s.id), s.id in open_ids,
                                         reviews.get(s.id)) for s in specs],
            notifications=_notifications(_prefixed(raw, NOTE)),
            result=raw.get("result"), error=json.loads(raw["error"]) if raw.get("error") else None,
            metadata=codecs.metadata(raw.get("metadata")),
            retry=_retry(raw.get("retry")), tenant=raw.get("tenant", DEFAULT_TENANT),
            started_by=raw.get("by"), created_at=iso(raw["created_at"]),
            updated_at=iso(raw["updated_at"]))

    def list_runs(self, status: Status | None = None, *, limit: int = 50,
                  offset: int = 0) -> list[RunSummary]:
        """Newest first; all states when `status` is None."""
        return self.summaries(self.runs.newest(status, limit, offset))

    def list_page(self, status: Status | None = None, *, limit: int = 50,
                  cursor: str | None = None, offset: int = 0,
                  agent_version: str | None = None, tenant: str | None = None
                  ) -> tuple[list[RunSummary], str | None]:
        """A page of runs, newest first, `offset` runs after `cursor` (or after the top),
        and the next page's cursor (None at the end). Raises `BadCursor` for a cursor the
        store did not make. With `tenant`, that tenant's runs alone, read from its own
        indexes (None: every tenant's). With `agent_version`, only runs started on that
        version: see `pinning.page_of_version`."""
        runs = self.runs if tenant is None else self.runs_of(tenant)
        if agent_version is not None:
            return pinning.page_of_version(self, runs, status, limit, cursor, offset,
                                           agent_version)
        if offset and cursor is None:
            scored = runs.newest(status, limit + 1, offset)
            after = cursor_of(*scored[limit - 1]) if len(scored) > limit else None
            return self.summaries(scored[:limit]), after
        scored, after = runs.page(status, limit + offset, cursor)
        scored = scored[offset:]
        if after is not None and scored:
            after = cursor_of(*scored[-1])
        return self.summaries(scored), after

    def fields_of_runs(self, run_ids: Sequence[str], *fields: str) -> list[list[str | None]]:
        """The `fields` of each run's hash (Nones for a run that is gone), each read where
        the run is: one round trip (two while the store moves to the sharded layout)."""
        pipe = self.redis.pipeline(transaction=False)
        for run_id, keys in zip(run_ids, self._located(run_ids), strict=True):
            pipe.hmget(keys.run(run_id), *fields)
        return cast("list[list[str | None]]", pipe.execute()) if run_ids else []

    def summaries(self, scored: list[tuple[str, int]]) -> list[RunSummary]:
        """The runs of (run id, score)s as lists show them; runs gone past retention left
        out."""
        found = self.fields_of_runs([run_id for run_id, _ in scored], "agent", "status",
                                    "version", "created_at", "updated_at", "open",
                                    "agent_version", "retry", "tenant")
        out = []
        for (run_id, _), fields in zip(scored, found, strict=True):
            raw = cast("list[str]", fields)
            if raw[0] is not None:  # expired after retention; the sweeper prunes the index
                out.append(RunSummary(id=run_id, agent=raw[0], status=Status(raw[1]),
                                      version=int(raw[2]),
                                      open_interrupts=len(_open(raw[5])),
                                      created_at=iso(raw[3]), updated_at=iso(raw[4]),
                                      agent_version=raw[6], retry=_retry(raw[7]),
                                      tenant=raw[8] or DEFAULT_TENANT))
        return out

    def events(self, run_id: str, after: str = "0-0", *, block_ms: int | None = None,
               count: int = 500) -> list[Event]:
        return events.read(self.redis, self.keys_of(run_id).events(run_id), after,
                           block_ms=block_ms, count=count)

    def last_park(self, run_id: str, interrupt_ids: set[str] | None = None) -> Event | None:
        """The run's newest `run.interrupted` event (that parked on one of `interrupt_ids`)."""
        return events.last_park(self.redis, self.keys_of(run_id).events(run_id),
                                interrupt_ids)

    def lease_of(self, run_id: str) -> tuple[str | None, int | None]:
        """Who holds the run's claim, and until when (ms)."""
        owner, until = cast("list[str | None]", self.redis.hmget(
            self.keys_of(run_id).run(run_id), "lease_owner", "lease_until"))
        # Most commits leave them empty ('' and 0: one call fewer); a park and the end of a
        # run delete them.
        return owner or None, int(until) if until and until != "0" else None

    def whose(self, run_id: str) -> Ownership:
        """Whose the run is (`Ownership`): one read, for the checks of who may see and act
        on it."""
        tenant, by, status, after = cast("list[str | None]", self.redis.hmget(
            self.keys_of(run_id).run(run_id), "tenant", "by", "status", "tokens_after"))
        if status is None:
            return Ownership(False)
        return Ownership(True, tenant or DEFAULT_TENANT, by, Status(status),
                         int(after) if after else None)

    def record_audit(self, entries: Sequence[str], *, of: str) -> None:
        """Keep audit entries that change no run (a refusal, a run token minted) in the
        audit trail of the shard of `of` (a run's id, or a caller's), in the sharded layout
        (a store still moving from 0.2.0's keeps none)."""
        keys = self.keys
        if entries and keys.shard_count is not None:
            self._call("record_audit", [keys.shard_of(of).audit],
                       keep_ms=self.config.audit_keep_ms, entries=list(entries))

    def audit_page(self, *, run: str | None = None,
                   keep: Callable[[dict[str, Any]], bool] = lambda _: True,
                   since_ms: int | None = None, cursor: str | None = None, limit: int = 100
                   ) -> tuple[list[dict[str, Any]], str | None]:
        """A page of the audit trail, newest first (`parking.audit.page`): a run's alone
        (its shard's), or every shard's, with the entries `keep` takes."""
        shards = self.keys.shards
        only = self.keys.shard_number(run) if run is not None else None
        return audit.page(self.redis, shards, only=only, since_ms=since_ms, cursor=cursor,
                          limit=limit, keep=(lambda e: e.get("run") == run and keep(e))
                          if run is not None else keep)

    def revoke_tokens(self, run_id: str, by: str, audit: Sequence[str] = ()) -> int | None:
        """Refuse the run's run tokens minted until now; when that is (ms), or None for a
        run that is not there."""
        reply = self._run("revoke_tokens", run_id, by=by, audit=list(audit))
        return int(reply[1]) if reply[0] == "ok" else None

    def status_of(self, run_id: str) -> tuple[Status | None, int | None]:
        """The run's status and when it last changed (ms)."""
        status, updated = cast("list[str | None]", self.redis.hmget(
            self.keys_of(run_id).run(run_id), "status", "updated_at"))
        return Status(status) if status else None, int(updated) if updated else None

    # -- the registries, as the sweeper and on-call read them -------------------------------

    def due_deadlines(self, limit: int = 200) -> list[tuple[str, str]]:
        """(run id, interrupt id) of interrupts past their deadline, the longest past first."""
        pairs = []
        for member, _ in due_in([shard.deadlines for shard in self.shards], self.now_ms(),
                                limit):
            run_id, _, interrupt_id = member.rpartition(" ")
            pairs.append((run_id, interrupt_id))
        return pairs

    def soonest_deadlines(self, limit: int = 1000) -> list[str]:
        """The runs whose interrupts expire soonest (past or not), the soonest first, each
        once: one round trip."""
        found = due_in([shard.deadlines for shard in self.shards], float("inf"), limit)
        return list(dict.fromkeys(member.rpartition(" ")[0] for member, _ in found))

    def due_retries(self, limit: int = 200) -> list[str]:
        """Retrying runs whose next try is due, the longest due first."""
        return [run_id for run_id, _ in due_in([shard.retries for shard in self.shards],
                                               self.now_ms(), limit)]

    def lapsed_leases(self, limit: int = 200) -> list[str]:
        """Running runs whose claim lapsed, the longest lapsed first."""
        return [run_id for run_id, _ in due_in([shard.leases for shard in self.shards],
                                               self.now_ms(), limit)]

    def waiting_too_long(self, older_than_ms: int, limit: int = 200) -> list[str]:
        """Runs queued or resuming since before `older_than_ms` ago whose message is no
        longer in its queue: lost (a task that failed before its claim, a message purged).
        One whose message waits behind others is left to wait, however long the queue
        (`gone_from_queue`): a burst of 100,000 starts takes longer to drain than
        LAYBY_LOST_MESSAGE_S, and copies of its messages (45,000 once) slowed the parks
        behind them 30 times. The oldest first, a page at a time, until a page finds none:
        the oldest of a queue are the first its consumers reach. Messages a restart, a
        failover or a worker's death may have lost are requeued by their own checks."""
        return self._gone_oldest_first(self.now_ms() - older_than_ms, 0, limit)

    def maybe_reserved(self, limit: int = 1000) -> list[str]:
        """Waiting runs whose message a worker may have taken from its queue and not yet
        claimed (within RESERVED_HEADROOM numbers of the last claim, `gone_from_queue`),
        or lost: after a worker's death, what it may have held. The others wait in their
        queue, and a copy would only lengthen it."""
        return self._gone_oldest_first(self.now_ms(), RESERVED_HEADROOM, limit)

    def _gone_oldest_first(self, cutoff_ms: int, headroom: int, limit: int) -> list[str]:
        found: list[str] = []
        seen: set[str] = set()
        for _ in range(LOST_SCAN_PAGES):
            page = [r for r in self.runs.waiting_since_before(
                (Status.QUEUED, Status.RESUMING), cutoff_ms, LOST_SCAN_PAGE + len(seen))
                if r not in seen]
            if not page:
                break
            seen.update(page)
            gone = self.gone_from_queue(page, headroom)
            found.extend(gone)
            if not gone or len(found) >= limit:
                break
        return found[:limit]

    def gone_from_queue(self, run_ids: list[str], headroom: int = 0) -> list[str]:
        """Of the waiting `run_ids`, those whose task message is no longer in its queue.
        Each step's message took a number in its queue (the run's `sent`, lua/_prelude.lua)
        and each claim notes the highest it took (`queues`): a queue is taken in order, so
        a number a claim passed has left it, and so has every message of an empty queue
        (`queue_length`). With `headroom`, also those within that many numbers of the last
        taken: what a dead worker may have reserved and not yet claimed. A run queued by a
        layby before 0.3.0 has no number: it is gone once it is older than the oldest
        message of the turns queue (or when that is not known), as that layby did."""
        if not run_ids:
            return []
        # A queue's numbers are counted in each shard (`queues`): a run's against its own
        # (while the store moves, one still in the legacy layout against the legacy's).
        located = self._located(run_ids)
        shard_queues = [keys.shard_of(run_id).queues
                        for run_id, keys in zip(run_ids, located, strict=True)]
        wanted = list(dict.fromkeys(shard_queues))
        pipe = self.redis.pipeline(transaction=False)
        for key in wanted:
            pipe.hgetall(key)
        for run_id, keys in zip(run_ids, located, strict=True):
            pipe.hmget(keys.run(run_id), "sent", "updated_at")
        replies = pipe.execute()
        of_shard = dict(zip(wanted, replies[:len(wanted)], strict=True))
        fields = replies[len(wanted):]
        lengths: dict[str, int | None] = {}

        def empty(queue: str) -> bool:
            if queue not in lengths:
                lengths[queue] = self.queue_length(queue)
            return lengths[queue] == 0

        gone, unnumbered = [], []
        for run_id, key, (sent, updated_at) in zip(run_ids, shard_queues, fields, strict=True):
            progress = of_shard[key]
            queue, _, number = (sent or "").partition(" ")
            if not number.isdigit():
                unnumbered.append((run_id, updated_at))
            elif int(number) <= int(progress.get(f"{queue}:taken", 0)) + headroom or empty(queue):
                gone.append(run_id)
        if unnumbered:
            oldest = self.oldest_queued_ms()
            pushed = (self.config.messages or {}).get("turn")
            gone.extend(pinning.not_behind_pinned(self, pushed[0] if pushed else None, [
                run_id for run_id, updated_at in unnumbered
                if headroom or oldest is None or updated_at is None or int(updated_at) < oldest]))
        return gone

    def queue_length(self, queue: str) -> int | None:
        """How many messages wait in `queue` on the broker, or None when that is not known
        (`length_of_queue`, which the process's runtime sets, asks the broker; without it,
        only a broker that is this server is asked)."""
        if self.length_of_queue is not None:
            return self.length_of_queue(queue)
        pushed = (self.config.messages or {}).get("turn")
        if not pushed:
            return None
        prefix = pushed[0][:len(pushed[0]) - len(self.tasks.turn_queue)]
        return int(self.redis.llen(prefix + queue))

    def oldest_queued_ms(self) -> int | None:
        """When the oldest message still on the turns queue (the next to be taken) was
        pushed, if a transition script pushed it (its delivery tag ends with the moment);
        None when the queue is empty, the broker is another server, or the message does
        not say (one kombu published)."""
        pushed = (self.config.messages or {}).get("turn")
        if not pushed:
            return None
        # kombu's Redis transport LPUSHes and takes from the right: the oldest is the last
        # (and a message kombu restores is RPUSHed there, to be taken next).
        raw = self.redis.lindex(pushed[0], -1)
        if raw is None:
            return None
        try:  # the tag `push` in _queue.lua writes: "<task id>:<ms pushed>"
            tag = json.loads(raw)["properties"]["delivery_tag"]
            moment = str(tag).rsplit(":", 1)[1]
        except (ValueError, KeyError, TypeError, IndexError):
            return None
        return int(moment) if moment.isdigit() else None

    def beat_worker(self, name: str, about: str,
                    hosting: Sequence[str] | None = None) -> None:
        """A process is alive (a worker's reserved messages are its own for one lease),
        and says what it is (`about`: "<kind> <newest format> <release>"); the format the
        store writes now comes back, and is the one this store writes from now on.
        `hosting`: the agent versions a worker runs pinned runs of (`<agent>@<version>`),
        told again at each beat, for `layby doctor`. The layout comes back too. While the
        store moves to the sharded layout, whose registry is named otherwise, the process
        takes itself out of the legacy one's."""
        layout = self.layout
        keys, legacy = layout.keys, layout.legacy

        def fill(pipe: Any) -> None:
            self._call("beat_worker", [keys.workers, keys.workers_about, keys.format],
                       client=pipe, worker=name, lease_ms=self.config.lease_ms, about=about)
            if hosting is not None:
                pipe.hset(keys.hosting, name, _dumps(sorted(hosting)))
            if legacy is not None:
                pipe.zrem(legacy.workers, name)
                pipe.hdel(legacy.workers_about, name)
                pipe.hdel(legacy.hosting, name)

        began = time.monotonic()
        reply = self._pipelined(fill, "beat_worker")[0]
        self._learn(formats.parsed([r or None for r in reply[4:9]]), int(reply[3]), began)

    def reap_workers(self) -> list[tuple[str, int, str]]:
        """Processes whose beat lapsed, once each, with their last beat (epoch ms) and what
        they said they were."""
        reaped = []
        for keys in self._registries():
            raw = self._call("reap_workers", [keys.workers, keys.workers_about],
                             lease_ms=self.config.lease_ms)
            found = [(_text(raw[i]), int(_text(raw[i + 1])), _text(raw[i + 2]))
                     for i in range(0, len(raw), 3)]
            if found:
                self.redis.hdel(keys.hosting, *(name for name, _, _ in found))
            reaped += found
        return reaped

    def _registries(self) -> list[Keys]:
        """The layouts whose registry of processes is read: the store's, and the legacy
        one's while the store moves to the sharded layout (those that died before)."""
        layout = self.layout
        return [layout.keys] + ([layout.legacy] if layout.legacy is not None else [])

    def forget_worker(self, name: str) -> None:
        """A process that stopped cleanly (a worker's reserved messages went back to the
        queue)."""
        for keys in self._registries():
            pipe = self.redis.pipeline(transaction=True)
            pipe.zrem(keys.workers, name)
            pipe.hdel(keys.workers_about, name)
            pipe.hdel(keys.hosting, name)
            pipe.execute()

    def live_processes(self) -> dict[str, str]:
        """Every process whose beat has not lapsed, and what it said it is."""
        found: dict[str, str] = {}
        now = self.now_ms()
        for keys in self._registries():
            names = cast("list[str]", self.redis.zrangebyscore(keys.workers, f"({now}",
                                                               "+inf"))
            about = cast("list[str | None]", self.redis.hmget(keys.workers_about, names)) \
                if names else []
            found.update({name: told or "" for name, told in zip(names, about, strict=True)
                          if name not in found})
        return found

    def switch_format(self, to: int, *, force: bool = False,
                      shards: int | None = None) -> list[str]:
        """Start writing format `to` (`switch_format.lua`); the reply's verdict, then the
        older processes still alive (name, about, …) when that is why it did not. A store
        in the legacy layout is given `shards` (the sharded layout's count, for format 2 on),
        and its layout instant."""
        keys = self.keys
        delay_ms = int((formats.FRESH_S + formats.LAYOUT_MARGIN_S) * 1000)
        reply = self._call("switch_format", [keys.workers, keys.workers_about, keys.format],
                           to=to, force=force,
                           shards=shards if shards is not None and to >= formats.SHARDED
                           else "", layout_after_ms=delay_ms)
        if reply[0] == "switched":
            self._read_format()
        return [_text(r) for r in reply]

    def server_id(self) -> str:
        """The Redis server's run id: a new one after a restart or a failover, when the
        server may have lost the last writes before it (a task message among them). On a
        cluster, its primaries' run ids, sorted: another after any one's failover."""
        if on_cluster(self.redis):
            found = cast("RedisCluster", self.redis).info(
                "server", target_nodes=RedisCluster.PRIMARIES)
            return ",".join(sorted(str(info.get("run_id", "")) for info in found.values()))
        return str(self.redis.info("server").get("run_id", ""))

    def noted_server(self, *, broker: bool = False) -> str | None:
        """The server id last noted in the data (`note_server`): kept with the data, so a
        restart or a failover shows as another id, even to a process that never saw the
        server before it. With `broker`, the broker's server (when it is another Redis)."""
        key = self.keys.broker_server if broker else self.keys.server
        return cast("str | None", self.redis.get(key))

    def note_server(self, server: str | None = None, *, first: bool = False,
                    broker: bool = False) -> None:
        """Note this server's id in the data (with `first`, only where none is); with
        `broker`, `server` is the broker's."""
        key = self.keys.broker_server if broker else self.keys.server
        self.redis.set(key, server or self.server_id(), nx=first)

    def note_sweep(self) -> None:
        """Note that a sweep just finished (the sweeper's liveness, by the server's clock)."""
        self.redis.set(self.keys.swept, self.now_ms())

    def last_sweep_ms(self) -> int | None:
        """When the sweeper last finished a sweep (server time, ms), or None: never."""
        raw = self.redis.get(self.keys.swept)
        return int(raw) if raw else None

    def waiting(self, before_ms: int, limit: int = 200) -> list[str]:
        """Every run queued or resuming since before `before_ms`, a page at a time: a
        requeued run leaves the scan, its place in the index refreshed past it."""
        return self.runs.waiting_since_before((Status.QUEUED, Status.RESUMING), before_ms,
                                              limit)

    def retention_cutoff_ms(self) -> int:
        """Finished runs that ended before this are past retention."""
        return self.now_ms() - self.config.retention_s * 1000

    def fold_parked(self, limit: int = 5000) -> int:
        """Fold the events of runs parked `fold_after_ms` ago or more into their hashes
        (lua/fold_events.lua), in the order they parked, each shard's from where its last
        pass stopped (its `fold:cursor`), at most `limit` a shard; returns how many were
        folded. A run parked again later comes round again: its place in the index is its
        last park."""
        cutoff = self.now_ms() - self.config.fold_after_ms
        tenants = self.tenants()
        return sum(self._fold_shard(family, runs, cutoff, limit)
                   for shard, runs in self.layout.scanned
                   for family in registries.families([shard], tenants))

    def _fold_shard(self, shard: ShardKeys, runs: Keys, cutoff: int, limit: int) -> int:
        """Fold the runs `shard` indexes (a shard's own, or a tenant's in it: each has its
        cursor), their keys those of layout `runs` (the legacy
        shard's, while the store moves, folded where they are: one moved meanwhile is
        found not parked there, and comes round at its next park)."""
        start = cast("str | None", self.redis.get(shard.fold_cursor)) or "-inf"
        found = cast("list[tuple[str, float]]", self.redis.zrangebyscore(
            shard.index(Status.INTERRUPTED), start, cutoff, start=0, num=limit,
            withscores=True))
        if not found:
            return 0
        folded = 0
        for at in range(0, len(found), 200):
            def fill(pipe: Any, page: list[tuple[str, float]] = found[at:at + 200]) -> None:
                for run_id, _ in page:
                    self._call("fold_events", [runs.run(run_id), runs.events(run_id)],
                               client=pipe, keep=self.config.events_max)

            folded += sum(reply == "folded"
                          for reply in self._pipelined(fill, "fold_events"))
        # The next pass starts at this page's last time again (runs parked in the same ms
        # may be past the page; folding twice finds nothing), or past it when the whole
        # page was that one ms.
        last = int(found[-1][1])
        self.redis.set(shard.fold_cursor,
                       last + 1 if len(found) == limit and int(found[0][1]) == last else last)
        return folded

    def prune_finished(self) -> int:
        """Drop index entries of finished runs whose keys have expired."""
        return self.runs.prune_finished_before(self.retention_cutoff_ms())


def _event(event: dict[str, Any]) -> tuple[str, str]:
    """A step's event (its data as readers get it) as the scripts take it: its data, and
    its `messages` (the step's, JSON; '' without) apart, for the stream entry holds them in
    a field of their own (parking.events puts them back)."""
    data = dict(event)
    added = data.pop("messages", None)
    return _dumps(data), "" if added is None else _dumps(added)


def _first_text(messages: list[Message]) -> str | None:
    """The text of a history's first message when it is a user's text alone (as a run
    started from an input string begins), else None."""
    if not messages or messages[0].role != "user" or len(messages[0].content) != 1:
        return None
    part = messages[0].content[0]
    return part.text if part.text is not None and part.wire() == {"text": part.text} else None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _stored(note: Notification) -> dict[str, Any]:
    """A notification as stored: its wire form (no nulls: Lua reads them as truthy values)
    and its token, which the wire form leaves out; level 0 (the first reviewers asked, most
    notifications) is left out too, as Lua and the reader take a missing level for it."""
    stored = {**note.wire(), "token": note.token}
    if not stored.get("level"):
        stored.pop("level", None)
    return stored


# The fields of a run's hash that hold its interrupts and its notifications
# (lua/_prelude.lua), and how many a scan for them asks for at once.
INTERRUPT, NOTE = "i:", "n:"
SCAN_COUNT = 1000


def _prefixed(run: dict[str, str], prefix: str) -> dict[str, str]:
    """Id → JSON of the `prefix` fields of a run's hash as read whole."""
    return {k[len(prefix):]: v for k, v in run.items() if k.startswith(prefix)}


def _retry(field: str | None) -> RetryWait | None:
    """What a run's step waits for to try failed tool calls again (its `retry` field)."""
    return RetryWait.model_validate_json(field) if field else None


def _open(field: str | None) -> set[str]:
    """The run's open interrupts, from its `open` field (ids, space-separated)."""
    return set((field or "").split())


def _interrupts(specs: dict[str, str], answers: dict[str, str], open_ids: set[str]
                ) -> tuple[list[Interrupt], dict[str, Answer], set[str]]:
    found = sorted((codecs.interrupt(k, v) for k, v in specs.items()),
                   key=lambda i: (i.created_at or "", i.id))
    return (found, {k: Answer.model_validate_json(v) for k, v in answers.items()},
            set(open_ids))


def _reviews(raw: dict[str, str]) -> dict[str, Review]:
    """The review hash (parking.keys) read per interrupt, each list in time order."""
    found: dict[str, Review] = {}
    for name, value in raw.items():
        kind, _, rest = name.partition(":")
        interrupt_id, _, tail = rest.partition(":")
        review = found.setdefault(interrupt_id, Review())
        if kind == "approval":
            review.approvals.append(Answer.model_validate_json(value))
        elif kind == "delegated":
            review.delegations.append(Delegation.model_validate_json(value))
        elif kind == "escalated":
            review.escalations.append(Escalated(level=int(tail), at=iso(value)))
    for review in found.values():
        review.approvals.sort(key=lambda a: a.answered_at)
        review.delegations.sort(key=lambda d: d.at)
        review.escalations.sort(key=lambda e: e.level)
    return found


def _notifications(raw: dict[str, str]) -> list[Notification]:
    """Notification id → the record as stored, as `Notification`s in the order they were
    planned."""
    return sorted((_notification(k, v) for k, v in raw.items()),
                  key=lambda n: (n.created_at or "", n.interrupt_id, n.reviewer, n.channel,
                                 n.kind))


def _notification(notification_id: str, raw: str) -> Notification:
    data = codecs.note(notification_id, raw)
    due = data.pop("due", None)  # the record's own schedule, shown while one is pending
    if due is not None and data.get("state") in ("pending", "retrying"):
        data["nextAttemptAt"] = iso(due)
    for field_name in ("createdAt", "sentAt"):
        if isinstance(data.get(field_name), int):
            data[field_name] = iso(data[field_name])
    return Notification.model_validate(data)
