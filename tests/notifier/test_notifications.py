"""Reviewer notifications end to end: a run parks, and the reviewers of its interrupts hear of
it by email (a real SMTP server) and by webhook (a real receiver checking Standard Webhooks
signatures), each exactly once, with retries while a receiver is down, a recorded failure
when it stays down, and reminders before an interrupt expires.

Everything is checked the way a user or an operator would: the mail in the inbox, the
webhook the receiver accepted, the run's notifications in GET /v1/runs/{id}, the run's
events, and the logs."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterator
from datetime import datetime
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import celery
import httpx
import pytest
import redis
from standardwebhooks import Webhook, WebhookVerificationError

from layby.demo.agents import TRIVIA_CHOICES
from layby.ops.embedded import EmbeddedRedis
from layby.reviewers.tokens import TOKEN
from tests.support import sse
from tests.support.harness import as_0_1_0s_predecessors_kept_it, keys_of, wait_until
from tests.support.reviewers import (
    HOOK_SECRET,
    INBOUND_DOMAIN,
    Delivery,
    ReviewedSystem,
    SmtpServer,
    WebhookReceiver,
    link_in,
    own_reviewed,
    wait_gone,
)

ALICE = "alice@example.com"
BOB = "bob@example.com"
MALLORY = "mallory@example.com"
OTHER_SECRET = "whsec_" + base64.b64encode(b"someone-else-secret-32-bytes-xyz").decode()

# Databases of the `reviewer_redis` server for the systems built here (database 0 is the
# session's `reviewed` system); each is flushed before and after use.
RETRY_DB, FAIL_DB, REMIND_DB = 11, 12, 13

# The reminding system: interrupts of demo.expiring expire EXPIRY_S after they are made,
# and reviewers are reminded REMIND_BEFORE_S before that (REMIND_AT_S after the park).
EXPIRY_S, REMIND_BEFORE_S = 30, 20
REMIND_AT_S = EXPIRY_S - REMIND_BEFORE_S


# --- helpers -------------------------------------------------------------------------------

def notes(rs: ReviewedSystem, run_id: str) -> list[dict[str, Any]]:
    """The run's notifications, as GET /v1/runs/{id} shows them."""
    return rs.system.run(run_id).get("notifications", [])


def wait_notes(rs: ReviewedSystem, run_id: str, check: Callable[[list[dict[str, Any]]], bool],
               what: str, timeout: float = 60) -> list[dict[str, Any]]:
    """Poll the run's notifications until `check` holds; returns them."""
    return wait_until(lambda: (found := notes(rs, run_id)) and check(found) and found,
                      timeout, 0.1, what)


def all_in(state: str, count: int, kind: str | None = None
           ) -> Callable[[list[dict[str, Any]]], bool]:
    """A check: exactly `count` notifications (of `kind`), all in `state`."""
    def check(found: list[dict[str, Any]]) -> bool:
        mine = [n for n in found if kind is None or n["kind"] == kind]
        return len(mine) == count and all(n["state"] == state for n in mine)
    return check


def one(found: list[dict[str, Any]], channel: str, kind: str = "request") -> dict[str, Any]:
    (note,) = [n for n in found if n["channel"] == channel and n["kind"] == kind]
    return note


def events_of(rs: ReviewedSystem, run_id: str, kind: str) -> list[dict[str, Any]]:
    """The data of the run's events of type `kind` (GET /v1/runs/{id}/events?follow=false)."""
    return [e["data"]["data"] for e in sse.history(rs.system, run_id) if e["event"] == kind]


def text_of(mail: EmailMessage) -> str:
    """The plain-text part, with the line ends a mail client shows."""
    part = mail.get_body(preferencelist=("plain",))
    assert part is not None, "the mail has no plain-text part"
    return part.get_content().replace("\r\n", "\n")


def html_of(mail: EmailMessage) -> str:
    part = mail.get_body(preferencelist=("html",))
    assert part is not None, "the mail has no HTML part"
    return part.get_content().replace("\r\n", "\n")


