"""The store's shards: how runs, and the indexes, deadlines, leases and outbox their
transitions write, are spread so that each transition touches one cluster slot.

A store of the sharded layout holds a fixed number of shards (`count`, fixed when the store
is made). A shard's keys all carry its hash tag, `{<tag>}`: a run's own keys, and its
shard's share of every structure a transition writes beside them. Redis Cluster sends a
key to the slot of its tag (CRC16 of it, modulo 16,384), so a transition's keys are in one
slot and its script may run there.

Which tag: shard k's is the first `"<k>.<j>"` (j = 0, 1, …) whose slot falls in the k-th of
`count` equal ranges of the slots. A cluster that gives its primaries equal ranges of
slots, as `valkey-cli --cluster create` does, then holds count/primaries shards on each
(give or take one): tags "0", "1", … would land where CRC16 puts them, and 16 shards on 3
primaries as 8/5/3 as likely as 5/5/6. The tags are a function of `count` alone, and part
of the stored format: never change how they are made.

Which shard a run is in: CRC32 of its id, modulo `count` (`shard_of`); a run whose id must
land in a given shard (the one an idempotency key names) is given an id drawn until it does.
"""

from __future__ import annotations

import zlib
from functools import lru_cache

from redis.crc import key_slot

SLOTS = 16384
# LAYBY_STORE_SHARDS: enough for dozens of primaries, few enough that what reads every
# shard (a list page, the sweeper's pass) stays cheap on one server; and divisible by 1, 2,
# 3, 4, 6, 8, 12, 16 and 24 primaries (16 shards on 3 would be 5/5/6: one 12.5% above).
DEFAULT_COUNT = 48
MAX_COUNT = 1024


def slot_of(tag: str) -> int:
    """The cluster slot of keys tagged `{tag}`."""
    return int(key_slot(tag.encode()))


@lru_cache(maxsize=8)
def tags(count: int) -> tuple[str, ...]:
    """The hash tags of `count` shards, shard k's slot in the k-th of `count` equal ranges."""
    if not 1 <= count <= MAX_COUNT:
        raise ValueError(f"a store has 1 to {MAX_COUNT} shards, not {count}")
    out = []
    for k in range(count):
        low, high = k * SLOTS // count, (k + 1) * SLOTS // count
        j = 0
        while not low <= slot_of(f"{k}.{j}") < high:
            j += 1
        out.append(f"{k}.{j}")
    return tuple(out)


def shard_of(run_id: str, count: int) -> int:
    """The shard run `run_id` is in."""
    return zlib.crc32(run_id.encode()) % count
