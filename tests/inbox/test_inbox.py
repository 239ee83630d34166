"""The reviewers' inbox (`/inbox`) in a real browser: reviewers sign in with the link mailed
to them, see every request waiting for them (their own, their groups', those handed to
them), answer in place, approve a selection at once, and see new requests arrive.

Debian's Chromium, driven by Playwright, against a layby system of this module's own (its
own database of the reviewer tests' Valkey server, an SMTP server, a reply listener).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from layby.inbox import signin
from layby.ops.embedded import EmbeddedRedis
from layby.reviewers.tokens import parse_keys
from tests.support.browser import launch
from tests.support.harness import wait_until
from tests.support.reviewers import (
    TOKEN_KEYS,
    ReviewedSystem,
    SmtpServer,
    WebhookReceiver,
    link_in,
    own_reviewed,
    wait_gone,
)

DB = 6  # the reviewer tests' Valkey server, a database of this module's own
TIMEOUT_MS = 30_000
ALICE, BOB, MALLORY = "alice@example.com", "bob@example.com", "mallory@example.com"
TRUSTED_HEADER = "X-Forwarded-Email"


@pytest.fixture(scope="module")
def inboxed(reviewer_redis: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[ReviewedSystem]:
    with own_reviewed(reviewer_redis, tmp_path_factory.mktemp("inbox"), DB,
                      SmtpServer().start(), WebhookReceiver().start(),
                      LAYBY_DEMO_EXPIRY_S="3600",
                      LAYBY_INBOX_TRUSTED_HEADER=TRUSTED_HEADER) as system:
        yield system


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = launch(playwright)
        yield launched
        launched.close()


def _context(browser: Browser, **options: Any) -> Any:
    context = browser.new_context(**options)
    context.set_default_timeout(TIMEOUT_MS)
    context.set_default_navigation_timeout(2 * TIMEOUT_MS)
    return context


# -- signing in -----------------------------------------------------------------------------


def sign_in_mails(system: ReviewedSystem, address: str) -> list[EmailMessage]:
    return [m for m in system.smtp.mails_to(address) if "sign-in" in m["Subject"]]


def ask_for_link(system: ReviewedSystem, page: Page, address: str) -> str:
    """Ask the inbox for a sign-in link to `address`; the link mailed."""
    before = len(sign_in_mails(system, address))
    page.goto(f"{system.system.base_url}/inbox")
    assert page.inner_text("h1") == "Sign in to your inbox"
    page.fill("#f-email", address)
    with page.expect_navigation():
        page.click("text=Mail me a sign-in link")
    assert page.inner_text("h1") == "Check your mail"
    assert f"If {address} is a reviewer's address" in page.inner_text("main")
    mail = wait_until(lambda: len(found := sign_in_mails(system, address)) > before
                      and found[-1], 30, what=f"a sign-in mail to {address}")
    return link_in(mail, "/inbox/sign-in/")


def use_link(page: Page, link: str) -> None:
    """Open a sign-in link and press Sign in; lands on the inbox."""
    reply = page.goto(link)
    assert reply is not None and reply.status == 200, page.inner_text("body")
    with page.expect_navigation():
        page.click("button:has-text('Sign in')")
    assert page.url.endswith("/inbox"), page.url


@pytest.fixture(scope="module")
def sessions(inboxed: ReviewedSystem, browser: Browser) -> Callable[[str], Any]:
    """A signed-in browser state per address, signed in once by the mailed link."""
    states: dict[str, Any] = {}

    def of(address: str) -> Any:
        if address not in states:
            context = _context(browser)
            page = context.new_page()
            use_link(page, ask_for_link(inboxed, page, address))
            states[address] = context.storage_state()
            context.close()
        return states[address]
    return of


@pytest.fixture
def open_as(browser: Browser, sessions: Callable[[str], Any],
            inboxed: ReviewedSystem) -> Iterator[Callable[..., Page]]:
    """A page on the inbox, signed in as `address`, in a context of its own."""
    contexts: list[Any] = []

    def make(address: str, js: bool = False, width: int = 1000) -> Page:
        context = _context(browser, storage_state=sessions(address), java_script_enabled=js,
                           viewport={"width": width, "height": 900})
        contexts.append(context)
        page = context.new_page()
        reply = page.goto(f"{inboxed.system.base_url}/inbox")
        assert reply is not None and reply.status == 200, page.inner_text("body")
        assert "Signed in as" in page.inner_text("nav"), page.inner_text("body")
        return page

    yield make
    for context in contexts:
        context.close()


# -- runs ---------------------------------------------------------------------------------


def parked(system: ReviewedSystem, agent: str, text: str) -> tuple[str, str]:
    """Start a run; (run id, interrupt id) once it waits."""
    run_id = system.start_run(agent, text)["id"]
    run = wait_until(lambda: (r := system.system.run(run_id))["status"] == "interrupted"
                     and system.system.open_interrupts(r) and r, 30,
                     what=f"{agent} to park")
    return run_id, system.system.open_interrupts(run)[0]["id"]


def answer_of(system: ReviewedSystem, run_id: str, interrupt_id: str) -> dict[str, Any] | None:
    run = system.system.run(run_id)
    return next(i for i in run["interrupts"] if i["id"] == interrupt_id).get("answer")


def finished(system: ReviewedSystem, run_id: str) -> dict[str, Any]:
    run = system.system.wait_status(run_id, "completed", "failed", "cancelled", timeout=60)
    assert run["status"] == "completed", run.get("error")
    return run


def request_on(page: Page, interrupt_id: str) -> Any:
    return page.locator(f"#r-{interrupt_id}")


def reload(page: Page) -> None:
    reply = page.reload()
    assert reply is not None and reply.status == 200


def submit(page: Page, selector: str, status: int = 200) -> None:
    with page.expect_navigation() as navigation:
        page.click(selector)
    reply = navigation.value
    assert reply is not None and reply.status == status, page.inner_text("body")


def words(page: Page, selector: str = "main") -> str:
    return re.sub(r"\s+", " ", page.inner_text(selector))


# -- the tests ------------------------------------------------------------------------------


def test_a_reviewer_signs_in_with_the_mailed_link_once(inboxed: ReviewedSystem,
                                                        browser: Browser) -> None:
    """The mailed link signs Alice in once: opening it signs nobody in (mail scanners open
    links), pressing Sign in does; the link then, an expired one or an altered one are
    refused; an unknown address gets the same answer and no mail."""
    context = _context(browser)
    page = context.new_page()
    base = inboxed.system.base_url
    link = ask_for_link(inboxed, page, ALICE)
    assert "/inbox/sign-in/" in link

    reply = page.goto(link)
    assert reply is not None and reply.status == 200
    assert "as Alice Martin" in words(page)
    assert reply.headers["cache-control"] == "no-store"
    assert reply.headers["referrer-policy"] == "same-origin"
    # Opened, not used: the inbox still asks who you are.
    page.goto(f"{base}/inbox")
    assert page.inner_text("h1") == "Sign in to your inbox"

    use_link(page, link)
    assert "Signed in as Alice Martin" in words(page, "nav")
    cookie = next(c for c in context.cookies() if c["name"] == "layby_inbox")
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/inbox"
    signed_in = context.storage_state()

    # The same link again, in another browser: used up.
    other = _context(browser)
    again = other.new_page()
    reply = again.goto(link)
    assert reply is not None and reply.status == 403
    assert "used already" in words(again)
    # A link past its time, made with the same keys an hour ago.
    stale = signin.make(parse_keys(TOKEN_KEYS), "link", "alice", 900, now=time.time() - 3600)
    reply = again.goto(f"{base}/inbox/sign-in/{stale}")
    assert reply is not None and reply.status == 403
    assert "has expired" in words(again)
    # One altered character of a fresh link's signature.
    fresh = signin.make(parse_keys(TOKEN_KEYS), "link", "alice", 900)
    forged = fresh[:-1] + ("A" if fresh[-1] != "A" else "B")
    reply = again.goto(f"{base}/inbox/sign-in/{forged}")
    assert reply is not None and reply.status == 403
    assert "signature does not match" in words(again)

    # An address that is nobody's: the same answer, and no mail.
    again.goto(f"{base}/inbox")
    again.fill("#f-email", "nobody@example.com")
    with again.expect_navigation():
        again.click("text=Mail me a sign-in link")
    assert again.inner_text("h1") == "Check your mail"
    wait_gone(lambda: bool(inboxed.smtp.mails_to("nobody@example.com")), 2)
    other.close()

    # Signing out ends the session: its cookie no longer opens the inbox.
    with page.expect_navigation():
        page.click("text=Sign out")
    assert page.inner_text("h1") == "Sign in to your inbox"
    replay = _context(browser, storage_state=signed_in)
    replayed = replay.new_page()
    replayed.goto(f"{base}/inbox")
    assert replayed.inner_text("h1") == "Sign in to your inbox"
    replay.close()
    context.close()


def test_the_list_for_a_reviewer_a_group_member_and_a_delegate(
        inboxed: ReviewedSystem, open_as: Callable[..., Page]) -> None:
    """Alice sees the transfer her group must approve, with its input, the conversation
    and why it is hers; Bob sees the sign-off asked of him and not the transfer, until
    Alice hands it to him; then he approves it in place."""
    transfer, transfer_asks = parked(inboxed, "demo.transfer", "Send 250 to Bob")
    sign_off, sign_off_asks = parked(inboxed, "test.named", "bob")

    alice = open_as(ALICE)
    shown = request_on(alice, transfer_asks)
    assert shown.locator("h2").inner_text() == "Send 250 to Bob?"
    said = re.sub(r"\s+", " ", shown.inner_text())
    assert "demo.transfer" in said and "transfer_funds" in said
    assert "Asked of group approvers" in said
    assert [t.strip() for t in shown.locator("dl.input dd").all_inner_texts()] == ["Bob", "250"]
    shown.locator("summary", has_text="The conversation").click()
    assert "User: Send 250 to Bob" in re.sub(r"\s+", " ",
                                             shown.locator("ol.conversation").inner_text())
    assert request_on(alice, sign_off_asks).count() == 0

    bob = open_as(BOB)
    assert "Asked of you" in request_on(bob, sign_off_asks).inner_text()
    assert request_on(bob, transfer_asks).count() == 0

    # Filters: an agent that asked nothing of Alice hides everything.
    alice.select_option("#filter-agent", "demo.transfer")
    submit(alice, "button:has-text('Filter')")
    assert request_on(alice, transfer_asks).count() == 1

    # Alice hands the transfer on to Bob.
    shown = request_on(alice, transfer_asks)
    shown.locator("summary", has_text="Hand this request on").click()
    shown.locator("select[name=delegate_to]").select_option("bob")
    submit(alice, f"#r-{transfer_asks} button:has-text('Hand on')")
    assert "You handed “Send 250 to Bob?” to Bob Stone" in words(alice)
    assert request_on(alice, transfer_asks).count() == 0

    reload(bob)
    handed = request_on(bob, transfer_asks)
    assert "Handed to you by Alice Martin" in handed.inner_text()
    submit(bob, f"#r-{transfer_asks} button.approve")
    assert "You approved “Send 250 to Bob?”" in words(bob)
    run = finished(inboxed, transfer)
    assert run["result"] == "Sent 250 to Bob."
    answer = answer_of(inboxed, transfer, transfer_asks)
    assert answer is not None
    assert (answer["answeredBy"], answer["channel"]) == ("reviewer:bob", "inbox")
    assert inboxed.system.run(sign_off)["status"] == "interrupted"


def test_approving_declining_and_answering_a_question_in_place(
        inboxed: ReviewedSystem, open_as: Callable[..., Page]) -> None:
    """Approve, Decline and a schema question's form, each on its request in the list;
    every answer is recorded as Alice's, through the inbox, and the runs go on."""
    approve, approve_asks = parked(inboxed, "demo.transfer", "Send 30 to Carol")
    decline, decline_asks = parked(inboxed, "demo.transfer", "Send 900 to Mallory")
    trivia, trivia_asks = parked(inboxed, "demo.trivia", "play")

    page = open_as(ALICE)
    submit(page, f"#r-{approve_asks} button.approve")
    assert "You approved “Send 30 to Carol?”" in words(page)
    assert request_on(page, approve_asks).count() == 0

    request_on(page, decline_asks).locator("textarea, input[type=text]").first.fill(
        "Not to Mallory")
    submit(page, f"#r-{decline_asks} button.decline")
    assert "You declined “Send 900 to Mallory?”" in words(page)

    trivia_form = request_on(page, trivia_asks)
    assert trivia_form.locator("legend").inner_text().startswith("Your answer")
    trivia_form.locator('input[type=radio][value="Jaws"]').check()
    submit(page, f"#r-{trivia_asks} button:has-text('Send answer')")
    assert "Your answer to" in words(page)

    assert finished(inboxed, approve)["result"] == "Sent 30 to Carol."
    assert "no money was sent" in (finished(inboxed, decline)["result"] or "")
    assert finished(inboxed, trivia)["result"] == "Right! It was Jaws (1975)."
    for run_id, asks in ((approve, approve_asks), (decline, decline_asks),
                         (trivia, trivia_asks)):
        answer = answer_of(inboxed, run_id, asks)
        assert answer is not None
        assert (answer["answeredBy"], answer["channel"]) == ("reviewer:alice", "inbox")
    assert [t["to"] for t in inboxed.system.ledger()["transfers"]
            if t["run"] in (approve, decline)] == ["Carol"]

    # /metrics counts them under the inbox's channel.
    with inboxed.system.api() as api:
        metrics = api.get("/metrics").text
    found = re.search(r'^layby_answers_total\{channel="inbox"\} (\d+)', metrics, re.MULTILINE)
    assert found is not None and int(found.group(1)) >= 3, metrics

    # The history lists all three.
    page.click("text=History")
    history = words(page)
    assert "Approved Send 30 to Carol?" in history
    assert "Declined Send 900 to Mallory?" in history
    assert "via inbox" in history


