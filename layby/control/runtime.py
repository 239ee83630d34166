"""The application object: one process's settings, Celery app, Redis store, agents and
reviewer configuration, built by `build()` and handed down to whatever needs them.

Nothing here runs at import: a process (the `layby` command, the gateway's factory, the
Celery entry module `layby.tasks.app`, the test kit) calls `build()` once. The store is made
on first use and made again in a forked child (sockets are not shared across a fork).

When the broker is the store's server (LAYBY_BROKER_URL unset), the store's transitions
push the tasks that follow them themselves (`layby.broker_config.messages` makes the
messages). Publishing is for the outbox, when they cannot: a broker elsewhere (another
Redis, a Sentinel group, RabbitMQ), or tasks that ack their own entry. It sends outbox
entries to the broker after the transition committed, then acks them in the store; if the
broker is away the entries stay in the outbox and the sweeper publishes them later. A
message published twice (the ack lost) is dropped by the claim, which finds its version
taken.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import weakref
from collections.abc import Iterable
from functools import cache

from celery import Celery

from layby.access.keys import Keyring
from layby.broker_config import (
    DELIVER_TASK,
    NOTIFY,
    NOTIFY_TASK,
    RESUME_RUN,
    RUN_TURN,
    SLACK_TASK,
    TURNS,
    Settings,
    make_celery,
    pinned_queue,
    tracing,
)
from layby.broker_config.messages import shown_args, templates
from layby.control.broker_probe import BrokerProbe
from layby.control.connections import redis_client
from layby.generation.agents import Agent, hosted, hosted_versions, load_agents
from layby.generation.importing import import_user_module
from layby.parking import OutboxEntry, Store, StoreConfig, TaskNames, formats, migrations
from layby.parking.keys import Keys
from layby.reviewers.config import Reviewers
from layby.reviewers.directory import load_directory
from layby.reviewers.policy import load_rules

log = logging.getLogger(__name__)

# Tasks that ack their own outbox entry once their work is done, so that a task that fails
# for good (say, while the reviewer directory is broken) is published again by the sweeper
# until it succeeds: a parked run is never left unannounced.
ACKED_BY_THE_TASK = frozenset({NOTIFY_TASK})


TASK_NAMES = TaskNames(turn_task=RUN_TURN, resume_task=RESUME_RUN, turn_queue=TURNS,
                       notify_task=NOTIFY_TASK, notify_queue=NOTIFY, deliver_task=DELIVER_TASK,
                       slack_task=SLACK_TASK)


def store_config(settings: Settings, celery: Celery | None = None, *,
                 shards: int | None = None) -> StoreConfig:
    """The store's settings; with the `celery` app, when its broker is the store's server,
    the transitions push the tasks that follow them themselves. `shards`: the store's
    layout, as its format key says (`formats.keys_of`)."""
    messages = None
    if celery is not None and settings.broker_is_store:
        messages = {kind: (t.queue_key, t.message)
                    for kind, t in templates(celery, settings.broker_key_prefix).items()}
    return StoreConfig(TASK_NAMES, prefix=settings.key_prefix, retention_s=settings.retention_s,
                       idempotency_ttl_s=settings.idempotency_ttl_s,
                       lease_ms=int(settings.lease_s * 1000),
                       lost_message_ms=int(settings.lost_message_s * 1000),
                       events_max=settings.events_max,
                       audit_keep_ms=settings.audit_retention_days * 86_400_000,
                       fold_after_ms=int(settings.fold_events_after_s * 1000),
                       outbox_grace_ms=int(settings.outbox_grace_s * 1000),
                       min_replicas_ack=settings.redis_min_replicas_ack,
                       replica_ack_timeout_ms=int(settings.redis_replica_ack_timeout_s * 1000),
                       messages=messages, shards=shards)


class Runtime:
    """Settings, Celery app, store, agents and reviewers of one process."""

    def __init__(self, settings: Settings, celery: Celery,
                 agents: dict[str, Agent] | None = None) -> None:
        self.settings = settings
        self.celery = celery
        self.reviewers = Reviewers(settings)
        self._store: tuple[int, Store] | None = None
        self._broker_probe: BrokerProbe | None = None
        self._agents = agents
        self._keyring: Keyring | None = None
        self._hosted: tuple[str, ...] | None = None
        self._new_locks()
        # A lock held by another thread at fork would stay held in the child for good.
        me = weakref.ref(self)

        def renew_locks() -> None:
            rt = me()
            if rt is not None:
                rt._new_locks()

        os.register_at_fork(after_in_child=renew_locks)

    def _new_locks(self) -> None:
        self._store_lock = threading.Lock()
        self._agents_lock = threading.Lock()

    @property
    def store(self) -> Store:
        """The process's store (a new one in a forked child)."""
        found = self._store
        if found is not None and found[0] == os.getpid():
            return found[1]
        with self._store_lock:
            if self._store is None or self._store[0] != os.getpid():
                client = redis_client(self.settings)
                # Before anything is read or written: code that cannot read the store's
                # format or layout must not serve it (FormatError says what to run).
                state = formats.check(client, Keys(self.settings.key_prefix),
                                      migrations.newest(), shards=self.settings.wanted_shards,
                                      stamp_shards=self.settings.store_shards)
                store = Store(client, store_config(self.settings, self.celery,
                                                   shards=state.shards))
                store.writing = state.written or migrations.newest()
                if not self.settings.broker_is_store:
                    store.length_of_queue = self.queue_length
                self._store = (os.getpid(), store)
            return self._store[1]

    @property
    def keyring(self) -> Keyring:
        """The API keys the gateway takes (LAYBY_API_KEYS and LAYBY_KEYS_FILE's), read on
        first use; the file again when it changes (`Keyring.refresh`)."""
        found = self._keyring
        if found is None:
            with self._agents_lock:
                if self._keyring is None:
                    self._keyring = Keyring(self.settings.api_key_table,
                                            self.settings.keys_file)
                found = self._keyring
        return found

    @property
    def agents(self) -> dict[str, Agent]:
        """The agents of LAYBY_AGENT_MODULES, imported on first use (importing them takes
        its own lock: it never holds up the store)."""
        if self._agents is not None:
            return self._agents
        with self._agents_lock:
            if self._agents is None:
                self._agents = load_agents(self.settings.agent_modules)
            return self._agents

    @property
    def hosted(self) -> tuple[str, ...]:
        """The agent versions this process's worker runs pinned runs of, each as
        `<agent>@<version>` (LAYBY_AGENT_VERSIONS, or each agent's own)."""
        if self._hosted is None:
            self._hosted = hosted(self.agents.values(), self.settings.agent_versions)
        return self._hosted

    @property
    def pinned_queues(self) -> list[str]:
        """The queues of the pinned runs this process's worker hosts, one per version."""
        return [pinned_queue(v) for v in hosted_versions(self.hosted)]

    def broker_server_id(self) -> str | None:
        """The run id of the broker's Redis server when that is a server of its own
        (LAYBY_BROKER_URL): a new one after its restart or failover, which may have lost
        task messages. None when the broker is the store's server (the store's own id says
        it) or RabbitMQ (its quorum queues keep what they confirmed), or does not answer
        now (asked again at the next sweep; never waited for: the sweep goes on)."""
        if self.settings.broker_is_store or self.settings.broker_is_amqp:
            return None
        # kombu's Redis channel holds redis-py's client of the primary.
        return self.broker_probe.ask(
            lambda channel: str(channel.client.info("server").get("run_id", "")),
            "its server")

    def queue_length(self, queue: str) -> int | None:
        """How many messages wait in `queue` on the broker; None when it does not answer
        now (the queue is not looked at this time). No such queue (on Redis, an empty one
        is no key): none waits."""
        return self.broker_probe.ask(
            lambda channel: int(channel.queue_declare(queue=queue, passive=True).message_count),
            f"queue {queue}", refused=0)

    @property
    def broker_probe(self) -> BrokerProbe:
        """The connection the process keeps for its questions to the broker."""
        if self._broker_probe is None:
            with self._store_lock:
                if self._broker_probe is None:
                    self._broker_probe = BrokerProbe(self.celery)
        return self._broker_probe

    def publish(self, entries: Iterable[OutboxEntry]) -> int:
        """Send entries to the broker and ack them; returns how many were sent."""
        entries = list(entries)
        if not entries:
            return 0
        try:
            with self.celery.producer_or_acquire() as producer:
                for e in entries:
                    # In the run's trace: the publish span of Celery's instrumentation (when
                    # this process traces) and the message's header both continue it.
                    with tracing.continued(e.trace):
                        self.celery.send_task(
                            e.task, args=e.args, task_id=e.id, queue=e.queue,
                            producer=producer, argsrepr=shown_args(e.args, e.agent),
                            headers={"traceparent": e.trace} if e.trace else None)
        except Exception:  # the outbox keeps them; the sweeper tries again
            log.exception("publish failed; %d outbox entries left for the sweeper",
                          len(entries))
            return 0
        # Every task's first argument is its run's id.
        self.store.outbox.ack_outbox([(e.args[0], e.id) for e in entries
                                      if e.task not in ACKED_BY_THE_TASK])
        self.store.outbox.hold_outbox([(e.args[0], e.id) for e in entries
                                       if e.task in ACKED_BY_THE_TASK])
        return len(entries)


