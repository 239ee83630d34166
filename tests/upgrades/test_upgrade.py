"""Upgrading from the previous release while runs wait, a process at a time: the previous
release (the newest one CHANGELOG.md names with its commit that this checkout comes after:
0.2.0 today) is built from the git history (`git archive`) into a wheel, installed in a
virtualenv of its own next to this code, and run on a real Valkey beside this layby's
processes, as a deployment is rolled (tests/upgrades/test_rolling.py rolls one under load, within
this code):

1. 0.2.0's gateway, worker and sweeper make the store (format 1, the legacy layout) and
   park runs; one finishes.
2. This layby's gateway and worker join: while a process of 0.2.0 lives, the store is
   written in format 1, in the legacy layout, and runs answered and started through the
   newer gateway complete or park, whichever worker takes their steps.
3. 0.2.0's gateway and worker stop; this layby's sweeper starts, and 0.2.0's stops: no
   process of 0.2.0 is left, the sweeper switches the store to format 2, and from its
   layout instant every process uses the sharded layout, moving a run of the legacy one
   as it is touched (migration 2); 0.2.0 now refuses the store.
4. `layby migrate` moves the rest: the store is at format 2, no key of the legacy layout
   left, every run's events read as 0.2.0 gave them, and the runs 0.2.0 parked are
   answered and complete."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import tarfile
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path

import httpx
import pytest
import redis

from layby.ops.embedded import EmbeddedRedis
from layby.ops.supervisor import gateway_argv, sweeper_argv
from layby.parking import Keys, formats
from layby.parking.keys import KEY_SPECS
from tests.support.harness import ROOT, LaybySystem, Proc, free_port, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RELEASE = re.compile(r"^## (\d+)\.(\d+)\.(\d+) \(.*commit ([0-9a-f]{7,40})\)")


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=False)


def _previous_release() -> tuple[str, str]:
    """The newest release CHANGELOG.md records with its commit ("## 0.2.0 (2026-11-27,
    commit bbc36c3)") that this checkout's commit comes after (a checkout of a release's
    own commit: the one before it)."""
    found = [(tuple(int(n) for n in m.groups()[:3]), m[4])
             for line in (ROOT / "CHANGELOG.md").read_text().splitlines()
             if (m := RELEASE.match(line))]
    head = _git("rev-parse", "HEAD").stdout.strip()
    assert head, "the test needs the project's git history (a clone, not an export)"
    older = sorted((v, commit) for v, commit in found
                   if _git("rev-parse", commit).stdout.strip() != head
                   and _git("merge-base", "--is-ancestor", commit, "HEAD").returncode == 0)
    assert older, "CHANGELOG.md names no earlier release with its commit"
    version, commit = older[-1]
    return ".".join(map(str, version)), commit


PREVIOUS, PREVIOUS_COMMIT = _previous_release()


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv with the previous release's wheel, built from its commit, and this
    one's dependencies (it pins the same ranges): its `bin/` directory."""
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
    # .pth files in it are not read), then the release's wheel in the venv's own
    # site-packages.
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
    """The previous release's worker, sweeper and gateway, started with its own `layby`
    command, away from this checkout (its folder is not on their path)."""

    def __init__(self, bin_dir: Path, env: dict[str, str], logs: Path) -> None:
        self.env = {**env, "PYTHONPATH": ""}
        self.port = free_port()
        self.layby = str(bin_dir / "layby")
        self.procs = {name: Proc(name, argv, logs / f"old-{name}.log") for name, argv in (
            ("worker", [self.layby, "worker", "--concurrency", "2"]),
            ("sweeper", [self.layby, "sweeper"]),
            ("gateway", [self.layby, "gateway", "--host", "127.0.0.1", "--port",
                         str(self.port)]))}
        self.cwd = logs

    def start(self) -> None:
        for proc in self.procs.values():
            proc.log.parent.mkdir(parents=True, exist_ok=True)
            with open(proc.log, "ab") as out:
                proc.process = subprocess.Popen(proc.argv, env=self.env, cwd=self.cwd,
                                                stdout=out, stderr=subprocess.STDOUT,
                                                start_new_session=True)
        wait_until(lambda: "ready." in self.procs["worker"].output(), 60,
                   what=f"{PREVIOUS}'s worker")
        wait_until(self._up, 60, what=f"{PREVIOUS}'s gateway")

    def _up(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30,
                            headers={"Authorization": f"Bearer {self.env['LAYBY_API_KEYS']}"})

    def command(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.layby, *args], env=self.env, cwd=self.cwd,
                              capture_output=True, text=True, timeout=60)

    def stop(self, *names: str) -> None:
        """Stop its processes (those `names` only, when given), cleanly (SIGTERM)."""
        for name, proc in reversed(self.procs.items()):
            if not names or name in names:
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


