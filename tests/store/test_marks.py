"""The store's marks (`store.marks`), on a real Valkey: a thing seen once within a time, a
count in a window, and since when something holds; what the gateway asks of them on a
signed-in reviewer's every request, in one round trip."""

from __future__ import annotations

import pytest

from tests.store.conftest import World

pytestmark = pytest.mark.store


def test_a_thing_is_seen_first_once_and_again_once_forgotten(world: World) -> None:
    marks = world.store.marks
    assert marks.first_sight("mail:<m1@example.com>", 60)
    assert not marks.first_sight("mail:<m1@example.com>", 60)
    assert marks.has_seen("mail:<m1@example.com>")
    assert 55 <= world.client.ttl(world.keys.seen("mail:<m1@example.com>")) <= 60
    marks.forget_sight("mail:<m1@example.com>")
    assert not marks.has_seen("mail:<m1@example.com>")
    assert marks.first_sight("mail:<m1@example.com>", 60)


def test_a_count_runs_over_the_window_its_first_sight_began(world: World) -> None:
    marks = world.store.marks
    assert [marks.tally("signin:client-1", 600) for _ in range(3)] == [1, 2, 3]
    assert marks.tally("signin:client-2", 600) == 1
    # Later counts do not push the window on: it ends 600 s after the first.
    world.client.expire(world.keys.seen("signin:client-1"), 5)
    marks.tally("signin:client-1", 600)
    assert world.client.ttl(world.keys.seen("signin:client-1")) <= 5


def test_seen_and_since_are_read_together(world: World) -> None:
    marks = world.store.marks
    assert marks.seen_and_since("inbox-out:s1", "inbox-revoked:alice") == (False, None)
    since = marks.note_since("inbox-revoked:alice", 60)
    assert marks.noted_since("inbox-revoked:alice") == since
    assert marks.seen_and_since("inbox-out:s1", "inbox-revoked:alice") == (False, since)
    marks.first_sight("inbox-out:s1", 60)
    assert marks.seen_and_since("inbox-out:s1", "inbox-revoked:alice") == (True, since)
    assert marks.seen_and_since("inbox-out:s2", "inbox-revoked:bob") == (False, None)
