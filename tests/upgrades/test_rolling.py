"""Rolling a deployment one process at a time: a gateway told to stop (SIGTERM) ends its
open event streams cleanly, and the client takes them up at another gateway with
`Last-Event-ID`, missing nothing; a task message an older worker cannot read waits for a
newer one; and a whole deployment rolled from one format to the next under load."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest
import redis

from layby import Client
from layby.broker_config import JOBS, NOTIFY, TURNS, make_celery
from layby.ops.supervisor import gateway_argv, sweeper_argv, worker_argv
from layby.parking import Keys, formats
from layby.wire import Status
from tests.support import tasks_new_release
from tests.support.front import Front
from tests.support.harness import API_KEY, ROOT, LaybySystem, Proc, free_port, wait_until


def _frames(lines: Iterator[str]) -> Iterator[dict[str, str]]:
    """SSE frames as {field: value} (comments left out), each when its blank line comes."""
    frame: dict[str, str] = {}
    for line in lines:
        if not line:
            if frame:
                yield frame
            frame = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(": ")
            frame[name] = value


def test_a_stopping_gateway_ends_its_streams_and_they_go_on_at_another(
        isolated: Callable[..., LaybySystem]) -> None:
    system = isolated().start()
    second = Proc("gateway-2", gateway_argv("127.0.0.1", port := free_port()),
                  system.logs / "gateway-2.log")
    second.start(system.env)
    system.procs["gateway-2"] = second
    other = _at(system, port)
    wait_until(other._gateway_up, 30, what="the second gateway")
    run = system.start_run("demo.trivia", "Ask me a movie question")
    system.wait_status(run["id"], "interrupted")

    seen: list[dict[str, str]] = []
    first = system.procs["gateway"]
    headers = {"Authorization": f"Bearer {system.env['LAYBY_API_KEYS']}"}
    with httpx.stream("GET", f"{system.base_url}/v1/runs/{run['id']}/events",
                      headers=headers, timeout=30) as stream:
        frames = _frames(stream.iter_lines())
        while not any(f.get("event") == "run.interrupted" for f in seen):
            seen.append(next(frames))
        assert first.process is not None
        stopped_at = time.monotonic()
        first.process.send_signal(signal.SIGTERM)
        rest = list(frames)  # the stream ends: not cut, nor left open
    assert rest == [{"retry": "500"}], rest
    first.process.wait(timeout=10)
    assert time.monotonic() - stopped_at < 5, "the gateway waited on its open stream"
    # (uvicorn, done, raises the signal it caught again: the exit status says SIGTERM.)
    assert first.process.returncode in (0, -signal.SIGTERM), first.output()[-2000:]
    assert "Traceback" not in first.output()
    # Out of the registry of processes as it stopped, not a lease later.
    client = redis.Redis.from_url(system.redis_url, decode_responses=True)
    about = client.hgetall(formats.keys_of(client, system.settings.key_prefix).workers_about)
    kinds = sorted(told.split()[0] for told in about.values())
    assert kinds == ["gateway", "sweeper", "worker"], about  # the other gateway
    assert not [n for n in about if n.endswith(f":{first.process.pid}")]

    # Answered meanwhile; the stream goes on at the other gateway after the last event read.
    question = other.open_interrupts(other.run(run["id"]))[0]
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers) as api:
        answered = api.post(f"/v1/runs/{run['id']}/interrupts/{question['id']}",
                            json={"status": "resolved", "payload": "Jaws"})
        assert answered.status_code == 200, answered.text
    last = seen[-1]["id"]
    with httpx.stream("GET", f"http://127.0.0.1:{port}/v1/runs/{run['id']}/events",
                      headers={**headers, "Last-Event-ID": last}, timeout=30) as stream:
        after = list(_frames(stream.iter_lines()))
    kinds = [f["event"] for f in after]
    assert kinds[0] != "run.interrupted" and kinds[-1] == "run.completed", kinds
    ids = [f["id"] for f in seen if "id" in f] + [f["id"] for f in after]
    assert len(ids) == len(set(ids)) and ids == sorted(ids, key=_order)


def _stored_format(raw: str) -> int:
    """The format a run's stored metadata was written in (tests/support/format3.py, which this
    process must not import: it would register format 3 in the test process itself)."""
    return 3 if raw.startswith("z:") else 2


def _order(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)


def _at(system: LaybySystem, port: int) -> LaybySystem:
    """The same system, seen through the gateway on `port`."""
    return LaybySystem(system.redis_url, system.logs, system.env_overrides, port=port)


def test_a_task_message_an_older_worker_cannot_read_waits_for_one_that_can(
        isolated: Callable[..., LaybySystem]) -> None:
    system = isolated().start()
    old = system.procs["worker"]
    client = redis.Redis.from_url(system.redis_url, decode_responses=True)
    make_celery(system.settings).send_task(tasks_new_release.NAME, args=["ran"],
                                           queue=TURNS)
    wait_until(lambda: "handed back to its queue" in old.output(), 20,
               what="the older worker to hand the message back")
    time.sleep(2)
    assert client.get("ran") is None
    assert "tests.new_release_task" in old.output()

    system.env_overrides["LAYBY_TASK_MODULES"] = "tests.support.tasks_new_release"
    system.start_worker("worker-new")
    wait_until(lambda: client.get("ran") is not None, 60, what="the newer worker to run it")
    time.sleep(1)
    assert client.get("ran") == "1"  # once


class Recording(httpx.HTTPTransport):
    """The client's transport, noting every reply that was not a 2xx (status, Retry-After)
    and the longest any call waited for its reply's head."""

    def __init__(self, seen: Seen) -> None:
        super().__init__()
        self.seen = seen

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        began = time.monotonic()
        try:
            response = super().handle_request(request)
        except httpx.TransportError as exc:
            self.seen.note(f"{type(exc).__name__} on {request.method}", None)
            raise
        finally:
            self.seen.waited(time.monotonic() - began)
        if response.status_code >= 300:
            self.seen.note(f"{response.status_code} on {request.method} "
                           f"{_route(request.url.path)}", response.headers.get("retry-after"))
        return response