def test_runs_parked_by_the_previous_release_complete_through_a_rolled_upgrade(
        previous_release: Path, stores: LaybySystem, tmp_path: Path) -> None:
    old = PreviousSystem(previous_release, stores.env, tmp_path / "old")
    old.start()
    client = redis.Redis.from_url(stores.redis_url, decode_responses=True)
    prefix = stores.settings.key_prefix
    legacy, sharded = Keys(prefix), Keys(prefix, 48)
    try:
        # 1. The previous release parks runs, and finishes one.
        with old.api() as api:
            started = [api.post("/v1/runs", json={"agent": "demo.trivia",
                                                  "input": f"Ask me question {n}"})
                       for n in range(4)]
            assert all(r.status_code == 202 for r in started), [r.text for r in started]
            ids = [r.json()["id"] for r in started]
            for run_id in ids:
                wait_until(lambda r=run_id: api.get(f"/v1/runs/{r}").json()["status"]
                           == "interrupted", 60, what="the runs to park")
            finished = _finished_by(api, ids[-1])
            streams = {run_id: _events_text(api, run_id) for run_id in [*ids, finished]}
        state = formats.read(client, legacy)
        assert (state.version, state.shards) == (1, None)  # format 1, the legacy layout
        assert all(client.exists(legacy.run(r)) for r in [*ids, finished])

        # 2. This layby's gateway and worker join; the store stays at format 1.
        stores.port = free_port()
        stores._start("gateway", gateway_argv("127.0.0.1", stores.port))
        wait_until(stores._gateway_up, 30, what="this layby's gateway")
        stores.start_worker()
        with stores.api() as api:  # it shows what the previous release wrote
            assert {run_id: _events_text(api, run_id) for run_id in streams} == streams
        _answer(stores, ids[0])
        parked_here = stores.start_run("demo.trivia", "Ask me one here")["id"]
        stores.wait_status(parked_here, "interrupted", timeout=60)
        assert client.exists(legacy.run(parked_here))
        assert formats.read(client, legacy).written == 1
        # The previous release reads the run this one made, its id of the shorter shape.
        assert re.fullmatch(r"run_[0-9A-Za-z]{22}", parked_here), parked_here
        with old.api() as api, stores.api() as here:
            seen = api.get(f"/v1/runs/{parked_here}")
            assert seen.status_code == 200 and seen.json()["status"] == "interrupted", \
                seen.text
            assert _events_text(api, parked_here) == _events_text(here, parked_here)

        # 3. The previous release's gateway and worker stop; the sweepers take turns: no
        # process of the previous release is left, and the store switches to format 2.
        old.stop("gateway", "worker")
        stores._start("sweeper", sweeper_argv(stores.settings))
        wait_until(lambda: client.get(legacy.swept) is not None, 30, what="a sweep")
        old.stop()
        wait_until(lambda: formats.read(client, legacy).written == 2, 60, what="the switch")
        state = formats.read(client, legacy)
        assert state.shards == 48 and state.sharded_at is not None
        refused = old.command("runs", "ls")
        assert refused.returncode == 2 and "written by a newer layby" in refused.stderr, \
            refused.stderr
        # From the layout instant on, a run answered is moved first, and completes.
        wait_until(lambda: formats.server_ms(client.time()) > (state.sharded_at or 0), 30,
                   what="the layout instant")
        _answer(stores, ids[1])
        assert client.exists(sharded.run(ids[1])) and not client.exists(legacy.run(ids[1]))

        # 4. `layby migrate` moves the rest.
        migrated = stores.layby("migrate", timeout=180)
        assert migrated.returncode == 0, migrated.stderr
        assert "the store is at format 2" in migrated.stdout, migrated.stdout
        assert formats.read(client, legacy).version == 2
        left = [key for key in (*client.scan_iter(match=f"{prefix}:*"),
                                *client.scan_iter(match=f"{{{prefix}:format}}:*"))
                if any(spec.migrated_by == 2 and spec.regex(prefix).fullmatch(key)
                       for spec in KEY_SPECS)]
        assert left == []
        with stores.api() as api:  # every run's events as the previous release gave them
            assert {r: _events_text(api, r) for r in [*ids[2:], finished]} == \
                {r: streams[r] for r in [*ids[2:], finished]}
        for run_id in (*ids[2:], parked_here):
            _answer(stores, run_id)
    finally:
        old.stop()
        client.close()


def _answer(system: LaybySystem, run_id: str) -> None:
    """Answer the run's question (demo.trivia) with its first choice; it completes."""
    [question] = system.open_interrupts(system.run(run_id))
    choice = question["responseSchema"]["enum"][0]
    assert system.answer(run_id, question["id"], payload=choice).status_code == 200
    done = system.wait_status(run_id, "completed", timeout=60)
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
