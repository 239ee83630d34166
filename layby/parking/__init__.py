"""layby.parking: the Redis store of runs, interrupts, answers, outbox and indexes.

Every state change is one atomic Lua script named after its transition (`parking/lua/`);
`parking.keys` documents every key. What it hands out to readers is `layby.wire`'s.
"""

from layby.parking.clock import iso
from layby.parking.keys import Keys
from layby.parking.records import Announcements, OutboxEntry, RunRecord
from layby.parking.registries import BadCursor
from layby.parking.results import Transition, Verdict
from layby.parking.store import NotReplicated, Store, StoreConfig, TaskNames, generated_run_id

__all__ = ["Announcements", "BadCursor", "Keys", "NotReplicated", "OutboxEntry", "RunRecord",
           "Store", "StoreConfig", "TaskNames", "Transition", "Verdict", "generated_run_id",
           "iso"]
