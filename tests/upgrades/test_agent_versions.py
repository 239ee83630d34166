"""Agent versions end to end, with real workers: runs park on one version of the code
(tests/support/agents_versioned.py, variant a), the worker is replaced by one on the next (variant
b), and the answers resume them there. A removed tool fails its run with `agent_changed`
naming it; a widened schema continues; a narrowed one that refuses the parked call fails
clearly, or goes on through the agent's migrate hook. A pinned run's steps run only on the
worker that hosts its version, never on the new one (even handed its message), and
`layby doctor` says so while no live worker hosts it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from layby.broker_config import make_celery
from layby.ops.doctor import check_pinned_versions
from tests.support.agents_versioned import agents
from tests.support.harness import LaybySystem, wait_until

pytestmark = pytest.mark.integration

ENV = {"LAYBY_AGENT_MODULES": "tests.support.agents_versioned", "LAYBY_TEST_AGENT_VARIANT": "a",
       "LAYBY_TEST_WORKER_TAG": "old"}
NEW = {"LAYBY_TEST_AGENT_VARIANT": "b", "LAYBY_TEST_WORKER_TAG": "new"}
CHANGES = ("removed", "widened", "narrowed", "migrated")


def version_of(variant: str, agent: str) -> str:
    """The agent's version in that variant of the code, as a worker loading it sees it."""
    return agents(variant)[agent].version


def approve(system: LaybySystem, run_id: str) -> None:
    [intr] = system.open_interrupts(system.run(run_id))
    reply = system.answer(run_id, intr["id"], payload={"approved": True})
    assert reply.status_code == 200, reply.text


def parked_by_version(system: LaybySystem) -> dict[tuple[str, str, str], float]:
    """/metrics' parked runs by (agent, version, pinned)."""
    with system.api() as api:
        text = api.get("/metrics").text
    return {(s.labels["agent"], s.labels["version"], s.labels["pinned"]): s.value
            for family in text_string_to_metric_families(text)
            if family.name == "layby_runs_parked_by_version" for s in family.samples}


def step_versions(system: LaybySystem, run_id: str) -> list[tuple[str, str]]:
    """(type, agentVersion) of the run's step events that say which version ran them."""
    with system.api() as api:
        reply = api.get(f"/v1/runs/{run_id}/events", params={"follow": "false"})
    events = [json.loads(line[5:]) for line in reply.text.splitlines()
              if line.startswith("data:")]
    return [(e["type"], e["data"]["agentVersion"]) for e in events
            if isinstance(e.get("data"), dict) and "agentVersion" in e["data"]]


def test_a_changed_agent_fails_what_no_longer_fits_and_resumes_the_rest(isolated: Any) -> None:
    system: LaybySystem = isolated(**ENV).start()
    old = {name: version_of("a", f"versioned.{name}") for name in CHANGES}
    runs = {name: system.start_run(f"versioned.{name}", "refund order 42")["id"]
            for name in CHANGES}
    for name, run_id in runs.items():
        run = system.wait_status(run_id, "interrupted")
        assert run["agentVersion"] == old[name] and run["pinned"] is False
        assert [i["agentVersion"] for i in run["interrupts"]] == [old[name]]

    system.procs["worker"].stop()
    system.start_worker("worker-new", **NEW)
    for run_id in runs.values():
        approve(system, run_id)

    removed = system.wait_status(runs["removed"], "failed")["error"]
    new = version_of("b", "versioned.removed")
    assert removed["code"] == "agent_changed"
    assert removed["message"] == (f"tool 'refund' is gone in version {new} of agent "
                                  f"'versioned.removed' (the run was parked on "
                                  f"{old['removed']})")
    assert removed["detail"]["tool"] == "refund" and removed["detail"]["change"] == "removed"

    narrowed = system.wait_status(runs["narrowed"], "failed")["error"]
    assert narrowed["code"] == "agent_changed" and narrowed["detail"]["change"] == "input"
    assert "tool 'refund' no longer takes the input it was called with" in narrowed["message"]
    assert "/amount: Input should be less than or equal to 100" in narrowed["message"]

    widened = system.wait_status(runs["widened"], "completed")
    assert widened["result"] == "refunded 250.0 on new"
    migrated = system.wait_status(runs["migrated"], "completed")
    assert migrated["result"] == "refunded 100 on new"
    # The run keeps the version it started on; each step says which one it ran on.
    assert migrated["agentVersion"] == old["migrated"]
    assert step_versions(system, runs["migrated"])[-1] == (
        "run.completed", version_of("b", "versioned.migrated"))
    # Nothing reached the model as a tool error: the failed runs end at the parked turn.
    for name in ("removed", "narrowed"):
        assert system.run(runs[name])["messages"][-1]["role"] == "model"

    # Operators find runs by the version they started on.
    with system.api() as api:
        listed = api.get("/v1/runs", params={"agentVersion": old["widened"]}).json()
    assert [r["id"] for r in listed["runs"]] == [runs["widened"]]
    assert listed["runs"][0]["agentVersion"] == old["widened"]
    ls = subprocess.run([sys.executable, "-m", "layby.ops.cli", "runs", "ls",
                         "--agent-version", old["narrowed"]], env=system.env,
                        capture_output=True, text=True, timeout=60)
    assert ls.returncode == 0, ls.stderr
    [line] = ls.stdout.splitlines()
    assert line.split()[:4] == [runs["narrowed"], "failed", "versioned.narrowed",
                                old["narrowed"]]


