"""Testing your own agents and jobs against real parts: an embedded Valkey server, a Celery
worker and the sweeper in threads of the test process, and the HTTP gateway on loopback,
driven with `layby.Client`. No fake of Redis or Celery.

As pytest fixtures (`layby.testing.plugin`, registered with pytest when layby is installed)::

    def test_refund_needs_approval(layby_client):
        run = layby_client.start("shop.refund", input="Refund order 42")
        run = layby_client.wait(run.id, until={"interrupted"})
        layby_client.answer(run.id, run.open_interrupts[0].id, payload={"approved": True})
        assert layby_client.wait(run.id).status == "completed"

While it runs, LAYBY_URL and LAYBY_API_KEY name it (so `layby.Client()` with no arguments,
in a script under test, reaches it), and LAYBY_REDIS_URL its Valkey. `layby_server`
(session-scoped: the first test pays the start-up, about a second; later tests reuse it)
loads the agent and task modules named by the `layby_agent_modules` and `layby_task_modules`
ini options (pytest.ini / pyproject.toml), or else by LAYBY_AGENT_MODULES and
LAYBY_TASK_MODULES. Outside pytest, `serve(...)` is the same as a
context manager.
"""

from __future__ import annotations

import logging
import os
import secrets
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layby.client import Client

# The kit's parts (Celery, Redis, uvicorn, the embedded server) are imported when it starts:
# pytest loads the plugin in every session of every project that has layby installed.
if TYPE_CHECKING:
    from layby.broker_config import Settings
    from layby.control import Runtime

log = logging.getLogger(__name__)

# Short timers: a test waits seconds, not minutes, for what the sweeper does.
TEST_SETTINGS: dict[str, Any] = {"lease_s": 10.0, "outbox_grace_s": 2.0,
                                 "sweep_interval_s": 0.5, "visibility_timeout_s": 60,
                                 "turn_budget_s": 5.0}


@dataclass
class LaybyServer:
    """A running layby for tests: `client` talks to its gateway at `url` with `api_key`;
    `runtime` is the application object its worker and gateway share."""

    url: str
    api_key: str
    redis_url: str
    runtime: Runtime
    client: Client

    def new_client(self) -> Client:
        """Another client of this server (the caller closes it)."""
        return Client(self.url, api_key=self.api_key)


@contextmanager
def serve(agent_modules: Sequence[str], task_modules: Sequence[str] = (), *,
          worker_threads: int = 4, **settings: Any) -> Iterator[LaybyServer]:
    """Start Valkey, a worker, the sweeper and the gateway for these modules; stop them on
    exit. `settings` override `Settings` fields (`LAYBY_*` names without the prefix)."""
    from layby.control import build
    from layby.ops.embedded import EmbeddedRedis

    with ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="layby-test-")))
        redis = EmbeddedRedis(folder / "valkey").start()
        stack.callback(redis.stop)
        api_key = "lby_test_" + secrets.token_urlsafe(16)
        rt = build(_settings({**TEST_SETTINGS, "redis_url": redis.url,
                              "data_dir": folder / "data", "api_keys": [api_key],
                              "agent_modules": list(agent_modules),
                              "task_modules": list(task_modules), **settings}))
        stack.enter_context(_worker(rt, worker_threads))
        stack.enter_context(_sweeper(rt))
        url = stack.enter_context(_gateway(rt))
        stack.enter_context(_environment({
            "LAYBY_URL": url, "LAYBY_API_KEY": api_key, "LAYBY_REDIS_URL": redis.url,
            "LAYBY_KEY_PREFIX": rt.settings.key_prefix}))
        client = stack.enter_context(Client(url, api_key=api_key))
        yield LaybyServer(url, api_key, redis.url, rt, client)


def _settings(values: dict[str, Any]) -> Settings:
    """Settings from code only: the developer's LAYBY_* variables (a real SMTP server, a
    reviewer directory, a metrics port) never reach a test's server."""
    from layby.broker_config import Settings

    class OwnSettings(Settings):
        @classmethod
        def settings_customise_sources(cls, settings_cls: Any, init_settings: Any,
                                       *_: Any, **__: Any) -> tuple[Any, ...]:
            return (init_settings,)

    unknown = sorted(set(values) - set(Settings.model_fields))
    if unknown:
        raise TypeError(f"serve() got settings layby does not have: {unknown} (they are "
                        "Settings fields: LAYBY_* names without the prefix, in lowercase)")
    return OwnSettings(**values)


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """While the server runs, code that reads LAYBY_* variables finds it: `layby.Client()`
    with no arguments, a tool keeping its own Redis client (the demo's ledger)."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def _worker(rt: Runtime, threads: int) -> Iterator[None]:
    """A Celery worker in a thread of this process, on every queue but the sweeper's."""
    from celery.contrib.testing.worker import start_worker

    from layby.broker_config import worker_queues
    from layby.tasks import register

    app = register(rt)
    for module in rt.settings.task_modules:  # as `celery worker` imports its app's `include`
        __import__(module)
    with start_worker(app, pool="threads", concurrency=threads, perform_ping_check=False,
                      loglevel="WARNING",
                      queues=[*worker_queues(rt.settings), *rt.pinned_queues],
                      shutdown_timeout=30):
        yield


@contextmanager
def _sweeper(rt: Runtime) -> Iterator[None]:
    """What `layby sweeper` does, every LAYBY_SWEEP_INTERVAL_S, in a thread."""
    from layby.tasks.sweeper import sweep

    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(rt.settings.sweep_interval_s):
            try:
                sweep(rt)
            except Exception:  # as the sweeper's next beat would, try again next time
                log.exception("sweep failed")

    thread = threading.Thread(target=loop, name="layby-sweeper", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


@contextmanager
def _gateway(rt: Runtime) -> Iterator[str]:
    """The HTTP gateway on a free loopback port, in a thread; yields its URL."""
    import uvicorn

    from layby.http.app import create_app
    from layby.ops.embedded import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(rt), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="on",
                                           timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, name="layby-gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError("the layby gateway did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


__all__ = ["LaybyServer", "serve"]
