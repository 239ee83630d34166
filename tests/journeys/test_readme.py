"""The examples of the README and of the pages it sends a newcomer to, run in order as they
would be pasted, against a real system (Valkey, worker, sweeper, gateway): the README's
agent and client script, the HTTP page's curl session, the client page's script, and the
scripted agent of "Writing agents". Each file's code is read from the Markdown itself, so an
example that stops working fails here.

What a user changes is changed here too, and nothing else: the gateway's address (this
system's port), and the ids a command printed, pasted into the next one. The API key is
read where `layby up` leaves it, `.layby/api_key` in the folder they run from."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import API_KEY, ROOT, LaybySystem, wait_until

pytestmark = pytest.mark.integration

DOCS_URL = "http://127.0.0.1:8000"


def blocks(page: str, language: str) -> list[str]:
    """The fenced code blocks of `language` in a Markdown page, in order."""
    text = (ROOT / page).read_text()
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the user works: the README's `agents.py`, the scripted agent of "Writing
    agents" (`orders.py`), and `.layby/api_key` as `layby up` leaves it."""
    here = tmp_path_factory.mktemp("newcomer")
    [readme_agents] = [b for b in blocks("README.md", "python") if "# agents.py" in b]
    (here / "agents.py").write_text(readme_agents)
    [scripted] = [b for b in blocks("docs/writing-agents.md", "python")
                  if "ScriptedModel(" in b and "orders" in b]
    (here / "orders.py").write_text(scripted)
    (here / ".layby").mkdir()
    (here / ".layby" / "api_key").write_text(API_KEY + "\n")
    return here


@pytest.fixture
def newcomer(isolated: Callable[..., LaybySystem], folder: Path) -> LaybySystem:
    return isolated(PYTHONPATH=f"{ROOT}:{folder}",
                    LAYBY_AGENT_MODULES="layby.demo.agents,agents,orders").start()


def _python(system: LaybySystem, code: str, cwd: Path) -> str:
    """A script as pasted (it reads its key from `.layby/api_key`), the gateway's address
    this system's."""
    script = code.replace(DOCS_URL, system.base_url)
    done = subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{code}\n--- stderr:\n{done.stderr}"
    return done.stdout


def _commands(block: str) -> list[str]:
    """A shell block's commands: continued lines joined, comments kept (bash drops them)."""
    return [c for c in block.replace("\\\n", " ").splitlines() if c.strip()]


def _sh(system: LaybySystem, command: str, cwd: Path) -> str:
    command = command.replace("localhost:8000", f"127.0.0.1:{system.port}")
    done = subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, f"{command}\n--- stderr:\n{done.stderr}"
    return done.stdout


def test_the_examples_run_in_order_as_pasted(newcomer: LaybySystem, folder: Path) -> None:
    # 1. The README: an agent that asks, and the client script that answers it.
    [client_script] = [b for b in blocks("README.md", "python") if "Client(" in b]
    out = _python(newcomer, client_script, folder)
    assert out.splitlines() == ["Which day?", "Booked for Friday."], out

    # 2. "Try it over HTTP": the curl session, each command as pasted, the ids it printed
    # put where the next one says <run id> and <interrupt id>.
    [session] = blocks("docs/http-api.md", "sh")[:1]
    setup, start, show, answer, ledger = _commands(session)
    assert setup.startswith("KEY=$(cat .layby/api_key)")
    run: dict[str, Any] = json.loads(_sh(newcomer, f"{setup}\n{start}", folder))
    assert run["status"] == "queued" and run["agent"] == "demo.transfer", run
    show = show.replace("<run id>", run["id"])
    # "status interrupted": the user runs it again until it says so.
    parked = wait_until(lambda: (r := json.loads(_sh(newcomer, f"{setup}\n{show}", folder)))
                        ["status"] == "interrupted" and r, 30, what="the run to park")
    [waiting] = [i for i in parked["interrupts"] if i["state"] == "open"]
    answer = answer.replace("<run id>", run["id"]).replace("<interrupt id>", waiting["id"])
    answered = json.loads(_sh(newcomer, f"{setup}\n{answer}", folder))
    assert "error" not in answered, answered
    newcomer.wait_status(run["id"], "completed")
    transfers = json.loads(_sh(newcomer, ledger, folder))["transfers"]
    assert [(t["run"], t["to"], t["amount"]) for t in transfers] == [(run["id"], "Bob", 250)]

    # 3. The client page's script, next: a run of its own (its idempotency key is not the
    # curl session's), approved, finished. (With one key, it got the curl run, completed,
    # and `run.open_interrupts[0]` raised IndexError.)
    [client_page] = blocks("docs/client.md", "python")[:1]
    out = _python(newcomer, client_page, folder)
    assert out.strip() == "Sent 250 to Bob.", out
    assert len(newcomer.ledger()["transfers"]) == 2

    # 4. "Writing agents": the scripted agent, run the way the page says.
    said = re.search(r"`layby run orders \"([^\"]+)\"` answers \"([^\"]+)\"",
                     (ROOT / "docs/writing-agents.md").read_text())
    assert said, "the page no longer says how to run the scripted agent"
    request, answer_text = said.groups()
    ran = subprocess.run([str(Path(sys.executable).parent / "layby"), "run", "orders",
                          request], env=newcomer.env, cwd=folder, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=60, check=False)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[-1] == answer_text, ran.stdout
