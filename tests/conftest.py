"""Session fixtures: one real Valkey server and one layby system (worker, sweeper, gateway)
on its database 0. Tests that kill or restart parts build their own on other databases."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from layby.ops.embedded import EmbeddedRedis
from tests.harness import LaybySystem
from tests.reviewers import ReviewedSystem, SmtpServer, WebhookReceiver, reviewed_system


def _valkey(factory: pytest.TempPathFactory, name: str) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(factory.mktemp(name)).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    yield from _valkey(tmp_path_factory, "valkey")


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


@pytest.fixture(scope="session")
def reviewer_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """A Valkey server of the reviewer tests' own: `isolated` flushes databases 1-15."""
    yield from _valkey(tmp_path_factory, "valkey-reviewers")


@pytest.fixture(scope="session")
def reviewed(reviewer_redis: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[ReviewedSystem]:
    """One layby system with reviewers (alice and bob by email, hookbot by webhook), an
    SMTP server receiving its mail, a webhook receiver, and its reply listener."""
    logs: Path = tmp_path_factory.mktemp("reviewed")
    smtp = SmtpServer().start()
    hooks = WebhookReceiver().start()
    running = reviewed_system(LaybySystem(f"redis://127.0.0.1:{reviewer_redis.port}/0", logs,
                                          env_overrides={"LAYBY_DEMO_EXPIRY_S": "60"}),
                              logs, smtp, hooks)
    yield running
    running.system.stop()
    smtp.stop()
    hooks.stop()
