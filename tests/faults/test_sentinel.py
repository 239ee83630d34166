"""Redis Sentinel: broker and store reach the primary through three sentinels; when the
primary is killed, the sentinels promote the replica and everything carries on: parked
runs take their answers and finish, a run caught mid-tool finishes, new runs park and
finish, `layby doctor` names the new primary. Real Valkey processes (a primary, a replica,
three sentinels, all with passwords), real Celery workers, real HTTP.

Also: configuration mistakes are refused with a clear message, passwords stay out of logs
and of Celery's `inspect conf`, and WAIT (LAYBY_REDIS_MIN_REPLICAS_ACK) refuses to
acknowledge what no replica has.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from layby.broker_config import Settings, make_celery
from layby.broker_config.celery_app import celery_config
from layby.control import connections
from layby.control.runtime import TASK_NAMES
from layby.errors import ConfigError
from layby.generation import text_message
from layby.ops.embedded import EmbeddedRedis
from layby.parking import NotReplicated, Store, StoreConfig, Verdict
from tests.support.harness import ROOT, LaybySystem, wait_until
from tests.support.sentinels import DATA_PASSWORD, MASTER, SENTINEL_PASSWORD, SentinelSetup


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[SentinelSetup]:
    setup = SentinelSetup(tmp_path / "valkey")
    try:
        yield setup.start()
    finally:
        setup.stop()


def _answer_when_up(system: LaybySystem, run_id: str, interrupt_id: str) -> httpx.Response:
    """The answer, sent again while the gateway says Redis is away (503)."""
    def attempt() -> httpx.Response | None:
        reply = system.answer(run_id, interrupt_id, payload={"approved": True})
        return None if reply.status_code == 503 else reply

    return wait_until(attempt, 30, every=0.5, what=f"an answer to {run_id} to be taken")


def _cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.slow
def test_failover_keeps_parked_and_running_runs_going(sentinels: SentinelSetup,
                                                      tmp_path: Path) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    # A lease above the few seconds the failover takes: the held run is not requeued while
    # its tool legitimately waits.
    system = LaybySystem(sentinels.url, tmp_path / "system", env_overrides={
        **sentinels.env, "LAYBY_TEST_GATE_DIR": str(gates), "LAYBY_LEASE_S": "10"}).start()
    try:
        parked = []
        for i in range(3):
            run = system.start_run("demo.transfer", f"Send {10 + i} to Ann{i}")
            parked.append(system.wait_status(run["id"], "interrupted"))
        held = system.start_run("test.gated", "gate1")
        wait_until(lambda: (gates / "gate1.started").exists(), 30,
                   what="the held run's tool to start")
        assert system.run(held["id"])["status"] == "running"

        old_primary = sentinels.primary()
        sentinels.wait_replicated()
        old_primary.kill()

        # While the sentinels fail over, the API answers or says 503, never a 500.
        with system.api() as api:
            during = api.post("/v1/runs", json={"agent": "demo.transfer",
                                                "input": "Send 5 to Bo"})
        assert during.status_code in (202, 503), during.text
        if during.status_code == 503:
            assert during.json()["error"]["code"] == "redis_unavailable"

        def promoted() -> int | None:
            port = sentinels.primary_port()
            return None if port == old_primary.port else port

        new_port = wait_until(promoted, 60, every=0.2, what="the sentinels to promote the replica")
        (gates / "gate1").touch()

        for run in parked:
            (approval,) = system.open_interrupts(run)
            reply = _answer_when_up(system, run["id"], approval["id"])
            assert reply.status_code == 200, reply.text
        for i, run in enumerate(parked):
            done = system.wait_status(run["id"], "completed", "failed", timeout=60)
            assert done["result"] == f"Sent {10 + i} to Ann{i}.", done
        transfers = [t["run"] for t in system.ledger()["transfers"]]
        assert sorted(transfers) == sorted(r["id"] for r in parked)  # each exactly once

        done = system.wait_status(held["id"], "completed", "failed", timeout=60)
        assert done["result"] == "Released: released.", done

        if during.status_code == 202:  # started during the failover: it parks too
            system.wait_status(during.json()["id"], "interrupted", timeout=60)
        fresh = system.start_run("demo.transfer", "Send 7 to Cy")
        (approval,) = system.open_interrupts(
            system.wait_status(fresh["id"], "interrupted", timeout=60))
        assert system.answer(fresh["id"], approval["id"],
                             payload={"approved": True}).status_code == 200
        assert system.wait_status(fresh["id"], "completed", timeout=60)["result"] == \
            "Sent 7 to Cy."
        with system.api() as api:  # the gateway's asyncio client, through the sentinels too
            events = api.get(f"/v1/runs/{fresh['id']}/events")
        assert events.status_code == 200 and "event: run.completed" in events.text

        doctor = _cli(system.env, "-m", "layby.ops.cli", "doctor")
        lines = doctor.stdout.splitlines()
        assert f"OK      redis primary: 127.0.0.1:{new_port}, named by 3 sentinel(s)" \
            in lines, doctor.stdout + doctor.stderr
        assert f"OK      redis sentinels: 3 of 3 answer for {MASTER!r}" in lines
        # The old primary is gone and nothing replaces it: no replica left to promote.
        replicas = next(line for line in lines if "redis replicas" in line)
        assert replicas.startswith("PROBLEM") and "replicaof" in replicas
        assert doctor.returncode == 1

        conf = _cli(system.env, "-m", "celery", "-A", "layby.tasks.app", "inspect", "conf",
                    "--json", "--timeout", "10")
        assert conf.returncode == 0, conf.stderr
        assert "sentinel_kwargs" in conf.stdout and "********" in conf.stdout
        logs = "".join(p.output() for p in system.procs.values())
        for secret in (DATA_PASSWORD, SENTINEL_PASSWORD):
            assert secret not in conf.stdout + conf.stderr
            assert secret not in logs
            assert secret not in doctor.stdout + doctor.stderr
    finally:
        system.stop()


def test_a_sentinel_url_configures_the_store_and_the_broker_alike() -> None:
    settings = Settings(redis_url="sentinel://:p%40ss@10.0.0.1:26380/3;sentinel://10.0.0.2",
                        redis_sentinel_master="main", redis_sentinel_password="s3cret")
    group = connections.sentinel_group(settings.redis_url or "")
    assert group.sentinels == [("10.0.0.1", 26380), ("10.0.0.2", 26379)]
    assert group.password is not None and group.password.get_secret_value() == "p@ss"
    assert group.db == 3
    options = celery_config(settings)["broker_transport_options"]
    assert options["master_name"] == "main"  # type: ignore[index]
    assert options["sentinel_kwargs"]["password"] == "s3cret"  # type: ignore[index]
    # What `celery inspect conf` and Flower show of it.
    shown = repr(make_celery(settings).conf.table(with_defaults=False))
    for secret in ("s3cret", "p@ss", "p%40ss"):
        assert secret not in shown


@pytest.mark.parametrize("url,master,expected", [
    ("sentinel://:s3cret@h1:26379;redis://h2:6379", "m", "address 2 of LAYBY_REDIS_URL is "
     "not a sentinel:// address"),
    ("sentinel://h1:26379;sentinel://:s3cret@h2:26379", "m", "from the first address only"),
    ("sentinel://:s3cret@h1:26379/0;sentinel://:s3cret@h2:26379/1", "m",
     "from the first address only"),
    ("sentinel://:s3cret@h1:26379/zero", "m", "must be a database number"),
    ("sentinel://:s3cret@h1:26379?master_name=m", "m", "takes none"),
    ("sentinel://:s3cret@h1:port", "m", "port that is not a number"),
    ("sentinel://:s3cret@:26379", "m", "has no host"),
    ("sentinel://:s3cret@h1:26379", " ", "LAYBY_REDIS_SENTINEL_MASTER is empty"),
])
def test_bad_sentinel_configuration_says_what_to_fix(url: str, master: str,
                                                      expected: str) -> None:
    settings = Settings(redis_url=url, redis_sentinel_master=master)
    with pytest.raises(ConfigError) as caught:
        connections.redis_client(settings)
    assert expected in caught.value.message
    assert "s3cret" not in caught.value.message


@pytest.mark.integration
def test_a_bad_sentinel_url_stops_the_layby_command_with_the_message(tmp_path: Path
                                                                     ) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "LAYBY_DATA_DIR": str(tmp_path),
           "LAYBY_REDIS_URL": "sentinel://:s3cret@h1:26379;sentinel://:0therPw@h2:26379"}
    done = _cli(env, "-m", "layby.ops.cli", "runs", "ls")
    assert done.returncode == 1
    assert "error: address 2 of LAYBY_REDIS_URL gives a user, password or database" \
        in done.stderr, done.stderr
    for secret in ("s3cret", "0therPw"):
        assert secret not in done.stderr + done.stdout


# -- WAIT: acknowledged only once a replica has it -----------------------------------------


def _create(store: Store, run_id: str) -> Any:
    return store.runs.create_run(run_id, "demo.transfer", input="hi",
                                 messages=[text_message("user", "hi")], metadata={},
                                 idempotency_key=None)


def test_min_replicas_ack_waits_for_a_replica_and_refuses_without_one(tmp_path: Path) -> None:
    primary = EmbeddedRedis(tmp_path / "primary").start()
    replica = EmbeddedRedis(tmp_path / "replica",
                            options={"replicaof": f"127.0.0.1 {primary.port}"}).start()
    try:
        with redis.Redis(port=replica.port, decode_responses=True) as on_replica:
            wait_until(lambda: on_replica.info("replication")["master_link_status"] == "up",
                       20, what="the replica to sync")
            store = Store(redis.Redis(port=primary.port, decode_responses=True),
                          StoreConfig(TASK_NAMES, prefix="wait", min_replicas_ack=1,
                                      replica_ack_timeout_ms=300))
            assert _create(store, "run_acked").ok
            # Acknowledged means on the replica already: no waiting for it.
            assert on_replica.hget("wait:{run_acked}:run", "status") == "queued"

            replica.stop()
            with pytest.raises(NotReplicated) as caught:
                _create(store, "run_alone")
            assert "0 of the 1 replica(s)" in str(caught.value)
            assert "LAYBY_REDIS_MIN_REPLICAS_ACK" in str(caught.value)
            # Written on the primary all the same; a refused write is not an error.
            assert store.runs.view("run_alone") is not None
            assert _create(store, "run_alone").verdict is Verdict.EXISTS
    finally:
        replica.stop()
        primary.stop()
