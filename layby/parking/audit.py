"""The audit trail as the store keeps it: one stream a shard (`<p>:{<shard>}:audit`), an
entry a thing a caller did or was refused, its time the entry's id, its fields one JSON
string (`e`: caller, tenant, action, run, interrupt, channel, outcome, source). Written by
the transition it records (lua/_prelude.lua `audit`), or on its own (lua/record_audit.lua);
entries past the retention (LAYBY_AUDIT_RETENTION_DAYS) are trimmed as new ones come.

A page reads the shards newest first, merged by time (a run's alone when the page is of one
run), and keeps the entries its filter takes; a cursor (`<entry id>.<shard>`) says where the
next page starts, and a page reads at most SCAN entries, so a filter that takes few may give
fewer than asked with a cursor to read on."""

from __future__ import annotations

import heapq
import json
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

from redis import Redis

from layby.errors import Invalid
from layby.parking.keys import ShardKeys

SCAN = 5000
CHUNK = 200
CURSOR = re.compile(r"^(\d{1,15})-(\d{1,10})\.(\d{1,4})$")

Entry = dict[str, Any]


def _id(raw: str) -> tuple[int, int]:
    ms, _, seq = raw.partition("-")
    return int(ms), int(seq)


def _entries(client: Redis, key: str, number: int, start: str) -> Iterator[
        tuple[tuple[int, int, int], Entry]]:
    """The shard's entries from `start` (an XREVRANGE bound) down, newest first, read a
    chunk at a time; each keyed for the merge (newest first, then by shard)."""
    while True:
        found = cast("list[tuple[str, dict[str, str]]]",
                     client.xrevrange(key, start, "-", count=CHUNK))
        for entry_id, fields in found:
            ms, seq = _id(entry_id)
            try:
                data = json.loads(fields.get("e", "{}"))
            except ValueError:
                data = {}
            yield (-ms, -seq, number), {"id": entry_id, "shard": number, **data}
        if len(found) < CHUNK:
            return
        start = "(" + found[-1][0]


def page(client: Redis, shards: Sequence[ShardKeys], *, only: int | None = None,
         keep: Callable[[Entry], bool] = lambda _: True, since_ms: int | None = None,
         cursor: str | None = None, limit: int = 100) -> tuple[list[Entry], str | None]:
    """Up to `limit` entries `keep` takes, newest first, from `cursor` on (None: the newest),
    none older than `since_ms`; and the cursor of the page after (None at the end). `only`:
    the number of the one shard to read (a run's)."""
    at: tuple[str, int] | None = None
    if cursor is not None:
        found = CURSOR.match(cursor)
        if found is None:
            raise Invalid(f"the cursor {cursor[:80]!r} is not one an audit page gave: start "
                          "again without `cursor`, then pass each page's `nextCursor`",
                          code="invalid_cursor")
        at = (f"{int(found.group(1))}-{int(found.group(2))}", int(found.group(3)))
        if at[0] == "0-0":
            return [], None  # nothing comes before the first entry there can be
    numbers = [only] if only is not None else range(len(shards))
    streams = []
    for number in numbers:
        start = "+"
        if at is not None:
            # After the cursor: older entries, and in its millisecond those of later shards.
            start = at[0] if number > at[1] else "(" + at[0]
        streams.append(_entries(client, shards[number].audit, number, start))
    out: list[Entry] = []
    last: Entry | None = None
    for looked, (_, entry) in enumerate(heapq.merge(*streams, key=lambda pair: pair[0])):
        if since_ms is not None and _id(entry["id"])[0] < since_ms:
            return out, None
        if looked >= SCAN:
            break
        last = entry
        if keep(entry):
            out.append(entry)
            if len(out) == limit:
                break
    else:
        return out, None
    assert last is not None
    return out, f"{last['id']}.{last['shard']}"
