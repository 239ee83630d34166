"""The sharded layout (`Keys(prefix, shard_count)`), that of a store made on a cluster,
run on one server: every transition's keys share one cluster
slot (a run's keys carry its shard's tag), and runs spread over three shards go through
their whole life, and are listed, expired and sought as in one."""

from __future__ import annotations

import re

import pytest
from redis.crc import key_slot

from layby.control.commands import RUN_ID, new_run_id
from layby.ids import first_fitting, random_strings
from layby.parking import Announcements, Keys, Verdict, generated_run_id
from layby.parking.shards import tags
from layby.parking.store.core import RUN_ID_ALPHABET
from layby.reviewers import tokens
from layby.wire import Status
from tests.store.conftest import (
    MESSAGES,
    World,
    answered_to_the_end,
    interrupt,
    note,
    pages,
)

pytestmark = pytest.mark.store

RUNS = [f"run_{i}" for i in range(12)]


def test_a_transitions_keys_are_in_its_shards_slot() -> None:
    keys = Keys("layby", 48)
    seen = set()
    for run_id in RUNS:
        shard = keys.shard_number(run_id)
        seen.add(shard)
        slots = {key_slot(k.encode()) for k in keys.for_scripts(run_id)}
        assert slots == {key_slot(tags(48)[shard].encode())}, run_id
        assert keys.run(run_id) == f"layby:{{{tags(48)[shard]}}}:{run_id}:run"
    assert len(seen) > 1
    # Format 1's layout: a run's own keys share its slot; the rest are elsewhere.
    legacy = Keys("layby")
    assert len({key_slot(k.encode()) for k in legacy.of_run("run_1")}) == 1
    assert legacy.run("run_1") == "layby:{run_1}:run"


def test_runs_over_three_shards_live_their_whole_life(sharded: World) -> None:
    store = sharded.store
    assert len({store.keys.shard_number(r) for r in RUNS}) == 3
    for run_id in RUNS:
        sharded.make("interrupted", run_id)
        sharded.next_ms()
    # Each run's keys are where its shard puts them, and nothing of it is elsewhere.
    for run_id in RUNS:
        shard = store.keys.shard_of(run_id)
        assert sharded.client.exists(store.keys.run(run_id))
        assert store.keys.run(run_id).startswith(shard.base + ":")
        assert sharded.client.zscore(shard.index(Status.INTERRUPTED), run_id) is not None
    # Listed newest first across the shards, page by page.
    seen = [run_id for page in pages(store.all_runs, Status.INTERRUPTED, 5)
            for run_id, _ in page]
    assert seen == RUNS[::-1]
    # Answered, resumed, claimed and completed, each in its own shard.
    for run_id in RUNS[:4]:
        answered_to_the_end(store, run_id)
        assert store.runs.status_of(run_id)[0] is Status.COMPLETED
    assert {run_id for run_id, _ in store.all_runs.page(Status.COMPLETED, 10)[0]} == set(RUNS[:4])


def test_deadlines_and_lost_messages_are_found_in_every_shard(sharded: World) -> None:
    store = sharded.store
    for run_id in RUNS[:6]:
        sharded.make("interrupted", run_id, interrupts=[interrupt("int_a", expires_ms=1)])
    sharded.next_ms()
    assert sorted(store.deadlines.due_deadlines()) == sorted((run_id, "int_a")
                                                             for run_id in RUNS[:6])
    # Queued runs of every shard, their queue empty (nobody pushed their messages): lost.
    pushing = sharded.store_with(pushing=True)
    for run_id in RUNS[6:]:
        assert pushing.runs.create_run(run_id, "demo.agent", input="hi", messages=MESSAGES,
                                       metadata={}, idempotency_key=None).ok
    sharded.client.delete(f"{sharded.prefix}:broker:layby.turns")
    sharded.next_ms()
    assert sorted(pushing.deadlines.waiting_too_long(0)) == sorted(RUNS[6:])


def test_an_idempotency_key_finds_its_run_in_any_shard(sharded: World) -> None:
    store = sharded.store
    # A retry of a start comes with another fresh id: each is drawn in the key's shard.
    for key in ("order-1", "order-2", "order-3", "order-4"):
        first, again = store.runs.new_run_id(key), store.runs.new_run_id(key)
        assert store.keys.shard_number(first) == store.keys.shard_number(again)
        assert store.runs.create_run(first, "demo.agent", input="hi", messages=MESSAGES,
                                     metadata={}, idempotency_key=key).ok
        retried = store.runs.create_run(again, "demo.agent", input="hi", messages=MESSAGES,
                                        metadata={}, idempotency_key=key)
        assert retried.verdict is Verdict.EXISTS and retried.run_id == first
    assert len({store.keys.shard_number(store.runs.new_run_id(k))
                for k in ("order-1", "order-2", "order-3", "order-4")}) > 1
    # Drawn in the key's shard, and of the shape of every generated id.
    assert all(re.fullmatch(r"run_[0-9A-Za-z]{22}", store.runs.new_run_id(k))
               for k in ("order-1", "order-2", "order-3", "order-4"))


