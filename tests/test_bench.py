"""Smoke test of the benchmark harness: `python -m bench` with a tiny N, as a user runs it.

It checks that every figure is there and sane, and that the bench stopped what it started.
No timing thresholds: the figures depend on the machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parent.parent
RUNS = 5


def _cmdlines() -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, ValueError):
            continue
    return found


@pytest.mark.timeout(170)
def test_bench_runs_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "-m", "bench", "--runs", str(RUNS), "--warmup", "2",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=160)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ratio layby / baseline" in done.stdout
    result = json.loads(out.read_text())

    layby, baseline = result["layby"], result["baseline"]
    assert layby["runs"] == layby["completed"] == RUNS
    assert baseline["chains"] == baseline["completed"] == RUNS
    assert result["at_rest"] == {"runs": RUNS, "completed": RUNS}
    # start → park is layby.run_turn, answer → complete is layby.resume_run
    assert layby["hops_per_cycle"] == baseline["hops_per_chain"] == 2
    assert layby["hops_seen"] == {"2": RUNS}
    assert layby["cycles_per_s"] > 0 and baseline["chains_per_s"] > 0
    assert result["ratio"] > 0
    assert len(result["rounds"]) == result["settings"]["rounds"] == 4
    for key in ("answer_to_continuation_ms", "answer_to_continuation_at_rest_ms"):
        latency = result[key]
        assert latency["count"] == RUNS
        assert 0 <= latency["min"] <= latency["p50"] <= latency["p99"] <= latency["max"]
    assert result["settings"]["concurrency"] == 2 and result["settings"]["runs"] == RUNS
    machine = result["machine"]
    assert machine["cores"] >= 1 and machine["python"] and machine["server"].startswith("valkey")

    # everything it started is gone: the worker processes, and the embedded server
    worker_tag = result["settings"]["worker"].split(" -n ")[1].split()[0]
    assert not [c for c in _cmdlines() if worker_tag in c]
    with pytest.raises(redis.exceptions.ConnectionError):
        redis.Redis.from_url(result["settings"]["redis_url"], socket_connect_timeout=1).ping()
