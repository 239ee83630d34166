"""layby.parking: the Redis store of runs, interrupts, answers, outbox and indexes.

Every state change is one atomic Lua script named after its transition (`parking/lua/`);
`parking.keys` documents every key. What it hands out to readers is `layby.wire`'s.
"""

from layby.parking.keys import Keys
from layby.parking.records import OutboxEntry
from layby.parking.store import NotReplicated, Result, RunRecord, Store, StoreConfig, iso

__all__ = ["Keys", "NotReplicated", "OutboxEntry", "Result", "RunRecord", "Store", "StoreConfig",
           "iso"]
