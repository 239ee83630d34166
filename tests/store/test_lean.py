"""The lean cycle, as users and operators see it: lists that page by cursor at any depth,
one delivery task per notification however long the queue waits, parked runs that keep
only what they hold, and the tasks a cycle takes.

Real parts: a Valkey server, workers, the sweeper and the gateway as subprocesses, an SMTP
server and a webhook receiver for the notifications.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from layby import Client
from layby.broker_config import JOBS, NOTIFY, TURNS, Settings, make_celery
from layby.broker_config.messages import templates
from layby.control.runtime import store_config
from layby.generation import text_message
from layby.ops.embedded import EmbeddedRedis
from layby.ops.supervisor import worker_argv
from layby.parking import BadCursor, Keys, Store
from layby.parking.events import STEP_EVENTS
from layby.parking.migrations.m0001_versioned import old_keys
from layby.parking.registries import RunIndex
from layby.parking.scripts import PLACEHOLDER
from layby.wire import Status
from tests.support import sse
from tests.support.harness import (
    API_KEY,
    LaybySystem,
    as_0_1_0s_predecessors_kept_it,
    keys_of,
    wait_until,
)
from tests.support.reviewers import SmtpServer, WebhookReceiver, reviewed_system


def _park(system: LaybySystem, count: int, agent: str = "demo.trivia") -> list[str]:
    ids = [system.start_run(agent, f"Ask me question {i}")["id"] for i in range(count)]
    for run_id in ids:
        system.wait_status(run_id, "interrupted")
    return ids


# -- lists, a page at a time ---------------------------------------------------------------


def test_lists_page_by_cursor_through_the_api_the_client_and_the_command(isolated: Any
                                                                          ) -> None:
    system = isolated().start()
    parked = _park(system, 7)
    with system.api() as api:
        seen: list[str] = []
        cursor = None
        pages = 0
        while True:
            params: dict[str, Any] = {"status": "interrupted", "limit": 3}
            if cursor:
                params["cursor"] = cursor
            reply = api.get("/v1/runs", params=params)
            assert reply.status_code == 200, reply.text
            body = reply.json()
            seen += [r["id"] for r in body["runs"]]
            pages += 1
            cursor = body.get("nextCursor")
            if cursor is None:
                break
        # every parked run once, in pages of 3
        assert sorted(seen) == sorted(parked) and len(seen) == 7 and pages == 3

        refused = api.get("/v1/runs", params={"cursor": "not-a-cursor"})
        assert refused.status_code == 422
        assert refused.json()["error"]["detail"][0]["path"] == "/cursor"
        deep = api.get("/v1/runs", params={"offset": 5000})
        assert deep.status_code == 422
        assert "nextCursor" in deep.text
        # a cursor and an offset: that many runs further on
        first = api.get("/v1/runs", params={"status": "interrupted", "limit": 2}).json()
        both = api.get("/v1/runs", params={"status": "interrupted", "limit": 2, "offset": 1,
                                           "cursor": first["nextCursor"]}).json()
        assert [r["id"] for r in both["runs"]] == seen[3:5]
        # an offset page also says where to go on
        offset_page = api.get("/v1/runs", params={"status": "interrupted", "limit": 2,
                                                   "offset": 2}).json()
        assert [r["id"] for r in offset_page["runs"]] == seen[2:4]
        after = api.get("/v1/runs", params={"status": "interrupted", "limit": 2,
                                            "cursor": offset_page["nextCursor"]}).json()
        assert [r["id"] for r in after["runs"]] == seen[4:6]

    with Client(system.base_url, API_KEY) as client:
        assert [r.id for r in client.iter_runs("interrupted")] == seen
        page = client.page("interrupted", limit=4)
        assert [r.id for r in page.runs] == seen[:4] and page.next_cursor

    listed = subprocess.run([sys.executable, "-m", "layby.ops.cli", "runs", "ls", "--status",
                             "interrupted", "--all"], env=system.env, capture_output=True,
                            text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()] == seen


def test_a_page_goes_on_past_runs_that_changed_in_the_same_millisecond(
        redis_server: EmbeddedRedis) -> None:
    client = redis.Redis(port=redis_server.port, db=14, decode_responses=True)
    client.flushdb()
    try:
        keys = Keys("ties")
        runs = RunIndex(client, *keys.shards)
        # Nine runs, three changing in each of three milliseconds; and in another state.
        for i in range(9):
            client.zadd(keys.legacy.index(Status.INTERRUPTED), {f"run-{i}": 1000 + i // 3})
        client.zadd(keys.legacy.index(Status.COMPLETED), {"run-x": 1001})
        every = [run_id for run_id, _ in runs.newest(None, 20)]
        assert len(every) == 10
        for size in (1, 2, 4):
            got, cursor = [], None
            while True:
                page, cursor = runs.page(None, size, cursor)
                got += [run_id for run_id, _ in page]
                if cursor is None:
                    break
            assert got == every, size
        with pytest.raises(BadCursor) as refused:
            runs.page(None, 2, "not a cursor")
        assert "nextCursor" in refused.value.message
    finally:
        client.flushdb()
        client.close()


# -- one delivery task per notification -------------------------------------------------


class _NoNotifyWorker(LaybySystem):
    """A system whose worker does not take notifications: they wait in their queue."""

    def start_worker(self, name: str = "worker") -> Any:
        proc = self._start(name, worker_argv(self.settings, [TURNS, JOBS, "celery"],
                                             self.worker_count, "INFO"))
        wait_until(lambda: "ready." in proc.output(), 40, what=f"{name} to be ready")
        return proc


@pytest.mark.integration
@pytest.mark.slow
def test_a_queued_delivery_is_never_queued_again(redis_server: EmbeddedRedis,
                                                 tmp_path: Path) -> None:
    db = 13
    store = redis.Redis(port=redis_server.port, db=db, decode_responses=True)
    store.flushdb()
    smtp, hooks = SmtpServer().start(), WebhookReceiver().start()
    system = _NoNotifyWorker(f"redis://127.0.0.1:{redis_server.port}/{db}", tmp_path)
    try:
        # The sweeper looks every second, and the outbox's grace is one second: the old
        # behaviour queued every waiting delivery again each second.
        reviewed_system(system, tmp_path, smtp, hooks, LAYBY_OUTBOX_GRACE_S="1",
                        LAYBY_LOST_MESSAGE_S="120")
        parked = _park(system, 12)
        requests = [n for run_id in parked for n in system.run(run_id)["notifications"]
                    if n["kind"] == "request"]
        assert len(requests) == 24  # alice by email and hookbot by webhook, for each run
        time.sleep(6)  # six sweeps
        assert store.llen(NOTIFY) == len(requests)  # one message each, none again

        system._start("notifier", worker_argv(system.settings, [NOTIFY], 2, "INFO"))
        wait_until(lambda: len(smtp.messages) >= 12 and len(hooks.deliveries) >= 12, 60,
                   what="the notifications to go out")
        time.sleep(3)
        assert len(smtp.messages) == 12 and len(hooks.deliveries) == 12
        for run_id in parked:
            states = {n["state"] for n in system.run(run_id)["notifications"]
                      if n["kind"] == "request"}
            assert states == {"sent"}, (run_id, states)
        assert store.llen(NOTIFY) == 0
    finally:
        system.stop()
        smtp.stop()
        hooks.stop()
        store.flushdb()
        store.close()


def test_a_transition_pushes_celerys_own_message_with_the_run_filled_in(
        redis_server: EmbeddedRedis) -> None:
    """The message a transition script pushes is the template Celery made, with the run's
    values where its placeholders were: byte for byte what the same text replaced in
    Python gives, and what a worker reads as `layby.run_turn(run_id, 1)`."""
    settings = Settings(redis_url=f"redis://127.0.0.1:{redis_server.port}/12",
                        key_prefix="fill")
    celery = make_celery(settings)
    client = redis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    client.flushdb()
    try:
        store = Store(client, store_config(settings, celery))
        # A run id with what a substitution could take for a pattern or a placeholder.
        run_id = "run_%1@@V@@"
        store.runs.create_run(run_id, "demo.trivia", input="hi", messages=[
            text_message("user", "hi")], metadata={}, idempotency_key=None)
        pushed = client.lrange(TURNS, 0, -1)
        assert len(pushed) == 1
        message = json.loads(pushed[0])
        task_id = f"{run_id}:turn:1"
        values = {"R": run_id, "V": "1", "N": "", "T": task_id,
                  "D": message["properties"]["delivery_tag"], "A": "agent=demo.trivia ",
                      "S": "", "P": ""}
        expected = PLACEHOLDER.sub(lambda m: values[m.group(1)],
                                   templates(celery)["turn"].message)
        assert pushed[0] == expected
        assert message["properties"]["delivery_tag"].startswith(task_id + ":")
        assert message["headers"]["task"] == "layby.run_turn"
        assert message["headers"]["id"] == task_id
        assert json.loads(message["body"])[0] == [run_id, 1]
        # What Flower shows: the ids and the run's agent (the arguments stay the ids).
        assert message["headers"]["argsrepr"] == f"agent=demo.trivia ['{run_id}', 1]"
        assert message["headers"]["traceparent"] == ""  # started in no trace
        # A run started in a trace: its steps' messages carry it, for the worker's span; a
        # value that is not a traceparent never reaches a message.
        parent = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
        for given, carried in ((parent, parent), ('x", "task": "evil', "")):
            client.delete(TURNS)
            store.runs.create_run(store.runs.new_run_id(None), "demo.trivia", input="hi",
                                  messages=[text_message("user", "hi")], metadata={},
                                  idempotency_key=None, trace=given)
            [pushed_now] = client.lrange(TURNS, 0, -1)
            assert json.loads(pushed_now)["headers"]["traceparent"] == carried
    finally:
        client.flushdb()
        client.close()


# -- what a cycle takes -----------------------------------------------------------------


def test_a_cycle_takes_two_tasks_and_a_parked_run_keeps_only_what_it_holds(
        isolated: Any) -> None:
    system = isolated().start()
    (run_id,) = _park(system, 1)
    with redis.Redis.from_url(system.redis_url, decode_responses=True) as client:
        keys = keys_of(client, system.settings.key_prefix)
        # The run's events take what they hold: a new stream reserves room for many more
        # (4 KB with the server's defaults), and the park gives it back.
        held = sum(len(k) + len(v) for _, fields in client.xrange(keys.events(run_id))
                   for k, v in fields.items())
        assert client.memory_usage(keys.events(run_id), samples=0) < held + 1024
        # Nor does its hash keep what a parked run has no use for: its id (the key says
        # it), metadata it was not given, the claim of the step that parked it.
        # Its interrupt is a field of its hash, not a key of its own.
        assert not client.exists(*old_keys(keys, run_id))
        kept = set(client.hkeys(keys.run(run_id)))
        # Nor what repeats another field: what it waits on is what is open.
        assert not kept & {"id", "metadata", "lease_owner", "lease_until", "attempts",
                           "checkpointed", "waiting"}, kept
        assert {"agent", "status", "version", "messages", "open"} <= kept, kept
        assert len([k for k in kept if k.startswith("i:")]) == 1, kept
        # The park planned nothing here (no reviewers), and queued no task: the run waits.
        assert client.llen(TURNS) == 0 and client.llen(NOTIFY) == 0

    run = system.run(run_id)
    (question,) = system.open_interrupts(run)
    assert system.answer(run_id, question["id"], payload="Jaws").status_code == 200
    system.wait_status(run_id, "completed")
    with httpx.Client(base_url=system.base_url,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as api:
        text = api.get(f"/v1/runs/{run_id}/events", params={"follow": "false"}).text
    # One task took the first turn and parked, one resumed and finished.
    assert text.count("event: run.started") == 2
    # When each event happened is its id's time: the stream does not store it twice, and
    # readers still get it.
    with redis.Redis.from_url(system.redis_url, decode_responses=True) as client:
        assert not [f for _, f in client.xrange(keys.events(run_id)) if "at" in f]
    for event in sse.history(system, run_id):
        written = datetime.fromisoformat(event["data"]["at"].replace("Z", "+00:00"))
        assert round(written.timestamp() * 1000) == int(event["id"].split("-")[0]), event


def test_a_runs_input_is_kept_once_and_read_back_as_given(isolated: Any) -> None:
    """A run started from a string has it as its first message too: the hash keeps it
    there alone, for as long as the run lives. Any other input is kept as given."""
    system = isolated().start()
    given: list[tuple[dict[str, Any], Any]] = [
        ({"input": "Ask me a question"}, "Ask me a question"),
        ({"input": {"topic": "films", "level": 2}}, {"topic": "films", "level": 2}),
        ({"messages": [{"role": "user", "content": [{"text": "Ask me a question"}]}]}, None),
    ]
    ids = []
    with system.api() as api:
        for body, _ in given:
            reply = api.post("/v1/runs", json={"agent": "demo.trivia", **body})
            assert reply.status_code == 202, reply.text
            ids.append(reply.json()["id"])
    with redis.Redis.from_url(system.redis_url, decode_responses=True) as client:
        keys = keys_of(client, system.settings.key_prefix)
        kept = [client.hexists(keys.run(run_id), "input") for run_id in ids]
    assert kept == [False, True, True]
    for run_id, (_, expected) in zip(ids, given, strict=True):
        run = system.wait_status(run_id, "interrupted")
        assert run.get("input") == expected  # (none given: none shown)


def test_a_run_parked_a_while_keeps_its_events_in_its_hash_and_readers_see_no_change(
        isolated: Any, tmp_path: Path) -> None:
    """Parked a while (LAYBY_FOLD_EVENTS_AFTER_S), a run's events leave their stream for a
    field of its hash, the data they repeat rebuilt from the hash when read: the stream's
    own cost goes. Readers get the same events, ids and all; a follower waiting on the
    folded run is woken by its next event; the run's later events follow them."""
    smtp, hooks = SmtpServer().start(), WebhookReceiver().start()
    try:
        system = reviewed_system(isolated(), tmp_path, smtp, hooks,
                                 LAYBY_FOLD_EVENTS_AFTER_S="4").system
        (run_id,) = _park(system, 1)
        client = redis.Redis.from_url(system.redis_url, decode_responses=True)
        keys = keys_of(client, system.settings.key_prefix)
        wait_until(lambda: [f["type"] for _, f in client.xrange(keys.events(run_id))].count(
            "notification.sent") == 2, 30, what="both notifications sent")
        before = sse.history(system, run_id)
        held = (client.memory_usage(keys.run(run_id), samples=0)
                + client.memory_usage(keys.events(run_id), samples=0))
        assert client.exists(keys.events(run_id)), "folded before it was read: too slow"

        wait_until(lambda: not client.exists(keys.events(run_id)), 15, what="the fold")
        assert sse.history(system, run_id) == before
        assert sse.history(system, run_id, before[1]["id"]) == before[2:]
        folded = client.hget(keys.run(run_id), "events")
        assert folded and len(folded.splitlines()) == len(before)
        # What the events repeat of the hash is not held twice: the stream's few hundred
        # bytes of its own go, and most of what its entries held.
        assert client.memory_usage(keys.run(run_id), samples=0) < held - 500
        assert len(folded) < sum(len(json.dumps(e["data"])) for e in before) / 3

        # A follower from the last folded event waits, and is woken by the answer.
        got: list[dict[str, Any]] = []

        def follow() -> None:
            with system.api() as api, api.stream(
                    "GET", f"/v1/runs/{run_id}/events",
                    headers={"Last-Event-ID": before[-1]["id"]}) as reply:
                for event in sse.parse(reply.iter_lines()):
                    got.append(event)
                    if event["event"] == "run.completed":
                        return

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        time.sleep(1)
        (question,) = system.open_interrupts(system.run(run_id))
        assert system.answer(run_id, question["id"], payload="Jaws").status_code == 200
        follower.join(30)
        assert got and got[-1]["event"] == "run.completed"
        assert got[0]["event"] == "interrupt.answered"
        # The same events again (a parked step's messages as the resume rewrote them).
        after = sse.history(system, run_id)
        assert [e["id"] for e in before + got] == [e["id"] for e in after]
        assert [e for e in before + got if e["event"] not in STEP_EVENTS] == \
            [e for e in after if e["event"] not in STEP_EVENTS]
        client.close()
    finally:
        smtp.stop()
        hooks.stop()


