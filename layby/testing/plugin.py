"""layby's pytest plugin: the `layby_server` and `layby_client` fixtures (see `layby.testing`),
and the `layby_agent_modules` / `layby_task_modules` ini options that configure them.
Registered through the `pytest11` entry point; importing it starts nothing."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # the kit (Celery, Redis, uvicorn) is imported when a test asks for it
    from layby.client import Client
    from layby.testing import LaybyServer


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("layby_agent_modules", "modules with your layby Agents (for the "
                  "layby_server fixture)", type="args", default=[])
    parser.addini("layby_task_modules", "modules with your Celery tasks used as background "
                  "jobs (for the layby_server fixture)", type="args", default=[])


def _modules(config: pytest.Config, name: str) -> list[str]:
    given = list(config.getini(f"layby_{name}"))
    if given:
        return given
    return [m.strip() for m in os.environ.get(f"LAYBY_{name.upper()}", "").split(",")
            if m.strip()]


@pytest.fixture(scope="session")
def layby_server(pytestconfig: pytest.Config) -> Iterator[LaybyServer]:
    """A running layby (Valkey, worker, sweeper, gateway) for the whole test session."""
    agents = _modules(pytestconfig, "agent_modules")
    if not agents:
        raise pytest.UsageError("layby_server needs your agent modules: set "
                                "`layby_agent_modules = [\"yourpackage.agents\"]` in "
                                "[tool.pytest.ini_options], or LAYBY_AGENT_MODULES")
    from layby.testing import serve

    with serve(agents, _modules(pytestconfig, "task_modules")) as server:
        yield server


@pytest.fixture
def layby_client(layby_server: LaybyServer) -> Client:
    """The `layby.Client` of the session's server."""
    return layby_server.client


__all__ = ["layby_client", "layby_server"]
