"""Reviewers on Slack, end to end over real parts: a layby system whose Slack Web API is a
local server that records the calls and answers as Slack does, and interactions signed
with the app's signing secret as Slack signs them.

A request is posted with its buttons (a DM to a reviewer, a post to a group's channel); a
click completes the run exactly once; forged, stale and unknown clicks are refused; a
second click, or one after an email answer, records nothing and updates the message; a
question is answered in a modal built from its schema; a quorum is made across Slack and
the API, its progress in the message's thread, and across Slack and the reviewers' inbox
(a reviewer's approval counting once whichever channels they use)."""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from layby.broker_config import make_celery
from layby.control.runtime import store_config
from layby.ops.embedded import EmbeddedRedis
from layby.parking import Store, iso
from layby.wire import Answer, InterruptState
from tests.answering.test_reviewer_answers import assert_answered, notification, reply, transfers_of
from tests.support.harness import wait_until
from tests.support.reviewers import ReviewedSystem, wait_gone
from tests.support.slack import (
    ALICE,
    BOB,
    BOT_TOKEN,
    MALLORY,
    OPS_CHANNEL,
    SIGNING_SECRET,
    STRANGER,
    Call,
    SlackApi,
    click,
    interaction,
    posts,
    signed,
    slack_reviewed,
    submission,
    wait_post,
)
from tests.support.sse import history

pytestmark = pytest.mark.integration

DB = 11  # the reviewer tests' Valkey server, a database of this module's own
ALICE_DM = "D" + ALICE[1:]
# The inbox's reviewers named by a sign-in proxy's header (tests/inbox/test_inbox.py signs in by
# the mailed link): the inbox as a reviewer sees it, over plain HTTP.
TRUSTED_HEADER = "X-Forwarded-Email"
POLICY = """\
[[rules]]
name = "large-transfers"
tool = "transfer_funds"
when = "input.amount >= 1000"
reviewers = ["approvers"]
required_approvals = 2

[[rules]]
name = "ops-transfers"
tool = "transfer_funds"
when = "input.to == 'Ops'"
reviewers = ["ops"]

[[rules]]
name = "reminded"
tool = "transfer_funds"
when = "input.amount >= 400 && input.amount < 500"
reviewers = ["alice"]
remind_every = "2s"

[[rules]]
name = "escalating"
tool = "transfer_funds"
when = "input.amount >= 500 && input.amount < 1000"
reviewers = ["alice"]
escalate = [{ after = "3s", to = ["bob"] }]

[[rules]]
name = "default"
"""


@pytest.fixture(scope="module")
def api() -> Iterator[SlackApi]:
    server = SlackApi().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def slacked(reviewer_redis: EmbeddedRedis, api: SlackApi,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReviewedSystem]:
    tmp = tmp_path_factory.mktemp("slack")
    rules = tmp / "policy.toml"
    rules.write_text(POLICY)
    with slack_reviewed(reviewer_redis, tmp, DB, api, LAYBY_POLICY_FILE=str(rules),
                        LAYBY_INBOX_TRUSTED_HEADER=TRUSTED_HEADER) as system:
        yield system


# -- helpers -------------------------------------------------------------------------------


def parked(slacked: ReviewedSystem, agent: str, text: str) -> tuple[str, str]:
    run_id = slacked.start_run(agent, text)["id"]
    run = slacked.system.wait_status(run_id, "interrupted", timeout=60)
    (intr,) = slacked.system.open_interrupts(run)
    return run_id, intr["id"]


def slack_notes(slacked: ReviewedSystem, run_id: str) -> list[dict[str, Any]]:
    return [n for n in slacked.system.run(run_id)["notifications"] if n["channel"] == "slack"]


def message_of(slacked: ReviewedSystem, run_id: str, reviewer: str = "alice") -> str:
    """Where the reviewer's (or group's) message is, as recorded with its notification."""
    return str(wait_until(lambda: next((n.get("message") for n in slack_notes(slacked, run_id)
                                        if n["reviewer"] == reviewer and n.get("message")),
                                       None), 60, what=f"the Slack message to {reviewer}"))


def updates(api: SlackApi, message: str) -> list[Call]:
    channel, _, ts = message.partition("/")
    return api.of("chat.update", channel=channel, ts=ts)


