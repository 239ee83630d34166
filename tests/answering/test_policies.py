"""Reviewer policies end to end, over real parts (Valkey, worker, sweeper, gateway, reply
listener, an SMTP server, a webhook receiver, the answer page in Chromium): rules that
answer the routine with nobody asked, requests that need two approvals from two channels,
escalation to the next level when nobody answers in time, hand-overs (page, mail, callback,
and a directory entry away), and a broken rules file refused while the old rules go on.

What is checked is what users see: the run's status and result, each interrupt's audit
(`answeredBy`, `channel`, `rule`, `approvals`, `escalationLevel`, `delegations`), the event
stream, who got mail, `/metrics`, and what `layby policy` and `layby doctor` print.
"""

from __future__ import annotations

import hashlib
import json
import os
import smtplib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from layby.ops.embedded import EmbeddedRedis
from layby.ops.supervisor import sweeper_argv
from tests.answering.test_reviewer_answers import (
    ALICE,
    callback_body,
    error_of,
    hook_token,
    notification,
    post_callback,
    reply,
    signature_headers,
    signed_callback,
    text_of,
    transfers_of,
)
from tests.support.browser import launch
from tests.support.harness import API_KEY, ROOT, wait_until
from tests.support.reviewers import (
    ReviewedSystem,
    SmtpServer,
    WebhookReceiver,
    link_in,
    own_reviewed,
    wait_gone,
)
from tests.support.sse import history

DB = 8  # the reviewer tests' Valkey server, a database of this module's own
BOB = "bob@example.com"
# Fifteen API callers, each recorded as its own reviewer: the first two by name (`api:ops`,
# `api:billing`), the rest by their keys' fingerprints. Every key starts as layby's own do.
VOTER_KEYS = [f"lby_voter-key-{n:03d}-0123456789" for n in range(15)]
CONFIGURED_KEYS = [API_KEY, "ops:" + VOTER_KEYS[0], "billing:" + VOTER_KEYS[1], *VOTER_KEYS[2:]]

RULES = """\
[[rules]]
name = "small-transfers"
agent = "demo.transfer"
tool = "transfer_funds"
when = "input.amount <= 100"
action = "approve"
note = "small enough"

[[rules]]
name = "gated-refunds"
tool = "refund"
when = "input.amount <= 500"
action = "approve"

[[rules]]
name = "no-crypto"
tool = "transfer_funds"
when = "input.to == 'crypto'"
action = "decline"
note = "no transfers to crypto exchanges"

[[rules]]
name = "escalating"
tool = "transfer_funds"
when = "input.amount >= 500 && input.amount < 1000"
reviewers = ["alice"]
escalate = [{ after = "3s", to = ["bob"] }]

[[rules]]
name = "reminded"
tool = "transfer_funds"
when = "input.amount >= 400 && input.amount < 500"
reviewers = ["alice"]
remind_every = "2s"

[[rules]]
name = "large-transfers"
tool = "transfer_funds"
when = "input.amount >= 1000 && input.amount < 5000"
reviewers = ["approvers"]
required_approvals = 2

[[rules]]
name = "huge-transfers"
tool = "transfer_funds"
when = "input.amount >= 5000"
reviewers = ["everyone"]
required_approvals = 5

[[rules]]
name = "default"
"""


