"""The harness's fork server (`tests/support/forkserver.py`) starts a command line as a
process of its own would run it: the same view of how it was started, output and exit
code, its own session, killed and reaped the same way; a process whose environment differs
in what the server read at import gets a process of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.support import forkserver
from tests.support.harness import BASE_ENV, LAYBY, ROOT, LaybySystem, wait_until

pytestmark = pytest.mark.integration


def both(argv: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str],
                                                          subprocess.CompletedProcess[str]]:
    """`argv` run by the fork server, then in a process of its own."""
    assert forkserver.server_started(env, ROOT) is not None
    served = forkserver.run(argv, env, ROOT, 60)
    own = subprocess.run(argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=60, check=False)
    return served, own


def test_a_process_it_starts_sees_what_a_process_of_its_own_sees(tmp_path: Path) -> None:
    env = {**os.environ, **BASE_ENV, "LAYBY_PROBE": "mine"}
    argv = [sys.executable, "-m", "tests.support.process_view", "LAYBY_PROBE",
            "LAYBY_LEASE_S", "HOME"]
    served, own = both(argv, env)  # as subprocess.run starts it

    assert served.returncode == own.returncode == 0, served.stderr + own.stderr
    seen, expected = json.loads(served.stdout), json.loads(own.stdout)
    assert seen == expected
    assert served.stderr == own.stderr == ""  # no warning of its own (runpy's, say)
    assert seen["env"]["LAYBY_PROBE"] == "mine" and not seen["own_session"]
    assert seen["main"] == "__main__" and seen["stdin"] == os.devnull

    # As the harness starts a worker: in a session of its own, its output in a log.
    forked = forkserver.spawn(argv, env, ROOT, tmp_path / "served.log")
    assert forked is not None and forked.wait(30) == 0
    with open(tmp_path / "own.log", "ab") as log:
        subprocess.run(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                       stdin=subprocess.DEVNULL, start_new_session=True, check=True)
    seen = json.loads((tmp_path / "served.log").read_text())
    assert seen == json.loads((tmp_path / "own.log").read_text())
    assert seen["own_session"]


def test_a_command_gives_what_it_gives_in_a_process_of_its_own() -> None:
    env = {**os.environ, **BASE_ENV, "LAYBY_REDIS_URL": "redis://127.0.0.1:1/0"}
    for args in (["--version"], ["runs", "ls", "--status", "nonsense"], ["runs", "ls"]):
        served, own = both([LAYBY, *args], env)
        assert (served.returncode, served.stdout) == (own.returncode, own.stdout), args
        assert served.stderr.splitlines()[-1:] == own.stderr.splitlines()[-1:], args
    assert own.returncode != 0 and "127.0.0.1:1" in own.stderr  # the last: no store there


def test_what_it_cannot_start_as_a_new_interpreter_would_gets_a_process_of_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {**os.environ, **BASE_ENV}
    server = forkserver.server_started(env, ROOT)
    assert server is not None
    read_at_import = {name for name in server.read if name not in os.environ}
    # Read by name while layby's modules import (OpenTelemetry's propagators, say): none
    # of layby's own settings.
    assert read_at_import and not [n for n in read_at_import if n.startswith("LAYBY_")]
    argv = [sys.executable, "-m", "tests.support.process_view"]
    assert forkserver.spawn(argv, env, ROOT, tmp_path / "a.log") is not None
    assert "OTEL_PROPAGATORS" in server.read
    changed = {**env, "OTEL_PROPAGATORS": "b3"}
    assert forkserver.spawn(argv, changed, ROOT, tmp_path / "b.log") is None
    assert forkserver.spawn(argv, {**env, "PYTHONPATH": str(tmp_path)}, ROOT,
                            tmp_path / "c.log") is None
    assert forkserver.spawn(argv, env, tmp_path, tmp_path / "d.log") is None
    # A module it imported, run as `__main__`: runpy would warn that it may misbehave.
    assert forkserver.spawn([sys.executable, "-m", "layby.ops.cli", "--help"], env, ROOT,
                            tmp_path / "e.log") is None
    # Turned off (as the fault suite does: its figures are those of new interpreters).
    monkeypatch.setenv("LAYBY_TEST_FORKSERVER", "0")
    assert forkserver.spawn(argv, env, ROOT, tmp_path / "f.log") is None


def test_a_worker_it_starts_is_killed_and_reaped_as_a_process_of_its_own_is(
        system: LaybySystem, tmp_path: Path) -> None:
    running = LaybySystem(system.redis_url.rsplit("/", 1)[0] + "/9", tmp_path,
                          env_overrides={"LAYBY_LOG_FORMAT": "json"})
    worker = running.start_worker()
    try:
        process = worker.process
        assert isinstance(process, forkserver.Forked) and process.poll() is None
        assert os.getpgid(process.pid) == process.pid  # a session of its own
        assert "LAYBY_LOG_FORMAT" not in os.environ  # the setting reached the worker only
        assert json.loads(worker.output().splitlines()[-1])["message"].endswith("ready.")
        pool = psutil.Process(process.pid).children()
        assert len(pool) == running.worker_count
        os.killpg(process.pid, signal.SIGKILL)
        assert process.wait(10) == -signal.SIGKILL
        wait_until(lambda: not any(_alive(child) for child in pool), 10,
                   what="the pool's processes to go with it")
    finally:
        running.stop()


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
