"""Smoke test of the benchmark harness: `python -m bench` with a tiny N, as a user runs it.

It checks that every figure is there and sane, and that the bench stopped what it started.
No timing thresholds: the figures depend on the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

pytestmark = pytest.mark.integration

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
    # What a cycle costs, counted by the server and read off MONITOR: a cycle is two tasks,
    # both pushed by the transitions that queue them; each step claims and commits once.
    lay_cost, base_cost = result["costs"]["layby"], result["costs"]["baseline"]
    assert lay_cost["tasks_by_name"] == {"layby.resume_run": 1.0, "layby.run_turn": 1.0}
    assert lay_cost["task_messages_pushed_by_scripts"] == 2.0
    assert lay_cost["evalsha_by_script"] == {"answer_interrupts": 1.0, "claim_run": 2.0,
                                             "complete_run": 1.0, "create_run": 1.0,
                                             "park_run": 1.0}
    assert base_cost["tasks_by_name"] == {"bench.hop": 2.0}
    for cost in (lay_cost, base_cost):
        assert cost["round_trips"] > 0 and cost["commands"] >= cost["round_trips"]
        # The server's own time: at most a core's worth of them a second.
        assert cost["server_us"] > 0
        assert cost["per_s_per_primary"] == round(1_000_000 / cost["server_us"])
    assert lay_cost["commands"] > base_cost["commands"]  # the Lua transitions' own
    assert 0 < lay_cost["script_us"] < lay_cost["server_us"] and base_cost["script_us"] == 0
    baseline_latency = result["baseline_publish_to_start_at_rest_ms"]
    assert baseline_latency["count"] == RUNS and baseline_latency["p50"] >= 0
    machine = result["machine"]
    assert machine["cores"] >= 1 and machine["python"] and machine["server"].startswith("valkey")

    # everything it started is gone: the worker processes, and the embedded server
    worker_tag = result["settings"]["worker"].split(" -n ")[1].split()[0]
    assert not [c for c in _cmdlines() if worker_tag in c]
    with pytest.raises(redis.exceptions.ConnectionError):
        redis.Redis.from_url(result["settings"]["redis_url"], socket_connect_timeout=1).ping()


@pytest.mark.timeout(170)
def test_bench_with_the_broker_on_another_server(tmp_path: Path) -> None:
    from layby.ops.embedded import EmbeddedRedis

    broker = EmbeddedRedis(tmp_path / "broker").start()
    try:
        out = tmp_path / "bench.json"
        done = subprocess.run([sys.executable, "-m", "bench", "--runs", str(RUNS), "--warmup",
                               "2", "--broker-url", broker.url, "--json", str(out)],
                              cwd=ROOT, capture_output=True, text=True, timeout=160)
        assert done.returncode == 0, done.stdout + done.stderr
        result = json.loads(out.read_text())
        assert result["layby"]["completed"] == result["baseline"]["completed"] == RUNS
        assert result["settings"]["broker_url"] == broker.url
        lay_cost = result["costs"]["layby"]
        # The messages went to the broker, published after the commits: no script pushed one.
        assert lay_cost["task_messages_pushed_by_scripts"] == 0
        assert lay_cost["server_us"] > 0 and lay_cost["per_s_per_primary"] > 0
        # Nothing of the bench is left on the broker's server.
        assert redis.Redis.from_url(broker.url).dbsize() == 0
    finally:
        broker.stop()


@pytest.mark.timeout(300)
def test_bench_over_http_and_on_parked_runs(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "-m", "bench", "--runs", str(RUNS), "--warmup", "2",
                           "--rounds", "1", "--http", "--parked", "30,60", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=280,
                          # Memory is measured once the parked runs' events are folded.
                          env={**os.environ, "LAYBY_FOLD_EVENTS_AFTER_S": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "over HTTP (layby.AsyncClient)" in done.stdout and "60 parked" in done.stdout
    result = json.loads(out.read_text())
    http = result["http"]
    assert http["runs"] == http["completed"] == RUNS and http["cycles_per_s"] > 0
    assert http["over_direct"] > 0 and http["round_trips"] > 0
    levels = result["parked"]["levels"]
    assert [lv["level"] for lv in levels] == [30, 60]
    # Each level on a server of its own, measured side by side in turns; the bench's own
    # (the deepest level's) runs the cycles after.
    assert levels[0]["redis_url"] != levels[1]["redis_url"] == result["settings"]["redis_url"]
    if sys.platform == "linux":
        assert result["settings"]["malloc"] == "mimalloc"
    for lv in levels:
        assert lv["parked"] == lv["level"]
        assert lv["parks_per_s"] > 0 and lv["answer_ms"]["count"] > 0
        assert len(lv["parks_per_s_by_turn"]) == len(lv["answer_ms_by_turn"]) == 5
        assert lv["parks_per_s"] in lv["parks_per_s_by_turn"]
        # Each answered run was seen completed, after its answer returned.
        done = lv["answer_to_completed_ms"]
        assert done["count"] == lv["answer_ms"]["count"]
        assert done["p50"] > lv["answer_ms"]["p50"]
        assert 0 < lv["history_bytes"] < lv["memory_of_keys_per_run"] < 20_000
        assert lv["memory_by_key"]["run"] > lv["history_bytes"]
        # Folded into the run's hash by the time memory is measured: no stream left.
        assert "events" not in lv["memory_by_key"] and lv["memory_by_key"]["index"] > 0
        for key in ("list_first_page_ms", "list_deep_page_ms", "list_all_states_ms"):
            assert lv[key]["count"] > 0
        # A message for each start and each resume, and no copy.
        assert lv["turn_messages"] == lv["turn_messages_needed"] > lv["parked"]
        assert lv["duplicate_turn_messages"] == 0
    assert set(result["parked"]["last_over_first"]) >= {"answer_ms", "answer_to_completed_ms",
                                                         "list_deep_page_ms", "park_time"}
    assert len(result["parked"]["last_over_first_by_turn"]["answer_ms"]) == 5
    # The first level's site is gone too.
    with pytest.raises(redis.exceptions.ConnectionError):
        redis.Redis.from_url(levels[0]["redis_url"], socket_connect_timeout=1).ping()
