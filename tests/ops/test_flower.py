"""`layby flower`: a real Flower process on loopback, watching the session's layby system.

After demo runs through the HTTP API, Flower's REST API lists layby's tasks with their names
and states, their arguments carry ids only, every layby queue has a length, the workers are
there; requests without (or with wrong) credentials are refused; the process listens on
127.0.0.1 only and its password is on no command line.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from layby.broker_config import QUEUES
from layby.ops.embedded import free_port
from tests.support.harness import API_KEY, ROOT, LaybySystem, Proc, wait_until

USER = "ops"
PASSWORD = "flower-test-pw-7f3a9c"
AUTH = (USER, PASSWORD)


@dataclass
class Flower:
    proc: Proc
    url: str

    def get(self, path: str, auth: Any = AUTH, **params: Any) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", auth=auth, params=params, timeout=15)

    def json(self, path: str, **params: Any) -> Any:
        reply = self.get(path, **params)
        assert reply.status_code == 200, (reply.status_code, reply.text[:500])
        return reply.json()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthcheck", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def flower(system: LaybySystem, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flower]:
    port = free_port()
    logs = tmp_path_factory.mktemp("flower")
    env = {**system.env, "LAYBY_FLOWER_BASIC_AUTH": f"{USER}:{PASSWORD}",
           "LAYBY_FLOWER_PORT": str(port), "LAYBY_LOG_FORMAT": "json"}
    env.pop("LAYBY_FLOWER_HOST", None)
    proc = Proc("flower", [sys.executable, "-m", "layby.ops.cli", "flower"], logs / "flower.log")
    proc.start(env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _healthy(url) or proc.process.poll() is not None, 60,
                   every=0.5, what="Flower to listen")
        assert proc.process.poll() is None, proc.output()
        yield Flower(proc, url)
    finally:
        proc.stop()
        assert proc.process.poll() is not None


def _ids_only(args: str, run_ids: set[str]) -> None:
    """Arguments of layby's own tasks: a run id, then a version or a notification id."""
    values, agent = _shown(args)
    assert agent in (None, "demo.trivia", "demo.transfer"), args
    assert isinstance(values, (list, tuple)) and 1 <= len(values) <= 2, args
    assert values[0] in run_ids, args
    for value in values[1:]:
        assert isinstance(value, int) or re.fullmatch(r"[A-Za-z0-9_:.-]{1,80}", str(value)), args


def test_tasks_queues_and_workers_with_credentials(system: LaybySystem, flower: Flower) -> None:
    # Flower's workers view fills from the workers' heartbeats and its inspect calls.
    workers = wait_until(lambda: flower.json("/api/workers", refresh="true"), 60, every=1,
                         what="Flower to see the workers")
    assert any(name.startswith("layby-") for name in workers), list(workers)

    trivia = system.start_run("demo.trivia", "Ask me a movie question")
    transfer = system.start_run("demo.transfer", "Send 250 to Bob")
    run_ids = {trivia["id"], transfer["id"]}
    for run, payload in ((trivia, "Jaws"), (transfer, {"approved": True})):
        parked = system.wait_status(run["id"], "interrupted")
        (question,) = system.open_interrupts(parked)
        assert system.answer(run["id"], question["id"], payload=payload).status_code == 200
        system.wait_status(run["id"], "completed")

    def mine() -> dict[str, dict[str, Any]]:
        tasks = flower.json("/api/tasks", limit=5000)
        return {uuid: t for uuid, t in tasks.items()
                if t.get("args") and any(r in t["args"] for r in run_ids)}

    def finished() -> dict[str, dict[str, Any]] | None:
        tasks = mine()
        names = {t["name"] for t in tasks.values() if t["state"] == "SUCCESS"}
        # A park announces its interrupts itself (no task between): two tasks a run.
        wanted = {"layby.run_turn", "layby.resume_run"}
        return tasks if wanted <= names else None

    tasks = wait_until(finished, 60, every=1, what="Flower to list the runs' tasks")
    for task in tasks.values():
        assert task["name"].startswith("layby."), task
        assert task["state"] in ("PENDING", "RECEIVED", "STARTED", "SUCCESS", "RETRY"), task
        _ids_only(task["args"], run_ids)
        assert task["kwargs"] in ("{}", None, ""), task
        # Nothing people typed or answered, no tokens or keys.
        for secret in ("movie", "Jaws", "Bob", "approved", "test-key", "Bearer"):
            assert secret not in str(task), (secret, task)
    # Each run's tasks are resolvable by id, with a name and a state.
    some = next(iter(tasks))
    info = flower.json(f"/api/task/info/{some}")
    assert info["name"] == tasks[some]["name"] and info["state"]

    lengths = flower.json("/api/queues/length")["active_queues"]
    names = {q["name"] for q in lengths}
    assert set(QUEUES) - {"layby.sweep"} <= names, lengths
    assert all(isinstance(q["messages"], int) for q in lengths)


