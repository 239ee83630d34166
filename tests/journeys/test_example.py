"""layby as a team adopts it: the wheel built from this repository, installed into a fresh
virtualenv (not editable, nothing of the source tree on the path), used by the example
project under examples/shop (its own pyproject.toml, tasks.py, agents, tests and a client
script) from a copy of that folder elsewhere on disk."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import httpx
import pytest

from layby.ops.embedded import free_port
from tests.support.harness import source_copy, wait_until

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "shop"
# What the example's own tests and type check need besides layby (its pyproject's extra).
TOOLS = ["pytest>=8", "mypy>=1.11", "celery-types>=0.22"]

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: no LAYBY_* or PYTHONPATH of the tests'."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LAYBY_", "PYTEST", "PYTHON"))}
    return {**env, **extra}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel, and a fresh virtualenv with it (and the example's test tools) installed
    from it, as `pip install layby` would."""
    out = tmp_path_factory.mktemp("wheel")
    source = source_copy(tmp_path_factory.mktemp("source"))
    # The build backend the project names (setuptools) from the tests' environment, as
    # tests/upgrades/test_upgrade.py builds the previous release: the same wheel, without
    # installing setuptools into an isolated environment first.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "-w", str(out), str(source)], check=True,
                   timeout=300, env=_clean_env())
    [wheel] = out.glob("layby-*.whl")
    venv = tmp_path_factory.mktemp("venv") / "env"
    # A virtualenv without pip of its own (ensurepip is 4 s of CPU): the tests' pip installs
    # into it (`pip --python`), resolving the wheel's dependencies as `pip install` would.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    # No byte-compiling of every installed module (mypy's among them): a third of the
    # install's time; what the tests import is compiled when they import it.
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                           "install", "--quiet", "--no-compile", str(wheel), *TOOLS],
                          capture_output=True, text=True, timeout=600, env=_clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return Installed(wheel, venv)


def _project(tmp_path: Path) -> Path:
    """The example project, copied where no layby source folder is near."""
    folder = tmp_path / "shop"
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("__pycache__", ".layby",
                                                                    ".pytest_cache"))
    return folder


def test_the_wheel_holds_one_package_layby(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = wheel.namelist()
        top_level = wheel.read(next(n for n in names if n.endswith("top_level.txt")))
    assert {n.split("/")[0] for n in names} == {"layby",
                                                 f"layby-{metadata.version('layby')}.dist-info"}
    assert top_level.decode().split() == ["layby"]
    # The design card's folders are inside the package, with their data files.
    for inside in ("layby/tasks/__init__.py", "layby/broker_config/settings.py",
                   "layby/notifier/delivery.py", "layby/parking/lua/claim_run.lua",
                   "layby/notifier/templates/email.html", "layby/py.typed",
                   "layby/answering/templates/review.html",
                   "layby/inbox/templates/inbox.html", "layby/inbox/templates/inbox.js"):
        assert inside in names, inside
    # Installed, nothing of layby's rooms sits at the top of site-packages.
    site = next(installed.venv.glob("lib/python*/site-packages"))
    top = {p.name for p in site.iterdir()}
    assert {"tasks", "control", "demo", "bench", "generation", "gateway", "parking",
            "notifier", "broker_config", "examples"}.isdisjoint(top), sorted(top)
    assert "layby" in top


def test_the_example_projects_tests_pass_against_the_wheel(installed: Installed,
                                                           tmp_path: Path) -> None:
    project = _project(tmp_path)
    done = subprocess.run([installed.bin("python"), "-m", "pytest", "-q", "-p",
                           "no:cacheprovider"], cwd=project, capture_output=True, text=True,
                          timeout=300, env=_clean_env())
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "4 passed" in done.stdout
    # layby came from the wheel, not from a source tree.
    where = subprocess.run([installed.bin("python"), "-c", "import layby; print(layby.__file__)"],
                           cwd=project, capture_output=True, text=True, env=_clean_env())
    assert str(installed.venv) in where.stdout, where.stdout


def test_the_example_project_passes_mypy_strict(installed: Installed, tmp_path: Path) -> None:
    project = _project(tmp_path)
    done = subprocess.run([installed.bin("mypy")], cwd=project, capture_output=True,
                          text=True, timeout=300, env=_clean_env())
    assert done.returncode == 0, done.stdout[-4000:]
    assert "Success: no issues found" in done.stdout


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_layby_up_in_a_folder_with_its_own_tasks_control_and_demo_modules(
        installed: Installed, tmp_path: Path) -> None:
    """The project's tasks.py is its own; layby's sweeper, worker and gateway never import
    the folder's control.py, demo.py or generation.py, and the project's agent and
    background job run."""
    project = _project(tmp_path)
    for name in ("control", "demo", "generation", "parking"):
        (project / f"{name}.py").write_text(
            f"raise ImportError('layby imported the project\\'s own {name}.py')\n")
    port = free_port()
    env = _clean_env(LAYBY_AGENT_MODULES="shop.agents", LAYBY_TASK_MODULES="tasks",
                     LAYBY_REPLY_LISTENER_PORT=str(free_port()),
                     LAYBY_MAIL_CATCHER_PORT=str(free_port()), LAYBY_SWEEP_INTERVAL_S="0.5")
    log = tmp_path / "up.log"
    with open(log, "wb") as out:
        up = subprocess.Popen([installed.bin("layby"), "up", "--port", str(port),
                               "--no-flower"], cwd=project, env=env, stdout=out,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: "Ctrl-C stops everything" in log.read_text(), 60,
                   what="layby up")
        wait_until(lambda: _answers(f"http://127.0.0.1:{port}/healthz"), 60,
                   what="the gateway")
        key = (project / ".layby" / "api_key").read_text().strip()
        done = subprocess.run([installed.bin("python"), "refund_script.py", "42", "250"],
                              cwd=project, capture_output=True, text=True, timeout=120,
                              env={**env, "LAYBY_URL": f"http://127.0.0.1:{port}",
                                   "LAYBY_API_KEY": key})
        assert done.stdout.strip() == ("Refunded 250 on order 42 (damaged in transit); "
                                       "credit note CN-42."), done.stdout + done.stderr
        listed = subprocess.run([installed.bin("layby"), "agents"], cwd=project, env=env,
                                capture_output=True, text=True, timeout=60)
        assert listed.stdout.split()[0] == "shop.support", listed.stdout + listed.stderr
    finally:
        try:
            os.killpg(up.pid, signal.SIGINT)
            up.wait(60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(up.pid, signal.SIGKILL)
            up.wait(10)
    output = log.read_text()
    assert up.returncode == 0, output[-3000:]
    assert "unregistered task" not in output.lower(), output[-3000:]
    assert "ImportError" not in output, output[-3000:]