def test_a_selection_approved_at_once(inboxed: ReviewedSystem,
                                      open_as: Callable[..., Page]) -> None:
    """Two routine transfers ticked, listed for confirmation (nothing recorded yet), then
    approved: each approval recorded on its own; what was not ticked still waits."""
    first = parked(inboxed, "demo.transfer", "Send 11 to Dan")
    second = parked(inboxed, "demo.transfer", "Send 12 to Eve")
    third = parked(inboxed, "demo.transfer", "Send 13 to Fay")
    question = parked(inboxed, "demo.trivia", "play")

    page = open_as(ALICE)
    # A question asks for more than an approval: it has nothing to tick.
    assert request_on(page, question[1]).locator("input[name=_pick]").count() == 0
    submit(page, "button:has-text('Approve selected')", status=422)
    assert "Select the requests to approve first" in words(page)

    for _, asks in (first, second):
        request_on(page, asks).locator("input[name=_pick]").check()
    submit(page, "button:has-text('Approve selected')")
    assert page.inner_text("h1") == "Approve these 2 requests?"
    listed = words(page, "ol.bulk-list")
    assert "Send 11 to Dan?" in listed and "Send 12 to Eve?" in listed
    assert "Send 13 to Fay?" not in listed
    assert answer_of(inboxed, *first) is None and answer_of(inboxed, *second) is None

    submit(page, "button:has-text('Approve all 2')")
    assert page.inner_text("h1") == "Approved 2 of 2"
    ids = set()
    for run_id, asks in (first, second):
        finished(inboxed, run_id)
        answer = answer_of(inboxed, run_id, asks)
        assert answer is not None
        assert (answer["answeredBy"], answer["channel"]) == ("reviewer:alice", "inbox")
        ids.add(answer["answerId"])
    assert len(ids) == 2  # two answers, each its own
    assert inboxed.system.run(third[0])["status"] == "interrupted"
    assert inboxed.system.run(question[0])["status"] == "interrupted"