@pytest.fixture(scope="module")
def policed(reviewer_redis: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[ReviewedSystem]:
    tmp = tmp_path_factory.mktemp("policies")
    rules = tmp / "policy.toml"
    rules.write_text(RULES)
    with own_reviewed(reviewer_redis, tmp, DB, SmtpServer().start(), WebhookReceiver().start(),
                      LAYBY_POLICY_FILE=str(rules),
                      LAYBY_API_KEYS=",".join(CONFIGURED_KEYS)) as reviewed:
        yield reviewed


def transfer(reviewed: ReviewedSystem, amount: int, to: str = "Bob") -> str:
    return reviewed.start_run("demo.transfer", f"Send {amount} to {to}")["id"]


def the_interrupt(run: dict[str, Any]) -> dict[str, Any]:
    (intr,) = run["interrupts"]
    return intr


def events_of(reviewed: ReviewedSystem, run_id: str, kind: str) -> list[dict[str, Any]]:
    return [e["data"]["data"] for e in history(reviewed.system, run_id) if e["event"] == kind]


def metric(reviewed: ReviewedSystem, name: str, **labels: str) -> float:
    with reviewed.system.api() as api:
        reply = api.get("/metrics")
    assert reply.status_code == 200, reply.text
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def approve_on_page(link: str) -> str:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page()
        page.goto(link)
        page.get_by_role("button", name="Approve").click()
        page.wait_for_load_state()
        text = page.inner_text("main")
        browser.close()
    return text


def layby_cli(reviewed: ReviewedSystem, *args: str) -> subprocess.CompletedProcess[str]:
    env = reviewed.system.env
    return subprocess.run([sys.executable, "-m", "layby.ops.cli", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


# -- rules --------------------------------------------------------------------------------


def test_a_small_transfer_is_approved_by_rule_and_nobody_is_mailed(policed: ReviewedSystem
                                                                    ) -> None:
    before = metric(policed, "layby_policy_auto_answers_total", rule="small-transfers")
    run_id = transfer(policed, 20)
    done = policed.system.wait_status(run_id, "completed", timeout=60)
    assert done["result"] == "Sent 20 to Bob."
    intr = the_interrupt(done)
    assert intr["rule"] == "small-transfers"
    assert (intr["answer"]["answeredBy"], intr["answer"]["channel"]) == \
        ("policy:small-transfers", "policy")
    assert intr["answer"]["payload"] == {"approved": True, "note": "small enough"}
    assert len(transfers_of(policed, run_id)) == 1
    (auto,) = events_of(policed, run_id, "interrupt.auto_answered")
    assert auto["answeredBy"] == "policy:small-transfers"
    assert events_of(policed, run_id, "run.interrupted")[0]["interrupts"] == []
    # Nobody heard of it, and nothing is planned to be sent.
    wait_gone(lambda: bool(policed.smtp.mails_to(ALICE, run_id)
                           or policed.hooks.for_run(run_id)), 2)
    assert done["notifications"] == []
    assert metric(policed, "layby_policy_auto_answers_total",
                  rule="small-transfers") == before + 1


def test_rules_refine_what_requires_approval_declares(policed: ReviewedSystem) -> None:
    def refund(text: str) -> dict[str, Any]:
        run_id = policed.start_run("test.refunds", text)["id"]
        return policed.system.wait_status(run_id, "completed", "interrupted", timeout=60)

    small = refund("refund 50 on order 7")  # under the tool's own limit: nobody asked
    assert (small["result"], small["interrupts"]) == ("Refunded 50.", [])
    routine = refund("refund 300 on order 8")  # the tool asks, a rule approves
    assert routine["result"] == "Refunded 300."
    assert the_interrupt(routine)["answer"]["answeredBy"] == "policy:gated-refunds"
    large = refund("refund 900 on order 9")  # the tool asks, no rule answers: a person
    assert large["status"] == "interrupted"
    intr = the_interrupt(large)
    assert intr["rule"] == "default" and intr["metadata"] == {"layby:approval": True}
    assert policed.system.answer(large["id"], intr["id"],
                                 payload={"approved": False, "note": "too much"}) \
        .status_code == 200
    assert policed.system.wait_status(large["id"], "completed", timeout=60)["result"] == \
        "Declined: too much."


def test_a_rule_declines_with_its_reason(policed: ReviewedSystem) -> None:
    run_id = transfer(policed, 300, to="crypto")
    done = policed.system.wait_status(run_id, "completed", timeout=60)
    assert done["result"] == "Transfer cancelled: no transfers to crypto exchanges. " \
                             "No money was sent."
    answer = the_interrupt(done)["answer"]
    assert (answer["answeredBy"], answer["status"]) == ("policy:no-crypto", "cancelled")
    assert transfers_of(policed, run_id) == []


# -- quorum -------------------------------------------------------------------------------


def test_a_large_transfer_needs_two_approvals_from_two_channels(policed: ReviewedSystem
                                                                ) -> None:
    run_id = transfer(policed, 2000)
    parked = policed.system.wait_status(run_id, "interrupted", timeout=60)
    intr = the_interrupt(parked)
    assert (intr["rule"], intr["requiredApprovals"]) == ("large-transfers", 2)
    mail = notification(policed, run_id, intr["id"])

    # Alice approves by email: counted, the run still waits.
    assert reply(policed, mail, "approve").startswith("250")
    waiting = wait_until(lambda: (r := policed.system.run(run_id))["interrupts"][0]
                         ["approvals"] and r, 30)
    assert waiting["status"] == "interrupted"
    (first,) = the_interrupt(waiting)["approvals"]
    assert (first["answeredBy"], first["channel"]) == ("reviewer:alice", "email")
    assert transfers_of(policed, run_id) == []

    # Her second approval, from her page this time, counts for nothing and says why.
    page = httpx.post(link_in(mail, "/review/"), data={"decision": "approve"}, timeout=30)
    assert page.status_code == 409 and "Your approval is recorded" in page.text
    assert len(the_interrupt(policed.system.run(run_id))["approvals"]) == 1

    # hookbot's system approves: the second reviewer, the run resumes once.
    taken = signed_callback(policed, run_id, intr["id"], {"approved": True})
    assert taken.status_code == 200, taken.text
    assert taken.json()["resumed"] is True
    done = policed.system.wait_status(run_id, "completed", timeout=60)
    approvals = the_interrupt(done)["approvals"]
    assert [(a["answeredBy"], a["channel"]) for a in approvals] == \
        [("reviewer:alice", "email"), ("reviewer:hookbot", "webhook")]
    assert len(transfers_of(policed, run_id)) == 1
    assert len(events_of(policed, run_id, "run.resuming")) == 1
    assert [e["approvals"] for e in events_of(policed, run_id, "interrupt.approved")] == [1]


def test_a_decline_by_anyone_declines_a_request_needing_two(policed: ReviewedSystem) -> None:
    run_id = transfer(policed, 1500)
    intr = the_interrupt(policed.system.wait_status(run_id, "interrupted", timeout=60))
    mail = notification(policed, run_id, intr["id"])
    assert reply(policed, mail, "approve").startswith("250")
    wait_until(lambda: the_interrupt(policed.system.run(run_id))["approvals"], 30)
    assert signed_callback(policed, run_id, intr["id"], {"approved": False,
                                                         "note": "too much"}).status_code == 200
    done = policed.system.wait_status(run_id, "completed", timeout=60)
    assert done["result"] == "The transfer was not approved; no money was sent."
    assert transfers_of(policed, run_id) == []


def test_fifty_concurrent_answers_record_five_approvals_and_resume_once(
        policed: ReviewedSystem) -> None:
    run_id = transfer(policed, 9000)
    intr = the_interrupt(policed.system.wait_status(run_id, "interrupted", timeout=60))
    assert intr["requiredApprovals"] == 5
    mail = notification(policed, run_id, intr["id"])
    barrier = threading.Barrier(50)
    outcomes: list[int] = []
    lock = threading.Lock()

    def api_vote(key: str) -> None:
        barrier.wait(30)
        got = httpx.post(f"{policed.system.base_url}/v1/runs/{run_id}/interrupts/{intr['id']}",
                         json={"status": "resolved", "payload": {"approved": True}},
                         headers={"Authorization": f"Bearer {key}"}, timeout=60)
        with lock:
            outcomes.append(got.status_code)

    def hook_vote() -> None:
        barrier.wait(30)
        got = signed_callback(policed, run_id, intr["id"], {"approved": True})
        with lock:
            outcomes.append(got.status_code)

    def mail_vote() -> None:
        barrier.wait(30)
        try:
            answer = reply(policed, mail, "approve")
        except smtplib.SMTPRecipientsRefused as exc:  # refused at RCPT, naming why
            code, why = next(iter(exc.recipients.values()))
            answer = f"{code} {why.decode()}"
        except smtplib.SMTPResponseException as exc:  # refused at DATA
            answer = f"{exc.smtp_code} {exc.smtp_error.decode()}"
        with lock:
            outcomes.append(200 if answer.startswith("250 2.0.0 Answer") else
                            409 if answer.startswith("550") else int(answer[:3]))

    voters = ([lambda k=k: api_vote(k) for k in VOTER_KEYS for _ in range(3)]
              + [hook_vote] * 3 + [mail_vote] * 2)
    assert len(voters) == 50
    threads = [threading.Thread(target=v) for v in voters]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(outcomes) == 50 and set(outcomes) <= {200, 409}, outcomes
    done = policed.system.wait_status(run_id, "completed", timeout=60)
    approvals = the_interrupt(done)["approvals"]
    assert len(approvals) == 5
    assert len({a["answeredBy"] for a in approvals}) == 5
    assert outcomes.count(200) == 5
    assert len(events_of(policed, run_id, "run.resuming")) == 1
    assert len(transfers_of(policed, run_id)) == 1


# -- escalation ---------------------------------------------------------------------------


def test_an_unanswered_request_escalates_to_bob_who_answers_it(policed: ReviewedSystem
                                                               ) -> None:
    before = metric(policed, "layby_escalations_total", level="1")
    run_id = transfer(policed, 700)
    intr = the_interrupt(policed.system.wait_status(run_id, "interrupted", timeout=60))
    assert intr["escalation"] == [{"afterS": 3.0, "reviewers": ["bob"]}]
    notification(policed, run_id, intr["id"])  # alice is asked at once
    assert policed.smtp.mails_to(BOB, run_id) == []
    bob_mail = wait_until(lambda: policed.smtp.mails_to(BOB, run_id), 30,
                          what="the escalation to bob")[0]
    assert str(bob_mail["Subject"]).strip().startswith("Escalated: [layby] demo.transfer")
    assert "Nobody answered this request in time" in text_of(bob_mail)
    escalated = policed.system.run(run_id)
    assert the_interrupt(escalated)["escalationLevel"] == 1
    (event,) = events_of(policed, run_id, "interrupt.escalated")
    assert event == {"interruptId": intr["id"], "level": 1}
    text = approve_on_page(link_in(bob_mail, "/review/"))
    assert "recorded" in text
    done = policed.system.wait_status(run_id, "completed", timeout=60)
    answer = the_interrupt(done)["answer"]
    assert (answer["answeredBy"], answer["channel"]) == ("reviewer:bob", "page")
    assert metric(policed, "layby_escalations_total", level="1") == before + 1
    # Alice got one request and no escalation; bob got exactly one.
    assert len(policed.smtp.mails_to(ALICE, run_id)) == 1
    assert len(policed.smtp.mails_to(BOB, run_id)) == 1


def test_an_answer_before_the_delay_means_nobody_else_is_asked(policed: ReviewedSystem
                                                               ) -> None:
    run_id = transfer(policed, 800)
    intr = the_interrupt(policed.system.wait_status(run_id, "interrupted", timeout=60))
    assert reply(policed, notification(policed, run_id, intr["id"]), "approve") \
        .startswith("250")
    policed.system.wait_status(run_id, "completed", timeout=60)
    wait_gone(lambda: bool(policed.smtp.mails_to(BOB, run_id)), 5)
    escalation = [n for n in policed.system.run(run_id)["notifications"]
                  if n["kind"] == "escalation"]
    assert escalation and all(n["state"] == "skipped" for n in escalation)


def test_an_escalation_due_while_worker_and_sweeper_are_dead_fires_once(
        policed: ReviewedSystem) -> None:
    system = policed.system
    run_id = transfer(policed, 750)
    intr = the_interrupt(system.wait_status(run_id, "interrupted", timeout=60))
    notification(policed, run_id, intr["id"])  # alice is asked
    system.procs["sweeper"].kill()
    system.procs["worker"].kill()
    time.sleep(4)  # bob's level falls due while nothing runs
    assert policed.smtp.mails_to(BOB, run_id) == []
    system.start_worker()
    system._start("sweeper", sweeper_argv(system.settings))
    wait_until(lambda: policed.smtp.mails_to(BOB, run_id), 60, what="the escalation to bob")
    wait_gone(lambda: len(policed.smtp.mails_to(BOB, run_id)) > 1, 4)
    assert len(events_of(policed, run_id, "interrupt.escalated")) == 1
    shown = layby_cli(policed, "runs", "show", run_id)
    assert "rule escalating" in shown.stdout and "escalated to level 1" in shown.stdout
    assert system.answer(run_id, intr["id"], status="cancelled").status_code == 200
    system.wait_status(run_id, "completed", timeout=60)


def test_reminders_repeat_until_someone_answers(policed: ReviewedSystem) -> None:
    run_id = transfer(policed, 450)
    intr = the_interrupt(policed.system.wait_status(run_id, "interrupted", timeout=60))
    assert intr["remindEveryS"] == 2.0
    mails = wait_until(lambda: len(m := policed.smtp.mails_to(ALICE, run_id)) >= 3 and m, 30,
                       what="a request and two reminders")
    assert reply(policed, mails[0], "approve").startswith("250 2.0.0 Answer")
    policed.system.wait_status(run_id, "completed", timeout=60)
    sent = len(policed.smtp.mails_to(ALICE, run_id))
    wait_gone(lambda: len(policed.smtp.mails_to(ALICE, run_id)) > sent, 5)
    kinds = [n["kind"] for n in policed.system.run(run_id)["notifications"]]
    assert kinds.count("request") == 1 and kinds.count("reminder") >= 3


def test_two_named_keys_make_a_quorum_of_two_and_the_client_shows_them(
        policed: ReviewedSystem) -> None:
    from layby import Client

    with Client(policed.system.base_url, api_key=API_KEY) as client:
        run = client.start("test.quorum", input="rocket")
        run = client.wait(run.id, until="interrupted", timeout=60)
        intr = run.open_interrupts[0]
        assert (intr.required_approvals, intr.rule) == (2, "default")
        for key in VOTER_KEYS[:2]:
            with Client(policed.system.base_url, api_key=key) as voter:
                voter.answer(run.id, intr.id, payload={"approved": True})
        done = client.wait(run.id, until="completed", timeout=60)
    assert done.result == "Launched: rocket"
    (answered,) = done.interrupts
    assert [a.answered_by for a in answered.approvals] == ["api:ops", "api:billing"]


def test_keys_without_names_that_start_alike_are_two_approvers(policed: ReviewedSystem
                                                                ) -> None:
    """Every key layby makes starts with `lby_`: a caller named by its key's first
    characters made two services one approver, and the second got 409."""
    from layby import Client

    first, second = VOTER_KEYS[2], VOTER_KEYS[3]
    assert first[:12] == second[:12]
    with Client(policed.system.base_url, api_key=API_KEY) as client:
        run = client.start("test.quorum", input="satellite")
        intr = client.wait(run.id, until="interrupted", timeout=60).open_interrupts[0]
        for key in (first, second):
            with Client(policed.system.base_url, api_key=key) as voter:
                voter.answer(run.id, intr.id, payload={"approved": True})
        done = client.wait(run.id, until="completed", timeout=60)
    callers = [a.answered_by for a in done.interrupts[0].approvals]
    assert callers == [f"api-key:{hashlib.sha256(k.encode()).hexdigest()[:12]}"
                       for k in (first, second)]


def test_ag_ui_interrupts_carry_how_they_are_reviewed(policed: ReviewedSystem) -> None:
    from layby.http.agui import agui_interrupt

    run_id = transfer(policed, 2100)
    intr = the_interrupt(policed.system.wait_status(run_id, "interrupted", timeout=60))
    shown = agui_interrupt(intr).model_dump(by_alias=True, exclude_none=True)
    assert shown["metadata"]["layby"] == {"rule": "large-transfers", "requiredApprovals": 2}
    assert shown["metadata"]["to"] == "Bob"  # the tool's own metadata stays
    assert policed.system.answer(run_id, intr["id"], status="cancelled").status_code == 200


# -- delegation ---------------------------------------------------------------------------


def test_alice_hands_a_request_to_bob_on_the_page_and_her_link_stops_working(
        policed: ReviewedSystem) -> None:
    from playwright.sync_api import sync_playwright

    run_id = transfer(policed, 300)  # the default rule: the approvers (alice, hookbot)
    intr = the_interrupt(policed.system.wait_status(run_id, "interrupted", timeout=60))
    alice_link = link_in(notification(policed, run_id, intr["id"]), "/review/")
    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page()
        page.goto(alice_link)
        page.get_by_label("Hand to").select_option("bob")
        page.get_by_label("Note for them (optional)").fill("I am off today")
        page.get_by_role("button", name="Hand on").click()
        page.wait_for_load_state()
        assert "You handed this request to" in page.content()
        assert "Bob Stone" in page.content()
        browser.close()
    bob_mail = wait_until(lambda: policed.smtp.mails_to(BOB, run_id), 30,
                          what="the request to bob")[0]
    assert "alice handed this request to you: I am off today." in text_of(bob_mail)
    # Alice's link no longer answers: refused, saying to whom she handed it.
    refused = httpx.post(alice_link, data={"decision": "approve"}, timeout=30)
    assert refused.status_code == 403 and "handed this request to bob" in refused.text
    with pytest.raises(smtplib.SMTPRecipientsRefused) as mailed:
        reply(policed, notification(policed, run_id, intr["id"]), "approve")
    # Refused at RCPT, before the mail is sent.
    [(code, why)] = mailed.value.recipients.values()
    assert code == 550 and b"handed this request to bob" in why
    assert policed.system.run(run_id)["status"] == "interrupted"
    # Bob answers with his own reply.
    assert reply(policed, bob_mail, "approve").startswith("250 2.0.0 Answer")
    done = policed.system.wait_status(run_id, "completed", timeout=60)
    intr = the_interrupt(done)
    assert intr["answer"]["answeredBy"] == "reviewer:bob"
    (handed,) = intr["delegations"]
    assert (handed["reviewer"], handed["to"], handed["by"], handed["channel"],
            handed["note"]) == ("alice", "bob", "reviewer:alice", "page", "I am off today")
    (event,) = events_of(policed, run_id, "interrupt.delegated")
    assert (event["reviewer"], event["to"]) == ("alice", "bob")


def test_a_reviewer_hands_on_by_email_and_by_callback(policed: ReviewedSystem) -> None:
    run_id = transfer(policed, 250)
    intr = the_interrupt(policed.system.wait_status(run_id, "interrupted", timeout=60))
    # hookbot's system hands its part to mallory with a callback (signed, as hookbot).
    body = json.dumps({"runId": run_id, "interruptId": intr["id"], "reviewer": "hookbot",
                       "delegateTo": "mallory"})
    headers = signature_headers(body)
    handed = post_callback(policed, body, headers)
    assert handed.status_code == 200, handed.text
    assert handed.json()["delegatedTo"] == "mallory"
    # The same callback again (a retry after a lost reply) gets the same reply.
    assert post_callback(policed, body, headers).json()["delegatedTo"] == "mallory"
    wait_until(lambda: policed.smtp.mails_to("mallory@example.com", run_id), 30,
               what="the request to mallory")
    refused = signed_callback(policed, run_id, intr["id"], {"approved": True})
    assert refused.status_code == 403 and "handed this request to mallory" in error_of(refused)
    # Alice hands hers to bob by replying "delegate bob".
    answer = reply(policed, notification(policed, run_id, intr["id"]), "delegate bob")
    assert answer == f"250 2.0.0 Request of run {run_id} handed to bob"
    bob_mail = wait_until(lambda: policed.smtp.mails_to(BOB, run_id), 30)[0]
    assert reply(policed, bob_mail, "approve").startswith("250 2.0.0 Answer")
    done = policed.system.wait_status(run_id, "completed", timeout=60)
    chain = [(d["reviewer"], d["to"], d["channel"]) for d in
             the_interrupt(done)["delegations"]]
    assert chain == [("hookbot", "mallory", "webhook"), ("alice", "bob", "email")]


def test_a_hand_over_to_someone_unknown_is_refused_with_the_reason(policed: ReviewedSystem
                                                                    ) -> None:
    run_id = transfer(policed, 260)
    intr = the_interrupt(policed.system.wait_status(run_id, "interrupted", timeout=60))
    token = hook_token(policed, run_id)
    body = json.dumps({"runId": run_id, "interruptId": intr["id"], "token": token,
                       "delegateTo": "nobody"})
    refused = post_callback(policed, body)
    assert refused.status_code == 422
    assert "no reviewer 'nobody'" in error_of(refused)
    both = callback_body(run_id, intr["id"], {"approved": True}, reviewer=None, token=token)
    both = json.dumps({**json.loads(both), "delegateTo": "bob"})
    assert post_callback(policed, both).status_code == 422
    assert the_interrupt(policed.system.run(run_id))["delegations"] == []
    assert policed.system.answer(run_id, intr["id"], payload={"approved": False}) \
        .status_code == 200


def test_a_reviewer_away_has_new_requests_go_to_their_delegate(policed: ReviewedSystem
                                                               ) -> None:
    directory = Path(policed.system.env["LAYBY_REVIEWERS_FILE"])
    original = directory.read_text()
    away = original.replace('email = "alice@example.com"\n',
                            'email = "alice@example.com"\naway_until = 2099-01-01T00:00:00Z\n'
                            'delegate_to = "bob"\n', 1)
    assert away != original
    directory.write_text(away)
    try:
        time.sleep(1.1)  # a new modification time for the reload
        directory.touch()
        run_id = transfer(policed, 270)
        intr = the_interrupt(policed.system.wait_status(run_id, "interrupted", timeout=60))
        bob_mail = wait_until(lambda: policed.smtp.mails_to(BOB, run_id), 30,
                              what="alice's request, sent to bob")[0]
        handed = wait_until(lambda: the_interrupt(policed.system.run(run_id))["delegations"],
                            30)
        assert [(d["reviewer"], d["to"], d["by"]) for d in handed] == \
            [("alice", "bob", "directory")]
        wait_gone(lambda: bool(policed.smtp.mails_to(ALICE, run_id)), 2)
        assert reply(policed, bob_mail, "approve").startswith("250 2.0.0 Answer")
        # hookbot is still asked too, but one approval settles it.
        policed.system.wait_status(run_id, "completed", timeout=60)
        assert intr["id"] == the_interrupt(policed.system.run(run_id))["id"]
    finally:
        directory.write_text(original)


# -- the rules file -------------------------------------------------------------------------


def test_a_broken_rules_file_is_refused_and_the_old_rules_stay(policed: ReviewedSystem
                                                               ) -> None:
    rules = Path(policed.system.env["LAYBY_POLICY_FILE"])
    broken = RULES.replace('reviewers = ["approvers"]', 'reviewers = ["approvrs"]')
    rules.write_text(broken)
    try:
        check = layby_cli(policed, "policy", "check", str(rules))
        assert check.returncode == 1
        assert "rule 'large-transfers' names unknown reviewers or groups ['approvrs']" in \
            check.stderr
        doctor = layby_cli(policed, "doctor")
        assert "policy rules" in doctor.stdout and "approvrs" in doctor.stdout
        # The running system keeps the rules it had: a small transfer is still approved.
        run_id = transfer(policed, 30)
        done = policed.system.wait_status(run_id, "completed", timeout=60)
        assert the_interrupt(done)["answer"]["answeredBy"] == "policy:small-transfers"
        worker_log = policed.system.procs["worker"].output()
        assert "approvrs" in worker_log and "previous rule(s)" in worker_log
    finally:
        rules.write_text(RULES)
    explained = layby_cli(policed, "policy", "explain", "--agent", "demo.transfer", "--tool",
                          "transfer_funds", "--input", '{"to": "Bob", "amount": 2000}')
    assert explained.returncode == 0, explained.stderr
    assert "skip   small-transfers" in explained.stdout
    assert "rule 'large-transfers' decides: ask approvers; 2 approvals needed" in \
        explained.stdout


@pytest.mark.integration
def test_the_readme_example_file_checks_and_explains() -> None:
    example = ROOT / "examples" / "policies" / "reviewers.toml"
    env = {**os.environ, "LAYBY_REVIEWERS_FILE": str(example)}
    env.pop("LAYBY_POLICY_FILE", None)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "layby.ops.cli", "policy", *args],
                              env=env, capture_output=True, text=True, timeout=60, check=False)

    checked = cli("check", str(example))
    assert checked.returncode == 0, checked.stderr
    assert "4 rule(s), all valid" in checked.stdout
    explained = cli("explain", "--agent", "shop.support", "--tool", "refund", "--input",
                    '{"amount": 2000}')
    assert explained.returncode == 0, explained.stderr
    assert "rule 'large-refunds' decides: ask ops; 2 approvals needed; after 30m also " \
           "leads; after 2h also oncall; remind every 1h" in explained.stdout
    declined = cli("explain", "--agent", "shop.support", "--tool", "transfer_funds",
                   "--input", '{"amount": 500}', "--metadata", '{"country": "XX"}')
    assert "rule 'blocked-countries' decides: decline at once" in declined.stdout