def token_of(mail: EmailMessage) -> str:
    """The reviewer token the mail carries in its reply address."""
    found = re.fullmatch(rf"reply\+(.+)@{re.escape(INBOUND_DOMAIN)}", mail["Reply-To"])
    assert found, mail["Reply-To"]
    return found.group(1)


def reminders(mails: list[EmailMessage]) -> list[EmailMessage]:
    return [m for m in mails if m["Subject"].startswith("Reminder:")]


def hooks_of(hooks: WebhookReceiver, run_id: str, kind: str) -> list[Delivery]:
    return [d for d in hooks.for_run(run_id) if d.json["type"] == kind]


def logs(rs: ReviewedSystem) -> str:
    """Everything the system's processes logged."""
    return "\n".join(proc.output() for proc in rs.system.procs.values())


def parked_transfer(rs: ReviewedSystem, text: str = "Send 250 to Bob") -> dict[str, Any]:
    run = rs.start_run("demo.transfer", text)
    return rs.parked(run["id"])


@pytest.fixture
def ops_app(reviewed: ReviewedSystem) -> Iterator[celery.Celery]:
    """An operator's bare Celery app on the reviewed system's broker (no layby code)."""
    app = celery.Celery("ops-console", broker=reviewed.system.redis_url)
    yield app
    app.close()