def test_a_new_request_appears_without_a_reload(inboxed: ReviewedSystem,
                                                open_as: Callable[..., Page]) -> None:
    page = open_as(ALICE, js=True)
    loads: list[str] = []
    page.on("load", lambda: loads.append(page.url))
    run_id, asks = parked(inboxed, "demo.transfer", "Send 77 to Gus")
    page.wait_for_selector(f"#r-{asks}", timeout=30_000)
    assert "Send 77 to Gus?" in request_on(page, asks).inner_text()
    assert loads == []  # it came in place, not by loading the page again
    wait_until(lambda: "new request" in page.inner_text("#arrivals"), 10,
               what="the arrival announced to screen readers")
    # It answers like any other.
    submit(page, f"#r-{asks} button.approve")
    assert finished(inboxed, run_id)["result"] == "Sent 77 to Gus."


def test_the_inbox_on_a_375_px_phone(inboxed: ReviewedSystem, open_as: Callable[..., Page],
                                     tmp_path: Path) -> None:
    """At a phone's width nothing runs off the side, every control has a label, and the
    keyboard reaches Approve."""
    parked(inboxed, "demo.transfer", "Send 5 to Hal")
    page = open_as(ALICE, width=375)
    shot = tmp_path / "inbox-375.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 0
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
    unlabelled = page.evaluate("""() => [...document.querySelectorAll(
        'input:not([type=hidden]), select, textarea')].filter(
        e => !e.hidden && e.labels.length === 0 && !e.getAttribute('aria-label')
    ).map(e => e.name)""")
    assert unlabelled == []
    for _ in range(60):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.className") == "approve":
            break
    else:
        raise AssertionError("Tab never reached an Approve button")


