"""The first hour with layby, as a newcomer lives it: `layby up` refuses what would stop it
before anything starts (one line, exit code 2), stops everything when its terminal closes or
it is killed, refuses a second `layby up` on its data folder, and a second terminal in the
same folder sees the stack that runs there (its agents, reviewers and mail, its gateway and
key for `layby.Client()`).

The unit tests at the top (pure functions, files) start no process; the others do."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from pydantic import ValidationError

from layby import running
from layby.broker_config.settings import REDIS_SCHEMES, Settings, settings_problem, url_problem
from layby.control.connections import cluster_nodes
from layby.errors import ConfigError
from layby.generation.importing import import_user_module
from layby.ops.embedded import free_port
from layby.ops.supervisor import port_free
from tests.support.harness import ROOT, wait_until, wait_up

integration = pytest.mark.integration

PAYER = '''\
from layby import Agent, Reply, ScriptedModel

payer = Agent(name="bank.payer", description="Pays, in a project of its own.",
              model=ScriptedModel(steps=[Reply(text="Paid: {input}.")]))
'''


# -- unit: what is refused, and how it is said ------------------------------------------


def test_a_redis_url_of_an_unknown_scheme_is_refused_naming_the_schemes_taken() -> None:
    assert url_problem("redis+socket://h:7000", REDIS_SCHEMES) == (
        "the scheme redis+socket:// is not one layby takes: give one of redis://, "
        "rediss://, sentinel://")
    assert url_problem("localhost:6379", REDIS_SCHEMES).startswith("not a URL")
    assert url_problem("redis://:pw@h:6379/0", REDIS_SCHEMES) is None
    assert url_problem("sentinel://h:26379/0;sentinel://h2:26379", REDIS_SCHEMES) is None
    with pytest.raises(ValidationError) as refused:
        Settings(redis_url="unix://:s3cret@h:7000/0")
    line = settings_problem(refused.value)
    assert line.startswith("LAYBY_REDIS_URL: the scheme unix:// is not one")
    assert "redis+cluster://" in line  # the store may be a cluster
    assert "s3cret" not in line and "\n" not in line


def test_a_cluster_is_the_store_only_with_a_broker_beside_it() -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(redis_url="redis+cluster://:s3cret@h:7000")
    line = settings_problem(refused.value)
    assert line.startswith("LAYBY_REDIS_URL names a cluster, which cannot carry Celery's")
    assert "set LAYBY_BROKER_URL" in line and "s3cret" not in line
    with pytest.raises(ValidationError) as refused:
        Settings(redis_url="redis://h:6379", broker_url="valkey+cluster://:s3cret@h:7000")
    line = settings_problem(refused.value)
    assert line.startswith("LAYBY_BROKER_URL: a cluster cannot be the broker")
    assert "s3cret" not in line
    given = Settings(redis_url="valkey+cluster://h:7000", broker_url="redis://b:6379")
    assert given.store_is_cluster and not given.broker_is_store
    assert given.wanted_shards == 48  # a cluster's store is sharded; one server's, not
    assert Settings(redis_url="redis://h:6379").wanted_shards is None
    assert Settings(redis_url="redis://h:6379", store_shards=16).wanted_shards == 16


def test_a_cluster_url_is_read_for_its_nodes_and_login() -> None:
    found = cluster_nodes("rediss+cluster://ops:p%40ss@10.0.0.1:7000,10.0.0.2")
    assert found.nodes == [("10.0.0.1", 7000), ("10.0.0.2", 6379)] and found.tls
    assert found.username == "ops" and found.password.get_secret_value() == "p@ss"
    for bad, said in (("redis+cluster://h:7000/3", "database"),
                      ("redis+cluster://:s3cret@h:port", "port that is not a number"),
                      ("redis+cluster://h:7000?timeout=1", "options"),
                      ("redis+cluster://", "names no cluster node")):
        with pytest.raises(ConfigError) as refused:
            cluster_nodes(bad)
        assert said in refused.value.message and "s3cret" not in refused.value.message


    with pytest.raises(ValidationError):
        Settings(public_url="127.0.0.1:8000")


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "bank").mkdir()
    (tmp_path / "bank" / "__init__.py").write_text("")
    yield tmp_path
    for name in [m for m in sys.modules if m == "bank" or m.startswith("bank.")]:
        del sys.modules[name]


def test_a_module_not_found_is_told_apart_from_one_that_fails(project: Path) -> None:
    with pytest.raises(ConfigError) as missing:
        import_user_module("bank.nowhere", "LAYBY_AGENT_MODULES")
    assert missing.value.message.startswith(
        "LAYBY_AGENT_MODULES names 'bank.nowhere', and no module 'bank.nowhere' is found")

    (project / "bank" / "needy.py").write_text("import os\nimport stripe_not_installed\n")
    with pytest.raises(ConfigError) as failed:
        import_user_module("bank.needy", "LAYBY_AGENT_MODULES")
    assert failed.value.message.startswith(
        f"LAYBY_AGENT_MODULES: module 'bank.needy' failed while importing, at "
        f"{project / 'bank' / 'needy.py'}:2: ModuleNotFoundError: No module named "
        "'stripe_not_installed'")

    (project / "bank" / "typo.py").write_text("x = 1\ndef broken(:\n")
    with pytest.raises(ConfigError) as typo:
        import_user_module("bank.typo", "LAYBY_TASK_MODULES")
    assert typo.value.message.startswith(
        f"LAYBY_TASK_MODULES: module 'bank.typo' has a syntax error at "
        f"{project / 'bank' / 'typo.py'}:2")

    (project / "bank" / "raises.py").write_text("\n\nraise RuntimeError('no config')\n")
    with pytest.raises(ConfigError) as raised:
        import_user_module("bank.raises", "LAYBY_AGENT_MODULES")
    assert f"{project / 'bank' / 'raises.py'}:3: RuntimeError: no config" in (
        raised.value.message)


def test_the_data_folder_lock_refuses_a_second_owner_and_is_free_once_released(
        tmp_path: Path) -> None:
    first = running.Lock.take(tmp_path, "http://127.0.0.1:8123")
    try:
        assert running.is_held(tmp_path)
        with pytest.raises(running.Taken) as taken:
            running.Lock.take(tmp_path, "http://127.0.0.1:9999")
        assert f"(PID {os.getpid()}, http://127.0.0.1:8123)" in str(taken.value)
        running.write(tmp_path, running.Stack(pid=os.getpid(), url="http://127.0.0.1:8123",
                                              settings={"agent_modules": ["bank.payer"]}))
        assert running.running(tmp_path).settings == {"agent_modules": ["bank.payer"]}
        assert (tmp_path / running.STATE_FILE).stat().st_mode & 0o077 == 0
    finally:
        first.release()
    # Its owner gone, the files left behind say nothing: nobody runs there.
    assert not running.is_held(tmp_path)
    assert running.running(tmp_path) is None
    running.Lock.take(tmp_path, "http://127.0.0.1:9999").release()


# -- processes --------------------------------------------------------------------------


def _env(data_dir: Path | None = None, **extra: str) -> dict[str, str]:
    """The environment of a terminal with no LAYBY_* variable (or those given), and ports
    of its own for the parts a developer's own `layby up` may hold."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYBY_")}
    env["PYTHONPATH"] = str(ROOT)
    if data_dir is not None:
        env["LAYBY_DATA_DIR"] = str(data_dir)
    return {**env, **extra}