@pytest.fixture(scope="module")
def reminding(reviewer_redis: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[ReviewedSystem]:
    """A reviewed system that reminds reviewers REMIND_BEFORE_S before an interrupt of
    demo.expiring (which expires after EXPIRY_S) expires."""
    with own_reviewed(reviewer_redis, tmp_path_factory.mktemp("reminding"), REMIND_DB,
                      SmtpServer().start(), WebhookReceiver().start(),
                      LAYBY_DEMO_EXPIRY_S=str(EXPIRY_S),
                      LAYBY_REMIND_BEFORE_S=str(REMIND_BEFORE_S)) as rs:
        yield rs


# --- what a parked run sends ---------------------------------------------------------------

def test_a_parked_transfer_mails_alice_once_with_everything_to_answer_it(
        reviewed: ReviewedSystem) -> None:
    """Alice (default group "approvers", email) gets one mail saying who asks what, with
    the tool's input, approve and decline links and a reply address bound to her."""
    run = parked_transfer(reviewed)
    run_id = run["id"]
    (interrupt,) = reviewed.system.open_interrupts(run)
    (mail,) = reviewed.smtp.wait_mail(ALICE, run_id)
    found = wait_notes(reviewed, run_id, all_in("sent", 2), "both notifications sent")
    wait_gone(lambda: len(reviewed.smtp.mails_to(ALICE, run_id)) > 1, 2)

    assert "demo.transfer asks for your approval: Send 250 to Bob?" in mail["Subject"]
    assert "layby" in mail["From"]
    assert mail["To"] == f"Alice Martin <{ALICE}>"
    assert mail["X-Envelope-To"] == ALICE
    assert mail["Auto-Submitted"] == "auto-generated"
    assert mail.get_content_type() == "multipart/alternative"

    text, html = text_of(mail), html_of(mail)
    for body in (text, html):
        assert "Send 250 to Bob?" in body
        assert "transfer_funds" in body
        assert '"to": "Bob"' in body.replace("&#34;", '"').replace("&quot;", '"')
        assert '"amount": 250' in body.replace("&#34;", '"').replace("&quot;", '"')

    token = token_of(mail)
    assert TOKEN.match(token), token
    assert len(f"reply+{token}") <= 64  # SMTP's limit for the local part of an address
    page = f"{reviewed.system.base_url}/review/{token}"
    assert link_in(mail, "decision=approve") == f"{page}?decision=approve"
    assert link_in(mail, "decision=decline") == f"{page}?decision=decline"
    assert f'href="{page}?decision=approve"' in html
    assert f'href="{page}?decision=decline"' in html
    assert "Answer here:" not in text  # a confirmation offers the two decisions instead

    email_note = one(found, "email")
    assert (email_note["reviewer"], email_note["interruptId"]) == ("alice", interrupt["id"])
    assert email_note["id"].startswith("ntf_")
    assert mail["Message-ID"] == f"<{email_note['id']}@{INBOUND_DOMAIN}>"
    assert mail["X-Layby-Interrupt"] == interrupt["id"]

    # The approve link opens the answer page for this request, with no API key.
    opened = httpx.get(link_in(mail, "decision=approve"), timeout=30)
    assert opened.status_code == 200
    assert "Send 250 to Bob?" in opened.text


def test_a_parked_transfer_posts_one_signed_webhook_to_hookbot(
        reviewed: ReviewedSystem) -> None:
    """hookbot (default group, webhook) gets one POST, signed with its secret, whose
    webhook-id is the notification id and whose body says what to answer and how."""
    run = parked_transfer(reviewed)
    run_id = run["id"]
    (interrupt,) = reviewed.system.open_interrupts(run)
    (delivery,) = reviewed.hooks.wait_for(run_id)
    found = wait_notes(reviewed, run_id, all_in("sent", 2), "both notifications sent")
    wait_gone(lambda: len(reviewed.hooks.for_run(run_id)) > 1, 2)

    assert delivery.verified, delivery.error
    Webhook(HOOK_SECRET).verify(delivery.body, delivery.headers)  # our own check, too
    with pytest.raises(WebhookVerificationError):
        Webhook(OTHER_SECRET).verify(delivery.body, delivery.headers)

    hook_note = one(found, "webhook")
    assert hook_note["reviewer"] == "hookbot"
    assert delivery.headers["webhook-id"] == hook_note["id"]

    body = delivery.json
    assert body["type"] == "interrupt.requested"
    data = body["data"]
    assert data["notificationId"] == hook_note["id"]
    assert data["reviewer"] == "hookbot"
    assert data["run"]["id"] == run_id and data["run"]["agent"] == "demo.transfer"
    assert data["interrupt"]["id"] == interrupt["id"]
    assert data["interrupt"]["message"] == "Send 250 to Bob?"
    assert data["interrupt"]["toolName"] == "transfer_funds"
    assert data["interrupt"]["responseSchema"]["properties"]["approved"]["type"] == "boolean"
    answer = data["answer"]
    base = reviewed.system.base_url
    assert answer["callbackUrl"] == f"{base}/callbacks/answers"
    assert TOKEN.match(answer["token"]), answer["token"]
    assert answer["pageUrl"] == f"{base}/review/{answer['token']}"


def test_bob_outside_the_default_group_hears_nothing(reviewed: ReviewedSystem) -> None:
    """Only the default group is asked when the interrupt names nobody."""
    run_id = parked_transfer(reviewed)["id"]
    reviewed.smtp.wait_mail(ALICE, run_id)
    reviewed.hooks.wait_for(run_id)
    found = wait_notes(reviewed, run_id, all_in("sent", 2), "both notifications sent")
    assert {(n["reviewer"], n["channel"]) for n in found} == {("alice", "email"),
                                                               ("hookbot", "webhook")}
    wait_gone(lambda: bool(reviewed.smtp.mails_to(BOB, run_id)
                           or reviewed.smtp.mails_to(MALLORY, run_id)), 2)


def test_the_run_shows_its_notifications_and_no_secret_shows_anywhere(
        reviewed: ReviewedSystem) -> None:
    """GET /v1/runs/{id} lists each notification (state, channel, reviewer, attempts) but
    never its token; neither the tokens nor the webhook secret are in events or logs."""
    run_id = parked_transfer(reviewed)["id"]
    (mail,) = reviewed.smtp.wait_mail(ALICE, run_id)
    (delivery,) = reviewed.hooks.wait_for(run_id)
    wait_notes(reviewed, run_id, all_in("sent", 2), "both notifications sent")

    run = reviewed.system.run(run_id)
    for note in run["notifications"]:
        assert note["state"] == "sent"
        assert note["kind"] == "request"
        assert note["attempts"] == 1
        assert note["sentAt"] and "lastError" not in note and "nextAttemptAt" not in note
        assert "token" not in note
    assert sorted((n["reviewer"], n["channel"]) for n in run["notifications"]) == \
        [("alice", "email"), ("hookbot", "webhook")]
    # As the run's hash keeps them for as long as it waits: a request sent at the first
    # attempt, what most are, says neither (read back as above); nor is the grant behind
    # a token JSON (its values, space-separated).
    with redis.Redis.from_url(reviewed.system.redis_url, decode_responses=True) as client:
        keys = keys_of(client, reviewed.system.settings.key_prefix)
        held = client.hgetall(keys.run(run_id))
        stored = [json.loads(v) for k, v in held.items() if k.startswith("n:")]
        assert len(stored) == 2 and not [n for n in stored if {"k", "s", "a"} & n.keys()]
        ref = token_of(mail).split("-")[1]
        grant = client.get(keys.shard_of(ref).grant(ref))
        assert grant.split(" ", 4)[:3] == [run_id, run["notifications"][0]["interruptId"],
                                           str(run["version"])], grant

    secrets = [token_of(mail), delivery.json["data"]["answer"]["token"], HOOK_SECRET]
    assert secrets[0] != secrets[1]  # each reviewer has a token of their own
    shown = json.dumps(run) + json.dumps(sse.history(reviewed.system, run_id))
    logged = logs(reviewed)
    assert run_id in logged  # the logs do talk about this run…
    for secret in secrets:
        assert secret not in shown
        assert secret not in logged  # …but never hold a token or the secret
    assert secrets[0] not in reviewed.system.procs["worker"].output()


def test_a_question_mail_links_to_the_answer_page_and_lists_the_choices(
        reviewed: ReviewedSystem) -> None:
    """A question is no approval: one link to the answer page, and the reply instructions
    list the choices."""
    run_id = reviewed.start_run("demo.trivia", "quiz me")["id"]
    reviewed.parked(run_id)
    (mail,) = reviewed.smtp.wait_mail(ALICE, run_id)

    assert "demo.trivia asks you: Which 1975 film" in mail["Subject"]
    text, html = text_of(mail), html_of(mail)
    page = f"{reviewed.system.base_url}/review/{token_of(mail)}"
    assert f"Answer here: {page}\n" in text
    assert f'href="{page}"' in html
    assert "decision=" not in text and "decision=" not in html
    assert "approve" not in text.lower()
    assert "Reply with one of these choices" in text
    for number, choice in enumerate(TRIVIA_CHOICES, 1):
        assert f"{number}. {choice}" in text
        assert choice in html


@pytest.mark.parametrize(("who", "mailed", "hooked"), [
    ("bob", {"bob"}, False),
    ("everyone", {"alice", "bob"}, True),
    ("mallory,bob", {"mallory", "bob"}, False),
])
def test_an_interrupt_naming_reviewers_notifies_only_them(
        reviewed: ReviewedSystem, who: str, mailed: set[str], hooked: bool) -> None:
    """`ctx.interrupt(reviewers=[...])` names people or groups: they are asked, not the
    default group."""
    run_id = reviewed.start_run("test.named", who)["id"]
    reviewed.parked(run_id)
    count = len(mailed) + hooked
    found = wait_notes(reviewed, run_id, all_in("sent", count), f"{count} notifications sent")
    assert {(n["reviewer"], n["channel"]) for n in found} == \
        {(r, "email") for r in mailed} | ({("hookbot", "webhook")} if hooked else set())
    for reviewer in mailed:
        (mail,) = reviewed.smtp.wait_mail(f"{reviewer}@example.com", run_id)
        assert "Sign off on the quarterly audit?" in mail["Subject"]
    everybody = {"alice", "bob", "mallory"}

    def strays() -> bool:
        return any(reviewed.smtp.mails_to(f"{r}@example.com", run_id)
                   for r in everybody - mailed) \
            or len(reviewed.hooks.for_run(run_id)) != int(hooked)
    wait_gone(strays, 2)


def test_each_open_interrupt_is_announced_once_per_reviewer_and_channel(
        reviewed: ReviewedSystem) -> None:
    """demo.parallel parks on a question and an approval at once: 2 mails to alice and 2
    webhooks to hookbot, one per interrupt, and no more however many sweeps pass."""
    run = reviewed.start_run("demo.parallel", "pay Carol")
    run = reviewed.parked(run["id"])
    run_id = run["id"]
    open_ids = {i["id"] for i in reviewed.system.open_interrupts(run)}
    assert len(open_ids) == 2

    mails = reviewed.smtp.wait_mail(ALICE, run_id, count=2)
    deliveries = reviewed.hooks.wait_for(run_id, count=2)
    found = wait_notes(reviewed, run_id, all_in("sent", 4), "4 notifications sent")
    assert sorted((n["interruptId"], n["reviewer"], n["channel"]) for n in found) == sorted(
        (i, r, c) for i in open_ids for r, c in (("alice", "email"), ("hookbot", "webhook")))
    assert {m["X-Layby-Interrupt"] for m in mails} == open_ids
    assert {d.json["data"]["interrupt"]["id"] for d in deliveries} == open_ids
    subjects = sorted(m["Subject"] for m in mails)
    assert any("asks for your approval: Send 40 to Carol?" in s for s in subjects), subjects
    assert any("asks you: Which account should we pay from?" in s for s in subjects), subjects

    # The sweeper runs every 0.5 s and re-queues what looks lost after 3 s: none of it is.
    wait_gone(lambda: len(reviewed.smtp.mails_to(ALICE, run_id)) > 2
              or len(reviewed.hooks.for_run(run_id)) > 2, 5)
    assert all(n["attempts"] == 1 for n in notes(reviewed, run_id))


def test_planning_and_delivering_again_sends_nothing_twice(
        reviewed: ReviewedSystem, ops_app: celery.Celery) -> None:
    """As after a crash or a redelivered message: the planning task and a delivery task for
    a notification already sent run again, and nobody hears twice."""
    run = parked_transfer(reviewed, "Send 90 to Frank")
    run_id = run["id"]
    reviewed.smtp.wait_mail(ALICE, run_id)
    reviewed.hooks.wait_for(run_id)
    before = wait_notes(reviewed, run_id, all_in("sent", 2), "both notifications sent")

    worker = reviewed.system.procs["worker"]
    sent = [ops_app.send_task("layby.notify.interrupts", args=[run_id, run["version"]],
                              queue="layby.notify")]
    sent += [ops_app.send_task("layby.notify.deliver", args=[run_id, n["id"]],
                               queue="layby.notify") for n in before]
    for task_id in [task.id for task in sent]:
        wait_until(lambda: f"[{task_id}] succeeded" in worker.output(), 60,  # noqa: B023
                   what=f"the worker to run {task_id}")
    wait_gone(lambda: len(reviewed.smtp.mails_to(ALICE, run_id)) > 1
              or len(reviewed.hooks.for_run(run_id)) > 1, 4)

    after = notes(reviewed, run_id)
    assert [(n["id"], n["state"], n["attempts"], n["sentAt"]) for n in after] == \
        [(n["id"], "sent", 1, n["sentAt"]) for n in before]


# --- receivers that fail ---------------------------------------------------------------------

@pytest.mark.integration
def test_a_receiver_down_for_a_while_gets_its_notification_once_it_is_back(
        reviewer_redis: EmbeddedRedis, tmp_path: Path) -> None:
    """The mail server is down and the webhook receiver answers 503 three times: the run
    shows the notifications retrying (why, and when next); once the receivers are back, each
    arrives exactly once."""
    smtp = SmtpServer()  # not started yet: the mail server is down
    hooks = WebhookReceiver(fail_next=3).start()
    with own_reviewed(reviewer_redis, tmp_path, RETRY_DB, smtp, hooks,
                      LAYBY_NOTIFY_ATTEMPTS="30") as rs:
        run_id = parked_transfer(rs, "Send 75 to Dana")["id"]

        found = wait_notes(rs, run_id, lambda f: one(f, "email")["state"] == "retrying",
                           "the mail to be retrying")
        retrying = one(found, "email")
        assert "refused" in retrying["lastError"].lower(), retrying
        assert retrying["nextAttemptAt"]
        wait_until(lambda: any(e["channel"] == "email" and e["id"] == retrying["id"]
                               for e in events_of(rs, run_id, "notification.retrying")),
                   30, what="a notification.retrying event for the mail")
        assert all("refused" in e["error"].lower()
                   for e in events_of(rs, run_id, "notification.retrying")
                   if e["channel"] == "email")
        assert not smtp.messages

        smtp.start()
        (mail,) = smtp.wait_mail(ALICE, run_id, timeout=60)
        (delivery,) = hooks.wait_for(run_id, timeout=60)
        found = wait_notes(rs, run_id, all_in("sent", 2), "both notifications sent")
        wait_gone(lambda: len(smtp.mails_to(ALICE, run_id)) > 1
                  or len(hooks.for_run(run_id)) > 1, 4)

        email_note, hook_note = one(found, "email"), one(found, "webhook")
        assert email_note["attempts"] > 1
        assert "lastError" not in email_note and "nextAttemptAt" not in email_note
        assert mail["Message-ID"] == f"<{email_note['id']}@{INBOUND_DOMAIN}>"
        assert hook_note["attempts"] == 4  # three 503s, then the one that got through
        assert delivery.verified and delivery.headers["webhook-id"] == hook_note["id"]
        assert any("503" in e["error"] for e in events_of(rs, run_id, "notification.retrying")
                   if e["channel"] == "webhook")
        assert len(events_of(rs, run_id, "notification.sent")) == 2
        assert rs.system.run(run_id)["status"] == "interrupted"


@pytest.mark.integration
def test_a_receiver_down_for_good_fails_the_notification_not_the_run(
        reviewer_redis: EmbeddedRedis, tmp_path: Path) -> None:
    """With 2 attempts allowed and both receivers down throughout, the notifications end
    failed saying why, the run records it in its events, stays parked, and can still be
    answered through /v1."""
    smtp, hooks = SmtpServer(), WebhookReceiver()  # neither is ever started
    with own_reviewed(reviewer_redis, tmp_path, FAIL_DB, smtp, hooks,
                      LAYBY_NOTIFY_ATTEMPTS="2") as rs:
        run = parked_transfer(rs, "Send 30 to Erin")
        run_id = run["id"]
        found = wait_notes(rs, run_id, all_in("failed", 2), "both notifications failed")

        for note in found:
            assert note["attempts"] == 2
            assert "gave up after 2 attempts" in note["lastError"], note
            assert "refused" in note["lastError"].lower(), note
            assert "nextAttemptAt" not in note
        # The receiver's address, not its path: a webhook path may itself be a secret.
        webhook_error = one(found, "webhook")["lastError"]
        assert f"http://127.0.0.1:{hooks.port}" in webhook_error
        assert "/hooks/layby" not in webhook_error
        failed = events_of(rs, run_id, "notification.failed")
        assert sorted(e["channel"] for e in failed) == ["email", "webhook"]
        assert all("gave up after 2 attempts" in e["error"] for e in failed)

        run = rs.system.run(run_id)
        assert run["status"] == "interrupted"
        (interrupt,) = rs.system.open_interrupts(run)
        reply = rs.system.answer(run_id, interrupt["id"], payload={"approved": True})
        assert reply.status_code == 200, reply.text
        done = rs.system.wait_status(run_id, "completed", timeout=60)
        assert done["result"] == "Sent 30 to Erin."
        assert [n["state"] for n in done["notifications"]] == ["failed", "failed"]


# --- reminders -----------------------------------------------------------------------------

def test_a_reminder_arrives_before_the_interrupt_expires(reminding: ReviewedSystem) -> None:
    """With LAYBY_REMIND_BEFORE_S set, each reviewer gets the request and then one reminder
    (same token, "Reminder:" in the subject), sent before the interrupt expires."""
    run = reminding.start_run("demo.expiring", "ship it")
    run = reminding.parked(run["id"])
    run_id = run["id"]
    (interrupt,) = reminding.system.open_interrupts(run)
    (request,) = reminding.smtp.wait_mail(ALICE, run_id)
    assert not request["Subject"].startswith("Reminder:")
    planned = wait_notes(reminding, run_id, lambda f: len(f) == 4, "4 planned notifications")
    assert all(n["nextAttemptAt"] for n in planned if n["kind"] == "reminder")

    mails = reminding.smtp.wait_mail(ALICE, run_id, count=2, timeout=REMIND_AT_S + 60)
    (reminder,) = reminders(mails)
    assert reminder["Subject"].startswith(
        "Reminder: [layby] demo.expiring asks for your approval: Deploy v2.0 to production?")
    assert "still waiting for your answer" in text_of(reminder)
    assert token_of(reminder) == token_of(request)
    assert reminder["Message-ID"] != request["Message-ID"]
    (hook,) = wait_until(lambda: hooks_of(reminding.hooks, run_id, "interrupt.reminder"), 60,
                         what="the reminder webhook")
    assert hook.verified

    found = wait_notes(reminding, run_id, all_in("sent", 2, "reminder"), "reminders sent")
    expires = datetime.fromisoformat(interrupt["expiresAt"].replace("Z", "+00:00"))
    for note in found:
        if note["kind"] == "reminder":
            assert datetime.fromisoformat(note["sentAt"].replace("Z", "+00:00")) < expires
    wait_gone(lambda: len(reminders(reminding.smtp.mails_to(ALICE, run_id))) > 1, 2)


def test_no_reminder_for_an_interrupt_answered_in_time(reminding: ReviewedSystem) -> None:
    """Answered through /v1 before its reminder time: the reminders are skipped and never
    arrive."""
    run = reminding.parked(reminding.start_run("demo.expiring", "ship it")["id"])
    run_id = run["id"]
    reminding.smtp.wait_mail(ALICE, run_id)
    (interrupt,) = reminding.system.open_interrupts(run)
    reply = reminding.system.answer(run_id, interrupt["id"], payload={"approved": True})
    assert reply.status_code == 200, reply.text
    assert reminding.system.wait_status(run_id, "completed")["result"] == "Deployed v2.0."

    # Past the reminder time, the sweeper takes the reminders up and skips them.
    wait_notes(reminding, run_id, all_in("skipped", 2, "reminder"), "reminders skipped",
               timeout=REMIND_AT_S + 60)
    wait_gone(lambda: bool(reminders(reminding.smtp.mails_to(ALICE, run_id))
                           or hooks_of(reminding.hooks, run_id, "interrupt.reminder")), 2)
    assert len(reminding.smtp.mails_to(ALICE, run_id)) == 1


def test_a_run_cancelled_while_parked_sends_no_reminder(reminding: ReviewedSystem) -> None:
    """Cancelled while it waits: the pending reminders are skipped, never sent."""
    run_id = reminding.parked(reminding.start_run("demo.expiring", "ship it")["id"])["id"]
    reminding.smtp.wait_mail(ALICE, run_id)
    pending = wait_notes(reminding, run_id, lambda f: len(f) == 4, "4 planned notifications")
    assert [n["state"] for n in pending if n["kind"] == "reminder"] == ["pending", "pending"]

    with reminding.system.api() as api:
        reply = api.post(f"/v1/runs/{run_id}/cancel", json={"reason": "not today"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["status"] == "cancelled"

    wait_notes(reminding, run_id, all_in("skipped", 2, "reminder"), "reminders skipped",
               timeout=REMIND_AT_S + 60)
    wait_gone(lambda: bool(reminders(reminding.smtp.mails_to(ALICE, run_id))
                           or hooks_of(reminding.hooks, run_id, "interrupt.reminder")), 2)
    assert len(reminding.smtp.mails_to(ALICE, run_id)) == 1


def test_a_run_parked_by_0_1_0s_predecessors_keeps_its_notifications_once_migrated(
        reminding: ReviewedSystem) -> None:
    """What an upgrade from 0.1.0 may find: a parked run whose interrupt and notifications
    are keys of their own (0.1.0's predecessors' layout). Every process stopped, `layby
    migrate` rewrites it; started again, they are shown as before, and cancelling the run
    skips its pending reminders, which are never sent."""
    system = reminding.system
    run_id = reminding.parked(reminding.start_run("demo.expiring", "ship it")["id"])["id"]
    reminding.smtp.wait_mail(ALICE, run_id)
    # The requests recorded as sent, not only planned: a mail received while its delivery
    # is still `sending` would be `sent` after the migration, and differ from `before`.
    before = wait_notes(reminding, run_id, lambda f: len(f) == 4 and all(
        n["state"] == "sent" for n in f if n["kind"] == "request"),
        "4 planned notifications, the requests sent")
    system.stop()
    with redis.Redis.from_url(system.redis_url, decode_responses=True) as client:
        moved = as_0_1_0s_predecessors_kept_it(client, system.settings.key_prefix, run_id)
    assert len([k for k in moved if k.startswith("n:")]) == 4, moved
    migrated = system.layby("migrate")
    assert migrated.returncode == 0, migrated.stderr
    # The gateway first: nothing sends the reminders (due REMIND_AT_S into the park, which
    # a restart may pass) before the run is cancelled.
    system.start_again("gateway")
    assert notes(reminding, run_id) == before

    with system.api() as api:
        reply = api.post(f"/v1/runs/{run_id}/cancel", json={"reason": "not today"})
    assert reply.status_code == 200, reply.text
    system.start_again()
    wait_notes(reminding, run_id, all_in("skipped", 2, "reminder"), "reminders skipped",
               timeout=REMIND_AT_S + 60)
    wait_gone(lambda: bool(reminders(reminding.smtp.mails_to(ALICE, run_id))
                           or hooks_of(reminding.hooks, run_id, "interrupt.reminder")), 2)
    assert len(reminding.smtp.mails_to(ALICE, run_id)) == 1


def test_a_run_parked_while_the_directory_is_broken_is_announced_once_it_is_fixed(
        reviewed: ReviewedSystem) -> None:
    """The operator saves a broken reviewers.toml just as a run parks: nobody can be
    notified yet, but the announcement is not dropped. Once the file is fixed, Alice gets
    her mail (once), and the run is answered as usual."""
    directory = Path(reviewed.system.env_overrides["LAYBY_REVIEWERS_FILE"])
    good = directory.read_text()
    complaints = logs(reviewed).count("is invalid")
    try:
        directory.write_text(good + "\n[reviewers.broken\n")
        run = parked_transfer(reviewed, "Send 20 to Fay")
        wait_until(lambda: logs(reviewed).count("is invalid") > complaints, 30,
                   what="the worker to report the broken directory")
        assert reviewed.smtp.mails_to(ALICE, run["id"]) == []
        assert notes(reviewed, run["id"]) == []
    finally:
        directory.write_text(good)
    reviewed.smtp.wait_mail(ALICE, run["id"], timeout=60)
    wait_gone(lambda: len(reviewed.smtp.mails_to(ALICE, run["id"])) > 1, 4)
    assert {(n["reviewer"], n["state"]) for n in notes(reviewed, run["id"])} \
        == {("alice", "sent"), ("hookbot", "sent")}