def test_a_form_without_its_csrf_token_records_nothing(
        inboxed: ReviewedSystem, open_as: Callable[..., Page]) -> None:
    run_id, asks = parked(inboxed, "demo.transfer", "Send 66 to Ivy")
    page = open_as(ALICE)
    token = page.get_attribute(f"#r-{asks} input[name=_csrf]", "value")
    assert token
    base = inboxed.system.base_url
    for form in ({"_ref": f"{run_id}/{asks}", "decision": "approve"},
                 {"_ref": f"{run_id}/{asks}", "decision": "approve", "_csrf": "x" + token}):
        reply = page.request.post(f"{base}/inbox/answer", form=form)
        assert reply.status == 403
        assert "CSRF" in reply.text()
    reply = page.request.post(f"{base}/inbox/bulk/approve",
                              form={"_pick": f"{run_id}/{asks}"})
    assert reply.status == 403
    assert answer_of(inboxed, run_id, asks) is None
    # With it, the same post is an approval.
    reply = page.request.post(f"{base}/inbox/answer", form={
        "_ref": f"{run_id}/{asks}", "decision": "approve", "_csrf": token})
    assert reply.status == 200  # the inbox, after the redirect
    assert "You approved" in reply.text()
    finished(inboxed, run_id)


def test_a_selection_past_the_limit_records_nothing(
        inboxed: ReviewedSystem, open_as: Callable[..., Page]) -> None:
    """More than 100 requests ticked at once: both steps of a selection (confirm, approve)
    refuse it whole, saying the limit, and the one real request among them stays open."""
    run_id, asks = parked(inboxed, "demo.transfer", "Send 67 to Ivy")
    page = open_as(ALICE)
    token = page.get_attribute("#bulk input[name=_csrf]", "value")
    assert token
    base = inboxed.system.base_url
    picks = [f"{run_id}/{asks}"] + [f"run_{k}/int_{k}" for k in range(100)]
    body = "&".join([f"_csrf={token}"] + [f"_pick={pick}" for pick in picks])
    for step in ("bulk", "bulk/approve"):
        reply = page.request.post(f"{base}/inbox/{step}", data=body, headers={
            "Content-Type": "application/x-www-form-urlencoded"})
        assert reply.status == 422, step
        assert "101 requests were selected; at most 100 are approved at once" in \
            reply.text()
    assert answer_of(inboxed, run_id, asks) is None
    assert inboxed.system.run(run_id)["status"] == "interrupted"


