"""`layby up` as a newcomer runs it: embedded Valkey, worker, sweeper, gateway; a parked run
survives Ctrl-C and a second `layby up` on the same data folder."""

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

from gateway.embedded import free_port
from tests.harness import ROOT, wait_until

pytestmark = pytest.mark.slow


def _up(data_dir: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LAYBY_REDIS_URL", "LAYBY_API_KEYS")}
    env.update({"LAYBY_DATA_DIR": str(data_dir), "PYTHONPATH": str(ROOT)})
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "gateway.cli", "up", "--port", str(port),
                                 "--concurrency", "1"], env=env, cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _printed(log: Path, label: str) -> str:
    match = re.search(rf"^\s+{label}\s+(\S+)", log.read_text(), flags=re.MULTILINE)
    return match.group(1) if match else ""


def _client(base: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"})


def _ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


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
        wait_until(lambda: _ready(base), 60, what="layby up")
        key = _printed(log, "api key")
        assert key and (data_dir / "api_key").read_text().strip() == key
        assert _printed(log, "gateway") == base
        assert _printed(log, "redis").startswith("redis://127.0.0.1:")
        assert (data_dir / "redis.url").exists()
        with _client(base, key) as api:
            run_id = api.post("/v1/runs", json={"agent": "demo.transfer",
                                                "input": "Send 30 to Ann"}).json()["id"]
            wait_until(lambda: api.get(f"/v1/runs/{run_id}").json()["status"]
                       == "interrupted", 30, what="the run to park")
    finally:
        leftovers = _stop(up)
    assert leftovers == []
    assert not (data_dir / "redis.url").exists()

    up = _up(data_dir, port, log)
    try:
        wait_until(lambda: _ready(base), 60, what="layby up, again")
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
