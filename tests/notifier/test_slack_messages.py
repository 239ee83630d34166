"""Slack, in process: the directory's Slack ids and channels, who is sent what (a direct
message, a post to a group's channel), the message and its buttons, the answer modal built
from the request's schema and read back as the answer page reads its form, and the
request signature."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from layby.answering import slack_interactions
from layby.answering.answers import Opened
from layby.answering.forms import entry_from_form
from layby.broker_config import Settings
from layby.errors import ConfigError, Invalid
from layby.notifier import planning, slack_messages
from layby.ops.doctor import Check, check_slack
from layby.reviewers.config import Reviewers
from layby.reviewers.directory import load_directory
from layby.reviewers.tokens import Grant
from layby.wire import InterruptView, RunView, Status
from tests.answering.test_forms import APPROVAL, ORDER, TRIVIA, answer, view
from tests.support.slack import (
    ALICE,
    BOB,
    BOT_TOKEN,
    MALLORY,
    OPS_CHANNEL,
    SIGNING_SECRET,
    SlackApi,
    directory_toml,
    signed,
)

TOKEN_KEYS = "t1:test-token-key-one-0123456789"


def directory_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "reviewers.toml"
    path.write_text(text)
    return path


def run_of(*interrupts: InterruptView) -> RunView:
    return RunView(id="run_1", agent="demo.transfer", status=Status.INTERRUPTED, version=3,
                   messages=[], interrupts=list(interrupts), created_at="2025-06-01T11:00:00Z",
                   updated_at="2025-06-01T11:00:00Z")


def opened(intr: InterruptView) -> Opened:
    from layby.reviewers.directory import Reviewer
    return Opened(Grant("run_1", intr.id, "alice", 3, 0), Reviewer(id="alice"), run_of(intr),
                  intr)


# -- the directory -------------------------------------------------------------------------


def test_the_directory_takes_slack_ids_and_group_channels(tmp_path: Path) -> None:
    found = load_directory(directory_file(tmp_path, directory_toml("https://hooks.test/x")))
    assert found.reviewers["alice"].slack_id == ALICE
    assert found.groups["ops"] == ["bob"] and found.slack_channels == {"ops": OPS_CHANNEL}
    assert found.groups["approvers"] == ["alice", "hookbot"]
    assert found.by_slack_id(BOB).id == "bob"  # type: ignore[union-attr]
    assert found.by_slack_id("U0NOBODY01") is None


@pytest.mark.parametrize("text, says", [
    ('[reviewers.a]\nslack_id = "alice"\n', "slack_id"),
    ('[reviewers.a]\nslack_id = "C0CHANNEL1"\n', "slack_id"),
    ('[reviewers.a]\n[groups.g]\nmembers = ["a"]\nslack_channel = "#ops"\n', "slack_channels"),
    ('[reviewers.a]\n[groups.g]\nmembers = ["a"]\nchannel = "C0OPS00001"\n', "unknown keys"),
])
def test_a_slack_id_or_channel_of_the_wrong_shape_is_refused(tmp_path: Path, text: str,
                                                              says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_directory(directory_file(tmp_path, text))


# -- who is sent what ----------------------------------------------------------------------


def plan(tmp_path: Path, names: list[str] | None, *, stored: bool = True, **settings: Any
         ) -> list[tuple[str, str, str]]:
    path = directory_file(tmp_path, directory_toml("https://hooks.test/x"))
    config = Settings(reviewers_file=path, token_keys=TOKEN_KEYS, **settings)  # type: ignore[arg-type]
    intr = view(reviewers=names, created_at="2099-01-01T00:00:00Z", expires_at=None)
    made = planning.announcements(config, Reviewers(config), "run_1", 3, [intr], slack=stored)
    return sorted((n.reviewer, n.channel, n.kind) for n, _ in made.notes)


def test_reviewers_with_slack_ids_get_a_direct_message_when_slack_is_configured(
        tmp_path: Path) -> None:
    assert ("alice", "slack", "request") not in plan(tmp_path, ["alice"])
    assert plan(tmp_path, ["alice"], slack_bot_token="xoxb-1") == [
        ("alice", "email", "request"), ("alice", "slack", "request")]


def test_nothing_goes_to_slack_while_the_store_may_not_hold_it(tmp_path: Path) -> None:
    # A store still written in format 1 (processes of 0.2.0, which cannot read a
    # notification on Slack, may share it): the other channels only.
    assert plan(tmp_path, ["alice", "ops"], stored=False, slack_bot_token="xoxb-1") == [
        ("alice", "email", "request"), ("bob", "email", "request")]


def test_a_group_with_a_channel_gets_one_post_and_its_members_no_direct_message(
        tmp_path: Path) -> None:
    assert plan(tmp_path, ["ops"], slack_bot_token="xoxb-1") == [
        ("bob", "email", "request"), ("ops", "slack", "request")]
    # Bob asked by name too: still seen in the channel, not sent a DM as well.
    assert plan(tmp_path, ["ops", "bob"], slack_bot_token="xoxb-1") == [
        ("bob", "email", "request"), ("ops", "slack", "request")]


# -- the message ---------------------------------------------------------------------------


def elements(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for b in blocks if b["type"] == "actions" for e in b["elements"]]


def test_a_confirmation_has_approve_and_decline_and_shows_the_tool_input() -> None:
    intr = view(APPROVAL)
    blocks = slack_messages.open_blocks(run_of(intr), intr)
    text = str(blocks)
    assert "demo.transfer" in text and "Send 250 to Bob?" in text
    assert "transfer_funds" in text and '"amount": 250' in text
    assert [(e["action_id"], e["text"]["text"], e["value"]) for e in elements(blocks)] == [
        (slack_messages.APPROVE, "Approve", "run_1 int_1"),
        (slack_messages.DECLINE, "Decline", "run_1 int_1")]


def test_a_question_has_an_answer_button() -> None:
    intr = view(TRIVIA, reason="input_required")
    assert [e["action_id"] for e in elements(slack_messages.open_blocks(run_of(intr), intr))] == [
        slack_messages.ANSWER]


def test_the_input_is_escaped_for_slack() -> None:
    intr = view(APPROVAL, tool_input={"to": "<!channel> & co"})
    assert "<!channel>" not in str(slack_messages.open_blocks(run_of(intr), intr))


def test_an_answered_message_says_who_how_and_when_and_has_no_buttons() -> None:
    intr = view(APPROVAL, state="resolved",
                answer=answer({"approved": True}, by="reviewer:alice", channel="email"))
    blocks = slack_messages.closed_blocks(run_of(intr), intr, lambda rid: rid.capitalize())
    assert not elements(blocks)
    assert "*Approved* by Alice via email <!date^" in str(blocks)


# -- the modal -----------------------------------------------------------------------------


def inputs(modal: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {b["block_id"]: b for b in modal["blocks"] if b["type"] == "input"}


def test_the_modal_has_a_control_per_field_of_the_answer_page() -> None:
    intr = view(ORDER, reason="input_required")
    found = inputs(slack_interactions.modal(opened(intr), "D0ALICE001"))
    assert found["name"]["element"]["type"] == "plain_text_input"
    assert found["name"]["label"]["text"] == "Customer name" and not found["name"]["optional"]
    assert found["notes"]["element"]["multiline"] and found["notes"]["optional"]
    assert found["guests"]["element"] == {"type": "number_input", "is_decimal_allowed": False,
                                          "action_id": "value"}
    assert [o["value"] for o in found["grill"]["element"]["options"]] == ["charcoal", "gas"]
    assert found["checked"]["element"]["type"] == "checkboxes"
    assert "version" not in found  # a constant is filled in, not asked


def test_a_submitted_modal_reads_as_the_answer_page_reads_its_form() -> None:
    intr = view(ORDER, reason="input_required")
    state = {"values": {
        "name": {"value": {"type": "plain_text_input", "value": "Ada"}},
        "guests": {"value": {"type": "number_input", "value": "12"}},
        "grill": {"value": {"type": "radio_buttons", "selected_option": {"value": "gas"}}},
        "checked": {"value": {"type": "checkboxes", "selected_options": [{"value": "on"}]}},
        "notes": {"value": {"type": "plain_text_input", "value": None}}}}
    entry = entry_from_form(intr, slack_interactions.form_values(state))
    assert entry.payload["name"] == "Ada" and entry.payload["guests"] == 12
    assert entry.payload["grill"] == "gas" and entry.payload["version"] == 2
    with pytest.raises(Invalid):
        entry_from_form(intr, slack_interactions.form_values({"values": {}}))


def test_the_modal_of_a_trivia_question_offers_its_choices() -> None:
    intr = view(TRIVIA, reason="input_required")
    (field,) = inputs(slack_interactions.modal(opened(intr))).values()
    assert field["block_id"] == "payload"
    assert field["element"]["type"] == "radio_buttons"
    assert "Jaws" in [o["value"] for o in field["element"]["options"]]


# -- the signature -------------------------------------------------------------------------


def headers_of(body: str, **kwargs: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in signed(body, **kwargs).items()}


def test_a_signed_request_verifies() -> None:
    slack_interactions.verify(SIGNING_SECRET, b"payload=%7B%7D", headers_of("payload=%7B%7D"))


@pytest.mark.parametrize("change, says", [
    ({"secret": "another-secret"}, "does not verify"),
    ({"at": -6 * 60}, "more than 300 s"),
    ({"at": +6 * 60}, "more than 300 s"),
])
def test_a_forged_or_stale_request_is_refused(change: dict[str, Any], says: str) -> None:
    if "at" in change:  # from now, not from when the tests were collected
        change = {"at": time.time() + change["at"]}
    with pytest.raises(slack_interactions.BadSignature, match=says):
        slack_interactions.verify(SIGNING_SECRET, b"payload=%7B%7D",
                       headers_of("payload=%7B%7D", **change))


def test_a_changed_body_is_refused() -> None:
    with pytest.raises(slack_interactions.BadSignature, match="does not verify"):
        slack_interactions.verify(SIGNING_SECRET, b"payload=%7B%22a%22%7D",
                                  headers_of("payload=%7B%7D"))


def test_an_unsigned_request_is_refused() -> None:
    with pytest.raises(slack_interactions.BadSignature, match="X-Slack-Signature"):
        slack_interactions.verify(SIGNING_SECRET, b"payload=%7B%7D", {})


# -- layby doctor --------------------------------------------------------------------------


def doctor(tmp_path: Path, api: SlackApi, token: str = BOT_TOKEN) -> dict[str, Check]:
    path = directory_file(tmp_path, directory_toml("https://hooks.test/x"))
    config = Settings(reviewers_file=path, slack_bot_token=token,  # type: ignore[arg-type]
                      slack_signing_secret=SIGNING_SECRET, slack_api_url=api.url)
    return {c.name: c for c in check_slack(config)}


def test_doctor_says_whether_the_token_works_and_the_slack_users_exist(
        tmp_path: Path) -> None:
    api = SlackApi(users={ALICE, BOB}).start()
    try:
        found = doctor(tmp_path, api)
        assert found["slack token"].ok and "layby test" in found["slack token"].message
        assert not found["slack users"].ok
        assert f"mallory ({MALLORY}: Slack refused users.info: user_not_found)" in \
            found["slack users"].message
        api.users.add(MALLORY)
        assert doctor(tmp_path, api)["slack users"].ok
        refused = doctor(tmp_path, api, token="xoxb-revoked")
        assert not refused["slack token"].ok and "invalid_auth" in refused["slack token"].message
        assert BOT_TOKEN not in str(refused) and "xoxb-revoked" not in str(refused)
    finally:
        api.stop()
    assert [c.ok for c in check_slack(Settings())] == [True]  # not configured: no Slack


def test_the_modal_of_an_approval_asks_for_the_decision_and_the_note() -> None:
    intr = view(APPROVAL)
    found = inputs(slack_interactions.modal(opened(intr)))
    assert list(found) == ["decision", "note"]
    assert [(o["text"]["text"], o["value"]) for o in found["decision"]["element"]["options"]] \
        == [("Approve", "approve"), ("Decline", "decline")]
    entry = entry_from_form(intr, slack_interactions.form_values({"values": {
        "decision": {"value": {"type": "radio_buttons",
                               "selected_option": {"value": "approve"}}},
        "note": {"value": {"type": "plain_text_input", "value": "fine"}}}}))
    assert entry.payload == {"approved": True, "note": "fine"}