def test_a_generated_run_id_is_short_random_and_usable_anywhere() -> None:
    drawn = [generated_run_id() for _ in range(3000)] + [new_run_id() for _ in range(3000)]
    assert len(set(drawn)) == len(drawn)
    # `run_` and 22 letters and digits: the old version's checks take it (they take any
    # id of 1 to 128 letters, digits, `_`, `-`, `.`), and it is 14 characters shorter
    # than `run_` and 32 hex digits.
    assert all(re.fullmatch(r"run_[0-9A-Za-z]{22}", run_id) and RUN_ID.match(run_id)
               for run_id in drawn)
    # Every character drawn from the whole alphabet, the first as the last (an encoded
    # number would start with a small digit), evenly enough: 6,000 draws a position.
    for position in (4, 15, 25):
        counts = dict.fromkeys(RUN_ID_ALPHABET, 0)
        for run_id in drawn:
            counts[run_id[position]] += 1
        assert min(counts.values()) > 40 and max(counts.values()) < 170, position


@pytest.mark.parametrize("alphabet", [RUN_ID_ALPHABET, "abcdefghijklmnopqrstuvwxyz234567"])
def test_random_strings_take_every_letter_as_often(alphabet: str) -> None:
    """What run ids and token refs are drawn from: 62 letters do not divide 256 bytes, so
    mapping every byte would make 8 letters a quarter likelier than the rest."""
    drawn = random_strings(alphabet, 100, at_once=64)
    letters = "".join(next(drawn) for _ in range(3000))
    assert len(letters) == 300_000 and set(letters) == set(alphabet)
    mean = len(letters) / len(alphabet)
    counts = [letters.count(letter) for letter in alphabet]
    assert 0.92 * mean < min(counts) and max(counts) < 1.08 * mean, (min(counts), max(counts))
    with pytest.raises(ValueError, match="an alphabet of 1 to 256 letters, not 0"):
        next(random_strings("", 4))


def test_a_string_that_must_fit_is_the_first_drawn_that_does() -> None:
    """How a run id is made for an idempotency key's shard, and a token's ref for its run's:
    the prefix is part of what `fits` judges, and what it refuses is never returned."""
    seen: list[str] = []

    def ends_in_zero(candidate: str) -> bool:
        seen.append(candidate)
        return candidate.endswith("0")

    found = first_fitting(RUN_ID_ALPHABET, 22, ends_in_zero, prefix="run_")
    assert found == seen[-1] and len(found) == 26 and found.startswith("run_")
    assert found.endswith("0") and not any(s.endswith("0") for s in seen[:-1])
    assert all(s.startswith("run_") for s in seen)
    plain = first_fitting("ab", 8, None)
    assert len(plain) == 8 and set(plain) <= {"a", "b"}


def test_a_grant_and_an_outbox_ack_touch_their_runs_shard_alone(sharded: World) -> None:
    store = sharded.store
    run_id = RUNS[0]
    sharded.make("interrupted", run_id)
    fits = store.keys.fits_with(run_id)
    assert fits is not None and Keys("layby").fits_with(run_id) is None  # one shard: any
    keys = {"k1": b"k" * 32}
    refs = [tokens.issue(keys, tokens.Grant(run_id, "int_a", "alice", 2, 2**40), fits)[0]
            for _ in range(6)]
    assert all(store.keys.shard_number(ref) == store.keys.shard_number(run_id) for ref in refs)
    plan = Announcements(notes=[(note("ntf_1", "int_a"), None)],
                         grants=[(ref, f"grant {n}", 60_000) for n, ref in enumerate(refs)])
    store.outbox.plan_notifications(run_id, plan)
    # Found with one read, in the ref's own shard.
    assert [store.answers.grant(ref) for ref in refs] == [f"grant {n}" for n in range(6)]
    assert store.answers.grant("not-a-ref") is None
    # Entries of runs in every shard, acked by run: each shard loses its own.
    others = [r for r in RUNS[1:] if store.keys.shard_number(r) != store.keys.shard_number(run_id)]
    sharded.client.delete(*(shard.keys.outbox for shard in store.shards))  # the park's
    entries = []
    for other in (run_id, *others[:2]):
        created = store.runs.create_run(f"{other}_new", "demo.agent", input="hi",
                                        messages=MESSAGES, metadata={}, idempotency_key=None)
        entries.extend(created.entries)
    assert len(entries) == 3
    store.outbox.ack_outbox([(e.args[0], e.id) for e in entries[:2]])
    left = {shard.keys.outbox: sharded.client.zrange(shard.keys.outbox, 0, -1)
            for shard in store.shards if sharded.client.zcard(shard.keys.outbox)}
    assert left == {store.keys.shard_of(entries[2].args[0]).outbox: [entries[2].id]}
