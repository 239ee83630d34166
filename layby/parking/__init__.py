"""parking: the Redis store of runs, interrupts, answers, outbox and indexes.

Every state change is one atomic Lua script named after its transition (`parking/lua/`);
`parking.keys` documents every key.
"""

from layby.parking.keys import Keys
from layby.parking.records import (
    Answer,
    Event,
    InterruptView,
    Notification,
    OutboxEntry,
    RunSummary,
    RunView,
)
from layby.parking.states import InterruptState, Status
from layby.parking.store import NotReplicated, Result, RunRecord, Store, StoreConfig, iso

__all__ = ["Answer", "Event", "InterruptState", "InterruptView", "Keys", "NotReplicated",
           "Notification", "OutboxEntry",
           "Result", "RunRecord", "RunSummary", "RunView", "Status", "Store", "StoreConfig",
           "iso"]
