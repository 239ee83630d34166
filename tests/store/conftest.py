"""The store's own tests: every Lua transition script run directly against one real Valkey
server (embedded, started once for this folder), no worker, no gateway.

Each test has a key prefix of its own (`Keys(prefix)`), and with it a store whose scripts
queue what follows a transition in the outbox (the broker elsewhere) and, from
`World.store_with(pushing=True)`, one whose scripts push Celery's own messages onto queues
of the test's own (the broker on the store's server: `layby.broker_config.messages`).

Time is the server's clock (`TIME` in the scripts): a test never waits for it. A lease
lapses because it was taken for a negative length, a deadline or a send is due because it
was set in the past, an entry waits because it was set far ahead."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import redis
from celery import Celery

from layby.broker_config.celery_app import make_celery
from layby.broker_config.messages import templates
from layby.broker_config.settings import Settings
from layby.control.runtime import TASK_NAMES
from layby.generation.interrupts import Interrupt, ResumeMode
from layby.generation.messages import Message, text_message
from layby.ops.embedded import EmbeddedRedis
from layby.parking import Announcements, Keys, Store, StoreConfig
from layby.parking.clock import iso
from layby.parking.keys import ShardKeys
from layby.parking.registries import RunIndex
from layby.wire import Answer, Delegation, InterruptState, Notification, Status

OWNER = "worker-1"
MESSAGES = [text_message("user", "hi")]


@pytest.fixture(scope="session")
def store_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path_factory.mktemp("valkey-store")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def store_client(store_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis(host=store_server.host, port=store_server.port, db=0,
                         decode_responses=True)
    yield client
    client.close()


@pytest.fixture(scope="session")
def celery_app(store_server: EmbeddedRedis) -> Celery:
    """layby's Celery app, for the messages the scripts push (none is sent through it)."""
    return make_celery(Settings(redis_url=store_server.url))


_prefixes = itertools.count()


@pytest.fixture
def world(store_client: redis.Redis, celery_app: Celery) -> World:
    return World(store_client, f"st{next(_prefixes)}", celery_app)


@pytest.fixture
def sharded(store_client: redis.Redis, celery_app: Celery) -> World:
    """A store in the sharded layout (3 shards), on the shared server."""
    return World(store_client, f"st{next(_prefixes)}", celery_app, shards=3)


# -- what the scripts are given ---------------------------------------------------------


def interrupt(iid: str, *, expires_ms: int | None = None, reason: str = "input_required",
              reviewers: list[str] | None = None) -> Interrupt:
    return Interrupt(id=iid, reason=reason, message=f"question {iid}", tool_call_id=f"call_{iid}",
                     tool_name="ask", mode=ResumeMode.RESPOND, reviewers=reviewers,
                     expires_at=iso(expires_ms) if expires_ms is not None else None)


def answer(iid: str, *, status: str = "resolved", payload: Any = "yes", by: str = "alice",
           channel: str = "api", state: InterruptState | None = None) -> Answer:
    return Answer(interrupt_id=iid, status=status, payload=payload,  # type: ignore[arg-type]
                  state=state or (InterruptState.RESOLVED if status == "resolved"
                                  else InterruptState.CANCELLED),
                  answered_by=by, channel=channel, answered_at=iso(1_700_000_000_000))


def note(nid: str, iid: str, *, reviewer: str = "alice", kind: str = "request",
         level: int = 0, token: str = "tok") -> Notification:
    return Notification(id=nid, interrupt_id=iid, reviewer=reviewer, channel="email",
                        kind=kind, level=level, token=token)  # type: ignore[arg-type]


def handover(reviewer: str, to: str) -> Delegation:
    return Delegation(reviewer=reviewer, to=to, by=f"reviewer:{reviewer}", channel="api",
                      at=iso(1_700_000_000_000))


# -- a test's own corner of the server --------------------------------------------------


def answered_to_the_end(store: Store, run_id: str) -> None:
    """A run parked at version 2 on `int_a`: answered (it resumes), claimed at 3 and
    completed, each transition checked."""
    done = store.answers.answer(run_id, [answer("int_a")])
    assert done.resumed, done
    assert store.runs.claim(run_id, 3, OWNER).ok
    assert store.runs.complete(run_id, 3, OWNER, World.history(4), "done",
                               {"from": 3, "historyTo": 4}).ok