def _route(path: str) -> str:
    return "/".join("{id}" if part.startswith(("run_", "int_")) else part
                    for part in path.split("/"))


@dataclass
class Seen:
    replies: Counter[str] = field(default_factory=Counter)
    without_retry_after: list[str] = field(default_factory=list)
    longest_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, what: str, retry_after: str | None) -> None:
        with self.lock:
            self.replies[what] += 1
            if what.startswith("5") and not retry_after:
                self.without_retry_after.append(what)

    def waited(self, seconds: float) -> None:
        with self.lock:
            self.longest_s = max(self.longest_s, seconds)


def _client_loop(url: str, key: str, seen: Seen, me: int, stop: threading.Event) -> None:
    """One client: a transfer started, its approval answered, until told to stop; every
    run it starts is one it waits to see completed."""
    with Client(url, key, transport=Recording(seen)) as client:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                run = client.start("demo.transfer", input=f"Send {n} to Client {me}",
                                   metadata={"client": me, "n": n})
                with seen.lock:
                    seen.runs.append(run.id)
                parked = client.wait(run.id, "interrupted", timeout=120)
                [approval] = [i for i in parked.interrupts if i.state == "open"]
                client.answer(run.id, approval.id, {"approved": True})
                client.wait(run.id, "completed", timeout=120)
            except Exception as exc:  # noqa: BLE001  (what the test reports: a call failed)
                with seen.lock:
                    seen.errors.append(f"client {me}, run {n}: {exc!r}")


@pytest.mark.slow
def test_a_deployment_rolled_one_process_at_a_time_under_load(
        isolated: Callable[..., LaybySystem]) -> None:
    """The older release (format 2) runs a gateway, a worker and the sweeper behind a
    front; four clients keep starting and approving transfers. The newer release (format 3,
    tests/support/format3.py) replaces the gateway, then the worker, then the sweeper, one process
    at a time; the store switches to format 3 once no older process is left, and `layby
    migrate` brings the records written before to it. Every run completes, its money moved
    exactly once; no reply is a 5xx but 503 with Retry-After; every call goes through."""
    old = isolated(LAYBY_AGENT_MODULES="layby.demo.agents")
    old.worker_count = 2
    old.start()
    store = redis.Redis.from_url(old.redis_url, decode_responses=True)
    keys = formats.keys_of(store, old.settings.key_prefix)
    newer = {**old.env, "LAYBY_TASK_MODULES": "tests.support.format3"}
    front = Front([old.port])
    seen, stop = Seen(), threading.Event()
    clients = [threading.Thread(target=_client_loop, args=(front.url, API_KEY, seen, i, stop))
               for i in range(4)]
    began = time.monotonic()
    for thread in clients:
        thread.start()
    try:
        figures = _roll(old, store, keys, newer, front, seen, stop, clients, began)
    finally:
        stop.set()
        for thread in clients:
            thread.join(timeout=180)
        front.close()
    print("rolling upgrade:", json.dumps(figures))
    (old.logs / "rolling-upgrade.json").write_text(json.dumps(figures, indent=2))