def _shown(args: str) -> tuple[list[Any], str | None]:
    """Arguments as Flower shows layby's: `agent=<name> ` when known, then the ids."""
    agent = re.match(r"agent=(\S+) ", args)
    return ast.literal_eval(args[agent.end():] if agent else args), \
        agent.group(1) if agent else None


def test_no_sweep_rows_and_a_runs_steps_found_by_its_id(system: LaybySystem, flower: Flower,
                                                        tmp_path: Path) -> None:
    """What was observed: the sweeper's `layby.sweep` ran every second, 370 of 391 tasks
    after six minutes, and nothing said which run or agent a task served. Now the sweeper
    sweeps on its own clock (no task; its liveness is in /metrics), and a run's tasks show
    its id and agent: searching Flower's tasks page for the run id finds its steps. The
    screenshot is `flower-tasks.png` in the test's folder."""
    from playwright.sync_api import sync_playwright

    from tests.support.browser import launch

    run = system.start_run("demo.transfer", "Send 250 to Bob")
    run_id = run["id"]
    parked = system.wait_status(run_id, "interrupted")
    (approval,) = system.open_interrupts(parked)
    assert system.answer(run_id, approval["id"], payload={"approved": True}).status_code == 200
    system.wait_status(run_id, "completed")

    def steps() -> dict[str, dict[str, Any]] | None:
        tasks = flower.json("/api/tasks", limit=5000)
        mine = {u: t for u, t in tasks.items() if run_id in (t.get("args") or "")}
        done = {t["name"] for t in mine.values() if t["state"] == "SUCCESS"}
        return mine if {"layby.run_turn", "layby.resume_run"} <= done else None

    mine = wait_until(steps, 60, every=1, what="Flower to list the run's steps")
    for task in mine.values():
        ids, agent = _shown(task["args"])
        assert ids[0] == run_id and agent == "demo.transfer", task
    everything = flower.json("/api/tasks", limit=5000)
    assert not [t for t in everything.values() if t["name"] == "layby.sweep"]
    # The sweeper is alive all the same, sweeping every LAYBY_SWEEP_INTERVAL_S (0.5 s).
    age = _sweep_age(system)
    assert 0 <= age < 5, age

    shot = tmp_path / "flower-tasks.png"
    with sync_playwright() as pw:
        browser = launch(pw)
        context = browser.new_context(http_credentials={"username": USER,
                                                        "password": PASSWORD},
                                      viewport={"width": 1920, "height": 600})
        page = context.new_page()
        page.goto(f"{flower.url}/tasks")
        page.fill("#tasks-table_wrapper input[type=search]", run_id)
        rows = page.locator("#tasks-table tbody tr")

        def shown() -> list[str] | None:
            texts = rows.all_inner_texts()
            return texts if len(texts) >= 2 and all(run_id in t for t in texts) else None

        texts = wait_until(shown, 30, what="the tasks page to show the run's steps")
        page.screenshot(path=str(shot), full_page=True)
        whole = page.inner_text("body")
        browser.close()
    assert len(texts) == len(mine), (texts, mine)
    assert any("layby.run_turn" in t for t in texts) and any("layby.resume_run" in t
                                                             for t in texts), texts
    assert all("agent=demo.transfer" in t for t in texts), texts
    assert "layby.sweep" not in whole
    assert shot.stat().st_size > 10_000