def wait_update(api: SlackApi, message: str, count: int = 1) -> Call:
    return wait_until(lambda: len(found := updates(api, message)) >= count and found[-1],
                      60, what=f"{count} update(s) of the Slack message {message}")


def ephemerals(api: SlackApi, user: str) -> list[str]:
    return [str(c.params.get("text")) for c in api.of("chat.postEphemeral", user=user)]


def wait_ephemeral(api: SlackApi, user: str, before: int) -> str:
    return str(wait_until(lambda: len(found := ephemerals(api, user)) > before and found[-1],
                          30, what=f"an ephemeral message to {user}"))


def answered_count(slacked: ReviewedSystem, run_id: str) -> int:
    return sum(1 for e in history(slacked.system, run_id) if e["event"] == "interrupt.answered")


def actions(call: Call) -> list[str]:
    return [e["action_id"] for b in call.params.get("blocks") or [] if b["type"] == "actions"
            for e in b["elements"]]


# -- the message ---------------------------------------------------------------------------


def test_a_request_is_a_direct_message_with_its_buttons(slacked: ReviewedSystem,
                                                        api: SlackApi) -> None:
    run_id, interrupt_id = parked(slacked, "demo.transfer", "Send 250 to Bob")
    post = wait_post(api, run_id, ALICE_DM)
    assert api.of("conversations.open", users=ALICE)
    assert all(c.token == "xoxb-test-bot-token-never-logged" for c in api.calls)
    text = json.dumps(post.params["blocks"])
    assert "demo.transfer" in text and "Send 250 to Bob?" in text
    assert "transfer_funds" in text and '\\"amount\\": 250' in text
    assert actions(post) == ["layby_approve", "layby_decline"]
    values = {e["value"] for b in post.params["blocks"] if b["type"] == "actions"
              for e in b["elements"]}
    assert values == {f"{run_id} {interrupt_id}"}  # ids only: no token in a Slack message
    assert post.params["text"].startswith("demo.transfer asks for your approval")
    # Recorded with its notification, sent, with where the message is.
    (note,) = [n for n in slack_notes(slacked, run_id) if n["reviewer"] == "alice"]
    wait_until(lambda: message_of(slacked, run_id).startswith(f"{ALICE_DM}/"), 30)
    assert note["kind"] == "request"
    # Email goes out as before; a reviewer without a Slack id gets no Slack message.
    notification(slacked, run_id, interrupt_id)
    assert not [n for n in slack_notes(slacked, run_id) if n["reviewer"] == "hookbot"]


def test_a_click_completes_the_run_exactly_once(slacked: ReviewedSystem,
                                                api: SlackApi) -> None:
    run_id, interrupt_id = parked(slacked, "demo.transfer", "Send 260 to Bob")
    message = message_of(slacked, run_id)
    started = time.monotonic()
    got = interaction(slacked.system.base_url, click(ALICE, "layby_approve", run_id,
                                                      interrupt_id))
    assert got.status_code == 200, got.text
    assert time.monotonic() - started < 3  # Slack's limit
    done = slacked.system.wait_status(run_id, "completed", timeout=60)
    assert done["result"] == "Sent 260 to Bob."
    answer = assert_answered(slacked, run_id, interrupt_id, by="reviewer:alice",
                             channel="slack")
    assert answer["payload"]["approved"] is True
    assert len(transfers_of(slacked, run_id)) == 1
    # The message now says who answered, how and when, and has no buttons.
    update = wait_update(api, message)
    assert "Approved* by <@U0ALICE001> via slack" in json.dumps(update.params["blocks"])
    assert actions(update) == []

    # The same click again (a double click): nothing recorded, the message updated again.
    before = len(ephemerals(api, ALICE))
    again = interaction(slacked.system.base_url, click(ALICE, "layby_approve", run_id,
                                                        interrupt_id))
    assert again.status_code == 200, again.text
    assert "records nothing" in wait_ephemeral(api, ALICE, before)
    wait_update(api, message, 2)
    assert answered_count(slacked, run_id) == 1
    assert len(transfers_of(slacked, run_id)) == 1
    assert len([e for e in history(slacked.system, run_id)
                if e["event"] == "run.resuming"]) == 1


