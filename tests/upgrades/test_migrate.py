"""`layby migrate` and the format check, as an operator meets them after upgrading from
layby 0.1.0: every part refuses the unversioned store in one line that says what to run;
`layby doctor` says the same; `--dry-run` counts and changes nothing; a migration killed
with SIGKILL mid-way goes on where it stopped when run again, and a second run changes
nothing. A store of format 1 shared with a process of layby 0.2.0 is not switched to format 2
(the sharded layout) until it is gone, or `--finish` is given. (Runs parked by the previous
release itself completing after the upgrade: test_upgrade.py.)"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from layby.ops.embedded import EmbeddedRedis
from layby.parking import Keys, formats
from layby.parking.migrations.m0001_versioned import old_keys
from tests.store.conftest import MESSAGES, World
from tests.store.test_migrations import _aged, _parked_with_a_note
from tests.support import forkserver
from tests.support.harness import ROOT

pytestmark = pytest.mark.integration

LAYBY = str(Path(sys.executable).parent / "layby")


@dataclass
class Unversioned:
    """A store as layby 0.1.0 left it (runs, no format version), and the environment of
    this layby's command on it."""

    world: World
    env: dict[str, str]

    def layby(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return forkserver.run([LAYBY, *args], self.env, ROOT, timeout)


@pytest.fixture
def unversioned(redis_server: EmbeddedRedis, tmp_path: Path,
                request: pytest.FixtureRequest) -> Iterator[Unversioned]:
    prefix = f"mig{abs(hash(request.node.name)) % 10**8}"
    client = redis.Redis(port=redis_server.port, db=9, decode_responses=True)
    world = World(client, prefix, None)  # type: ignore[arg-type]  # no task pushed
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYBY_")}
    env |= {"LAYBY_REDIS_URL": f"redis://127.0.0.1:{redis_server.port}/9",
            "LAYBY_KEY_PREFIX": prefix, "LAYBY_DATA_DIR": str(tmp_path),
            "LAYBY_BROKER_KEY_PREFIX": f"{prefix}:broker:"}
    yield Unversioned(world, env)
    for key in [*client.scan_iter(match=f"{prefix}:*"),
                *client.scan_iter(match=f"{{{prefix}:format}}:*")]:
        client.delete(key)
    client.close()


def _refused(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    [line] = [ln for ln in done.stderr.splitlines() if "no format version" in ln]
    assert "reads formats 1–2" in line and "`layby migrate`" in line
    return line


def test_every_part_refuses_the_store_of_0_1_0_until_it_is_migrated(
        unversioned: Unversioned) -> None:
    u = unversioned
    _parked_with_a_note(u.world, "run_1")
    _refused(u.layby("runs", "ls"))
    _refused(u.layby("worker", "--concurrency", "1", timeout=120))
    _refused(u.layby("gateway", "--port", "0", timeout=120))
    doctor = u.layby("doctor")
    assert re.search(r"PROBLEM store format: the store has no format version", doctor.stdout)

    counted = u.layby("migrate", "--dry-run")
    assert counted.returncode == 0, counted.stderr
    # The run and its stream; then the run (and what it has) to move.
    assert "migration 1 (" in counted.stdout and "2 keys looked at, 0 would change" in \
        counted.stdout
    assert re.search(r"migration 2 \(the sharded layout.*\): \d+ keys looked at, [1-9]\d* "
                     "would change", counted.stdout), counted.stdout
    assert formats.read(u.world.client, u.world.keys).version is None

    done = u.layby("migrate")
    assert done.returncode == 0, done.stderr
    assert "migrating" in done.stderr  # the progress bar
    assert "the store is at format 2" in done.stdout
    assert "2 keys looked at, 0 changed" in done.stdout
    listed = u.layby("runs", "ls")
    assert listed.returncode == 0 and "run_1" in listed.stdout, listed.stderr
    doctor = u.layby("doctor")
    assert "OK      store format: format 2" in doctor.stdout
    again = u.layby("migrate")
    assert again.returncode == 0
    assert "nothing to do: the store is at format 2" in again.stdout


def test_a_migration_killed_mid_way_goes_on_where_it_stopped(unversioned: Unversioned) -> None:
    u = unversioned
    runs = 400
    for n in range(runs):
        _parked_with_a_note(u.world, f"run_{n:03}")
        _aged(u.world, f"run_{n:03}")
    counted = u.layby("migrate", "--dry-run")
    # Each run and its stream (written as format 1 writes it: nothing to change there).
    assert f"{2 * runs} keys looked at, {runs} would change" in counted.stdout, counted.stdout

    migrating = subprocess.Popen([LAYBY, "migrate", "--batch", "2"], env=u.env, cwd=ROOT,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    client, keys = u.world.client, u.world.keys
    deadline = time.monotonic() + 60
    # Killed once a batch changed some runs (a batch of two keys may hold none to change:
    # a stream, an index): the cursor alone does not say it did.
    while (not int(client.hget(keys.format, "m1:changed") or 0)
           and time.monotonic() < deadline):
        time.sleep(0.01)
    migrating.send_signal(signal.SIGKILL)
    migrating.communicate(timeout=30)
    state = formats.read(client, keys)
    assert state.version is None and state.migrating == 1, "killed after it finished"
    legacy = sum(1 for n in range(runs) if client.exists(old_keys(keys, f"run_{n:03}")[0]))
    assert 0 < legacy < runs

    # Its lock names a process of this machine that is gone: the next run takes it over.
    assert client.exists(keys.migrate_lock)
    done = u.layby("migrate", "--batch", "50")
    assert done.returncode == 0, done.stderr
    assert "the store is at format 2" in done.stdout
    assert not any(client.exists(old_keys(keys, f"run_{n:03}")[0]) for n in range(runs))
    # (Migrated on to the sharded layout: a store that reads the format now finds them.)
    store = u.world.store_with()
    held = [client.hkeys(store.keys.run(f"run_{n:03}")) for n in range(runs)]
    assert all(fields and "id" not in fields for fields in held)
    view = store.runs.view("run_123")
    assert view is not None and [i.id for i in view.interrupts] == ["int_a", "int_b"]
    assert u.layby("migrate").stdout.startswith("nothing to do")


@contextmanager
def _beating(store: Any, name: str, about: str) -> Iterator[None]:
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(1.0):
            store.processes.beat_worker(name, about)

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        yield
    finally:
        stop.set()
        beater.join()


def test_the_next_format_waits_for_the_older_processes_or_for_finish(
        unversioned: Unversioned) -> None:
    """A store at format 1 (the legacy layout, as layby 0.2.0 made it) that a process of
    0.2.0 shares: `layby migrate` refuses, naming it; `--finish` switches at once, with a
    warning, waits for the layout instant, and moves the store to the sharded layout."""
    u = unversioned
    assert u.world.store.runs.create_run("run_1", "demo.agent", input="hi", messages=MESSAGES,
                                         metadata={"team": "a"}, idempotency_key=None).ok
    u.world.client.hset(u.world.keys.format, "version", 1)
    u.world.store.processes.beat_worker("layby-1@old:42", "worker 1 0.2.0")
    before = u.world.run_hash("run_1")

    # The old worker beats as a live one does, however long `layby` takes to start (on a
    # loaded machine, longer than one beat lives).
    with _beating(u.world.store, "layby-1@old:42", "worker 1 0.2.0"):
        refused = u.layby("migrate", timeout=120)
    assert refused.returncode == 1, refused.stdout
    assert "processes of an older release are alive: layby-1@old:42 (worker 1 0.2.0)" in \
        refused.stderr
    assert "the store writes format 1 until they are gone" in refused.stderr
    assert formats.read(u.world.client, u.world.keys).written == 1
    assert u.world.client.exists(u.world.keys.run("run_1"))

    # Still alive (each `layby` takes seconds to start: its beat would lapse meanwhile).
    u.world.store.processes.beat_worker("layby-1@old:42", "worker 1 0.2.0")
    began = time.monotonic()
    with _beating(u.world.store, "layby-1@old:42", "worker 1 0.2.0"):
        done = u.layby("migrate", "--finish", timeout=120)
    assert done.returncode == 0, done.stderr
    assert "warning: switched to format 2 with processes of an older release in the " \
           "registry: layby-1@old:42" in done.stderr
    # Every process uses the sharded layout from the layout instant on: it waits for it.
    assert re.search(r"waited \d+\.\d s for every process to write format 2", done.stderr)
    assert time.monotonic() - began >= formats.FRESH_S + formats.LAYOUT_MARGIN_S
    assert re.search(r"migration 2 \(.*\): \d+ keys looked at, [1-9]\d* changed", done.stdout)
    assert "the store is at format 2" in done.stdout
    state = formats.read(u.world.client, u.world.keys)
    assert state.version == 2 and state.shards == 48
    assert not u.world.client.exists(u.world.keys.run("run_1"))
    moved = u.world.client.hgetall(Keys(u.world.prefix, 48).run("run_1"))
    assert moved == {k: v for k, v in before.items() if k != "sent"}
