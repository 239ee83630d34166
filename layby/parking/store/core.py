"""The store's core: its server, where the runs are (its layout), and how a script or a
pipeline runs on them. The parts by concern (`store.runs`, `store.answers`, …) are written
on it.

Each transition returns a small result. When the broker is the store's server (the
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
of many runs at once read each where it is (`located`); before its layout instant, a
transition that does not find its run looks in the sharded layout too (`Layout.next`).
"""

from __future__ import annotations

import string
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from redis import Redis, RedisCluster, RedisError
from redis.exceptions import AskError, MovedError, NoScriptError, TryAgainError

from layby.ids import first_fitting
from layby.parking import (
    formats,
    registries,
    scripts,
)
from layby.parking.formats import Layout
from layby.parking.keys import DEFAULT_TENANT, Keys
from layby.parking.registries import RunIndex, Shard, now_ms
from layby.parking.scripts import QueuedTask, ScriptSettings

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


def generated_run_id(fits: Callable[[str], bool] | None = None) -> str:
    """A fresh run id, `run_` and RUN_ID_CHARS random letters and digits; with `fits`, the
    first fresh one it accepts. Every id is as likely as any other."""
    return first_fitting(RUN_ID_ALPHABET, RUN_ID_CHARS, fits, prefix="run_")


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
    # The update of a run's Slack messages after answers, a hand-over or a cancel (an
    # outbox entry of the transition, never pushed); '': none queued.
    slack_task: str = ""

    def queued(self, messages: Mapping[str, tuple[str, str]] | None) -> dict[str, QueuedTask]:
        """The tasks as the scripts queue them, by kind; `messages` (kind → queue key,
        message template) when the broker is the store's server."""
        named = {"turn": (self.turn_task, self.turn_queue),
                 "resume": (self.resume_task, self.turn_queue),
                 "notify": (self.notify_task, self.notify_queue),
                 "deliver": (self.deliver_task, self.notify_queue)}
        if self.slack_task:
            named["slack"] = (self.slack_task, self.notify_queue)
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


# How old a process's idea of which tenants have runs in which shard may be (`tenants`): a
# new tenant's first runs reach the scans of every run this late at most.
TENANTS_FRESH_S = 5.0

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
# instant is a round trip ahead (`run_script`).
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


def _found_nothing(reply: list[Any]) -> bool:
    """Whether a run script's reply says it found no run, or nothing of it, to act on."""
    if not reply:
        return False
    return (reply[0] in NOT_FOUND or reply[:2] == ["done", "gone"]
            or reply == [[], []])