def _ports() -> dict[str, str]:
    return {"LAYBY_MAIL_CATCHER_PORT": str(free_port()),
            "LAYBY_REPLY_LISTENER_PORT": str(free_port()),
            "LAYBY_FLOWER_PORT": str(free_port())}


def _layby(*args: str, env: dict[str, str], cwd: Path = ROOT, timeout: float = 60
           ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "layby", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _start_up(env: dict[str, str], port: int, log: Path, cwd: Path = ROOT
              ) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "layby", "up", "--port", str(port),
                                 "--concurrency", "1", "--no-flower"], env=env, cwd=cwd,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_as_a_terminal_starts_it)


def _as_a_terminal_starts_it() -> None:
    """SIGHUP as a terminal's shell leaves it, whatever the test runner's: a suite started
    under `nohup` ignores it, and `layby up` rightly keeps a SIGHUP its starter ignored."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _family(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """`layby up` and everything it started (the Valkey server, the parts, their pools)."""
    me = psutil.Process(proc.pid)
    return [me, *me.children(recursive=True)]


def _gone(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running (a zombie waiting for its reaper counts as gone)."""
    alive = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def _kill(proc: subprocess.Popen[bytes], family: list[psutil.Process]) -> None:
    """Whatever is left, however the test ended."""
    for p in _gone(family):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@integration
