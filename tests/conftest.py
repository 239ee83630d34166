"""Session fixtures: one real Valkey server and one layby system (worker, sweeper, gateway)
on its database 0. Tests that kill or restart parts build their own on other databases."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.embedded import EmbeddedRedis
from tests.harness import LaybySystem


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path_factory.mktemp("valkey")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def system(redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[LaybySystem]:
    logs: Path = tmp_path_factory.mktemp("system")
    running = LaybySystem(f"redis://127.0.0.1:{redis_server.port}/0", logs).start()
    yield running
    running.stop()


@pytest.fixture
def isolated(redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[callable]:
    """Build systems on databases of their own (1, 2, …), stopped after the test."""
    made: list[LaybySystem] = []
    counter = iter(range(1, 16))

    def make(**env: str) -> LaybySystem:
        db = next(counter)
        made.append(LaybySystem(f"redis://127.0.0.1:{redis_server.port}/{db}",
                                tmp_path / f"db{db}", env_overrides=env))
        return made[-1]

    yield make
    for s in made:
        s.stop()
    import redis as _r

    for db in range(1, 16):
        _r.Redis(port=redis_server.port, db=db).flushdb()