class Core:
    """What the store's parts share: its server and config, where the runs are (the layout,
    read again from the format key), and how a script or a pipeline runs on them (moved
    first, WAITed for replicas, retried through a cluster's slot moves)."""

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
        self._version: int | None = None
        self._scripts = scripts.register(client, ScriptSettings(
            events_max=config.events_max, outbox_grace_ms=config.outbox_grace_ms,
            lost_message_ms=config.lost_message_ms,
            tasks=config.tasks.queued(config.messages), audit_keep_ms=config.audit_keep_ms))

    @property
    def layout(self) -> Layout:
        """The store's layout (`parking.formats.Layout`), its format key read again when
        this process's view of it is older than `formats.FRESH_S`, or its layout instant
        came: a switch reaches every process within that, pool children too (a beat brings
        it sooner)."""
        if self._layout_stale():
            self.read_format()
        return self._layout

    def _layout_stale(self) -> bool:
        now = time.monotonic()
        return now - self._layout_at > formats.FRESH_S or now >= self._layout_until

    def read_format(self) -> None:
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
        self.learn(formats.parsed(cast("list[str | None]", raw)), now, began)

    def learn(self, state: formats.FormatState, now_ms: int, began: float) -> None:
        """Take the store's format as read at `began` (monotonic), when the server's clock
        said `now_ms`."""
        self._layout_at = began
        if state.written is not None:
            self._writing = state.written
        self._version = state.version
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
    def all_runs(self) -> RunIndex:
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

    def forget_tenants(self) -> None:
        """Read the tenants again at the next scan of every run (a new tenant's run was
        made)."""
        self._tenants_read = float("-inf")

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

    def settled_keys(self) -> Keys | None:
        """What `keys_of` gives every run, when this process knows it without a round trip
        (its view of the layout is fresh, and the store is not between layouts); else None.
        For an event loop, which would hand `keys_of` to a thread (70 µs of CPU here)."""
        layout = self._layout
        if self._layout_stale() or layout.legacy is not None or layout.next is not None:
            return None
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
                self.queue(pipe, "move_run", [*legacy.for_scripts(run_id),
                                              *layout.keys.for_scripts(run_id)], [])

        for run_id, reply in zip(todo, self.pipelined(fill, "move_run"), strict=True):
            if reply[0] != "missing":  # (one made later by a late process may be legacy)
                if len(self._moved) >= MOVED_KEPT:
                    self._moved.clear()
                self._moved.add(run_id)

    def located(self, run_ids: Sequence[str]) -> list[Keys]:
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

    @property
    def version(self) -> int | None:
        """The format every record is in (migrations brought them up to it; None: a store
        without a version yet), read again with its layout."""
        self.layout  # noqa: B018  (read again when it is time)
        return self._version

    def script_names(self) -> dict[str, str]:
        """Each script's SHA1 (as EVALSHA names it) and its name: for MONITOR's readers."""
        return {script.sha: name for name, script in self._scripts.items()}

    def run_script(self, name: str, run_id: str, /, *, extra_keys: ExtraKeys = (),
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
            self.queue(pipe, name, keys, args)
            pipe.wait(wanted, self.config.replica_ack_timeout_ms)

        reply: list[Any]
        acked: int
        reply, acked = self.pipelined(fill, name, on_node_of=keys[0])
        if acked < wanted and reply and reply[0] in WROTE:
            raise NotReplicated(
                f"{name} for run {run_id} is written on the primary, but {acked} of the "
                f"{wanted} replica(s) asked for confirmed it within "
                f"{self.config.replica_ack_timeout_ms} ms (LAYBY_REDIS_MIN_REPLICAS_ACK): a "
                "failover now could lose it; check the replicas (`layby doctor`)")
        return reply

    def call(self, name: str, keys: list[str], /, *, client: Any = None, **named: Any) -> Any:
        """Run script `name`, one of global keys (or of a run's hash and events alone), on
        `keys`, given `named` (`scripts.argv`); queued on pipeline `client` when given (run
        by `_pipelined`)."""
        if client is not None:
            return self.queue(client, name, keys, scripts.argv(named))
        return self._scripts[name](keys=keys, args=scripts.argv(named))

    def queue(self, pipe: Any, name: str, keys: Sequence[str], args: Sequence[Any]) -> None:
        """Queue script `name` on `pipe` by its SHA1 alone. (redis-py's Script objects ask
        the server whether it has them before every pipeline, and a cluster's pipelines
        refuse them: `_pipelined` loads a script the server lacks, and sends again.)"""
        pipe.execute_command("EVALSHA", self._scripts[name].sha, len(keys), *keys, *args)

    def pipelined(self, fill: Callable[[Any], None], *names: str,
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

    def now_ms(self) -> int:
        return now_ms(self.redis)

    def fields_of_runs(self, run_ids: Sequence[str], *fields: str) -> list[list[str | None]]:
        """The `fields` of each run's hash (Nones for a run that is gone), each read where
        the run is: one round trip (two while the store moves to the sharded layout)."""
        pipe = self.redis.pipeline(transaction=False)
        for run_id, keys in zip(run_ids, self.located(run_ids), strict=True):
            pipe.hmget(keys.run(run_id), *fields)
        return cast("list[list[str | None]]", pipe.execute()) if run_ids else []


class Part:
    """One concern's share of the store: its reads and transitions, on the store's `Core`."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.redis = core.redis
        self.config = core.config
