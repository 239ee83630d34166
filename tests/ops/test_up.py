"""`layby up` as a newcomer runs it: embedded Valkey, worker, sweeper, gateway, reply
listener and mail catcher; a parked run survives Ctrl-C and a second `layby up` on the same
data folder; the whole email round trip works in a browser."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
import redis

from layby.ops.embedded import EmbeddedCluster, EmbeddedRedis, free_port
from layby.parking.keys import Keys
from tests.support.harness import ROOT, back_to_the_legacy_layout, wait_until, wait_up

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# `layby up` starts six processes, each importing Celery or uvicorn: seconds on an idle
# machine, a minute or more beside two other test files on two cores.
UP_WITHIN_S = 120


def _up(data_dir: Path, port: int, log: Path, **more: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LAYBY_REDIS_URL", "LAYBY_API_KEYS") and not k.startswith("LAYBY_SMTP")}
    env.update(more)
    # Free ports rather than the defaults (1025, 2525), which a developer's own `layby up`
    # may hold while the tests run.
    env.update({"LAYBY_DATA_DIR": str(data_dir), "PYTHONPATH": str(ROOT),
                "LAYBY_MAIL_CATCHER_PORT": str(free_port()),
                "LAYBY_REPLY_LISTENER_PORT": str(free_port()),
                "LAYBY_FLOWER_PORT": str(free_port())})
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "layby.ops.cli", "up", "--port", str(port),
                                 "--concurrency", "1"], env=env, cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _printed(log: Path, label: str) -> str:
    match = re.search(rf"^\s+{label}\s+(\S+)", log.read_text(), flags=re.MULTILINE)
    return match.group(1) if match else ""


def _client(base: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"})


def _stop(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """Ctrl-C as a terminal sends it; returns what was still running afterwards."""
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0
    return [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def test_layby_up_survives_a_restart_with_a_parked_run(tmp_path: Path) -> None:
    data_dir, port, log = tmp_path / "data", free_port(), tmp_path / "up.log"
    base = f"http://127.0.0.1:{port}"
    up = _up(data_dir, port, log)
    try:
        wait_up(up, base, log, UP_WITHIN_S)
        key = _printed(log, "api key")
        assert key and (data_dir / "api_key").read_text().strip() == key
        assert _printed(log, "gateway") == base
        assert _printed(log, "redis").startswith("redis://127.0.0.1:")
        assert (data_dir / "redis.url").exists()
        if sys.platform == "linux":  # its glibc malloc replaced (layby.ops.embedded)
            assert "(embedded, append-only, malloc mimalloc)" in log.read_text()
        with _client(base, key) as api:
            run_id = api.post("/v1/runs", json={"agent": "demo.transfer",
                                                "input": "Send 30 to Ann"}).json()["id"]
            wait_until(lambda: api.get(f"/v1/runs/{run_id}").json()["status"]
                       == "interrupted", 30, what="the run to park")
    finally:
        leftovers = _stop(up)
    assert leftovers == []
    assert not (data_dir / "redis.url").exists()

    # The data folder as layby 0.1.0 left it: the legacy layout, no format version. Its own
    # `layby up` (the server is its alone) migrates it, and says so.
    valkey = EmbeddedRedis(data_dir / "valkey").start()
    try:
        client = redis.Redis(port=valkey.port, decode_responses=True)
        back_to_the_legacy_layout(client, "layby")
        assert client.delete("layby:format") == 1
        client.close()
    finally:
        valkey.stop()
    up = _up(data_dir, port, log)
    try:
        wait_up(up, base, log, UP_WITHIN_S, "layby up, again")
        assert f"layby up: migrated the data in {data_dir} to format 1" in log.read_text()
        assert f"layby up: migrated the data in {data_dir} to format 2" in log.read_text()
        api = _client(base, key)
        run = api.get(f"/v1/runs/{run_id}").json()
        assert run["status"] == "interrupted"
        [waiting] = [i for i in run["interrupts"] if i["state"] == "open"]
        answered = api.post(f"/v1/runs/{run_id}/interrupts/{waiting['id']}",
                            json={"status": "resolved", "payload": {"approved": True}})
        assert answered.status_code == 200, answered.text
        wait_until(lambda: api.get(f"/v1/runs/{run_id}").json()["status"] == "completed",
                   30, what="the run to complete")
        assert api.get(f"/v1/runs/{run_id}").json()["result"] == "Sent 30 to Ann."
        api.close()
    finally:
        assert _stop(up) == []


def _a_transfer_approved(base: str, log: Path) -> str:
    """A transfer started, parked, approved and completed through `layby up`'s gateway."""
    with _client(base, _printed(log, "api key")) as api:
        run_id: str = api.post("/v1/runs", json={"agent": "demo.transfer",
                                                 "input": "Send 30 to Ann"}).json()["id"]
        wait_until(lambda: api.get(f"/v1/runs/{run_id}").json()["status"]
                   == "interrupted", 30, what="the run to park")
        run = api.get(f"/v1/runs/{run_id}").json()
        [waiting] = [i for i in run["interrupts"] if i["state"] == "open"]
        api.post(f"/v1/runs/{run_id}/interrupts/{waiting['id']}",
                 json={"status": "resolved", "payload": {"approved": True}})
        wait_until(lambda: api.get(f"/v1/runs/{run_id}").json()["status"]
                   == "completed", 30, what="the run to complete")
    return run_id


