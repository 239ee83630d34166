"""Rolling a deployment one process at a time: a gateway told to stop (SIGTERM) ends its
open event streams cleanly, and the client takes them up at another gateway with
`Last-Event-ID`, missing nothing."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator

import httpx
import redis

from layby.broker_config import TURNS, make_celery
from layby.ops.supervisor import gateway_argv
from tests import tasks_new_release
from tests.harness import LaybySystem, Proc, free_port, wait_until


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

    system.env_overrides["LAYBY_TASK_MODULES"] = "tests.tasks_new_release"
    system.start_worker("worker-new")
    wait_until(lambda: client.get("ran") is not None, 60, what="the newer worker to run it")
    time.sleep(1)
    assert client.get("ran") == "1"  # once
