"""Who may do what, over real HTTP on a real system with a keys file (LAYBY_KEYS_FILE): two
tenants who never see each other's runs (not by id, not in lists, not their events, answers,
cancels or AG-UI threads), a read-only key, a key limited to some agents, four eyes on
approvals (the key that started a transfer cannot approve it; another key of its tenant
with `approve` can), /metrics for admins, and a keys file that does not parse refused by
`layby up` before it says it is up."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from layby.ops.embedded import EmbeddedRedis, free_port
from tests.support.harness import API_KEY, LAYBY, ROOT, LaybySystem, wait_until

pytestmark = pytest.mark.integration

KEYS = {
    "billing": "lby_billing_0123456789", "approver": "lby_approver_0123456789",
    "auditor": "lby_auditor_0123456789", "clerk": "lby_clerk_0123456789",
    "bolt": "lby_bolt_0123456789", "bolt-ops": "lby_boltops_0123456789",
}
KEYS_FILE = f'''
[keys.billing]
secret = "{KEYS["billing"]}"
tenant = "acme"
agents = ["demo.t*"]
can = ["start", "read", "answer", "approve", "cancel"]

[keys.approver]
secret = "{KEYS["approver"]}"
tenant = "acme"
can = ["read", "approve"]

[keys.auditor]
secret = "{KEYS["auditor"]}"
tenant = "acme"
can = ["read"]

[keys.clerk]
secret = "{KEYS["clerk"]}"
tenant = "acme"
can = ["read", "answer"]

[keys.bolt]
secret = "{KEYS["bolt"]}"
tenant = "bolt"

[keys.bolt-ops]
secret = "{KEYS["bolt-ops"]}"
tenant = "bolt"
can = ["read", "approve"]
'''


@pytest.fixture(scope="module")
def tenanted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaybySystem]:
    base = tmp_path_factory.mktemp("tenants")
    keys = base / "keys.toml"
    keys.write_text(KEYS_FILE)
    server = EmbeddedRedis(base / "valkey").start()
    system = LaybySystem(server.url, base / "system",
                         env_overrides={"LAYBY_KEYS_FILE": str(keys),
                                        "LAYBY_TOKEN_KEYS": "k1:tokens-0123456789abcdef"})
    try:
        yield system.start()
    finally:
        system.stop()
        server.stop()


def api(system: LaybySystem, who: str) -> httpx.Client:
    return system.api(key=KEYS.get(who, API_KEY))


def start(system: LaybySystem, who: str, agent: str = "demo.transfer",
          text: str = "Send 40 to Ann", **headers: str) -> httpx.Response:
    with api(system, who) as c:
        return c.post("/v1/runs", json={"agent": agent, "input": text}, headers=headers)


def refused(reply: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    error: dict[str, Any] = reply.json()["error"]
    assert error["code"] == code, error
    return error


def parked(system: LaybySystem, run_id: str) -> dict[str, Any]:
    [waiting] = system.open_interrupts(system.wait_status(run_id, "interrupted"))
    return waiting


def test_a_tenant_never_sees_another_tenants_run(tenanted: LaybySystem) -> None:
    made = start(tenanted, "billing")
    assert made.status_code == 202, made.text
    run = made.json()
    assert (run["tenant"], run["startedBy"]) == ("acme", "api:billing")
    intr = parked(tenanted, run["id"])
    with api(tenanted, "bolt") as bolt:
        for reply in (bolt.get(f"/v1/runs/{run['id']}"),
                      bolt.get(f"/v1/runs/{run['id']}/events", params={"follow": "false"}),
                      bolt.post(f"/v1/runs/{run['id']}/interrupts/{intr['id']}",
                                json={"status": "resolved", "payload": {"approved": True}}),
                      bolt.post(f"/v1/runs/{run['id']}/cancel", json={})):
            error = refused(reply, 404, "notfound")
            assert "acme" not in str(error)
        assert run["id"] not in str(bolt.get("/v1/runs", params={"limit": 500}).json())
        mine = bolt.post("/v1/runs", json={"agent": "demo.trivia", "input": "quiz"}).json()
        listed = bolt.get("/v1/runs", params={"limit": 500}).json()["runs"]
        assert [r["id"] for r in listed] == [mine["id"]] and listed[0]["tenant"] == "bolt"
    with api(tenanted, "auditor") as auditor:
        ids = {r["id"] for r in auditor.get("/v1/runs", params={"limit": 500}).json()["runs"]}
        assert run["id"] in ids and mine["id"] not in ids
    with api(tenanted, "admin") as admin:  # LAYBY_API_KEYS: every tenant
        ids = {r["id"] for r in admin.get("/v1/runs", params={"limit": 500}).json()["runs"]}
        assert {run["id"], mine["id"]} <= ids
        # /metrics counts each tenant's runs, by state, as its own list has them.
        counted: Counter[str] = Counter()
        for family in text_string_to_metric_families(admin.get("/metrics").text):
            if family.name == "layby_tenant_runs":
                for sample in family.samples:
                    counted[sample.labels["tenant"]] += int(sample.value)
    for who, tenant in (("bolt", "bolt"), ("auditor", "acme")):
        with api(tenanted, who) as c:
            listed = c.get("/v1/runs", params={"limit": 500}).json()["runs"]
        assert counted[tenant] == len(listed) > 0, (tenant, counted)


def test_an_idempotency_key_is_a_tenants_own(tenanted: LaybySystem) -> None:
    key = f"order-{uuid.uuid4().hex[:8]}"
    ours = start(tenanted, "billing", **{"Idempotency-Key": key}).json()["id"]
    theirs = start(tenanted, "bolt", **{"Idempotency-Key": key}).json()["id"]
    assert ours != theirs
    assert start(tenanted, "billing", **{"Idempotency-Key": key}).json()["id"] == ours


def test_rights_and_agents_are_kept_with_403_naming_them(tenanted: LaybySystem) -> None:
    error = refused(start(tenanted, "auditor"), 403, "forbidden")
    assert "may not start" in error["message"] and error["detail"] == {"right": "start"}
    error = refused(start(tenanted, "billing", agent="demo.bbq"), 403, "forbidden")
    assert error["detail"] == {"agent": "demo.bbq"} and "demo.t*" in error["message"]
    with api(tenanted, "billing") as billing:
        agents = {a["name"] for a in billing.get("/v1/agents").json()["agents"]}
        assert "demo.transfer" in agents and "demo.bbq" not in agents
    run_id = start(tenanted, "billing").json()["id"]
    intr = parked(tenanted, run_id)
    with api(tenanted, "auditor") as auditor:
        assert auditor.get(f"/v1/runs/{run_id}").status_code == 200
        refused(auditor.post(f"/v1/runs/{run_id}/interrupts/{intr['id']}",
                             json={"status": "cancelled"}), 403, "forbidden")
        refused(auditor.post(f"/v1/runs/{run_id}/cancel", json={}), 403, "forbidden")
        refused(auditor.get("/metrics"), 403, "forbidden")
    with api(tenanted, "clerk") as clerk:  # `answer` declines, but does not approve
        error = refused(clerk.post(f"/v1/runs/{run_id}/interrupts/{intr['id']}",
                                   json={"status": "resolved", "payload": {"approved": True}}),
                        403, "forbidden")
        assert error["detail"] == {"right": "approve"}
        taken = clerk.post(f"/v1/runs/{run_id}/interrupts/{intr['id']}",
                           json={"status": "cancelled", "metadata": {"reason": "no"}})
        assert taken.status_code == 200, taken.text
    done = tenanted.wait_status(run_id, "completed")
    assert done["result"].startswith("Transfer cancelled")


def test_the_key_that_started_a_transfer_cannot_approve_it(tenanted: LaybySystem) -> None:
    run_id = start(tenanted, "billing", text="Send 900 to Bob").json()["id"]
    intr = parked(tenanted, run_id)
    approval = {"status": "resolved", "payload": {"approved": True}}
    with api(tenanted, "billing") as billing:
        error = refused(billing.post(f"/v1/runs/{run_id}/interrupts/{intr['id']}",
                                     json=approval), 403, "self_approval")
        assert "four eyes" in error["message"]
    assert tenanted.run(run_id)["status"] == "interrupted"  # nothing recorded
    with api(tenanted, "approver") as approver:
        taken = approver.post(f"/v1/runs/{run_id}/interrupts/{intr['id']}", json=approval)
    assert taken.status_code == 200, taken.text
    done = tenanted.wait_status(run_id, "completed")
    assert done["result"] == "Sent 900 to Bob."
    [answered] = done["interrupts"]
    assert answered["answer"]["answeredBy"] == "api:approver"


def test_a_tool_that_names_a_key_as_its_reviewer_is_answered_by_that_key_alone(
        tenanted: LaybySystem) -> None:
    """`reviewers=["api:bolt-ops"]`: a service made a reviewer on purpose. Another key of
    the tenant, though it holds `approve`, is refused, naming the key; the named one
    approves; keys are never asked of an interrupt that names none (the transfer above)."""
    run_id = start(tenanted, "bolt", agent="test.named", text="api:bolt-ops").json()["id"]
    intr = parked(tenanted, run_id)
    assert intr["reviewers"] == ["api:bolt-ops"]
    approval = {"status": "resolved", "payload": {"approved": True}}
    with api(tenanted, "bolt") as bolt:
        error = refused(bolt.post(f"/v1/runs/{run_id}/interrupts/{intr['id']}",
                                  json=approval), 403, "forbidden")
    assert "api:bolt-ops" in error["message"] and "api:bolt is not one of them" in \
        error["message"]
    assert tenanted.run(run_id)["status"] == "interrupted"
    with api(tenanted, "bolt-ops") as ops:
        taken = ops.post(f"/v1/runs/{run_id}/interrupts/{intr['id']}", json=approval)
    assert taken.status_code == 200, taken.text
    done = tenanted.wait_status(run_id, "completed")
    assert done["result"] == "Signed off."
    assert done["interrupts"][0]["answer"]["answeredBy"] == "api:bolt-ops"


def test_agui_threads_of_two_tenants_are_two_runs(tenanted: LaybySystem) -> None:
    thread = f"t-{uuid.uuid4().hex[:8]}"
    body = {"threadId": thread, "runId": "r1", "state": {}, "tools": [], "context": [],
            "forwardedProps": {}, "messages": [{"id": "u1", "role": "user",
                                                "content": "Send 5 to Ann"}]}
    seen = []
    for who in ("billing", "bolt"):
        with api(tenanted, who) as c, c.stream("POST", "/agui/demo.transfer",
                                               json=body) as reply:
            assert reply.status_code == 200
            seen.append("".join(reply.iter_text()))
    assert "RUN_ERROR" not in seen[0] and "RUN_ERROR" not in seen[1]
    with api(tenanted, "bolt") as bolt:
        mine = [r["id"] for r in bolt.get("/v1/runs", params={"limit": 500}).json()["runs"]
                if r["id"].startswith("agui")]
    with api(tenanted, "auditor") as auditor:
        ours = [r["id"] for r in auditor.get("/v1/runs", params={"limit": 500}).json()["runs"]
                if r["id"].startswith("agui")]
    assert len(mine) == 1 and len(ours) == 1 and mine != ours


CROSSING = {"X-Layby-Tenant": "bolt", "X-Tenant": "bolt", "X-Tenant-Id": "bolt",
            "Tenant": "bolt", "X-Forwarded-User": "api:bolt", "X-Layby-Caller": "api:admin"}


def test_a_tenant_named_in_a_body_header_or_query_crosses_nothing(
        tenanted: LaybySystem) -> None:
    """A key's tenant is the keys file's, whatever a request says: a tenant (or a caller)
    in headers, in the start's body or metadata, in a list's query or in an AG-UI body
    neither starts a run in another tenant nor shows or reaches one of its runs."""
    with api(tenanted, "bolt") as bolt:
        theirs = bolt.post("/v1/runs", json={"agent": "demo.transfer",
                                             "input": "Send 7 to Bo"}).json()["id"]
    parked(tenanted, theirs)
    before = _ids(tenanted, "bolt")
    with api(tenanted, "billing") as billing:
        billing.headers.update(CROSSING)
        made = billing.post("/v1/runs", params={"tenant": "bolt"}, json={
            "agent": "demo.transfer", "input": "Send 8 to Bo", "tenant": "bolt",
            "metadata": {"tenant": "bolt", "layby": {"tenant": "bolt"}}})
        if made.status_code == 202:
            assert made.json()["tenant"] == "acme"
        else:  # refused as a body it does not take: nothing started anywhere
            refused(made, 422, "invalid_request")
        refused(billing.get(f"/v1/runs/{theirs}", params={"tenant": "bolt"}), 404, "notfound")
        listed = billing.get("/v1/runs", params={"limit": 500, "tenant": "bolt"})
        assert listed.status_code in (200, 422), listed.text
        if listed.status_code == 200:
            assert {r["tenant"] for r in listed.json()["runs"]} == {"acme"}
        refused(billing.get("/v1/audit", params={"tenant": "bolt"}), 403, "forbidden")
        body = {"threadId": f"t-{uuid.uuid4().hex[:8]}", "runId": "r1",
                "state": {"tenant": "bolt"}, "tools": [], "context": [],
                "forwardedProps": {"tenant": "bolt", "runId": theirs},
                "messages": [{"id": "u1", "role": "user", "content": "Send 6 to Bo"}]}
        with billing.stream("POST", "/agui/demo.transfer", json=body) as reply:
            assert reply.status_code == 200
            said = "".join(reply.iter_text())
        assert theirs not in said
    assert _ids(tenanted, "bolt") == before  # nothing billing sent is bolt's
    assert tenanted.run(theirs)["status"] == "interrupted"  # untouched


def _ids(system: LaybySystem, who: str) -> set[str]:
    with api(system, who) as c:
        return {r["id"] for r in c.get("/v1/runs", params={"limit": 500}).json()["runs"]}


def test_a_keys_file_that_does_not_parse_stops_layby_up_before_its_banner(
        tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text('[keys.ops]\nsecret = "lby_ops_0123456789"\ncan = ["read", "fly"]\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYBY_")}
    env.update({"LAYBY_KEYS_FILE": str(keys), "LAYBY_DATA_DIR": str(tmp_path / "data"),
                "PYTHONPATH": str(ROOT)})
    done = subprocess.run([LAYBY, "up", "--port", str(free_port())], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{keys}:1: key 'ops': unknown right 'fly'" in done.stderr
    assert "gateway" not in done.stdout  # no banner: nothing said it was up
    doctor = subprocess.run([LAYBY, "doctor"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=120)
    assert "unknown right 'fly'" in doctor.stdout + doctor.stderr


def test_a_change_to_the_keys_file_is_taken_within_seconds(tenanted: LaybySystem) -> None:
    keys = Path(tenanted.env["LAYBY_KEYS_FILE"])
    before = keys.read_text()
    try:
        keys.write_text(before + '\n[keys.late]\nsecret = "lby_late_0123456789"\n'
                        'tenant = "acme"\ncan = ["read"]\n')
        with httpx.Client(base_url=tenanted.base_url, timeout=10,
                          headers={"Authorization": "Bearer lby_late_0123456789"}) as late:
            wait_until(lambda: late.get("/v1/runs").status_code == 200, 10,
                       what="the new key to be taken")
    finally:
        keys.write_text(before)


# -- run tokens -------------------------------------------------------------------------


def mint(system: LaybySystem, who: str, run_id: str, can: list[str],
         ttl_s: int = 900) -> httpx.Response:
    with api(system, who) as c:
        return c.post(f"/v1/runs/{run_id}/tokens", json={"can": can, "ttlS": ttl_s})


def bearer(system: LaybySystem, token: str) -> httpx.Client:
    return httpx.Client(base_url=system.base_url, timeout=30,
                        headers={"Authorization": f"Bearer {token}"})


def test_a_run_token_reads_and_answers_its_run_and_nothing_else(
        tenanted: LaybySystem) -> None:
    run_id = start(tenanted, "billing", text="Send 70 to Ann").json()["id"]
    other = start(tenanted, "billing", text="Send 71 to Ann").json()["id"]
    intr = parked(tenanted, run_id)
    minted = mint(tenanted, "billing", run_id, ["read", "answer"])
    assert minted.status_code == 201, minted.text
    token = minted.json()["token"]
    assert minted.json()["expiresAt"].endswith("Z") and token.startswith("lbr.")
    with bearer(tenanted, token) as browser:
        assert browser.get(f"/v1/runs/{run_id}").json()["id"] == run_id
        events = browser.get(f"/v1/runs/{run_id}/events", params={"follow": "false"})
        assert events.status_code == 200 and "run.interrupted" in events.text
        refused(browser.get(f"/v1/runs/{other}"), 404, "notfound")
        refused(browser.get("/v1/runs"), 403, "forbidden")
        refused(browser.post("/v1/runs", json={"agent": "demo.trivia", "input": "x"}),
                403, "forbidden")
        refused(browser.post(f"/v1/runs/{run_id}/tokens", json={"can": ["read"]}),
                403, "forbidden")
        # `answer` declines; approving takes `approve`, which this token does not carry.
        refused(browser.post(f"/v1/runs/{run_id}/interrupts/{intr['id']}",
                             json={"status": "resolved", "payload": {"approved": True}}),
                403, "forbidden")
        taken = browser.post(f"/v1/runs/{run_id}/interrupts/{intr['id']}",
                             json={"status": "cancelled", "metadata": {"reason": "not me"}})
        assert taken.status_code == 200, taken.text
        done = tenanted.wait_status(run_id, "completed")
        [answered] = done["interrupts"]
        assert (answered["answer"]["answeredBy"], answered["answer"]["channel"]) == (
            "api:billing", "token")
        # Its run has ended: the token is taken no more.
        error = refused(browser.get(f"/v1/runs/{run_id}"), 401, "unauthorized")
        assert "ended" in error["message"]


def test_a_token_carries_no_more_than_its_key_and_dies_by_time_or_revocation(
        tenanted: LaybySystem) -> None:
    run_id = start(tenanted, "billing").json()["id"]
    parked(tenanted, run_id)
    error = refused(mint(tenanted, "auditor", run_id, ["read", "answer"]), 403, "forbidden")
    assert error["detail"] == {"right": "answer"}
    refused(mint(tenanted, "bolt", run_id, ["read"]), 404, "notfound")
    refused(mint(tenanted, "billing", run_id, ["start"]), 422, "invalid")
    short = mint(tenanted, "billing", run_id, ["read"], ttl_s=1).json()["token"]
    kept = mint(tenanted, "billing", run_id, ["read"]).json()["token"]
    with bearer(tenanted, short) as browser:
        wait_until(lambda: browser.get(f"/v1/runs/{run_id}").status_code == 401, 5,
                   what="the token to expire")
        assert "expired" in browser.get(f"/v1/runs/{run_id}").json()["error"]["message"]
    forged = kept[:-3] + ("AAA" if not kept.endswith("AAA") else "BBB")
    with bearer(tenanted, forged) as browser:
        refused(browser.get(f"/v1/runs/{run_id}"), 401, "unauthorized")
    with bearer(tenanted, kept) as browser:
        assert browser.get(f"/v1/runs/{run_id}").status_code == 200
        with api(tenanted, "billing") as billing:
            assert billing.delete(f"/v1/runs/{run_id}/tokens").status_code == 200
        error = refused(browser.get(f"/v1/runs/{run_id}"), 401, "unauthorized")
        assert "revoked" in error["message"]
    fresh = mint(tenanted, "billing", run_id, ["read"]).json()["token"]
    with bearer(tenanted, fresh) as browser:  # minted after the revocation: good
        assert browser.get(f"/v1/runs/{run_id}").status_code == 200


def test_a_browser_follows_and_answers_its_agui_thread_with_a_run_token(
        tenanted: LaybySystem) -> None:
    """The page's server starts the thread with its key and mints a token for the thread's
    run; the browser's client streams and resumes it with the token alone."""
    thread = f"t-{uuid.uuid4().hex[:8]}"
    body: dict[str, Any] = {"threadId": thread, "runId": "r1", "state": {}, "tools": [],
                            "context": [], "forwardedProps": {},
                            "messages": [{"id": "u1", "role": "user",
                                          "content": "Send 8 to Ann"}]}
    with api(tenanted, "billing") as server, server.stream(
            "POST", "/agui/demo.transfer", json=body) as reply:
        assert reply.status_code == 200
        "".join(reply.iter_text())
    with api(tenanted, "auditor") as auditor:
        [run] = [r for r in auditor.get("/v1/runs", params={"limit": 500}).json()["runs"]
                 if r["id"].startswith("agui") and r["status"] == "interrupted"
                 and r["agent"] == "demo.transfer" and run_of_thread(auditor, r, thread)]
    token = mint(tenanted, "approver", run["id"], ["read", "approve"]).json()["token"]
    intr = parked(tenanted, run["id"])
    resume = {**body, "runId": "r2", "messages": [],
              "resume": [{"interruptId": intr["id"], "status": "resolved",
                          "payload": {"approved": True}}]}
    with bearer(tenanted, token) as browser, browser.stream(
            "POST", "/agui/demo.transfer", json=resume) as reply:
        text = "".join(reply.iter_text())
    assert "RUN_FINISHED" in text and "Sent 8 to Ann." in text, text[-800:]