def test_one_reviewer_cannot_see_or_answer_anothers_request(
        inboxed: ReviewedSystem, open_as: Callable[..., Page]) -> None:
    run_id, asks = parked(inboxed, "test.named", "bob")
    mallory = open_as(MALLORY)
    assert request_on(mallory, asks).count() == 0
    token = mallory.get_attribute("#bulk input[name=_csrf]", "value")
    base = inboxed.system.base_url
    reply = mallory.request.post(f"{base}/inbox/answer", form={
        "_ref": f"{run_id}/{asks}", "decision": "approve", "_csrf": token or ""})
    assert reply.status == 409
    assert "not one of yours to answer" in reply.text()
    reply = mallory.request.post(f"{base}/inbox/bulk/approve", form={
        "_pick": f"{run_id}/{asks}", "_csrf": token or ""})
    assert reply.status == 200
    assert "Approved 0 of 1" in reply.text()
    assert answer_of(inboxed, run_id, asks) is None
    assert inboxed.system.run(run_id)["status"] == "interrupted"
    # Nor what its run did.
    seen = mallory.request.get(f"{base}/inbox/timeline?ref={run_id}/{asks}")
    assert seen.status == 404 and run_id not in seen.text()
    assert "not one waiting for you" in seen.text()


def test_a_requests_run_timeline_is_one_click_from_the_inbox(
        inboxed: ReviewedSystem, open_as: Callable[..., Page]) -> None:
    """Each request links to what its run did so far: the step that parked it, whom it
    notified and how, with times."""
    run_id, asks = parked(inboxed, "demo.transfer", "Send 31 to Carol")
    page = open_as(ALICE)
    request_on(page, asks).locator("text=What the run did so far").click()
    page.wait_for_url(lambda url: "/inbox/timeline?ref=" in url)
    assert page.locator("h1").inner_text() == "What the run did so far"
    assert run_id in words(page)
    rows = [[c.strip() for c in row.locator("td").all_inner_texts()]
            for row in page.locator("table.timeline tbody tr").all()]
    assert [row[1] for row in rows][:3] == ["created", "step", "parked"], rows
    assert rows[2][2] == f"waits for {asks} (confirmation)"
    assert any(row[1] == "notified" and "via email" in row[4] for row in rows), rows
    page.click("text=Back to the request")
    assert request_on(page, asks).count() == 1


