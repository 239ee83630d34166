"""The shape of the package: one direction between rooms (import-linter's contracts in
pyproject.toml, run as a developer runs them: `lint-imports` at the top of the tree), a
small public surface, every module of the package as installed importable, and no work at
import."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import layby
from tests.support.harness import source_copy

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).parent / "lint-imports"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package as a wheel lays it out (tasks/, broker_config/ and notifier/ inside
    layby/)."""
    target = tmp_path_factory.mktemp("installed")
    source = source_copy(tmp_path_factory.mktemp("source"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-compile", "--target", str(target), str(source)], check=True,
                   timeout=300)
    return target


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` at the top of a source tree (the tree's own `layby` first on the path,
    not the editable install's)."""
    return subprocess.run([str(LINT)], cwd=tree,
                          env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.integration
def test_the_import_contracts_hold() -> None:
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout
    assert "one direction: a room imports only the rooms below it KEPT" in done.stdout


@pytest.mark.integration
@pytest.mark.parametrize("room", ["layby/generation", "tasks"])
def test_a_room_importing_upwards_breaks_the_contracts(tmp_path: Path, room: str) -> None:
    """In a room under layby/ and in one of the design card's top-level folders alike."""
    tree = source_copy(tmp_path / "tree")
    (tree / room / "sneaky.py").write_text(
        "from layby.http import app  # nothing below the edge may know it\n")
    done = lint(tree)
    assert done.returncode != 0
    importer = room.replace("/", ".") if room.startswith("layby") else f"layby.{room}"
    assert f"{importer} is not allowed to import layby.http" in done.stdout
    assert f"- {importer}.sneaky -> layby.http.app" in done.stdout


def _sources() -> list[Path]:
    """The package's modules, through its links to tasks/, broker_config/ and notifier/."""
    return [Path(folder) / name
            for folder, _, names in os.walk(ROOT / "layby", followlinks=True)
            for name in names if name.endswith(".py")]


def _imports() -> dict[str, set[str]]:
    """Each module of the package → the modules of the package it imports (at its top, in
    a function, or for type checking alike: a circle of any of them is one to a reader)."""
    found = {}
    for path in _sources():
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {name: set() for name in found}
    for name, path in found.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                graph[name] |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in found
                                else node.module for a in node.names} & found.keys()
            elif isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names} & found.keys()
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(name: str) -> None:
        order[name] = low[name] = len(order)
        stack.append(name)
        for other in graph[name] - {name}:
            if other not in order:
                visit(other)
                low[name] = min(low[name], low[other])
            elif other in stack:
                low[name] = min(low[name], order[other])
        if low[name] == order[name]:
            group = stack[stack.index(name):]
            del stack[stack.index(name):]
            if len(group) > 1:
                circles.append(sorted(group))

    for name in sorted(graph):
        if name not in order:
            visit(name)
    return circles


def test_no_module_imports_round_a_circle_nor_anothers_private_names() -> None:
    graph = _imports()
    assert "layby.generation.agents" in graph["layby.generation.turn"]  # the edges are read
    assert "layby.notifier.delivery" in graph["layby.tasks"]  # through the links too
    assert _circles(graph) == []
    # The check sees a circle when there is one: the turn's module imported back.
    looped = {**graph, "layby.generation.agents": graph["layby.generation.agents"]
              | {"layby.generation.turn"}}
    assert ["layby.generation.agents", "layby.generation.turn"] in _circles(looped)
    private = [f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{alias.name}"
               for path in _sources()
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("layby")
               for alias in node.names
               if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert private == []


# How big a class or a function of the package may grow before a reader loses its thread:
# a class holds one concern (the store is a core and a part per concern), a function
# reads on one screen (split where a name explains a step).
MOST_PUBLIC_METHODS = 30
MOST_LINES = 45


def test_classes_hold_one_concern_and_functions_fit_on_a_screen() -> None:
    crowded, long = [], []
    for path in _sources():
        where = path.relative_to(ROOT)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                public = {f.name for f in node.body
                          if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                          and not f.name.startswith("_")}
                if len(public) > MOST_PUBLIC_METHODS:
                    crowded.append(f"{where}:{node.lineno} {node.name}: {len(public)}")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MOST_LINES:
                    long.append(f"{where}:{node.lineno} {node.name}: {lines} lines")
    assert crowded == [], f"more than {MOST_PUBLIC_METHODS} public methods: split by concern"
    assert long == [], f"over {MOST_LINES} lines: split where a name explains a step"


def test_the_public_surface_is_small_and_complete() -> None:
    names = layby.__all__
    assert len(names) == len(set(names)) and 20 <= len(names) <= 34, names
    namespace: dict[str, object] = {}
    exec("from layby import *", namespace)  # noqa: S102
    assert set(names) <= set(namespace)
    # What an agent module needs is there.
    assert {"Agent", "tool", "interrupt_tool", "ToolContext", "Ask", "Approval",
            "ScriptedModel", "Reply", "Call", "Client", "AsyncClient", "RetryPolicy",
            "RetryLater"} <= set(names)
    assert (ROOT / "layby" / "py.typed").exists()


PROBE = """
import json, sys
import layby
after_layby = sorted(m for m in ("celery", "kombu", "redis", "fastapi", "uvicorn")
                     if m in sys.modules)
from kombu.transport import TRANSPORT_ALIASES
before = dict(TRANSPORT_ALIASES)
import layby.tasks, layby.http.app, layby.control, layby.ops.cli, layby.testing
import layby.broker_config, layby.notifier, layby.answering.listener, layby.demo.agents
print(json.dumps({"after_layby": after_layby,
                  "aliases_kept": dict(TRANSPORT_ALIASES) == before}))
"""


@pytest.mark.integration
def test_importing_layby_connects_to_nothing_and_reads_no_settings(tmp_path: Path) -> None:
    # Settings that could not even be read, and a Redis nobody listens on: an import that
    # read or used them would fail.
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "LAYBY_LOG_LEVEL": "LOUD",
           "LAYBY_REDIS_URL": "redis://127.0.0.1:1/0", "LAYBY_AGENT_MODULES": "nowhere"}
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"after_layby": [], "aliases_kept": True}


# What only some deployments use, loaded by the first use instead of at every start (a
# worker's start cost about 150 ms more with them: `layby up`, a restarted worker, each
# `layby` command pay it): CEL rule conditions, answers checked against a JSON schema,
# Slack, webhooks and layby's own HTTP client (httpx), and for a worker the mail templates.
SOME_USE = ["celpy", "lark", "jsonschema", "slack_sdk", "httpx"]
ON_FIRST_USE = {"layby.tasks.app": [*SOME_USE, "jinja2"],
                "layby.tasks.clock": [*SOME_USE, "jinja2"],
                "layby.http.app": SOME_USE,
                "layby.ops.cli": [*SOME_USE, "jinja2"]}


@pytest.mark.integration
@pytest.mark.parametrize("entry", sorted(ON_FIRST_USE))
def test_a_process_starts_without_what_only_some_deployments_use(entry: str) -> None:
    probe = (f"import json, sys, {entry}\n"
             "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert "celery" in loaded  # the probe saw the entry's imports
    assert loaded.isdisjoint(ON_FIRST_USE[entry]), loaded & set(ON_FIRST_USE[entry])


@pytest.mark.integration
def test_every_module_imports(installed: Path) -> None:
    """A name that moved or was renamed fails here, before any system test starts."""
    probe = ("import importlib, pkgutil, layby\n"
             "skip = {'layby.__main__', 'layby.tasks.app', 'layby.tasks.clock'}\n"
             "names = [m.name for m in pkgutil.walk_packages(layby.__path__, 'layby.')]\n"
             "for name in names:\n"
             "    if name not in skip:\n"
             "        importlib.import_module(name)\n"
             "print(len(names))\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=installed,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(installed)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) > 60