@pytest.mark.parametrize("module, expected", [
    ("bank.nowhere", ("LAYBY_AGENT_MODULES names 'bank.nowhere', and no module "
                      "'bank.nowhere' is found")),
    ("bank.typo", ("LAYBY_AGENT_MODULES: module 'bank.typo' has a syntax error at "
                   "{project}/bank/typo.py:2")),
    ("bank.needy", ("LAYBY_AGENT_MODULES: module 'bank.needy' failed while importing, at "
                    "{project}/bank/needy.py:1: ModuleNotFoundError: No module named "
                    "'stripe")),
])
def test_up_refuses_a_bad_agent_module_before_anything_starts(
        tmp_path: Path, module: str, expected: str) -> None:
    (tmp_path / "bank").mkdir()
    (tmp_path / "bank" / "__init__.py").write_text("")
    (tmp_path / "bank" / "typo.py").write_text("x = 1\ndef broken(:\n")
    (tmp_path / "bank" / "needy.py").write_text("import stripe_not_installed\n")
    port = free_port()
    done = _layby("up", "--port", str(port), "--no-flower",
                  env=_env(tmp_path / "data", LAYBY_AGENT_MODULES=module, **_ports()),
                  cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert line.startswith("error: " + expected.format(project=tmp_path))
    assert "\n" not in line  # one line: no traceback
    assert "layby is up" not in done.stdout
    assert not (tmp_path / "data" / "valkey").exists()  # no server was started
    assert port_free("127.0.0.1", port)


@integration
def test_up_refuses_a_taken_port_before_the_banner(tmp_path: Path, taken_port: int) -> None:
    done = _layby("up", "--port", str(taken_port), "--no-flower",
                  env=_env(tmp_path / "data", **_ports()))
    assert done.returncode == 2
    assert done.stderr == (f"error: port {taken_port} on 127.0.0.1 (the gateway) is taken: "
                           "stop what holds it, or choose another (--port or LAYBY_PORT)\n")
    assert done.stdout == ""
    assert not (tmp_path / "data" / "valkey").exists()
    # Flower's port too (it was skipped with a warning once every other part had started).
    done = _layby("up", "--port", str(free_port()),
                  env=_env(tmp_path / "data", **{**_ports(),
                                                 "LAYBY_FLOWER_PORT": str(taken_port)}))
    assert done.returncode == 2
    assert done.stderr == (f"error: port {taken_port} on 127.0.0.1 (the Flower dashboard) "
                           "is taken: stop what holds it, or choose another "
                           "(LAYBY_FLOWER_PORT, or --no-flower)\n")
    assert not (tmp_path / "data" / "valkey").exists()


@integration
def test_an_unknown_redis_scheme_is_refused_by_up_and_the_worker(tmp_path: Path) -> None:
    env = _env(tmp_path / "data", LAYBY_REDIS_URL="redis+socket://:s3cret@10.0.0.9:7000",
               **_ports())
    for command in (["up", "--port", str(free_port())], ["worker"], ["gateway"]):
        done = _layby(*command, env=env)
        assert done.returncode == 2, (command, done.stderr)
        assert done.stderr == (
            "error: LAYBY_REDIS_URL: the scheme redis+socket:// is not one layby takes: "
            "give one of redis://, rediss://, sentinel://, redis+cluster://, "
            "rediss+cluster://, valkey+cluster://, valkeys+cluster:// (fix it in the "
            "environment)\n")
    # A cluster without a broker beside it, refused the same way.
    env["LAYBY_REDIS_URL"] = "redis+cluster://:s3cret@10.0.0.9:7000"
    for command in (["up", "--port", str(free_port())], ["worker"], ["gateway"]):
        done = _layby(*command, env=env)
        assert done.returncode == 2, (command, done.stderr)
        assert done.stderr.startswith("error: LAYBY_REDIS_URL names a cluster, which cannot "
                                      "carry Celery's queues"), done.stderr
        assert "s3cret" not in done.stderr


@integration
def test_a_bad_task_module_or_reviewer_directory_is_refused_before_anything_starts(
        tmp_path: Path) -> None:
    broken = tmp_path / "reviewers.toml"
    broken.write_text("[reviewers.you]\nemail = \n")
    cases = [({"LAYBY_TASK_MODULES": "jobs_nowhere"},
              "error: LAYBY_TASK_MODULES names 'jobs_nowhere', and no module"),
             ({"LAYBY_REVIEWERS_FILE": str(broken)},
              f"error: the reviewer directory {broken}")]
    for extra, expected in cases:
        env = _env(tmp_path / "data", **_ports(), **extra)
        for command in (["up", "--port", str(free_port()), "--no-flower"], ["worker"]):
            done = _layby(*command, env=env)
            assert done.returncode == 2, (command, done.stderr)
            assert done.stderr.startswith(expected), (command, done.stderr)
            assert done.stderr.count("\n") == 1 and done.stdout == ""
    assert not (tmp_path / "data" / "valkey").exists()


@integration
def test_the_gateway_refuses_a_bad_module_and_says_when_it_is_not_ready(
        tmp_path: Path) -> None:
    env = _env(tmp_path / "data", LAYBY_AGENT_MODULES="nowhere_at_all",
               LAYBY_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    done = _layby("gateway", "--port", str(free_port()), env=env)
    assert done.returncode == 2
    assert done.stderr.startswith("error: LAYBY_AGENT_MODULES names 'nowhere_at_all'")
    # Run by uvicorn itself (the factory), it says so in one line too, before it listens.
    direct = subprocess.run([sys.executable, "-m", "uvicorn", "--factory",
                             "layby.http.app:create_app", "--port", str(free_port())],
                            env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
                            check=False)
    assert direct.returncode == 2
    assert direct.stderr.startswith("layby gateway: error: LAYBY_AGENT_MODULES names")

    # Started with its Redis away: alive (/healthz answers), not ready (/readyz: why).
    port = free_port()
    gateway = subprocess.Popen([sys.executable, "-m", "layby", "gateway", "--port", str(port)],
                               env={**env, "LAYBY_AGENT_MODULES": "layby.demo.agents"},
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        def readyz() -> httpx.Response | None:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
            except httpx.HTTPError:
                return None
        reply = wait_until(readyz, 60, what="the gateway to answer")
        assert reply.status_code == 503
        assert reply.json()["error"]["code"] == "redis_unavailable"
        assert reply.json()["error"]["message"].startswith("Redis does not answer")
    finally:
        os.killpg(gateway.pid, signal.SIGKILL)
        gateway.wait()


@integration
def test_closing_the_terminal_stops_everything(tmp_path: Path) -> None:
    port, log = free_port(), tmp_path / "up.log"
    up = _start_up(_env(tmp_path / "data", **_ports()), port, log)
    family: list[psutil.Process] = []
    try:
        wait_up(up, f"http://127.0.0.1:{port}", log)
        family = _family(up)
        assert len(family) >= 6  # up, valkey, worker (and its pool), sweeper, gateway, …
        up.send_signal(signal.SIGHUP)
        # The supervisor gives its parts 30 s together to stop (a loaded machine's worker
        # takes seconds for its warm shutdown), then Valkey its save: as long as `layby down`.
        try:
            code = up.wait(90)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"layby up still runs 90 s after SIGHUP; it said:\n"
                                 f"{log.read_text()[-3000:]}") from None
        assert code == 0, log.read_text()[-3000:]
        wait_until(lambda: not _gone(family), 10, what="every part to stop")
        assert port_free("127.0.0.1", port)
        assert not running.is_held(tmp_path / "data")
    finally:
        _kill(up, family)


@integration
def test_a_killed_up_takes_its_parts_along_and_its_lock_is_taken_over(tmp_path: Path) -> None:
    data_dir, log = tmp_path / "data", tmp_path / "up.log"
    port = free_port()
    up = _start_up(_env(data_dir, **_ports()), port, log)
    family: list[psutil.Process] = []
    again = None
    try:
        wait_up(up, f"http://127.0.0.1:{port}", log)
        family = _family(up)
        up.kill()  # SIGKILL: no chance to stop anything itself
        up.wait()
        # SIGTERM reaches each part at once; a worker's warm shutdown on a loaded machine
        # takes seconds, so this waits as long as `layby down` would.
        try:
            wait_until(lambda: not _gone(family), 30, what="the parts to die with their parent")
        except AssertionError:
            raise AssertionError(f"still running: {[p.pid for p in _gone(family)]}") from None
        # The lock died with its owner: the next `layby up` on the folder starts.
        again = _start_up(_env(data_dir, **_ports()), port, log)
        wait_up(again, f"http://127.0.0.1:{port}", log, what="layby up, again")
    finally:
        _kill(up, family)
        if again is not None:
            again_family = _family(again) if again.poll() is None else []
            again.send_signal(signal.SIGTERM)
            try:
                again.wait(60)
            finally:
                _kill(again, again_family)


@integration
def test_a_second_terminal_in_the_project_folder_uses_the_running_stack(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "project"
    (project / "bank").mkdir(parents=True)
    (project / "bank" / "__init__.py").write_text("")
    (project / "bank" / "payer.py").write_text(PAYER)
    port, log = free_port(), tmp_path / "up.log"
    # The first terminal names the project's agents; the second names nothing.
    first = _env(LAYBY_AGENT_MODULES="bank.payer", **_ports())
    up = _start_up(first, port, log, cwd=project)
    second = _env()
    family: list[psutil.Process] = []
    try:
        base = f"http://127.0.0.1:{port}"
        wait_up(up, base, log)
        family = _family(up)

        agents = _layby("agents", env=second, cwd=project)
        assert agents.returncode == 0, agents.stderr
        assert [line.split()[0] for line in agents.stdout.splitlines()] == ["bank.payer"]

        ran = _layby("run", "bank.payer", "50 to Ann", env=second, cwd=project)
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.splitlines()[-1] == "Paid: 50 to Ann."

        doctor = _layby("doctor", env=second, cwd=project)
        smtp = next(line for line in doctor.stdout.splitlines() if " smtp:" in line)
        assert smtp.startswith("OK") and "answers EHLO" in smtp
        directory = next(line for line in doctor.stdout.splitlines()
                         if "reviewer directory:" in line)
        assert f"{project / '.layby' / 'reviewers.toml'}: 1 reviewer(s)" in directory

        # A second `layby up` on the folder is refused, naming the one that runs.
        refused = _layby("up", "--port", str(free_port()), env=second, cwd=project)
        assert refused.returncode == 2
        assert refused.stderr == (f"error: another `layby up` runs on {project / '.layby'} "
                                  f"(PID {up.pid}, {base}): stop it first, or give this one "
                                  "another LAYBY_DATA_DIR\n")

        # layby.Client() with no arguments: the gateway and key of the stack in this folder.
        import layby

        monkeypatch.chdir(project)
        for name in ("LAYBY_URL", "LAYBY_API_KEY", "LAYBY_DATA_DIR"):
            monkeypatch.delenv(name, raising=False)
        with layby.Client() as client:
            run = client.start("bank.payer", input="7 to Bo")
            assert client.wait(run.id, timeout=30).result == "Paid: 7 to Bo."
        up.send_signal(signal.SIGINT)
        assert up.wait(60) == 0
        wait_until(lambda: not _gone(family), 10, what="every part to stop")
        assert not (project / ".layby" / running.STATE_FILE).exists()
    finally:
        _kill(up, family)


@integration
def test_ctrl_c_while_a_module_hangs_at_import_stops_at_once(tmp_path: Path) -> None:
    """A user's module that hangs at import (a connection it makes, say): Ctrl-C stops
    `layby up` there and then, nothing left running, rather than once every part started."""
    (tmp_path / "bank").mkdir()
    (tmp_path / "bank" / "__init__.py").write_text("")
    importing = tmp_path / "importing"
    (tmp_path / "bank" / "slow.py").write_text(
        f"import pathlib, time\npathlib.Path({str(importing)!r}).touch()\ntime.sleep(120)\n")
    env = _env(tmp_path / "data", LAYBY_AGENT_MODULES="bank.slow", **_ports(),
               PYTHONPATH=f"{ROOT}:{tmp_path}")
    log = tmp_path / "up.log"
    up = _start_up(env, free_port(), log)
    family: list[psutil.Process] = []
    try:
        wait_until(importing.exists, 60, what="layby up to import the module")
        family = _family(up)
        up.send_signal(signal.SIGINT)
        assert up.wait(10) == 130, log.read_text()
        assert "stopped while starting; nothing is left running" in log.read_text()
        assert "layby is up" not in log.read_text()
        assert _gone(family) == []
        assert not (tmp_path / "data" / "valkey").exists()
    finally:
        _kill(up, family)


@integration
def test_layby_check_says_ok_or_the_one_problem(tmp_path: Path) -> None:
    (tmp_path / "bank").mkdir()
    (tmp_path / "bank" / "__init__.py").write_text("")
    (tmp_path / "bank" / "payer.py").write_text(PAYER)
    fine = _layby("check", env=_env(tmp_path / "data", LAYBY_AGENT_MODULES="bank.payer"),
                  cwd=tmp_path)
    assert fine.returncode == 0, fine.stderr
    assert fine.stdout.startswith("ok: agents bank.payer; task modules layby.demo.jobs;")
    broken = _layby("check", env=_env(tmp_path / "data", LAYBY_AGENT_MODULES="bank.gone"),
                    cwd=tmp_path)
    assert broken.returncode == 2 and broken.stdout == ""
    assert broken.stderr.startswith("error: LAYBY_AGENT_MODULES names 'bank.gone', and no "
                                    "module 'bank.gone' is found")
    assert broken.stderr.count("\n") == 1