def test_a_fold_gives_back_any_event_as_it_was_and_keeps_the_newest(
        redis_server: EmbeddedRedis) -> None:
    """Straight on the store: events a fold cannot rebuild (an answer's payload, text with
    spaces and quotes, an event of 0.1.0's predecessors with its `at`) come back as they were
    stored; a second fold after the run parked again appends; past LAYBY_EVENTS_MAX the
    oldest go, and what stays still reads whole."""
    from layby.control.runtime import TASK_NAMES
    from layby.parking import Store, StoreConfig

    client = redis.Redis(port=redis_server.port, db=14, decode_responses=True)
    client.flushdb()
    store = Store(client, StoreConfig(TASK_NAMES, prefix="fold", fold_after_ms=0,
                                      events_max=8))
    run_id, iid, nid = "run_fold", "int_aaaa", "ntf_bbbb"
    keys = store.keys
    client.hset(keys.run(run_id), mapping={
        "agent": "demo.trivia", "status": "interrupted", "version": 2,
        "created_at": 1000, "updated_at": 2000, "open": iid, "messages": "[]",
        f"i:{iid}": '{"c":"ask_0_0","n":"ask","m":"Which?","t":1500}',
        f"n:{nid}": '{"t":"k-x-y","i":"int_aaaa","s":"sent","a":2,"c":"email","r":"alice"}'})
    client.zadd(keys.shard_of(run_id).index(Status.INTERRUPTED), {run_id: 2000})

    def sent(attempts: int) -> str:
        """A send's event data as finish_delivery.lua writes it (cjson's order of keys)."""
        return client.eval("return cjson.encode({id = 'ntf_bbbb', interruptId = 'int_aaaa', "
                           "reviewer = 'alice', channel = 'email', kind = 'request', "
                           f"attempts = {attempts}}})", 0)

    def add(kind: str, data: str, version: int = 2, at: str | None = None) -> None:
        fields = {"type": kind, "version": version, "data": data} | ({"at": at} if at else {})
        client.xadd(keys.events(run_id), fields)

    def fold_later() -> int:
        """The sweeper's fold, a moment after the newest event (one of that very
        millisecond is left for later: fold_events.lua)."""
        newest = int(client.xrevrange(keys.events(run_id), count=1)[0][0].split("-")[0])
        while (lambda t: t[0] * 1000 + t[1] // 1000)(client.time()) <= newest:
            pass
        return store.lists.fold_parked()

    add("run.created", '{"agent":"demo.trivia"}', 1)
    add("run.started", '{"from":"queued"}', 1)
    add("run.interrupted", '{"from":1,"historyTo":2,"interrupts":[{"id":"int_aaaa",'
                           '"reason":"input_required"}]}')
    add("notifications.planned", '{"ids":["ntf_bbbb"]}')
    add("notification.sent", sent(2))
    add("interrupt.answered", '{"payload":"it says \\"hi\\" — twice","by":"a b"}')
    before = store.runs.events(run_id)
    assert fold_later() == 1
    assert not client.exists(keys.events(run_id))
    assert store.runs.events(run_id) == before
    assert store.runs.events(run_id, before[2].id, count=2) == before[3:5]
    # An id without its sequence (a Last-Event-ID may be one) is that id's first.
    assert store.runs.events(run_id, before[3].id.split("-")[0]) == [
        e for e in before if e.id > before[3].id.split("-")[0] + "-0"]
    folded = client.hget(keys.run(run_id), "events")
    assert "int_aaaa" in folded and folded.count("ntf_bbbb") == 1  # the send names its plan

    # Parked again: a stream begun after the fold, an entry of 0.1.0's predecessors in it
    # (its `at`, the id's time, is read by nothing).
    add("run.resuming", "{}", 3, at="123")
    add("notification.sent", sent(2))
    add("run.started", '{"from":"resuming"}', 3)
    whole = store.runs.events(run_id)
    assert [e.id for e in whole[:6]] == [e.id for e in before]
    # An entry with more than type, version and data stays in its stream.
    assert fold_later() == 0 and client.exists(keys.events(run_id))
    client.delete(keys.events(run_id))
    add("notification.sent", sent(3))
    for n in range(5):
        add("interrupt.escalated", f'{{"interruptId":"int_aaaa","level":{n}}}')
    whole = store.runs.events(run_id)
    assert len(whole) == 12
    client.delete(keys.shard_of(run_id).fold_cursor)
    assert fold_later() == 1
    kept = store.runs.events(run_id)
    # The newest LAYBY_EVENTS_MAX, the sends among them whole without their plan.
    assert kept == whole[-8:]
    assert [(e.type, e.data.get("id"), e.data.get("attempts")) for e in kept[:3:2]] == [
        ("notification.sent", "ntf_bbbb", 2), ("notification.sent", "ntf_bbbb", 3)]
    client.flushdb()
    client.close()


def _replayed(system: LaybySystem, run_id: str, started_with: list[dict[str, Any]]
              ) -> list[dict[str, Any]]:
    """The history a client rebuilds from the messages it started the run with and the run's
    events: each step's messages at `from`."""
    rebuilt = list(started_with)
    for event in sse.history(system, run_id):
        data = event["data"]["data"]
        if event["event"] in STEP_EVENTS:
            rebuilt[data["from"]:] = data["messages"]
    return rebuilt


@pytest.mark.parametrize("agent", ["test.ping_then_ask", "test.twice"])
def test_a_parked_run_holds_its_history_once_and_its_events_still_carry_it(
        isolated: Any, agent: str) -> None:
    """A parked run keeps its conversation once, in the run: its events are stored without
    the steps' messages (a conversation would otherwise be held twice, for as long as the
    run waits). Readers get them all the same: a client replaying the events rebuilds the
    run's history, parked and after it finished. `test.twice` parks a second time from its
    resume, which rewrites the parked model message."""
    system = isolated().start()
    (run_id,) = _park(system, 1, agent)
    with redis.Redis.from_url(system.redis_url, decode_responses=True) as client:
        keys = keys_of(client, system.settings.key_prefix)
        # An answer's own "messages" (its payload's, not a step's) is the reviewer's: a
        # later park must leave it as it was sent.
        answers = [{"by": "test", "messages": ["kept as sent"]}, {"second": True}] \
            if agent == "test.twice" else ["yes"]
        for parks, payload in enumerate(answers, start=1):
            stored = client.xrange(keys.events(run_id))
            assert [f["type"] for _, f in stored].count("run.interrupted") == parks
            # (A step's messages are a field of their own, dropped by the park.)
            assert not [f for _, f in stored if "messages" in f]
            run = system.run(run_id)
            assert _replayed(system, run_id, run["messages"][:1]) == run["messages"]
            (question,) = system.open_interrupts(run)
            assert system.answer(run_id, question["id"], payload=payload).status_code == 200
            if parks < len(answers):
                system.wait_status(run_id, "interrupted")
    done = system.wait_status(run_id, "completed")
    assert _replayed(system, run_id, done["messages"][:1]) == done["messages"]
    assert done["result"] in ("You said yes.", "Result: launch")
    given = [e["data"]["data"]["payload"] for e in sse.history(system, run_id)
             if e["event"] == "interrupt.answered"]
    assert given == answers


def test_a_run_parked_by_0_1_0s_predecessors_is_answered_and_finishes_once_migrated(
        isolated: Any) -> None:
    """What an upgrade from 0.1.0 may find: a parked run as 0.1.0's predecessors kept it
    (its interrupt and open interrupts in keys of their own; none of the run's newer
    fields). Every process stopped, `layby migrate` rewrites it; started again, layby
    shows it, takes its answer and finishes it."""
    system = isolated().start()
    (run_id,) = _park(system, 1)
    keys = Keys(system.settings.key_prefix)
    system.stop()
    with redis.Redis.from_url(system.redis_url, decode_responses=True) as client:
        moved = as_0_1_0s_predecessors_kept_it(client, system.settings.key_prefix, run_id)
        assert [k for k in moved if k.startswith("i:")], moved
        migrated = system.layby("migrate")
        assert migrated.returncode == 0, migrated.stderr
        assert ", 1 changed" in migrated.stdout, migrated.stdout
        # the older layout is gone
        assert not client.exists(*old_keys(keys, run_id))
        # (And migration 2 moved it to the sharded layout.)
        assert not client.exists(keys.run(run_id))
        held = client.hkeys(keys_of(client, system.settings.key_prefix).run(run_id))
        assert held and "id" not in held
    system.start_again()

    with system.api() as api:
        listed = api.get("/v1/runs", params={"status": "interrupted"}).json()["runs"]
    assert [r["openInterrupts"] for r in listed if r["id"] == run_id] == [1]
    (question,) = system.open_interrupts(system.run(run_id))
    assert system.answer(run_id, question["id"], payload="Jaws").status_code == 200
    done = system.wait_status(run_id, "completed")
    assert done["result"].startswith("Right!")


def test_back_to_back_sweeps_fold_and_prune_once(store_server: EmbeddedRedis) -> None:
    """Folding looks for runs parked LAYBY_FOLD_EVENTS_AFTER_S ago and pruning for runs
    finished LAYBY_RETENTION_S ago: a pass every second need not look for either (at 48
    shards they were 240 of an idle pass's 590 commands). Passes back to back look once; a
    pass half the fold delay later folds again; pruning waits its minute."""
    from layby.control import build
    from layby.tasks.sweeper import sweep

    settings = Settings(redis_url=store_server.url.rsplit("/", 1)[0] + "/9",
                        fold_events_after_s=1)
    client = redis.Redis(port=store_server.port, db=9, decode_responses=True)
    client.flushdb()
    rt = build(settings)
    shards = len(rt.store.shards)

    def calls(command: str) -> int:
        return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))

    def one_pass() -> tuple[int, int]:
        """(fold cursors read, index entries pruned) by one sweep."""
        gets, prunes = calls("get"), calls("zremrangebyscore")
        sweep(rt)
        return calls("get") - gets, calls("zremrangebyscore") - prunes

    try:
        first, again, later = one_pass(), one_pass(), (time.sleep(0.6), one_pass())[1]
        assert first[0] >= shards and first[1] == 3 * shards  # completed, failed, cancelled
        assert again[0] < shards and again[1] == 0
        assert later[0] >= shards and later[1] == 0
    finally:
        rt.store.redis.close()
        client.flushdb()
        client.close()
