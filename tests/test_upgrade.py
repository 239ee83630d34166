"""Upgrading from the previous release while runs wait: the previous release (the newest
CHANGELOG.md names with its commit, 0.1.0 today) is built from the git history (`git
archive`) into a wheel, installed in a virtualenv of its own next to this code, and run on
a real Valkey: it parks runs, it is stopped (0.1.0 announces no version, so this one step
stops every process), `layby migrate` versions the store, and this layby's processes
complete the runs it parked and give every run's events as it gave them (a finished one's
steps' messages, which 0.1.0 kept inside their data, kept apart now). (When the previous
release is 0.2.0 or later, which announce their format, this test must run the two side by
side instead, as tests/test_rolling.py rolls a deployment: the next release's work.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import time
from collections.abc import Iterator
from importlib import metadata
from io import BytesIO
from pathlib import Path

import httpx
import pytest
import redis

from layby.ops.embedded import EmbeddedRedis
from layby.parking import Keys
from tests.harness import ROOT, LaybySystem, Proc, free_port, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RELEASE = re.compile(r"^## (\d+)\.(\d+)\.(\d+) \(.*commit ([0-9a-f]{7,40})\)")


def _previous_release() -> tuple[str, str]:
    """The newest release before this code's version, and its commit, as CHANGELOG.md
    records them ("## 0.1.0 (2026-11-26, commit 4d81e2c)")."""
    mine = tuple(int(n) for n in metadata.version("layby").split(".")[:3])
    found = [(tuple(int(n) for n in m.groups()[:3]), m[4])
             for line in (ROOT / "CHANGELOG.md").read_text().splitlines()
             if (m := RELEASE.match(line))]
    older = sorted((v, commit) for v, commit in found if v < mine)
    assert older, "CHANGELOG.md names no earlier release with its commit"
    version, commit = older[-1]
    return ".".join(map(str, version)), commit


PREVIOUS, PREVIOUS_COMMIT = _previous_release()


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv with layby 0.1.0's wheel, built from its commit, and this one's
    dependencies (0.1.0 pins the same ranges): its `bin/` directory."""
    work = tmp_path_factory.mktemp("release")
    commit = PREVIOUS_COMMIT
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit],
                             capture_output=True, check=False)
    assert archive.returncode == 0, (
        f"git archive {commit} failed ({archive.stderr.decode().strip()}): the test needs "
        "the project's git history (a clone, not a shallow one or an export)")
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(work / "src", filter="data")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                            "--no-build-isolation", "-w", str(work / "wheels"),
                            str(work / "src")], capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stderr
    [wheel] = (work / "wheels").glob(f"layby-{PREVIOUS}-*.whl")
    venv = work / "venv"
    # Nothing of this checkout on the old release's path.
    alone = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # This environment's packages (not its editable layby: a .pth line adds a folder, the
    # .pth files in it are not read), then 0.1.0's wheel in the venv's own site-packages.
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True,
                               env=alone).stdout.strip())
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                    "--no-deps", str(wheel)], check=True, env=alone)
    shown = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import layby, importlib.metadata as m; "
                            "print(m.version('layby'), layby.__file__)"],
                           capture_output=True, text=True, check=True, cwd=work, env=alone)
    assert shown.stdout.startswith(PREVIOUS) and str(site) in shown.stdout, shown.stdout
    return venv / "bin"