def test_a_decline_click_declines(slacked: ReviewedSystem, api: SlackApi) -> None:
    run_id, interrupt_id = parked(slacked, "demo.transfer", "Send 270 to Bob")
    message_of(slacked, run_id)
    got = interaction(slacked.system.base_url, click(ALICE, "layby_decline", run_id,
                                                      interrupt_id))
    assert got.status_code == 200, got.text
    done = slacked.system.wait_status(run_id, "completed", timeout=60)
    assert transfers_of(slacked, run_id) == []
    assert done["interrupts"][0]["answer"]["channel"] == "slack"


# -- refusals ------------------------------------------------------------------------------


def test_forged_stale_and_unknown_clicks_are_refused(slacked: ReviewedSystem,
                                                     api: SlackApi) -> None:
    run_id, interrupt_id = parked(slacked, "demo.transfer", "Send 280 to Bob")
    base = slacked.system.base_url
    payload = click(ALICE, "layby_approve", run_id, interrupt_id)

    forged = interaction(base, payload, secret="not-the-signing-secret")
    assert forged.status_code == 401 and "does not verify" in forged.text
    stale = interaction(base, payload, at=time.time() - 6 * 60)
    assert stale.status_code == 401 and "more than 300 s" in stale.text
    body = "payload=" + json.dumps(payload)
    unsigned = httpx.post(f"{base}/slack/interactions", content=body,
                          headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert unsigned.status_code == 401
    # A signature over another body: a payload changed on the way.
    changed = interaction(base, payload, headers=signed("payload={}"))
    assert changed.status_code == 401

    # A Slack user who is no reviewer, and a reviewer not asked: told, nothing recorded.
    before = len(ephemerals(api, STRANGER))
    stranger = interaction(base, click(STRANGER, "layby_approve", run_id, interrupt_id))
    assert stranger.status_code == 200
    assert "not a reviewer" in wait_ephemeral(api, STRANGER, before)
    before = len(ephemerals(api, MALLORY))
    mallory = interaction(base, click(MALLORY, "layby_approve", run_id, interrupt_id))
    assert mallory.status_code == 200
    assert "not among the reviewers" in wait_ephemeral(api, MALLORY, before)

    run = slacked.system.run(run_id)
    assert run["status"] == "interrupted" and run["interrupts"][0].get("answer") is None
    assert answered_count(slacked, run_id) == 0
    # Still answerable, by the reviewer asked.
    assert interaction(base, click(ALICE, "layby_approve", run_id,
                                   interrupt_id)).status_code == 200
    slacked.system.wait_status(run_id, "completed", timeout=60)


def test_a_click_after_an_email_answer_records_nothing_and_updates_the_message(
        slacked: ReviewedSystem, api: SlackApi) -> None:
    run_id, interrupt_id = parked(slacked, "demo.transfer", "Send 290 to Bob")
    message = message_of(slacked, run_id)
    mail = notification(slacked, run_id, interrupt_id)
    assert reply(slacked, mail, "approve").startswith("250")
    slacked.system.wait_status(run_id, "completed", timeout=60)
    # The answer by email updates the Slack message too.
    update = wait_update(api, message)
    assert "via email" in json.dumps(update.params["blocks"]) and actions(update) == []

    before = len(ephemerals(api, ALICE))
    late = interaction(slacked.system.base_url, click(ALICE, "layby_approve", run_id,
                                                       interrupt_id))
    assert late.status_code == 200
    said = wait_ephemeral(api, ALICE, before)
    assert "by reviewer:alice via email" in said and "records nothing" in said
    wait_update(api, message, 2)
    assert_answered(slacked, run_id, interrupt_id, by="reviewer:alice", channel="email")
    assert len(transfers_of(slacked, run_id)) == 1


# -- the modal -----------------------------------------------------------------------------


def test_a_question_is_answered_in_a_modal_built_from_its_schema(slacked: ReviewedSystem,
                                                                 api: SlackApi) -> None:
    run_id, interrupt_id = parked(slacked, "demo.trivia", "go")
    post = wait_post(api, run_id, ALICE_DM)
    assert actions(post) == ["layby_answer"]
    message_of(slacked, run_id)

    pressed = click(ALICE, "layby_answer", run_id, interrupt_id)
    assert interaction(slacked.system.base_url, pressed).status_code == 200
    opened = wait_until(lambda: api.of("views.open", trigger_id=pressed["trigger_id"]), 10,
                        what="the modal opened")[0]
    view = opened.params["view"]
    (field,) = [b for b in view["blocks"] if b["type"] == "input"]
    assert (field["block_id"], field["element"]["type"]) == ("payload", "radio_buttons")
    assert "Jaws" in [o["value"] for o in field["element"]["options"]]

    # Sent without choosing: the modal shows the field's error, nothing is recorded.
    empty = interaction(slacked.system.base_url, submission(ALICE, view, {}))
    assert empty.status_code == 200
    assert empty.json()["response_action"] == "errors"
    assert "required" in empty.json()["errors"]["payload"]
    assert slacked.system.run(run_id)["status"] == "interrupted"

    chosen = {"payload": {"type": "radio_buttons", "selected_option": {"value": "Jaws"}}}
    sent = interaction(slacked.system.base_url, submission(ALICE, view, chosen))
    assert sent.json() == {"response_action": "clear"}
    done = slacked.system.wait_status(run_id, "completed", timeout=60)
    assert done["result"] == "Right! It was Jaws (1975)."
    assert_answered(slacked, run_id, interrupt_id, by="reviewer:alice", channel="slack")

    # The same modal sent again (Slack retries): refused in the modal, nothing recorded.
    again = interaction(slacked.system.base_url, submission(ALICE, view, chosen))
    assert again.json()["response_action"] == "errors"
    assert answered_count(slacked, run_id) == 1


# -- groups and quorum ---------------------------------------------------------------------


def test_a_group_channel_gets_the_request_and_a_member_answers_there(
        slacked: ReviewedSystem, api: SlackApi) -> None:
    run_id, interrupt_id = parked(slacked, "demo.transfer", "Send 300 to Ops")
    wait_post(api, run_id, OPS_CHANNEL)
    message = message_of(slacked, run_id, reviewer="ops")
    assert message.startswith(f"{OPS_CHANNEL}/")
    wait_gone(lambda: any(c.params["channel"] != OPS_CHANNEL for c in posts(api, run_id)), 1)
    got = interaction(slacked.system.base_url, click(BOB, "layby_approve", run_id,
                                                      interrupt_id, channel=OPS_CHANNEL))
    assert got.status_code == 200
    slacked.system.wait_status(run_id, "completed", timeout=60)
    assert_answered(slacked, run_id, interrupt_id, by="reviewer:bob", channel="slack")
    assert "by <@U0BOB00001> via slack" in json.dumps(wait_update(api, message).params)


def test_a_quorum_across_slack_and_the_api_shows_its_progress_in_the_thread(
        slacked: ReviewedSystem, api: SlackApi) -> None:
    run_id, interrupt_id = parked(slacked, "demo.transfer", "Send 2000 to Bob")
    message = message_of(slacked, run_id)
    channel, _, ts = message.partition("/")
    assert interaction(slacked.system.base_url, click(ALICE, "layby_approve", run_id,
                                                       interrupt_id)).status_code == 200
    waiting = wait_until(lambda: (r := slacked.system.run(run_id))["interrupts"][0]
                         ["approvals"] and r, 30)
    assert waiting["status"] == "interrupted"
    progress = wait_until(lambda: api.of("chat.postMessage", channel=channel, thread_ts=ts),
                          30, what="the progress in the thread")
    assert "1 of 2 approvals: <@U0ALICE001>" in progress[0].params["text"]

    # Alice again: her approval counts once, and she is told so.
    before = len(ephemerals(api, ALICE))
    assert interaction(slacked.system.base_url, click(ALICE, "layby_approve", run_id,
                                                       interrupt_id)).status_code == 200
    assert "already approved" in wait_ephemeral(api, ALICE, before)
    assert len(slacked.system.run(run_id)["interrupts"][0]["approvals"]) == 1

    # The run's owner approves through the API: the second approval, the run resumes.
    assert slacked.system.answer(run_id, interrupt_id, payload={"approved": True}
                                 ).status_code == 200
    done = slacked.system.wait_status(run_id, "completed", timeout=60)
    approvals = done["interrupts"][0]["approvals"]
    assert (approvals[0]["answeredBy"], approvals[0]["channel"]) == ("reviewer:alice",
                                                                     "slack")
    assert approvals[1]["channel"] == "api"
    assert len(transfers_of(slacked, run_id)) == 1
    assert actions(wait_update(api, message, 2)) == []


def inbox_of(slacked: ReviewedSystem, reviewer: str) -> tuple[str, str]:
    """The reviewer's inbox page, and the CSRF token its forms carry."""
    page = httpx.get(f"{slacked.system.base_url}/inbox", headers={TRUSTED_HEADER: reviewer},
                     timeout=30)
    assert page.status_code == 200, page.text
    token = re.search(r'name="_csrf" value="([^"]+)"', page.text)
    assert token is not None, page.text
    return page.text, token.group(1)


def in_inbox(page: str, interrupt_id: str) -> str:
    """The words of one request's entry in an inbox page ("" when it is not listed)."""
    found = re.search(rf'<article class="request" id="r-{interrupt_id}".*?</article>', page,
                      re.DOTALL)
    return " ".join(re.sub(r"<[^>]+>", " ", found.group(0)).split()) if found else ""


def inbox_answer(slacked: ReviewedSystem, reviewer: str, run_id: str, interrupt_id: str,
                 decision: str = "approve") -> httpx.Response:
    """The reviewer presses Approve (or Decline) on the request in their inbox."""
    _, token = inbox_of(slacked, reviewer)
    # Followed to the inbox it redirects to, its notice with it (post/redirect/get).
    return httpx.post(f"{slacked.system.base_url}/inbox/answer",
                      headers={TRUSTED_HEADER: reviewer}, timeout=30, follow_redirects=True,
                      data={"_ref": f"{run_id}/{interrupt_id}", "_csrf": token,
                            "decision": decision})


def test_a_quorum_across_slack_and_the_inbox(slacked: ReviewedSystem, api: SlackApi) -> None:
    """Two different reviewers must approve (test.quorum, asked of group everyone): Alice
    clicks Approve in Slack, Bob approves in his inbox. Between the two the run waits and
    both inboxes say 1 of 2; Alice approving again in her inbox records nothing; Bob's
    approval resumes the run once, and the Slack messages then say it was approved via
    the inbox."""
    run_id, interrupt_id = parked(slacked, "test.quorum", "rocket")
    alices = message_of(slacked, run_id)
    bobs = message_of(slacked, run_id, reviewer="bob")
    base = slacked.system.base_url

    assert interaction(base, click(ALICE, "layby_approve", run_id,
                                   interrupt_id)).status_code == 200
    wait_update(api, alices)  # the count, in the message (and in its thread)
    run = slacked.system.run(run_id)
    assert run["status"] == "interrupted"
    (approval,) = run["interrupts"][0]["approvals"]
    assert (approval["answeredBy"], approval["channel"]) == ("reviewer:alice", "slack")

    # Both inboxes list it with the count; Alice's says she approved, and has no form.
    page, _ = inbox_of(slacked, "alice@example.com")
    alice_sees = in_inbox(page, interrupt_id)
    assert "Approvals 1 of 2 by reviewer:alice via slack" in alice_sees, alice_sees
    assert "You approved this request. It waits for 1 more approval from other" in alice_sees
    assert f'value="{run_id}/{interrupt_id}"' not in page  # nothing to answer it with
    page, _ = inbox_of(slacked, "bob@example.com")
    bob_sees = in_inbox(page, interrupt_id)
    assert "Approvals 1 of 2 by reviewer:alice via slack" in bob_sees, bob_sees
    assert "You approved" not in bob_sees
    assert f'value="{run_id}/{interrupt_id}"' in page

    # Alice again, in the inbox (a form from before her click): her approval counts once.
    again = inbox_answer(slacked, "alice", run_id, interrupt_id)
    assert again.status_code == 409, again.text
    assert "Nothing was recorded: reviewer:alice already approved" in again.text
    run = slacked.system.run(run_id)
    assert run["status"] == "interrupted" and len(run["interrupts"][0]["approvals"]) == 1

    # Bob in his inbox: the second approval; the run resumes, once.
    done = inbox_answer(slacked, "bob", run_id, interrupt_id)
    assert done.status_code == 200, done.text
    assert "You approved “Launch rocket?”" in done.text
    assert in_inbox(done.text, interrupt_id) == ""
    finished = slacked.system.wait_status(run_id, "completed", timeout=60)
    assert finished["result"] == "Launched: rocket"
    intr = finished["interrupts"][0]
    assert (intr["answer"]["answeredBy"], intr["answer"]["channel"]) == ("reviewer:bob",
                                                                         "inbox")
    assert [(a["answeredBy"], a["channel"]) for a in intr["approvals"]] == [
        ("reviewer:alice", "slack"), ("reviewer:bob", "inbox")]
    assert answered_count(slacked, run_id) == 1
    assert len([e for e in history(slacked.system, run_id)
                if e["event"] == "run.resuming"]) == 1
    # Each one's inbox history has their approval, on the channel they gave it.
    for reviewer, channel in (("alice", "slack"), ("bob", "inbox")):
        page = httpx.get(f"{base}/inbox/history", headers={TRUSTED_HEADER: reviewer},
                         timeout=30).text
        rows = [" ".join(re.sub(r"<[^>]+>", " ", row).split())
                for row in re.findall(r"<tr>.*?</tr>", page, re.DOTALL) if run_id in row]
        assert len(rows) == 1 and rows[0].endswith(f"via {channel}"), rows
        assert "Approved Launch rocket?" in rows[0]

    # Both Slack messages say who gave the answer that closed it, via the inbox, and
    # lose their buttons.
    def closed_via_inbox(message: str) -> Call | None:
        return next((c for c in updates(api, message) if "via inbox" in json.dumps(c.params)),
                    None)

    for message in (alices, bobs):
        update = wait_until(functools.partial(closed_via_inbox, message), 60,
                            what=f"the Slack message {message} updated after the inbox answer")
        assert "*Approved* by <@U0BOB00001> via inbox" in json.dumps(update.params["blocks"])
        assert actions(update) == []
    # A click on Slack now records nothing.
    before = len(ephemerals(api, BOB))
    assert interaction(base, click(BOB, "layby_approve", run_id,
                                   interrupt_id)).status_code == 200
    assert "records nothing" in wait_ephemeral(api, BOB, before)
    assert answered_count(slacked, run_id) == 1


def test_the_other_way_round_an_inbox_approval_then_slack(slacked: ReviewedSystem,
                                                           api: SlackApi) -> None:
    """Bob approves in his inbox first; his Slack click then counts nothing (he is told
    he approved already), and Alice's click is the second approval, the one recorded."""
    run_id, interrupt_id = parked(slacked, "test.quorum", "probe")
    message_of(slacked, run_id, reviewer="bob")
    base = slacked.system.base_url
    first = inbox_answer(slacked, "bob", run_id, interrupt_id)
    assert first.status_code == 200, first.text
    assert "It waits for 1 more approval(s) from other reviewers" in first.text

    before = len(ephemerals(api, BOB))
    assert interaction(base, click(BOB, "layby_approve", run_id,
                                   interrupt_id)).status_code == 200
    assert "already approved" in wait_ephemeral(api, BOB, before)
    run = slacked.system.run(run_id)
    assert run["status"] == "interrupted" and len(run["interrupts"][0]["approvals"]) == 1

    assert interaction(base, click(ALICE, "layby_approve", run_id,
                                   interrupt_id)).status_code == 200
    done = slacked.system.wait_status(run_id, "completed", timeout=60)
    assert done["result"] == "Launched: probe"
    intr = done["interrupts"][0]
    assert (intr["answer"]["answeredBy"], intr["answer"]["channel"]) == ("reviewer:alice",
                                                                         "slack")
    assert [(a["answeredBy"], a["channel"]) for a in intr["approvals"]] == [
        ("reviewer:bob", "inbox"), ("reviewer:alice", "slack")]
    assert answered_count(slacked, run_id) == 1


# -- visible everywhere --------------------------------------------------------------------


def test_a_hand_over_in_the_inbox_updates_the_givers_message(slacked: ReviewedSystem,
                                                             api: SlackApi) -> None:
    """Alice hands the transfer to Bob in her inbox: her Slack message says so and loses
    its buttons, and a click on it records nothing."""
    run_id, interrupt_id = parked(slacked, "demo.transfer", "Send 45 to Kim")
    message = message_of(slacked, run_id)
    _, token = inbox_of(slacked, "alice")
    handed = httpx.post(f"{slacked.system.base_url}/inbox/answer",
                        headers={TRUSTED_HEADER: "alice"}, timeout=30,
                        data={"_ref": f"{run_id}/{interrupt_id}", "_csrf": token,
                              "_action": "delegate", "delegate_to": "bob"})
    assert handed.status_code == 303, handed.text
    update = wait_update(api, message)
    said = json.dumps(update.params)
    assert "Handed on" in said and "via inbox" in said
    assert actions(update) == []
    before = len(ephemerals(api, ALICE))
    interaction(slacked.system.base_url, click(ALICE, "layby_approve", run_id, interrupt_id))
    assert "handed" in wait_ephemeral(api, ALICE, before)
    assert slacked.system.run(run_id)["status"] == "interrupted"
    assert answered_count(slacked, run_id) == 0


def test_metrics_count_answers_given_in_slack(slacked: ReviewedSystem, api: SlackApi) -> None:
    run_id, interrupt_id = parked(slacked, "demo.transfer", "Send 310 to Bob")
    message_of(slacked, run_id)
    interaction(slacked.system.base_url, click(ALICE, "layby_approve", run_id, interrupt_id))
    slacked.system.wait_status(run_id, "completed", timeout=60)
    with slacked.system.api() as client:
        text = client.get("/metrics").text
    assert 'layby_answers_total{channel="slack"}' in text


# -- follow-ups in the thread, failures ----------------------------------------------------


def in_thread(api: SlackApi, message: str) -> list[str]:
    channel, _, ts = message.partition("/")
    return [str(c.params.get("text")) for c in api.of("chat.postMessage", channel=channel,
                                                        thread_ts=ts)]


def test_reminders_are_posted_in_the_requests_thread(slacked: ReviewedSystem,
                                                     api: SlackApi) -> None:
    run_id, interrupt_id = parked(slacked, "demo.transfer", "Send 450 to Bob")
    message = message_of(slacked, run_id)
    said = wait_until(lambda: in_thread(api, message), 30, what="a reminder in the thread")
    assert "Reminder" in said[0]
    channel, _, ts = message.partition("/")
    (first,) = api.of("chat.postMessage", channel=channel, thread_ts=ts)[:1]
    assert first.params["reply_broadcast"] is True  # shown in the conversation too
    assert len(posts(api, run_id)) == 1  # no new message: the thread
    interaction(slacked.system.base_url, click(ALICE, "layby_approve", run_id, interrupt_id))
    slacked.system.wait_status(run_id, "completed", timeout=60)


def test_an_escalation_messages_the_next_level_and_says_so_in_the_thread(
        slacked: ReviewedSystem, api: SlackApi) -> None:
    run_id, interrupt_id = parked(slacked, "demo.transfer", "Send 600 to Bob")
    alices = message_of(slacked, run_id)
    bob_dm = "D" + BOB[1:]
    post = wait_post(api, run_id, bob_dm, timeout=60)
    assert post.params["text"].startswith(":rotating_light: Escalated")
    said = wait_until(lambda: [t for t in in_thread(api, alices) if "escalated" in t], 30,
                      what="the escalation in Alice's thread")
    assert "escalated to <@U0BOB00001>" in said[0]
    bobs = message_of(slacked, run_id, reviewer="bob")
    assert interaction(slacked.system.base_url, click(BOB, "layby_approve", run_id,
                                                       interrupt_id)).status_code == 200
    slacked.system.wait_status(run_id, "completed", timeout=60)
    # Both messages say it is done.
    assert "via slack" in json.dumps(wait_update(api, alices).params)
    assert "via slack" in json.dumps(wait_update(api, bobs).params)


def test_a_failed_post_is_retried_and_an_unknown_user_fails_for_good(
        slacked: ReviewedSystem, api: SlackApi) -> None:
    api.fail_next = 2
    run_id, _ = parked(slacked, "demo.transfer", "Send 320 to Bob")
    message_of(slacked, run_id)
    (note,) = [n for n in slack_notes(slacked, run_id) if n["reviewer"] == "alice"]
    assert (note["state"], note["attempts"]) == ("sent", 3)

    api.users.discard(ALICE)
    try:
        run_id, _ = parked(slacked, "demo.transfer", "Send 330 to Bob")
        failed = wait_until(lambda: next((n for n in slack_notes(slacked, run_id)
                                          if n["state"] == "failed"), None), 30,
                            what="the Slack notification failed")
        assert "user_not_found" in failed["lastError"] and failed["attempts"] == 1
    finally:
        api.users.add(ALICE)


def test_no_slack_secret_in_any_log(slacked: ReviewedSystem) -> None:
    for name, proc in slacked.system.procs.items():
        output = proc.output()
        assert BOT_TOKEN not in output, name
        assert SIGNING_SECRET not in output, name


def test_a_cancelled_run_updates_its_message_and_a_click_records_nothing(
        slacked: ReviewedSystem, api: SlackApi) -> None:
    run_id, interrupt_id = parked(slacked, "demo.transfer", "Send 340 to Bob")
    message = message_of(slacked, run_id)
    with slacked.system.api() as client:
        assert client.post(f"/v1/runs/{run_id}/cancel", json={}).status_code == 200
    update = wait_update(api, message)
    assert "the run is cancelled" in json.dumps(update.params) and actions(update) == []
    before = len(ephemerals(api, ALICE))
    interaction(slacked.system.base_url, click(ALICE, "layby_approve", run_id, interrupt_id))
    assert "no longer open" in wait_ephemeral(api, ALICE, before)
    assert slacked.system.run(run_id)["status"] == "cancelled"


def test_an_answer_whose_caller_died_after_its_commit_still_updates_the_message(
        slacked: ReviewedSystem, api: SlackApi) -> None:
    """The Slack update is written with the answer, in its script: a gateway killed right
    after the commit (here, the answer committed through the store, and nothing published
    after it) leaves it in the outbox, and the sweeper publishes it after the grace time."""
    run_id, interrupt_id = parked(slacked, "demo.transfer", "Send 350 to Bob")
    message = message_of(slacked, run_id)
    settings = slacked.system.settings
    store = Store(redis.Redis.from_url(slacked.system.redis_url, decode_responses=True),
                  store_config(settings, make_celery(settings)))
    done = store.answers.answer(run_id, [Answer(
        interrupt_id=interrupt_id, status="resolved", payload={"approved": True},
        state=InterruptState.RESOLVED, answered_by="reviewer:alice", channel="api",
        answered_at=iso(store.now_ms()))], slack=True)
    assert done.resumed and [e.task for e in done.entries] == ["layby.notify.slack"]
    update = wait_update(api, message)  # published by the sweeper alone
    assert "*Approved* by <@U0ALICE001> via api" in json.dumps(update.params["blocks"])
    assert actions(update) == []
    assert slacked.system.wait_status(run_id, "completed", timeout=60)["status"] == "completed"


def test_a_body_past_the_limit_is_refused_before_its_signature_is_read(
        slacked: ReviewedSystem) -> None:
    body = "payload=" + "x" * 2_000_000
    got = httpx.post(f"{slacked.system.base_url}/slack/interactions", content=body,
                     headers=signed(body), timeout=30)
    assert got.status_code == 413 and "LAYBY_MAX_ANSWER_BYTES" in got.text


@pytest.mark.parametrize("payload", [
    {"type": "block_actions", "actions": {"action_id": "layby_approve"}},
    {"type": "block_actions", "actions": [], "user": "U0ALICE001"},
    {"type": "block_actions", "user": "U0ALICE001", "channel": ["x"],
     "actions": [{"action_id": "layby_approve", "value": "run_x int_y"}]},
    {"type": "view_submission", "view": ["not", "a", "view"]},
    {"type": "view_submission", "user": 7,
     "view": {"private_metadata": "{\"run\": \"run_x\", \"interrupt\": \"int_y\"}",
              "blocks": ["x", None], "state": "nope"}},
])
def test_a_signed_interaction_of_an_odd_shape_gets_a_clear_answer_not_a_500(
        slacked: ReviewedSystem, payload: dict[str, Any]) -> None:
    got = interaction(slacked.system.base_url, payload)
    assert got.status_code in (200, 400, 404), got.text
    assert got.headers["content-type"].startswith("application/json")