def test_a_step_that_waits_to_retry_says_so_in_flower_without_the_errors_text(
        system: LaybySystem, flower: Flower) -> None:
    """Operations see in Flower why a run's step ended without a commit: while the run waits,
    its step's task (one row a step: the try queued when due is the same task again) says
    the tool, the attempt, the error's type and the wait; the error's own text (a tool's,
    which may hold anything) stays in the run, for those who may read it."""
    run_id = system.start_run("test.exporter", "8")["id"]
    system.wait_status(run_id, "retrying")

    def waiting() -> str | None:
        tasks = flower.json("/api/tasks", limit=5000)
        found = [str(t.get("result")) for t in tasks.values()
                 if run_id in (t.get("args") or "") and t["state"] == "SUCCESS"
                 and t["name"] == "layby.run_turn"]
        return found[0] if found else None

    shown = wait_until(waiting, 30, every=0.5, what="Flower to show the waiting step")
    assert "retrying in 8.0 s: export_day attempt 1 of 5 failed (RetryLater)" in shown
    assert "exporter busy" not in shown
    assert system.run(run_id)["status"] == "retrying"
    done = system.wait_status(run_id, "completed", timeout=60)
    assert done["result"].startswith("exported on attempt 2")


def _sweep_age(system: LaybySystem) -> float:
    """`layby_sweeper_last_sweep_age_seconds` from the gateway's /metrics."""
    text = httpx.get(f"{system.base_url}/metrics", timeout=10,
                     headers={"Authorization": f"Bearer {API_KEY}"}).text
    line = next(ln for ln in text.splitlines()
                if ln.startswith("layby_sweeper_last_sweep_age_seconds "))
    return float(line.split()[1])


def test_a_task_is_listed_from_the_moment_it_is_sent(system: LaybySystem,
                                                     flower: Flower) -> None:
    """A message no worker has taken yet (on a queue nobody reads) is already in Flower."""
    from layby.broker_config import RUN_TURN, Settings, make_celery

    app = make_celery(Settings(redis_url=system.redis_url))
    queue = f"flower-probe-{os.getpid()}"
    run_id = f"run_flowerprobe{os.getpid()}"
    sent = app.send_task(RUN_TURN, args=[run_id, 1], queue=queue, routing_key=queue,
                         exchange="")
    try:
        task = wait_until(lambda: flower.json("/api/tasks", limit=5000).get(sent.id), 60,
                          every=1, what="Flower to list a task just sent")
        assert task["name"] == RUN_TURN and task["state"] == "PENDING", task
        assert ast.literal_eval(task["args"]) == [run_id, 1]
    finally:
        with app.connection_for_write() as conn:
            conn.default_channel.client.delete(queue)
        app.close()


@pytest.mark.integration
def test_logs_json_lines_without_the_password(tmp_path: Path) -> None:
    # LAYBY_LOG_FORMAT=json reaches Flower too: no banner, no tornado-format lines. A broker
    # that is not there makes it log something.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LAYBY_LOG_FORMAT": "json",
           "LAYBY_REDIS_URL": f"redis://:broker-pw-1@127.0.0.1:{free_port()}/0",
           "LAYBY_FLOWER_BASIC_AUTH": f"{USER}:{PASSWORD}", "LAYBY_FLOWER_PORT": str(free_port())}
    proc = Proc("flower", [sys.executable, "-m", "layby.ops.cli", "flower"], tmp_path / "f.log")
    proc.start(env)
    try:
        wait_until(lambda: "flower.events" in proc.output(), 30, what="Flower's complaint")
    finally:
        proc.stop()
    lines = [json.loads(line) for line in proc.output().splitlines()
             if line.strip() and not line.startswith(("Exception ignored", "Traceback", " "))]
    assert any(line["logger"] == "flower.events" and line["level"] == "ERROR"
               for line in lines), lines
    assert "Visit me at" not in proc.output()
    assert PASSWORD not in proc.output() and "broker-pw-1" not in proc.output()


def test_refused_without_credentials(flower: Flower) -> None:
    for path in ("/api/tasks", "/api/workers", "/api/queues/length", "/tasks", "/broker"):
        assert flower.get(path, auth=None).status_code == 401, path
        assert flower.get(path, auth=(USER, "wrong")).status_code == 401, path
    assert flower.get("/api/workers").status_code == 200