def build(settings: Settings | None = None, *, agents: dict[str, Agent] | None = None
          ) -> Runtime:
    """The application object, from `settings` (read from LAYBY_* variables when not
    given). `agents` replaces LAYBY_AGENT_MODULES (the test kit passes them)."""
    settings = settings or Settings()
    return Runtime(settings, make_celery(settings), agents)


def check_config(settings: Settings) -> dict[str, Agent]:
    """What a process needs before it serves, checked before any part starts (`layby up`,
    `layby worker`, the gateway): the user's agent and task modules import, the reviewer
    directory and its rules load, the keys file reads. Returns the agents; raises
    ConfigError, in one line, naming the file (and line) to fix."""
    agents = load_agents(settings.agent_modules)
    for name in settings.task_modules:
        import_user_module(name, "LAYBY_TASK_MODULES")
    directory = load_directory(settings.reviewers_file)
    rules = settings.policy_file or settings.reviewers_file
    if rules is not None:
        load_rules(rules).check(directory)
    Keyring(settings.api_key_table, settings.keys_file)  # KeysFileError: file and line
    tracing.check()  # the OTEL_* variables: an exporter layby ships
    return agents


def worker_name() -> str:
    """This process as a step's claim names it: host and pid."""
    return _named(os.getpid())


@cache
def _named(pid: int) -> str:
    # Asked at every step: the host's name is a system call, asked once a process (a forked
    # child has a pid of its own, so a name of its own).
    return f"{socket.gethostname()}:{pid}"
