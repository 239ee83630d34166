"""The Redis store of runs, by concern: every state change is one Lua script (see `lua/`),
reads are plain.

`Store` is the store's `Core` (its server, where the runs are, how a script runs on them)
and one part for each concern, each in a module of its own:

- `runs`: a run's life (create, claim, park, commit, fail, cancel, requeue) and its views;
- `answers`: what an answer is checked against, answers, hand-overs, deadlines that pass;
- `outbox`: notifications planned, due, delivered and retried, and the outbox of task
  messages to publish when the broker is another server;
- `lists`: pages of runs, their summaries, and the indexes' upkeep (folding, pruning);
- `deadlines`: what the sweeper reads (deadlines, retries, leases, lost messages);
- `processes`: the registry of live processes, the store's format and its switch;
- `inbox`: the reviewers' inbox's reads over many runs;
- `marks`: what was seen (webhook ids, mails), counts in a window, notes since a moment;
- `audit`: the audit trail.

Callers read `rt.store.runs.park(...)`, `rt.store.outbox.plan_notifications(...)`.
"""

from __future__ import annotations

from redis import Redis

from layby.parking.store.answers import Answers
from layby.parking.store.audit import Audit
from layby.parking.store.core import (
    Core,
    NotReplicated,
    StoreConfig,
    TaskNames,
    generated_run_id,
    on_cluster,
)
from layby.parking.store.deadlines import Deadlines
from layby.parking.store.inbox import Inbox
from layby.parking.store.lists import Lists
from layby.parking.store.marks import Marks
from layby.parking.store.outbox import Outbox
from layby.parking.store.processes import Processes
from layby.parking.store.runs import Runs


class Store(Core):
    """The store: its core, and its parts by concern (see the module's docstring)."""

    def __init__(self, client: Redis, config: StoreConfig) -> None:
        super().__init__(client, config)
        self.runs = Runs(self)
        self.answers = Answers(self)
        self.outbox = Outbox(self)
        self.lists = Lists(self)
        self.deadlines = Deadlines(self)
        self.processes = Processes(self)
        self.inbox = Inbox(self)
        self.marks = Marks(self)
        self.audit = Audit(self)


__all__ = ["NotReplicated", "Store", "StoreConfig", "TaskNames", "generated_run_id",
           "on_cluster"]