def test_loopback_only_and_no_secret_on_the_command_line(flower: Flower) -> None:
    process = psutil.Process(flower.proc.process.pid)
    listening = [c.laddr for p in [process, *process.children(recursive=True)]
                 for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert listening, "Flower listens on nothing"
    assert {addr.ip for addr in listening} == {"127.0.0.1"}, listening
    for p in [process, *process.children(recursive=True)]:
        assert PASSWORD not in " ".join(p.cmdline())
    # Another address on this machine does not answer.
    port = listening[0].port
    others = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
              if a.family.name == "AF_INET" and not a.address.startswith("127.")]
    for address in others[:2]:
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://{address}:{port}/healthcheck", timeout=2)


def test_refuses_to_start_without_credentials(system: LaybySystem, tmp_path: Path) -> None:
    env = {k: v for k, v in system.env.items()
           if not k.startswith(("FLOWER_", "LAYBY_FLOWER_"))}
    env.update({"LAYBY_DATA_DIR": str(tmp_path), "LAYBY_FLOWER_PORT": str(free_port())})
    done = subprocess.run([sys.executable, "-m", "layby.ops.cli", "flower"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "LAYBY_FLOWER_BASIC_AUTH" in done.stderr


def test_layby_up_credentials_file_is_private(tmp_path: Path) -> None:
    from layby.broker_config import Settings
    from layby.ops.flower import ensure_credentials, flower_argv, flower_env

    settings = Settings(data_dir=tmp_path / "data")
    made = ensure_credentials(settings)
    assert made.startswith("layby:") and len(made) > 20
    assert ensure_credentials(settings) == made
    assert (settings.flower_auth_file.stat().st_mode & 0o777) == 0o600
    env = flower_env(settings, {"FLOWER_UNAUTHENTICATED_API": "1", "FLOWER_ADDRESS": "0.0.0.0"})
    assert env["FLOWER_BASIC_AUTH"] == made
    assert "FLOWER_UNAUTHENTICATED_API" not in env and "FLOWER_ADDRESS" not in env
    argv = flower_argv(settings)
    assert "--address=127.0.0.1" in argv and "--port=5555" in argv
    assert made.split(":")[1] not in " ".join(argv)
    assert os.path.exists(argv[argv.index("flower") + 1].split("=", 1)[1])


@pytest.mark.integration
def test_layby_up_starts_flower_and_prints_its_credentials(tmp_path: Path) -> None:
    from tests.ops.test_up import _printed, _stop, _up

    data, log = tmp_path / "data", tmp_path / "up.log"
    proc = _up(data, free_port(), log)
    try:
        url = wait_until(lambda: _printed(log, "flower") or proc.poll() is not None, 90,
                         every=0.5, what="layby up to print Flower's URL")
        assert proc.poll() is None, log.read_text()
        credentials = (data / "flower.auth").read_text().strip()
        assert (data / "flower.auth").stat().st_mode & 0o777 == 0o600
        assert credentials in log.read_text()
        user, password = credentials.split(":", 1)
        assert url.startswith("http://127.0.0.1:")
        wait_until(lambda: _healthy(url), 60, every=0.5, what="layby up's Flower")
        workers = wait_until(
            lambda: httpx.get(f"{url}/api/workers?refresh=true", auth=(user, password),
                              timeout=15).json(),
            60, every=1, what="layby up's Flower to see its worker")
        assert any(name.startswith("layby-") for name in workers)
        assert httpx.get(f"{url}/api/workers", timeout=15).status_code == 401
        flower_procs = [p for p in psutil.Process(proc.pid).children(recursive=True)
                        if "flower" in p.cmdline()]
        assert flower_procs and all(password not in " ".join(p.cmdline())
                                    for p in flower_procs)
    finally:
        if proc.poll() is None:
            assert _stop(proc) == []


def test_flower_pages_hide_a_start_runs_input() -> None:
    from types import SimpleNamespace

    from layby.broker_config.flowerconfig import format_task

    task = SimpleNamespace(name="layby.start_run", args="['demo.trivia', 'my secret text']",
                           kwargs="{'run_id': 'run_order_42', 'metadata': {'order': 42}}")
    shown = format_task(task)
    assert "secret" not in shown.args and "order" not in shown.kwargs.replace("run_order", "")
    assert "demo.trivia" in shown.args and "run_order_42" in shown.kwargs
    other = SimpleNamespace(name="layby.run_turn", args="['run_1', 2]", kwargs="{}")
    assert format_task(other).args == "['run_1', 2]"