def test_a_pinned_run_resumes_only_on_the_worker_hosting_its_version(isolated: Any) -> None:
    system: LaybySystem = isolated(**ENV).start()
    old, new = version_of("a", "versioned.pinned"), version_of("b", "versioned.pinned")
    assert old != new
    run_id = system.start_run("versioned.pinned", "refund order 42")["id"]
    run = system.wait_status(run_id, "interrupted")
    assert run["agentVersion"] == old and run["pinned"] is True

    client = redis.Redis.from_url(system.redis_url, decode_responses=True)
    settings = system.settings
    [check] = check_pinned_versions(client, settings)
    assert check.ok, check.line()
    assert parked_by_version(system) == {("versioned.pinned", old, "true"): 1.0}

    # The deployment moves on: a worker on the new code, and the old one gone.
    newer = system.start_worker("worker-new", **NEW)
    system.procs["worker"].stop()
    wait_until(lambda: not check_pinned_versions(client, settings)[0].ok, 15,
               what="doctor to see that nobody hosts the pinned version")
    [check] = check_pinned_versions(client, settings)
    assert check.line() == (
        f"PROBLEM pinned versions: 1 run(s) of agent 'versioned.pinned' wait pinned to "
        f"version {old}, which no live worker hosts: keep (or start) a worker on the code "
        f"of that version until they are done, or start one with `--agent-versions {old}` "
        "whose code can run them")
    doctor = subprocess.run([sys.executable, "-m", "layby.ops.cli", "doctor"],
                            env=system.env, capture_output=True, text=True, timeout=60)
    assert check.line() in doctor.stdout, doctor.stdout

    approve(system, run_id)
    # Its resume waits on its version's queue; even handed to the new worker, it goes back.
    version = system.run(run_id)["version"]
    app = make_celery(settings)
    app.send_task("layby.resume_run", args=[run_id, version], queue="layby.turns")
    wait_until(lambda: "handed back to its queue" in newer.output(), 20,
               what="the new worker to hand the step back")
    time.sleep(2)
    assert system.run(run_id)["status"] == "resuming"

    # An old worker comes back for the runs of its version, and takes it.
    system.start_worker("worker-old", **ENV)
    done = system.wait_status(run_id, "completed")
    assert done["result"] == "refunded 250 on old"
    assert {v for _, v in step_versions(system, run_id)} == {old}
    assert check_pinned_versions(client, settings)[0].ok


def test_an_operator_hands_pinned_runs_to_new_code_with_agent_versions(isolated: Any) -> None:
    system: LaybySystem = isolated(**ENV).start()
    old = version_of("a", "versioned.pinned")
    run_id = system.start_run("versioned.pinned", "refund order 42")["id"]
    system.wait_status(run_id, "interrupted")
    system.procs["worker"].stop()
    refused = subprocess.run([sys.executable, "-m", "layby.ops.cli", "worker",
                              "--agent-versions", "not a version"], env=system.env,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert "LAYBY_AGENT_VERSIONS: 'not a version' is not a version" in refused.stderr
    # The new code, told it may run the old version's runs: it takes them, after the check.
    worker = system._start("worker-hosting-old", [
        sys.executable, "-m", "layby.ops.cli", "worker", "--agent-versions", old,
        "--concurrency", "1"], **NEW)
    wait_until(lambda: "ready." in worker.output(), 40, what="the worker to be ready")
    assert f"hosting {', '.join(f'{a}@{old}' for a in sorted(agents('b')))}" \
        in worker.output()
    client = redis.Redis.from_url(system.redis_url, decode_responses=True)
    wait_until(lambda: check_pinned_versions(client, system.settings)[0].ok, 15,
               what="doctor to see the version hosted")
    approve(system, run_id)
    assert system.wait_status(run_id, "completed")["result"] == "refunded 250 on new"
