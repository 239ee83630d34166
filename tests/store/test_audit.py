"""The audit trail in the store: each shard's stream, written by the transitions it records
(in the sharded layout), merged newest first across shards a page at a time by cursor,
filtered by run (its shard alone) or by what a reader keeps, trimmed past its retention."""

from __future__ import annotations

import json

import pytest

from layby.parking import audit
from tests.store.conftest import MESSAGES, World

pytestmark = pytest.mark.store


def _entry(caller: str, run: str, action: str = "start") -> str:
    return json.dumps({"caller": caller, "tenant": "acme", "action": action, "run": run})


def test_pages_merge_every_shard_newest_first_by_cursor(sharded: World) -> None:
    store = sharded.store
    for i in range(25):
        run_id = f"run_{i:02}"
        assert store.runs.create_run(run_id, "demo.agent", input="hi", messages=MESSAGES,
                                     metadata={}, idempotency_key=None,
                                     audit=[_entry(f"api:k{i % 3}", run_id)]).ok
        sharded.next_ms()
    found, cursor = [], None
    while True:
        page, cursor = store.audit.page(cursor=cursor, limit=4)
        found += page
        if cursor is None:
            break
    assert [e["run"] for e in found] == [f"run_{i:02}" for i in reversed(range(25))]
    assert len({e["shard"] for e in found}) == 3  # every shard read
    mine, _ = store.audit.page(keep=lambda e: e["caller"] == "api:k1", limit=100)
    assert [e["run"] for e in mine] == [f"run_{i:02}" for i in reversed(range(25)) if i % 3 == 1]
    one, after = store.audit.page(run="run_07")
    assert [e["run"] for e in one] == ["run_07"] and after is None


def test_refusals_are_kept_in_the_shard_of_their_run_and_trimmed_past_retention(
        sharded: World) -> None:
    store = sharded.store
    store.audit.record([_entry("api:bolt", "run_x", "read")], of="run_x")
    shard = sharded.keys.shard_of("run_x")
    assert sharded.client.xlen(shard.audit) == 1
    brief = sharded.store_with(audit_keep_ms=0)
    for _ in range(300):  # MINID ~ trims whole nodes of the stream, not entry by entry
        brief.audit.record([_entry("api:bolt", "run_x", "read")], of="run_x")
        sharded.next_ms()
    assert sharded.client.xlen(shard.audit) < 300


def test_a_cursor_not_made_by_a_page_is_refused(sharded: World) -> None:
    with pytest.raises(Exception, match="is not one an audit page gave"):
        sharded.store.audit.page(cursor="yesterday")
    assert audit.CURSOR.match("1700000000000-0.2")