def test_a_trusted_proxy_names_the_reviewer(inboxed: ReviewedSystem) -> None:
    """With LAYBY_INBOX_TRUSTED_HEADER set, the proxy's header signs the reviewer in (by
    email or id); a name the directory does not know is refused."""
    run_id, asks = parked(inboxed, "test.named", "bob")
    base = inboxed.system.base_url
    with httpx.Client(base_url=base, timeout=30) as http:
        page = http.get("/inbox", headers={TRUSTED_HEADER: BOB})
        assert page.status_code == 200
        assert "Signed in as <strong>Bob Stone</strong>" in page.text
        assert f'id="r-{asks}"' in page.text
        assert "Sign out" not in page.text  # the proxy's session is the proxy's to end
        refused = http.get("/inbox", headers={TRUSTED_HEADER: "eve@example.com"})
        assert refused.status_code == 403
        assert "is not in layby" in refused.text and "reviewer directory" in refused.text
        token = re.search(r'name="_csrf" value="([^"]+)"', page.text)
        assert token is not None
        done = http.post("/inbox/answer", headers={TRUSTED_HEADER: "bob"}, data={
            "_ref": f"{run_id}/{asks}", "_csrf": token.group(1), "decision": "approve"},
            follow_redirects=True)
        assert done.status_code == 200, done.text
        assert "You approved" in done.text
    answer = answer_of(inboxed, run_id, asks)
    assert answer is not None
    assert (answer["answeredBy"], answer["channel"]) == ("reviewer:bob", "inbox")


def test_arguments_edited_before_approving_where_the_tool_allows_it(
        inboxed: ReviewedSystem, open_as: Callable[..., Page]) -> None:
    """test.editable's tool allows edits: Alice corrects the amount, a bad amount is refused
    beside the field with nothing recorded, and the tool runs with what she approved. A
    tool that does not allow edits (the demo's transfer) offers none."""
    run_id, asks = parked(inboxed, "test.editable", "pay 400 to Bob")
    other, other_asks = parked(inboxed, "demo.transfer", "Send 3 to Jo")
    page = open_as(ALICE)
    assert request_on(page, other_asks).locator("details.edit").count() == 0
    shown = request_on(page, asks)
    shown.locator("summary", has_text="Edit the arguments").click()
    amount = shown.locator(f"#f-{asks}-input\\.amount")
    assert amount.input_value() == "400"

    amount.fill("-5")
    submit(page, f"#r-{asks} button.approve", status=422)
    assert "Your answer was not recorded" in request_on(page, asks).inner_text()
    assert answer_of(inboxed, run_id, asks) is None

    shown = request_on(page, asks)
    assert shown.locator("details.edit").get_attribute("open") is not None
    shown.locator(f"#f-{asks}-input\\.amount").fill("40")
    submit(page, f"#r-{asks} button.approve")
    assert finished(inboxed, run_id)["result"] == "Paid 40 to Bob."
    answer = answer_of(inboxed, run_id, asks)
    assert answer is not None
    assert answer["metadata"]["replaceInput"] == {"to": "Bob", "amount": 40}
    assert inboxed.system.run(other)["status"] == "interrupted"


