"""Smoke test of the benchmark harness: `python -m bench` with a tiny N, as a user runs it.

It checks that every figure is there and sane, and that the bench stopped what it started.
No timing thresholds: the figures depend on the machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from bench.costs import not_preempted

# These tests assert what the bench's report holds, never its figures (which, beside other
# test files, measure their load too): they run with the rest, not `alone`.
pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
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
    # (A worker's heartbeat, `beat_worker`, is the process's, not the cycle's: on a loaded
    # machine one may land in the counted window.)
    scripts = {name: n for name, n in lay_cost["evalsha_by_script"].items()
               if name != "beat_worker"}
    assert scripts == {"answer_interrupts": 1.0, "claim_run": 2.0, "complete_run": 1.0,
                       "create_run": 1.0, "park_run": 1.0}
    assert base_cost["tasks_by_name"] == {"bench.hop": 2.0}
    for cost in (lay_cost, base_cost):
        assert cost["round_trips"] > 0 and cost["commands"] >= cost["round_trips"]
        # The server's own time: at most a core's worth of them a second.
        assert 0 < cost["server_us"] and cost["primaries"] == 1
        assert cost["per_s_per_primary"] == round(1_000_000 / cost["server_us"])
    assert lay_cost["commands"] > base_cost["commands"]  # the Lua transitions' own
    # The scripts' time (by the clock) is part of the main thread's busy time (too).
    assert 0 < lay_cost["script_us"] < lay_cost["server_active_us"]
    # The bare chains run none of a cycle's scripts: a layby script in their window is the
    # idle worker's own (its heartbeat), one not layby's is kombu's (its bindings' refresh).
    assert not set(scripts) & set(base_cost["evalsha_by_script"])
    if not base_cost["evalsha_by_script"] and not base_cost["evalsha_not_layby"]:
        assert base_cost["script_us"] == 0
    # What each process spent a cycle: the four of them, the server's figure its time above.
    # (Processes count their time in clock ticks, 10 ms here: over so few cycles one may
    # show none, and which side costs more is the long bench's to say.)
    for cost in (lay_cost, base_cost):
        spent = cost["cpu_us_by_process"]
        assert set(spent) == {"bench", "worker main", "worker pool", "server"}
        assert all(us >= 0 for us in spent.values()) and spent["server"] == cost["server_us"]
    assert "CPU per cycle by process" in done.stdout
    # Where the server's time goes, from its slow log: each of a cycle's scripts by name,
    # and by command (the bare chains' are all outside scripts).
    assert set(scripts) <= set(lay_cost["server_us_by_script"])
    assert all(us > 0 for name, us in lay_cost["server_us_by_script"].items() if name in scripts)
    assert not set(scripts) & set(base_cost["server_us_by_script"])
    assert base_cost["server_us_by_command"] and "server µs by script" in done.stdout
    assert lay_cost["server_calls_preempted"] >= 0
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
                           "--rounds", "1", "--http", "--parked", "30,60", "--samples", "20",
                           "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=280,
                          # Memory is measured once the parked runs' events are folded.
                          env={**os.environ, "LAYBY_FOLD_EVENTS_AFTER_S": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "over HTTP (layby.AsyncClient, aiohttp)" in done.stdout and "60 parked" in done.stdout
    result = json.loads(out.read_text())
    http = result["http"]
    assert http["transport"] == "aiohttp"  # the test extra installs the aiohttp extra
    assert http["runs"] == http["completed"] == RUNS and http["cycles_per_s"] > 0
    assert http["over_direct"] > 0 and http["round_trips"] > 0
    # Over HTTP the gateway's process is counted; the direct rounds between have none.
    assert http["cpu_us_by_process"]["gateway"] >= 0
    assert "gateway" not in http["direct_cpu_us_by_process"]
    assert set(http["direct_cpu_us_by_process"]) == {"bench", "worker main", "worker pool",
                                                     "server"}
    # What each of a cycle's requests costs the gateway, beside the floor (/healthz).
    by_route = http["gateway_by_route"]
    assert by_route["requests"] == RUNS
    assert list(by_route["us_by_route"]) == [
        "GET /healthz", "GET /v1/agents", "POST /v1/runs", "GET /v1/runs/{id}",
        "POST /v1/runs/{id}/interrupts/{id}", "GET /v1/runs/{id}/events"]
    assert all(us >= 0 for us in by_route["us_by_route"].values())
    # A finished cycle's stream: created, started, interrupted, interrupt.answered,
    # resuming, started, completed.
    assert by_route["events_per_stream"] == 7
    assert "gateway µs by route" in done.stdout
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
        # Built by the fill (the product's code, in the bench process), past 200 parked by
        # the worker, answered and completed.
        assert lv["built_by"] == "fill" and lv["filled"] == lv["level"]
        for key in ("list_first_page_ms", "list_deep_page_ms", "list_all_states_ms"):
            assert lv[key]["count"] == 20  # --samples, a turn
        # A message for each start and each resume, and no copy.
        assert lv["turn_messages"] == lv["turn_messages_needed"] > lv["parked"]
        assert lv["duplicate_turn_messages"] == 0
    assert set(result["parked"]["last_over_first"]) >= {"answer_ms", "answer_to_completed_ms",
                                                         "list_deep_page_ms", "park_time"}
    assert len(result["parked"]["last_over_first_by_turn"]["answer_ms"]) == 5
    # The first level's site is gone too.
    with pytest.raises(redis.exceptions.ConnectionError):
        redis.Redis.from_url(levels[0]["redis_url"], socket_connect_timeout=1).ping()


@pytest.mark.timeout(240)
def test_bench_on_a_cluster_with_the_broker_beside_it(tmp_path: Path) -> None:
    from layby.ops.embedded import EmbeddedCluster, EmbeddedRedis

    cluster = EmbeddedCluster(tmp_path / "cluster", shards=3, replicas_per_primary=0)
    broker = EmbeddedRedis(tmp_path / "broker")
    try:
        cluster.start()
        broker.start()
        out = tmp_path / "bench.json"
        done = subprocess.run([sys.executable, "-m", "bench", "--runs", str(RUNS), "--warmup",
                               "2", "--rounds", "2", "--redis-url", cluster.url,
                               "--broker-url", broker.url, "--json", str(out)],
                              cwd=ROOT, capture_output=True, text=True, timeout=220)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "summed over 3 primaries" in done.stdout
        result = json.loads(out.read_text())
        assert result["layby"]["completed"] == result["baseline"]["completed"] == RUNS
        assert result["settings"]["primaries"] == 3 and result["settings"]["replicas"] == 0
        lay_cost = result["costs"]["layby"]
        # The store's scripts ran on the primaries (the runs' shards are spread over them);
        # the messages went to the broker beside the cluster.
        assert lay_cost["evalsha_by_script"]["create_run"] == 1.0
        assert lay_cost["task_messages_pushed_by_scripts"] == 0
        # Each primary's own time per cycle, and their sum; what one primary carries at
        # that cost, and what these three carry before the busiest is full.
        by_primary = lay_cost["server_us_by_primary"]
        assert lay_cost["primaries"] == len(by_primary) == 3
        assert sorted(by_primary) == sorted(m.address for m in cluster.members)
        assert all(us > 0 for us in by_primary.values())
        assert sum(by_primary.values()) == pytest.approx(lay_cost["server_us"], abs=0.5)
        assert lay_cost["per_s_per_primary"] == round(1_000_000 / lay_cost["server_us"])
        assert lay_cost["per_s_on_these_primaries"] == round(
            1_000_000 / max(by_primary.values()))
        assert 0 < lay_cost["script_us"] < lay_cost["server_active_us"]
        # Nothing of the bench is left on any primary, nor on the broker.
        prefix = result["settings"]["key_prefix"]
        assert prefix.startswith("laybybench-")
        for member in cluster.members:
            with member.client() as node:
                assert list(node.scan_iter(match=f"{prefix}*", count=1000)) == []
                assert node.dbsize() == 0
        assert redis.Redis.from_url(broker.url).dbsize() == 0
    finally:
        broker.stop()
        cluster.stop()


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("replicas", "said"), [(0, "without replicas"),
                                                 (1, "with a replica each")])
def test_bench_starts_a_cluster_of_its_own_and_one_server_beside_it(
        tmp_path: Path, replicas: int, said: str) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "-m", "bench", "--runs", str(RUNS), "--warmup", "1",
                           "--rounds", "1", "--cluster", "2", "--replicas", str(replicas),
                           "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=220)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"an embedded cluster of 2 primaries {said}" in done.stdout
    result = json.loads(out.read_text())
    assert result["settings"]["cluster"] == result["settings"]["primaries"] == 2
    assert result["settings"]["replicas"] == replicas
    assert result["layby"]["completed"] == RUNS
    lay_cost = result["costs"]["layby"]
    assert len(lay_cost["server_us_by_primary"]) == 2
    # One server set up as each primary is (its replicas linked, as its own INFO says),
    # measured in the same rounds, and the cluster's primaries over it.
    one = result["beside"]
    assert one["completed"] == RUNS and one["replicas"] == replicas
    assert one["primaries"] == 1 and one["server_us"] > 0
    assert one["per_s_per_primary"] == round(1_000_000 / one["server_us"])
    assert one["cluster_over_one_server"] == round(
        lay_cost["per_s_per_primary"] / one["per_s_per_primary"], 3)
    assert "each run followed by a read of its own as there" in done.stdout
    assert f"a primary of the cluster {lay_cost['per_s_per_primary']}: " in done.stdout
    assert f"{one['cluster_over_one_server']:.0%} of one server's" in done.stdout
    # Its worker and its server are stopped with the rest.
    worker_tag = one["worker"].split(" -n ")[1].split()[0]
    assert not [c for c in _cmdlines() if worker_tag in c]
    with pytest.raises(redis.exceptions.ConnectionError):
        redis.Redis.from_url(one["redis_url"], socket_connect_timeout=1).ping()


def test_bench_refuses_a_cluster_without_a_broker_beside_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    from bench.__main__ import parse

    with pytest.raises(SystemExit) as exited:
        parse(["--redis-url", "redis+cluster://127.0.0.1:7000"])
    assert exited.value.code == 2
    said = capsys.readouterr().err
    assert "needs its broker beside it" in said and "--broker-url" in said
    args = parse(["--redis-url", "redis+cluster://127.0.0.1:7000", "--broker-url",
                  "redis://127.0.0.1:6380/0"])
    assert args.broker_url == "redis://127.0.0.1:6380/0"


@pytest.mark.parametrize("argv", [["--replicas", "0"], ["--cluster", "--replicas", "-1"]])
def test_bench_refuses_replicas_without_a_cluster_of_its_own(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from bench.__main__ import parse

    with pytest.raises(SystemExit) as exited:
        parse(argv)
    assert exited.value.code == 2
    assert "--replicas is for the bench's own cluster" in capsys.readouterr().err
    assert parse(["--cluster", "--replicas", "0"]).replicas == 0


INBOX = 600  # two chunks of the inbox's 500


@pytest.mark.timeout(170)
def test_bench_inbox_reports_the_look_through_against_reading_whole(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "-m", "bench", "--inbox", str(INBOX), "--rounds",
                           "2", "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=160)
    assert done.returncode == 0, done.stdout + done.stderr
    said = done.stdout
    assert "layby bench: the reviewers' inbox" in said
    for row in ("look-through, per 1,000", "read whole, per 1,000", "look-through / whole",
                "one inbox page"):
        assert re.search(rf"^  {re.escape(row)} +\S", said, re.M), said
    for row in ("look-through, per 1,000", "read whole, per 1,000"):
        assert re.search(rf"^  {re.escape(row)} +store [0-9.]+ ms in its commands, [0-9.]+ "
                         r"ms of its main thread's CPU; this process [0-9.]+ ms wall, [0-9.]+ "
                         r"ms CPU; [0-9]+ commands", said, re.M), said
    assert re.search(r"waiting_for: [0-9.]+ ms wall \(middle of 5: [0-9.]+–[0-9.]+\)", said)
    assert f"looked through {INBOX} of {INBOX} waiting runs" in said
    result = json.loads(out.read_text())

    inbox = result["inbox"]
    assert inbox["parked"] == INBOX and inbox["rounds"] == 2 and inbox["chunk"] == 500
    assert inbox["folded"] == INBOX  # every run's events in its hash, as a sweeper leaves it
    look, whole = inbox["per_1000_runs"]["look"], inbox["per_1000_runs"]["whole"]
    for side in (look, whole):
        assert side["server_us"] > 0 and side["server_cpu_us"] > 0
        assert side["wall_ms"] > 0 and side["cpu_ms"] > 0
        # Three commands a run either way: HMGET, HMGET, HGETALL against three HGETALLs
        # (and now and then the store's look at its layout).
        assert 3000 <= side["commands"] < 3010
    for key, ratio in inbox["look_over_whole"].items():
        assert ratio == round(look[key] / whole[key], 3)
        assert len(inbox["look_over_whole_by_round"][key]) == 2
    assert [set(r) for r in inbox["by_round"]] == [{"look", "whole"}] * 2
    page = inbox["page"]
    # Every parked request is the reviewer's: the page looks through them all and shows
    # the 100 most urgent.
    assert page["pages"] == len(page["wall_ms_by_page"]) == 5
    assert (page["looked_through"], page["shown"], page["truncated"]) == (INBOX, 100, False)
    assert min(page["wall_ms_by_page"]) <= page["wall_ms"] <= max(page["wall_ms_by_page"])
    assert page["server_us"] > 0 and page["cpu_ms"] > 0
    assert result["settings"]["inbox"] == INBOX
    assert result["machine"]["server"].startswith("valkey")
    # The embedded server is gone.
    with pytest.raises(redis.exceptions.ConnectionError):
        redis.Redis.from_url(result["settings"]["redis_url"], socket_connect_timeout=1).ping()


def test_bench_inbox_refuses_what_it_does_not_measure(
        capsys: pytest.CaptureFixture[str]) -> None:
    from bench.__main__ import parse

    assert parse(["--inbox"]).inbox == 20_000
    assert parse([]).inbox == 0
    for extra in (["--parked", "10"], ["--http"], ["--cluster"],
                  ["--broker-url", "redis://127.0.0.1:6380/0"], ["--inbox", "-1"]):
        with pytest.raises(SystemExit) as exited:
            parse(["--inbox", "100", *extra])
        assert exited.value.code == 2
        assert "--inbox" in capsys.readouterr().err


@pytest.mark.timeout(240)
def test_bench_tenants_reports_a_tenants_pages_against_one_index(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "-m", "bench", "--tenants", "1000", "--samples",
                           "40", "--json", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=230)
    assert done.returncode == 0, done.stdout + done.stderr
    said = done.stdout
    assert "layby bench: tenants' lists" in said
    for page in ("the first page", "the page half way down"):
        for side in ("one tenant's", "one index (before)", "every tenant's"):
            assert re.search(rf"^  {re.escape(page)}, {re.escape(side)} +p50 [0-9.]+ ms, p99 "
                             r"[0-9.]+ ms; store [0-9]+ µs in its commands", said, re.M), said
    result = json.loads(out.read_text())
    lists = result["tenant_lists"]
    assert (lists["baseline_runs"], lists["tenants"], lists["tenant_runs"]) == (1000, 10, 100)
    for page in ("first", "deep"):
        figures = lists["pages"][page]
        for side in ("tenant", "baseline", "every"):
            assert figures[side]["count"] == lists["samples"] == 40
            assert 0 < figures[side]["p50"] <= figures[side]["p99"]
            assert figures[side]["server_us_per_page"] > 0
        for side in ("tenant", "every"):
            assert figures[f"{side}_over_baseline"]["p50"] == round(
                figures[side]["p50"] / figures["baseline"]["p50"], 2)
    # The embedded server is gone.
    with pytest.raises(redis.exceptions.ConnectionError):
        redis.Redis.from_url(result["settings"]["redis_url"], socket_connect_timeout=1).ping()


def test_bench_tenants_refuses_what_it_does_not_measure(
        capsys: pytest.CaptureFixture[str]) -> None:
    from bench.__main__ import parse

    assert parse(["--tenants"]).tenants == 20_000
    assert parse(["--tenants", "1000", "--samples", "40"]).samples == 40
    for given in (["--tenants", "999"], ["--tenants", "5000", "--inbox"],
                  ["--tenants", "5000", "--samples", "0"], ["--samples", "40"],
                  ["--tenants", "5000", "--http"], ["--tenants", "5000", "--cluster"]):
        with pytest.raises(SystemExit) as exited:
            parse(given)
        assert exited.value.code == 2
        assert "--tenants" in capsys.readouterr().err


def _alike(value: str) -> str:
    """A stored value with what differs from run to run (ids, tokens, times, numbers)
    made alike."""
    value = re.sub(r"run_[0-9A-Za-z]{22}", "run_R", value)
    value = re.sub(r"int_[0-9a-f]{20}", "int_I", value)
    value = re.sub(r"ntf_[0-9a-f]{20}", "ntf_N", value)
    value = re.sub(r"bench-[a-z0-9]+-[a-z0-9]+", "TOKEN", value)
    return re.sub(r"\d+", "0", value)


@pytest.mark.timeout(240)
def test_fill_parks_runs_as_the_worker_parks_them(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import fill, hooks, scale
    from bench.__main__ import _environment
    from bench.agents import ANNOUNCED
    from bench.measure import WORKER_QUEUES, wait_for_worker
    from bench.processes import Parts
    from layby.control import build, commands
    from layby.generation.interrupts import ResumeEntry
    from layby.wire import Status

    sink = hooks.Sink()
    with Parts() as parts:
        for name, value in {**_environment(parts, "layby", sink),
                            "LAYBY_FOLD_EVENTS_AFTER_S": "1"}.items():
            monkeypatch.setenv(name, value)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        rt = build()
        store = rt.store
        worker = parts.start_worker(WORKER_QUEUES, 2, env)
        wait_for_worker(store, worker.alive)
        parts.start_sweeper(env)
        # One run parked by the worker, its announcement delivered to the webhook.
        site = scale.Site(1, rt, sink)
        scale._park_announced(site, 1, 60)
        [(by_worker, _)] = store.all_runs.newest(Status.INTERRUPTED, 1)
        # And 300 built in this process and one forked from it.
        assert fill.parked(rt, ANNOUNCED, 300, processes=2) > 0
        assert store.all_runs.count(Status.INTERRUPTED) == 301
        scale.folded(store, 60)

        built = [run_id for run_id, _ in store.all_runs.newest(Status.INTERRUPTED, 300)]
        assert by_worker not in built and len(set(built)) == 300
        worker_hash = store.redis.hgetall(store.keys.run(by_worker))
        worker_events = [e.type for e in store.runs.events(by_worker)]
        assert worker_events[:3] == ["run.created", "run.started", "run.interrupted"]
        for run_id in built[::30]:
            # Stored as the worker stores it: the same keys, the same fields, the same
            # values but for ids, tokens and times; as many bytes.
            assert _keys_of(store, run_id) == [store.keys.run(run_id)]
            stored = store.redis.hgetall(store.keys.run(run_id))
            assert {_alike(k): _alike(v) for k, v in stored.items()} == {
                _alike(k): _alike(v) for k, v in worker_hash.items()}
            assert [e.type for e in store.runs.events(run_id)] == worker_events
            # Read through the API's own reads: parked, asking its reviewer, told.
            view = commands.get_run(rt, run_id)
            assert view.status == Status.INTERRUPTED and len(view.open_interrupts) == 1
            assert view.open_interrupts[0].reviewers == ["bench-hook"]
            [note] = store.outbox.notifications(run_id)
            assert note.state == "sent" and note.attempts == 1
            ref = note.token.split("-")[1]
            assert store.answers.grant(ref) is not None
        # A message numbered for each start, none copied; the outbox empty.
        assert scale.turn_messages(store)["duplicate_turn_messages"] == 0
        assert store.outbox.overdue_outbox() == []
        # A built run is answered and resumed by the worker, as any other.
        run_id = built[0]
        view = store.runs.view(run_id)
        assert view is not None
        answered = commands.answer(rt, run_id, [ResumeEntry(
            interrupt_id=view.open_interrupts[0].id, status="resolved", payload=True)],
            by="test", channel="test")
        scale._until_completed(store, run_id, answered.event_id or "0-0",
                               time.perf_counter())
        done = store.runs.view(run_id)
        assert done is not None and done.status == Status.COMPLETED
        # Only the worker's own park was announced over HTTP.
        assert sum(sink.ids.values()) == 1
    sink.stop()


def _keys_of(store: object, run_id: str) -> list[str]:
    client = store.redis  # type: ignore[attr-defined]
    return sorted(client.scan_iter(match=f"*{run_id}*", count=1000))


@pytest.mark.timeout(240)
def test_bench_traces_reports_the_worker_with_traces_off_and_on(tmp_path: Path) -> None:
    out = tmp_path / "traces.json"
    done = subprocess.run([sys.executable, "-m", "bench", "--traces", "--runs", "8",
                           "--rounds", "2", "--warmup", "2", "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=230,
                          env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "traces off vs on" in done.stdout and "on/off: cycles/s x" in done.stdout
    traces = json.loads(out.read_text())["traces"]
    for side in ("off", "on"):
        assert traces[side]["cycles"] == 8 and traces[side]["cycles/s"] > 0
        assert traces[side]["worker CPU ms per cycle"] > 0
    # The traced worker exported its spans (every pool child's, flushed as it stopped); the
    # untraced one nothing, and its tracing calls are a sliver of a cycle.
    assert traces["exports received"] >= 1 and traces["exported bytes per cycle"] > 500
    assert 0 < traces["off: share of the worker's CPU per cycle"] < 0.01
    assert traces["on/off cycles/s"] > 0


def test_bench_traces_refuses_what_it_does_not_compare(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bench", "--traces", "--http"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--traces compares a worker with traces off and on" in done.stderr


def test_a_slow_log_figure_leaves_out_calls_the_machine_stopped() -> None:
    """One call stopped for a time slice (25 ms among calls of 0.1 ms) counted 500 µs a
    cycle over 50 cycles; a slow call of the server's own (4 times the median, a cold
    cache) is its cost and stays."""

    calls = [100] * 49 + [400, 25_000]
    assert not_preempted(calls) == [100] * 49 + [400]
    # Twenty times the median is the line, whatever the median: a kind whose calls are
    # mostly long keeps them.
    assert not_preempted([3_000, 3_200, 70_000]) == [3_000, 3_200]
    assert not_preempted([3_000, 3_200, 50_000, 55_000]) == [3_000, 3_200, 50_000, 55_000]