def test_layby_up_with_the_broker_on_another_server(tmp_path: Path) -> None:
    broker = EmbeddedRedis(tmp_path / "broker").start()
    data_dir, port, log = tmp_path / "data", free_port(), tmp_path / "up.log"
    base = f"http://127.0.0.1:{port}"
    up = _up(data_dir, port, log, LAYBY_BROKER_URL=broker.url)
    try:
        wait_up(up, base, log, UP_WITHIN_S)
        assert f"  broker    Redis 127.0.0.1:{broker.port}   (LAYBY_BROKER_URL)" in log.read_text()
        _a_transfer_approved(base, log)
        # Celery's queues were on the broker's server, not on the embedded store.
        with redis.Redis(port=broker.port) as client:
            assert any(k.startswith(b"_kombu.binding.") for k in client.scan_iter())
    finally:
        assert _stop(up) == []
        broker.stop()


def test_layby_up_on_a_cluster_with_the_broker_beside_it(tmp_path: Path) -> None:
    cluster = EmbeddedCluster(tmp_path / "cluster").start()
    broker = EmbeddedRedis(tmp_path / "broker").start()
    data_dir, port, log = tmp_path / "data", free_port(), tmp_path / "up.log"
    base = f"http://127.0.0.1:{port}"
    # One node named: the client finds the others.
    up = _up(data_dir, port, log, LAYBY_REDIS_URL=f"valkey+cluster://{cluster.members[0].address}",
             LAYBY_BROKER_URL=broker.url)
    try:
        wait_up(up, base, log, UP_WITHIN_S)
        run_id = _a_transfer_approved(base, log)
        # The store was made in the sharded layout, its shard count recorded; the run's
        # keys carry its shard's tag.
        client = cluster.client()
        assert client.hget("layby:format", "shards") == "48"
        assert client.exists(Keys("layby", 48).run(run_id)) == 1
    finally:
        assert _stop(up) == []
        broker.stop()
        cluster.stop()


def test_the_email_round_trip_on_one_machine(tmp_path: Path) -> None:
    """What docs/getting-started.md promises a newcomer: start a run, read the approval
    request in the mail catcher's page, reply "approve" from that page (a real SMTP reply to
    the reply listener), and watch the run finish, the answer recorded as the reviewer's, by
    email."""
    from playwright.sync_api import sync_playwright

    from tests.support.browser import launch

    data_dir, port, log = tmp_path / "data", free_port(), tmp_path / "up.log"
    base = f"http://127.0.0.1:{port}"
    up = _up(data_dir, port, log)
    try:
        wait_up(up, base, log, UP_WITHIN_S)
        assert _printed(log, "mail") == f"{base}/mail"
        with _client(base, _printed(log, "api key")) as api:
            run_id = api.post("/v1/runs", json={"agent": "demo.transfer",
                                                "input": "Send 70 to Dee"}).json()["id"]
            wait_until(lambda: list((data_dir / "mail").glob("*.eml")), 30,
                       what="the notification in the mail catcher")
            with sync_playwright() as pw:
                browser = launch(pw)
                page = browser.new_context(java_script_enabled=False).new_page()
                page.goto(f"{base}/mail")
                page.get_by_role("link", name="demo.transfer asks for your approval").click()
                assert "Send 70 to Dee?" in page.content()
                page.get_by_label("Your reply").fill("approve")
                page.get_by_role("button", name="Send reply").click()
                assert "Reply sent" in page.get_by_role("status").inner_text()
                browser.close()
            wait_until(lambda: api.get(f"/v1/runs/{run_id}").json()["status"] == "completed",
                       30, what="the run to complete")
            run = api.get(f"/v1/runs/{run_id}").json()
        assert run["result"] == "Sent 70 to Dee."
        answer = run["interrupts"][0]["answer"]
        assert (answer["answeredBy"], answer["channel"]) == ("reviewer:you", "email")
        assert [n["state"] for n in run["notifications"]] == ["sent"]
        assert "mail to you@localhost: [layby] demo.transfer asks" in log.read_text()
    finally:
        assert _stop(up) == []