def pages(runs: RunIndex, status: Status | None, size: int) -> list[list[tuple[str, int]]]:
    """Every page of `runs` in `status` (None: all), `size` a page, cursor to cursor."""
    found, cursor = [], None
    while True:
        page, cursor = runs.page(status, size, cursor)
        found.append(page)
        if cursor is None:
            return found


@dataclass
class Run:
    """A run made by `World.make`: its id, its version and the claim that holds it."""

    id: str
    version: int
    owner: str = OWNER
    interrupts: list[str] = field(default_factory=list)


@dataclass
class World:
    client: redis.Redis
    prefix: str
    celery: Celery
    # None: format 1's layout; a number: the sharded layout with that many shards.
    shards: int | None = None
    store: Store = field(init=False)
    keys: Keys = field(init=False)

    def __post_init__(self) -> None:
        self.store = self.store_with()
        self.keys = self.store.keys

    def store_with(self, *, pushing: bool = False, **config: Any) -> Store:
        """A store on this test's prefix; `pushing`: its scripts push the task messages onto
        this test's own queues (`queue`)."""
        messages = None
        if pushing:
            messages = {kind: (t.queue_key, t.message) for kind, t in
                        templates(self.celery, key_prefix=f"{self.prefix}:broker:").items()}
        return Store(self.client, replace(StoreConfig(TASK_NAMES, prefix=self.prefix,
                                                      shards=self.shards),
                                          messages=messages, **config))

    # -- reads, as an operator would look ----------------------------------------------

    @property
    def shard(self) -> ShardKeys:
        """The keys of the store's one shard (format 1's layout): a sharded world's tests
        name the run's, `keys.shard_of(run_id)`."""
        [one] = self.keys.shards
        return one

    def now(self) -> int:
        return self.store.now_ms()

    def next_ms(self) -> int:
        """The server's clock once it has left the millisecond it is in (a spin of at most
        one ms, not a sleep): what comes after is told apart from what came before by its
        stream id's time, as events a moment apart are."""
        start = self.now()
        while (now := self.now()) == start:
            pass
        return now

    def run_hash(self, run_id: str) -> dict[str, str]:
        return self.client.hgetall(self.keys.run(run_id))  # type: ignore[no-any-return]

    def indexes_of(self, run_id: str) -> dict[str, int]:
        """Status → score of each index holding the run (one, when all is well)."""
        found = {}
        for status in Status:
            score = self.client.zscore(self.keys.shard_of(run_id).index(status), run_id)
            if score is not None:
                found[status.value] = int(score)
        return found

    def events(self, run_id: str) -> list[tuple[str, int, Any]]:
        """(type, version, data) of each entry of the run's stream, as stored: a step's
        messages, a field of their own, given as its data's `messages` (those a park
        dropped are not filled in from the history)."""
        return [(f["type"], int(f["version"]),
                 json.loads(f["data"]) | ({"messages": json.loads(f["messages"])}
                                          if "messages" in f else {}))
                for _, f in self.client.xrange(self.keys.events(run_id))]

    def event_types(self, run_id: str) -> list[str]:
        return [t for t, _, _ in self.events(run_id)]

    def zset(self, key: str) -> dict[str, int]:
        return {m: int(s) for m, s in self.client.zrange(key, 0, -1, withscores=True)}

    def outbox(self) -> dict[str, tuple[dict[str, Any], int]]:
        """Entry id → (entry, when it is due)."""
        entries = self.client.hgetall(self.shard.outbox_entries)
        due = self.zset(self.shard.outbox)
        assert set(entries) == set(due), "every outbox entry is scheduled, and only those"
        return {k: (json.loads(v), due[k]) for k, v in entries.items()}

    def stats(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.client.hgetall(self.shard.stats).items()}

    def queue(self, name: str) -> list[tuple[str, list[Any], str]]:
        """The messages pushed on this test's queue `name` (layby.turns, layby.notify),
        oldest first: (task, args, task id), as a worker reads them."""
        out = []
        for raw in reversed(self.client.lrange(f"{self.prefix}:broker:{name}", 0, -1)):
            message = json.loads(raw)
            assert message["properties"]["delivery_tag"].startswith(message["headers"]["id"])
            out.append((message["headers"]["task"], json.loads(message["body"])[0],
                        message["headers"]["id"]))
        return out

    def notes(self, run_id: str) -> dict[str, Notification]:
        return {n.id: n for n in self.store.outbox.notifications(run_id)}

    def raw_note(self, run_id: str, nid: str) -> dict[str, Any]:
        return json.loads(self.client.hget(self.keys.run(run_id), f"n:{nid}"))

    def snapshot(self) -> dict[str, Any]:
        """Every key of this test (the broker's queues too, and the sharded layout's
        registry, tagged `{<p>:format}`): its type, what it holds and whether it expires.
        Equal before and after: the call changed nothing."""
        out: dict[str, Any] = {}
        for key in sorted([*self.client.scan_iter(match=f"{self.prefix}:*", count=1000),
                           *self.client.scan_iter(match=f"{{{self.prefix}:format}}:*")]):
            kind = self.client.type(key)
            value: Any
            if kind == "string":
                value = self.client.get(key)
            elif kind == "hash":
                value = self.client.hgetall(key)
            elif kind == "zset":
                value = self.client.zrange(key, 0, -1, withscores=True)
            elif kind == "set":
                value = sorted(self.client.smembers(key))
            elif kind == "list":
                value = self.client.lrange(key, 0, -1)
            elif kind == "stream":
                value = self.client.xrange(key)
            else:
                raise AssertionError(f"{key}: {kind}")
            out[key] = (kind, value, self.client.pttl(key) > 0)
        return out

    # -- runs in a given state, made through the store ---------------------------------

    def make(self, status: str | Status, run_id: str = "run_1", *,
             interrupts: list[Interrupt] | None = None,
             plan: Announcements | None = None, store: Store | None = None) -> Run:
        """A run brought to `status` by the transitions that lead there. Parked runs wait
        on `interrupts` (one, `int_a`, unless said), announced by `plan` (nothing)."""
        status = Status(status)
        store = store or self.store
        made = store.runs.create_run(run_id, "demo.agent", input="hi", messages=MESSAGES,
                                     metadata={}, idempotency_key=None)
        assert made.ok, made
        run = Run(run_id, 1)
        if status is Status.QUEUED:
            return run
        if status is Status.CANCELLED:
            assert store.runs.cancel(run_id, "api:ops", "no longer needed").ok
            return Run(run_id, 2)
        assert store.runs.claim(run_id, 1, OWNER).ok
        if status is Status.RUNNING:
            return run
        if status is Status.COMPLETED:
            assert store.runs.complete(run_id, 1, OWNER, self.history(2), "done",
                                       {"from": 1, "historyTo": 2}).ok
            return Run(run_id, 2)
        if status is Status.FAILED:
            assert store.runs.fail(run_id, {"code": "boom", "message": "it broke"}, version=1,
                                   owner=OWNER).ok
            return Run(run_id, 2)
        intrs = interrupts if interrupts is not None else [interrupt("int_a")]
        parked = store.runs.park(run_id, 1, OWNER, self.history(2), intrs,
                                 park_event(intrs), plan=plan or Announcements())
        assert parked.ok, parked
        run = Run(run_id, 2, interrupts=[i.id for i in intrs])
        if status is Status.INTERRUPTED:
            return run
        assert status is Status.RESUMING
        done = store.answers.answer(run_id, [answer(i) for i in run.interrupts])
        assert done.resumed, done
        return Run(run_id, 3, interrupts=run.interrupts)

    def stepped_then_parked_unplanned(self, run_id: str = "run_1") -> list[dict[str, Any]]:
        """A running run that took a step (its messages in its event) and then parked
        without a plan (the announcement task plans it), so its stream is not compacted;
        returns the step's messages."""
        self.make("running", run_id)
        added = [{"role": "model", "content": [{"text": "message 1"}]}]
        self.store.runs.advance(run_id, 1, OWNER, self.history(2),
                                {"from": 1, "historyTo": 2, "messages": added}, inline=True)
        self.store.runs.park(run_id, 2, OWNER, self.history(3), [interrupt("int_a")],
                             park_event([interrupt("int_a")], 2, 3), plan=None)
        return added

    @staticmethod
    def history(n: int) -> list[Message]:
        return [text_message("user" if i % 2 == 0 else "model", f"message {i}")
                for i in range(n)]


def park_event(intrs: list[Interrupt], start: int = 1, to: int = 2) -> dict[str, Any]:
    """A park's event as tasks.steps writes it (its messages left for the script to cut)."""
    return {"from": start, "historyTo": to,
            "interrupts": [{"id": i.id, "reason": i.reason} for i in intrs]}