def run_of_thread(client: httpx.Client, run: dict[str, Any], thread: str) -> bool:
    full = client.get(f"/v1/runs/{run['id']}").json()
    return bool(full.get("metadata", {}).get("agui", {}).get("threadId") == thread)


# -- the audit trail --------------------------------------------------------------------


def test_the_audit_trail_shows_who_did_what_to_an_admin_alone(tenanted: LaybySystem) -> None:
    run_id = start(tenanted, "billing", text="Send 333 to Bob").json()["id"]
    intr = parked(tenanted, run_id)
    approval = {"status": "resolved", "payload": {"approved": True}}
    with api(tenanted, "billing") as billing:
        refused(billing.post(f"/v1/runs/{run_id}/interrupts/{intr['id']}", json=approval),
                403, "self_approval")
    assert mint(tenanted, "billing", run_id, ["read"]).status_code == 201
    with api(tenanted, "bolt") as bolt:
        refused(bolt.get(f"/v1/runs/{run_id}"), 404, "notfound")
    with api(tenanted, "approver") as approver:
        assert approver.post(f"/v1/runs/{run_id}/interrupts/{intr['id']}",
                             json=approval).status_code == 200
    tenanted.wait_status(run_id, "completed")
    with api(tenanted, "auditor") as auditor:  # `read` is not `admin`
        refused(auditor.get("/v1/audit"), 403, "forbidden")
    with api(tenanted, "admin") as admin:
        page = admin.get("/v1/audit", params={"run": run_id}).json()
    seen = [(e["caller"], e["action"], e["outcome"]) for e in reversed(page["entries"])]
    assert seen == [("api:billing", "start", "ok"),
                    ("api:billing", "answer", "self_approval"),
                    ("api:billing", "token.mint", "ok"),
                    ("api:bolt", "read", "notfound"),
                    ("api:approver", "approve", "ok")], seen
    for e in page["entries"]:
        assert e["run"] == run_id and e["source"] == "127.0.0.1" and e["at"].endswith("Z")
        assert e["tenant"] == ("bolt" if e["caller"] == "api:bolt" else "acme")
    approve = next(e for e in page["entries"] if e["action"] == "approve")
    assert (approve["interrupt"], approve["channel"]) == (intr["id"], "api")
    # No secret, key or token anywhere in it.
    text = str(page)
    assert not any(secret in text for secret in KEYS.values()) and "lbr." not in text
    # By caller, across every shard, and from the command line as JSON lines.
    with api(tenanted, "admin") as admin:
        mine = admin.get("/v1/audit", params={"caller": "api:approver"}).json()["entries"]
    assert mine and {e["caller"] for e in mine} == {"api:approver"}
    lines = tenanted.layby("audit", "--since", "10m", "--run", run_id)
    assert lines.returncode == 0, lines.stderr
    assert [json.loads(line)["action"] for line in lines.stdout.splitlines()] == [
        "approve", "read", "token.mint", "answer", "start"]