class PreviousSystem:
    """0.1.0's worker, sweeper and gateway, started with its own `layby` command, away
    from this checkout (its folder is not on their path)."""

    def __init__(self, bin_dir: Path, env: dict[str, str], logs: Path) -> None:
        self.env = {**env, "PYTHONPATH": ""}
        self.port = free_port()
        layby = str(bin_dir / "layby")
        self.procs = [Proc(name, argv, logs / f"old-{name}.log") for name, argv in (
            ("worker", [layby, "worker", "--concurrency", "2"]),
            ("sweeper", [layby, "sweeper"]),
            ("gateway", [layby, "gateway", "--host", "127.0.0.1", "--port", str(self.port)]))]
        self.cwd = logs

    def start(self) -> None:
        for proc in self.procs:
            proc.log.parent.mkdir(parents=True, exist_ok=True)
            with open(proc.log, "ab") as out:
                proc.process = subprocess.Popen(proc.argv, env=self.env, cwd=self.cwd,
                                                stdout=out, stderr=subprocess.STDOUT,
                                                start_new_session=True)
        wait_until(lambda: "ready." in self.procs[0].output(), 60, what="0.1.0's worker")
        wait_until(self._up, 60, what="0.1.0's gateway")

    def _up(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


@pytest.fixture
def stores(redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[LaybySystem]:
    """This layby's system (not started) on a database of its own."""
    system = LaybySystem(f"redis://127.0.0.1:{redis_server.port}/11", tmp_path,
                         env_overrides={"LAYBY_AGENT_MODULES": "layby.demo.agents"})
    client = redis.Redis(port=redis_server.port, db=11)
    client.flushdb()
    yield system
    system.stop()
    client.flushdb()
    client.close()


def test_runs_parked_by_the_previous_release_complete_after_the_upgrade(
        previous_release: Path, stores: LaybySystem, tmp_path: Path) -> None:
    old = PreviousSystem(previous_release, stores.env, tmp_path / "old")
    old.start()
    try:
        headers = {"Authorization": f"Bearer {stores.env['LAYBY_API_KEYS']}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{old.port}", headers=headers,
                          timeout=30) as api:
            started = [api.post("/v1/runs", json={"agent": "demo.trivia",
                                                  "input": f"Ask me question {n}"})
                       for n in range(3)]
            assert all(r.status_code == 202 for r in started), [r.text for r in started]
            ids = [r.json()["id"] for r in started]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                statuses = [api.get(f"/v1/runs/{i}").json()["status"] for i in ids]
                if set(statuses) == {"interrupted"}:
                    break
                time.sleep(0.2)
            assert set(statuses) == {"interrupted"}, statuses
            # One more, which 0.1.0 finishes too: its steps' events keep their messages
            # inside their data, where format 1 keeps them apart.
            finished = _finished_by(api, ids[-1])
            streams = {run_id: _events_text(api, run_id) for run_id in [*ids, finished]}
    finally:
        old.stop()
    assert all(p.process is not None and p.process.poll() is not None for p in old.procs)

    client = redis.Redis.from_url(stores.redis_url, decode_responses=True)
    steps = Keys(stores.settings.key_prefix).events(finished)

    def completed_entry() -> dict[str, str]:
        [(_, fields)] = [e for e in client.xrange(steps) if e[1]["type"] == "run.completed"]
        return fields

    assert '"messages":[' in completed_entry()["data"] and "messages" not in completed_entry()
    env = {**stores.env, "PYTHONPATH": str(ROOT)}
    layby = str(Path(sys.executable).parent / "layby")
    refused = subprocess.run([layby, "runs", "ls"], env=env, cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2 and "`layby migrate`" in refused.stderr, refused.stderr
    migrated = subprocess.run([layby, "migrate"], env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
    assert migrated.returncode == 0, migrated.stderr
    assert "the store is at format 1" in migrated.stdout
    assert '"messages"' not in completed_entry()["data"] and "messages" in completed_entry()
    client.close()

    stores.start()
    # Every run's events read as 0.1.0 gave them, byte for byte.
    with stores.api() as api:
        assert {run_id: _events_text(api, run_id) for run_id in streams} == streams
    for run_id in ids:
        run = stores.run(run_id)
        assert run["status"] == "interrupted"
        [question] = stores.open_interrupts(run)
        choice = question["responseSchema"]["enum"][0]
        stores.answer(run_id, question["id"], payload=choice)
    for run_id in ids:
        done = stores.wait_status(run_id, "completed", timeout=60)
        assert done["result"], done


def _events_text(api: httpx.Client, run_id: str) -> str:
    """The run's events as `GET /v1/runs/{id}/events` sends them (what is there)."""
    reply = api.get(f"/v1/runs/{run_id}/events", params={"follow": "false"})
    assert reply.status_code == 200, reply.text
    return reply.text


def _finished_by(api: httpx.Client, parked_like: str) -> str:
    """A run of demo.trivia started, parked, answered and completed (through `api`),
    as `parked_like` was started."""
    agent = api.get(f"/v1/runs/{parked_like}").json()["agent"]
    run_id = api.post("/v1/runs", json={"agent": agent, "input": "Ask me one more"}
                      ).json()["id"]
    run = wait_until(lambda: (r := api.get(f"/v1/runs/{run_id}").json())["status"]
                     == "interrupted" and r, 60, what="the run to park")
    [question] = [i for i in run["interrupts"] if i["state"] == "open"]
    answered = api.post(f"/v1/runs/{run_id}/interrupts/{question['id']}",
                        json={"status": "resolved",
                              "payload": question["responseSchema"]["enum"][0]})
    assert answered.status_code == 200, answered.text
    wait_until(lambda: api.get(f"/v1/runs/{run_id}").json()["status"] == "completed", 60,
               what="the run to complete")
    return str(run_id)