def _roll(old: LaybySystem, store: redis.Redis, keys: Keys, newer: dict[str, str],
          front: Front, seen: Seen, stop: threading.Event, clients: list[threading.Thread],
          began: float) -> dict[str, object]:

    def completed() -> int:
        return sum(int(store.zcard(shard.index(Status.COMPLETED))) for shard in keys.shards)

    def more_complete(than: int) -> None:
        wait_until(lambda: completed() >= than + 4, 60, what="runs to complete")

    more_complete(0)
    # The gateway: the newer one joins the front, the older one drains and stops.
    gateway = Proc("gateway-new", gateway_argv("127.0.0.1", port := free_port()),
                   old.logs / "gateway-new.log")
    gateway.start(newer)
    wait_until(_at(old, port)._gateway_up, 30, what="the newer gateway")
    front.backends = [old.port, port]
    more_complete(completed())
    old.procs["gateway"].stop()
    front.backends = [port]
    assert formats.read(store, keys).written == 2  # an older worker and sweeper live
    more_complete(completed())
    # The worker, then the sweeper: each newer one started before the older one stops.
    workers = Proc("worker-new", worker_argv(old.settings, [TURNS, JOBS, NOTIFY, "celery"],
                                             2, "INFO"), old.logs / "worker-new.log")
    workers.start(newer)
    wait_until(lambda: "ready." in workers.output(), 60, what="the newer worker")
    old.procs["worker"].stop()
    more_complete(completed())
    sweeper = Proc("sweeper-new", sweeper_argv(old.settings), old.logs / "sweeper-new.log")
    sweeper.start(newer)
    wait_until(lambda: store.get(keys.swept) is not None, 30, what="a sweep")
    old.procs["sweeper"].stop()
    # No older process left: the store writes format 3, new runs' metadata compressed.
    wait_until(lambda: formats.read(store, keys).written == 3, 30, what="the switch")
    # (Each process learns of the switch at its next beat.)
    wait_until(lambda: _stored_format(
        store.hget(keys.run(seen.runs[-1]), "metadata") or "") == 3, 30,
        what="runs written in format 3")
    migrate = subprocess.run([sys.executable, "-m", "tests.support.format3", "migrate"], env=newer,
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert migrate.returncode == 0, migrate.stderr
    assert "the store is at format 3" in migrate.stdout
    more_complete(completed())
    stop.set()
    for thread in clients:
        thread.join(timeout=180)
    elapsed = time.monotonic() - began
    for proc in (gateway, workers, sweeper):
        old.procs[proc.name] = proc

    assert seen.errors == []
    every = list(seen.runs)
    with _at(old, port).api() as api:
        statuses = Counter(api.get(f"/v1/runs/{run_id}").json()["status"] for run_id in every)
    assert statuses == {"completed": len(every)}, statuses
    transfers = Counter(entry["run"] for entry in _at(old, port).ledger()["transfers"])
    assert set(transfers) == set(every) and set(transfers.values()) == {1}
    assert all(_stored_format(store.hget(keys.run(r), "metadata") or "") == 3
               for r in every)
    assert seen.without_retry_after == []
    assert not [what for what in seen.replies if what[0] == "5" and not what.startswith("503")]
    figures = {"runs": len(every), "completed": statuses["completed"],
               "lost": len(every) - statuses["completed"],
               "duplicated": sum(n - 1 for n in transfers.values()),
               "non_2xx": dict(seen.replies), "longest_call_s": round(seen.longest_s, 2),
               "seconds": round(elapsed, 1)}
    return figures