def test_forms_from_another_site_and_odd_proxy_headers_are_refused(
        inboxed: ReviewedSystem) -> None:
    """A form another site's page posts (a sign-in link's included: it would sign the
    victim in as the attacker) is refused before it is read, and the link still works;
    a proxy header given twice is refused; a mail's link to the inbox, which carries no
    SameSite=Strict cookie, gets one step from this site instead of the sign-in form."""
    base = inboxed.system.base_url
    link = signin.make(parse_keys(TOKEN_KEYS), "link", "mallory", 900)
    with httpx.Client(base_url=base, timeout=30) as http:
        for elsewhere in ({"Sec-Fetch-Site": "cross-site"},
                          {"Origin": "https://attacker.example"}):
            refused = http.post(f"/inbox/sign-in/{link}", headers=elsewhere)
            assert refused.status_code == 403
            assert "another site" in refused.text
            assert "set-cookie" not in refused.headers
        used = http.post(f"/inbox/sign-in/{link}", headers={"Sec-Fetch-Site": "same-origin"})
        assert used.status_code == 303 and "layby_inbox=" in used.headers["set-cookie"]

        twice = http.get("/inbox", headers=[(TRUSTED_HEADER, BOB), (TRUSTED_HEADER, ALICE)])
        assert twice.status_code == 400
        assert "more than once" in twice.text

    with httpx.Client(base_url=base, timeout=30) as http:  # no session cookie sent
        hop = http.get("/inbox", headers={"Sec-Fetch-Site": "cross-site"})
        assert hop.status_code == 200
        assert '<meta http-equiv="refresh" content="0;url=/inbox">' in hop.text


def test_an_approval_that_counts_cannot_be_handed_on(inboxed: ReviewedSystem) -> None:
    """Bob approved a two-key launch in his inbox; handing it on to someone else then
    would let his approval count twice: refused, the approvals unchanged."""
    run_id, asks = parked(inboxed, "test.quorum", "rocket")
    base = inboxed.system.base_url
    with httpx.Client(base_url=base, timeout=30) as http:
        page = http.get("/inbox", headers={TRUSTED_HEADER: BOB})
        token = re.search(r'name="_csrf" value="([^"]+)"', page.text)
        assert token is not None
        ref = f"{run_id}/{asks}"
        approved = http.post("/inbox/answer", headers={TRUSTED_HEADER: BOB}, data={
            "_ref": ref, "_csrf": token.group(1), "decision": "approve"})
        assert approved.status_code == 303, approved.text
        handed = http.post("/inbox/answer", headers={TRUSTED_HEADER: BOB}, data={
            "_ref": ref, "_csrf": token.group(1), "_action": "delegate",
            "delegate_to": "mallory"})
        assert handed.status_code == 409
        assert "cannot be handed on" in handed.text
    run = inboxed.system.run(run_id)
    intr = next(i for i in run["interrupts"] if i["id"] == asks)
    assert [a["answeredBy"] for a in intr["approvals"]] == ["reviewer:bob"]
    assert intr["delegations"] == []


# -- the inbox's open ends: redirect after an answer, sign-in limits, ending sessions ------


def _csrf(page_text: str) -> str:
    found = re.search(r'name="_csrf" value="([^"]+)"', page_text)
    assert found is not None, page_text
    return found.group(1)


def test_an_answer_redirects_to_the_inbox_which_says_what_was_done_once(
        inboxed: ReviewedSystem) -> None:
    """Post/redirect/get: an answer is a 303 to the inbox, so a reload reads the list
    instead of posting the answer again; the inbox then says what was done, once, to that
    reviewer's session alone, and a notice nobody signed is not shown."""
    run_id, asks = parked(inboxed, "test.named", "bob")
    base = inboxed.system.base_url
    as_bob = {TRUSTED_HEADER: BOB}
    with httpx.Client(base_url=base, timeout=30) as http:
        token = _csrf(http.get("/inbox", headers=as_bob).text)
        done = http.post("/inbox/answer", headers=as_bob, data={
            "_ref": f"{run_id}/{asks}", "_csrf": token, "decision": "approve"})
        assert done.status_code == 303, done.text
        assert done.headers["location"] == "/inbox"
        flash = done.cookies["layby_inbox_flash"]
        assert "HttpOnly" in done.headers["set-cookie"]

        shown = http.get("/inbox", headers=as_bob)
        assert said(shown.text) == "You approved “Sign off on the quarterly audit?”."
        assert f'id="r-{asks}"' not in shown.text  # answered: no longer listed
        assert "layby_inbox_flash" not in http.cookies  # the notice is spent
        assert said(http.get("/inbox", headers=as_bob).text) is None

    # Another reviewer's request carrying Bob's notice, and a notice nobody signed.
    for cookie in (flash, flash[:-2] + "xx"):
        with httpx.Client(base_url=base, timeout=30,
                          cookies={"layby_inbox_flash": cookie}) as other:
            seen = other.get("/inbox", headers={TRUSTED_HEADER: ALICE})
            assert seen.status_code == 200
            assert said(seen.text) is None
    assert finished(inboxed, run_id)["status"] == "completed"


