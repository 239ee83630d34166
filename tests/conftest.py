"""Session fixtures: one real Valkey server and one layby system (worker, sweeper, gateway)
on its database 0. Tests that kill or restart parts build their own on other databases.

The tiers. A test that starts a process (a worker, the gateway, a browser, a command, an
install), or uses a fixture that does, carries the `integration` marker; `./dev check`
runs the others (`-m "not integration"`): unit tests, and the store's own tests against
a real Valkey. Tests that use the fixtures in PROCESS_FIXTURES are marked here; a test
that starts processes itself is marked in its module. Outside `integration`, starting any
process but a Valkey server fails the test, so the fast tier stays fast and honest."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from layby.ops.embedded import EmbeddedCluster, EmbeddedRedis
from tests.support.harness import LaybySystem, stop_all
from tests.support.reviewers import ReviewedSystem, SmtpServer, WebhookReceiver, reviewed_system
from tests.support.tls import share as share_tls

# Every httpx client of a test process takes one TLS context (tests/support/tls.py): built
# for each, they cost the suite's processes more CPU than their tests did.
share_tls()

# pytest rewrites every test module's asserts as it imports it (about 10 s of CPU for the
# suite's modules, in each pytest process) and keeps what it wrote in __pycache__, unless
# writing bytecode is off, as PYTHONDONTWRITEBYTECODE (which CI images often set) turns it
# off: then every pytest process (each xdist worker, each of ./dev test's phases) rewrites
# them all again. This process only: the processes the tests start keep the variable as
# they found it.
sys.dont_write_bytecode = False

# Fixtures (here and in test modules) that start layby's processes or other programs; a
# test is marked by any of them it uses, however indirectly. A cluster's six servers take
# seconds to form: not for the quick tier, though they are only Valkey.
PROCESS_FIXTURES = frozenset({
    "system", "isolated", "reviewed", "policed", "fuzzed", "flower", "durable", "reminding",
    "kit", "sentinels", "chatty", "browser", "quick_expiry", "valkey_cluster", "inboxed",
})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


_ALLOWED_PROGRAMS = ("valkey",)  # the store's tests run against a real server


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None
                            ) -> Generator[None, object, object]:
    if item.get_closest_marker("integration"):
        return (yield)
    original = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def refuse(self: subprocess.Popen[Any], args: Any, executable: Any, *rest: Any) -> Any:
        program = os.path.basename(str(executable or (args if isinstance(args, (str, bytes))
                                                      else args[0])))
        if not program.startswith(_ALLOWED_PROGRAMS):
            raise AssertionError(
                f"{item.nodeid} started {program!r} but is not marked integration: add "
                "`@pytest.mark.integration` (or use a fixture of PROCESS_FIXTURES in "
                "tests/conftest.py), so `./dev check` stays the tier that starts no process")
        return original(self, args, executable, *rest)

    subprocess.Popen._execute_child = refuse  # type: ignore[attr-defined]
    try:
        return (yield)
    finally:
        subprocess.Popen._execute_child = original  # type: ignore[attr-defined]


def _valkey(factory: pytest.TempPathFactory, name: str) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(factory.mktemp(name)).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    yield from _valkey(tmp_path_factory, "valkey")


@pytest.fixture(scope="session")
def valkey_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    """A Valkey Cluster: 3 primaries, a replica each, a node timeout of 1 s. Shared by the
    session: a test that moves a slot puts it back, and one that kills a node starts an
    `EmbeddedCluster` of its own."""
    cluster = EmbeddedCluster(tmp_path_factory.mktemp("valkey-cluster")).start()
    yield cluster
    cluster.stop()


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
    stop_all(made)
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