def said(page: str) -> str | None:
    """The inbox's notice of what was done, if it shows one."""
    found = re.search(r'<p class="ok" role="status">([^<]*)</p>', page)
    return found.group(1) if found else None


def _asked(http: httpx.Client, address: str) -> httpx.Response:
    return http.post("/inbox/sign-in", data={"email": address},
                     headers={"Sec-Fetch-Site": "same-origin"})


def test_sign_in_mails_are_limited_per_client_and_per_address(
        inboxed: ReviewedSystem) -> None:
    """At most 20 sign-in links asked for from one client and 5 for one address in ten
    minutes, known reviewer or not: then 429 saying so."""
    base = inboxed.system.base_url
    # Clients of their own: other loopback addresses than the other tests'.
    client = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(base_url=base, timeout=30, transport=client) as http:
        for n in range(20):
            assert _asked(http, f"nobody-{n}@example.com").status_code == 200, n
        refused = _asked(http, "nobody-20@example.com")
        assert refused.status_code == 429
        assert "too many sign-in links were asked for" in refused.text
        assert "wait ten minutes" in refused.text
    address = f"carol-{time.time_ns()}@example.com"  # one no other test asks for
    with httpx.Client(base_url=base, timeout=30,
                      transport=httpx.HTTPTransport(local_address="127.0.0.3")) as http:
        for n in range(5):  # however it is spelt
            assert _asked(http, address if n % 2 else address.upper()).status_code == 200
        assert _asked(http, address).status_code == 429
        assert _asked(http, "carol@example.com").status_code == 200  # another address
    with httpx.Client(base_url=base, timeout=30,
                      transport=httpx.HTTPTransport(local_address="127.0.0.4")) as http:
        assert _asked(http, address).status_code == 429  # the address's limit, elsewhere


@pytest.fixture
def revoked(inboxed: ReviewedSystem) -> Iterator[str]:
    """Mallory, whose sessions a test ends: the other tests' sessions of hers work again
    after it (the revocation forgotten, as it would be after the longest session)."""
    import redis

    yield "mallory"
    settings = inboxed.system.settings
    with redis.Redis.from_url(settings.redis_url or "") as client:
        client.delete(f"{settings.key_prefix}:seen:inbox-revoked:mallory")


def test_layby_inbox_revoke_ends_a_reviewers_sessions_and_links(
        inboxed: ReviewedSystem, revoked: str) -> None:
    """`layby inbox revoke ADDRESS` ends every session and sign-in link of the reviewer
    made until then, on the gateway already running; a new link signs them in again; the
    audit trail records who did it; an unknown address is refused, naming the directory."""
    base = inboxed.system.base_url
    keys = parse_keys(TOKEN_KEYS)
    session = signin.make(keys, "session", revoked, 3600)
    link = signin.make(keys, "link", revoked, 900)
    with httpx.Client(base_url=base, timeout=30, cookies={"layby_inbox": session}) as http:
        assert "Signed in as" in http.get("/inbox").text

        done = inboxed.system.layby("inbox", "revoke", MALLORY)
        assert done.returncode == 0, done.stderr
        assert "ended the inbox sessions and sign-in links of reviewer mallory" in done.stdout

        after = http.get("/inbox")
        assert after.status_code == 200
        assert "Sign in to your inbox" in after.text and "Signed in as" not in after.text
    with httpx.Client(base_url=base, timeout=30,
                      headers={"Sec-Fetch-Site": "same-origin"}) as http:
        old = http.post(f"/inbox/sign-in/{link}")
        assert old.status_code == 403
        assert "made before your sessions were ended" in old.text
        time.sleep(0.01)
        fresh = http.post(f"/inbox/sign-in/{signin.make(keys, 'link', revoked, 900)}")
        assert fresh.status_code == 303, fresh.text
        assert "Signed in as" in http.get("/inbox").text

    unknown = inboxed.system.layby("inbox", "revoke", "eve@example.com")
    assert unknown.returncode == 2
    assert "no reviewer 'eve@example.com' in the reviewer directory" in unknown.stderr
    trail = inboxed.system.layby("audit", "--since", "5m")
    assert trail.returncode == 0, trail.stderr
    [entry] = [e for e in map(json.loads, trail.stdout.splitlines())
               if e["action"] == "inbox.revoke"]
    assert entry["subject"] == "reviewer:mallory"
    assert entry["caller"].startswith("cli:")
    assert session not in trail.stdout and link not in trail.stdout
