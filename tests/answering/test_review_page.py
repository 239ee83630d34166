"""The review page in a real browser: a reviewer opens the link from the notification mail in
headless Chromium (JavaScript off, as in a locked-down mail client's browser) and answers on
the page, and the run records who answered, how and what.

Needs Debian's Chromium at /usr/bin/chromium (`apt-get install chromium`); Playwright drives
it, and no Playwright-downloaded browser is used.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, Response, sync_playwright

from layby.ops.embedded import EmbeddedRedis
from tests.support.agents import MARKUP_QUESTION
from tests.support.harness import wait_until
from tests.support.reviewers import (
    ReviewedSystem,
    SmtpServer,
    WebhookReceiver,
    link_in,
    own_reviewed,
)

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
TIMEOUT_MS = 30_000
ALICE = "alice@example.com"
BY_ALICE = "reviewer:alice"


# -- the browser ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: the review page tests drive Debian's Chromium "
                    "(`apt-get install chromium`); Playwright's own browsers are not used",
                    pytrace=False)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM),
                                              args=CHROMIUM_ARGS, timeout=60_000)
        yield launched
        launched.close()


@pytest.fixture
def new_page(browser: Browser) -> Iterator[Callable[..., Page]]:
    """Opens pages, each in a fresh browser context (its own cookies and history); scripts
    are off unless asked for."""
    contexts = []

    def make(js: bool = False) -> Page:
        context = browser.new_context(java_script_enabled=js)
        context.set_default_timeout(TIMEOUT_MS)
        context.set_default_navigation_timeout(2 * TIMEOUT_MS)
        contexts.append(context)
        return context.new_page()

    yield make
    for context in contexts:
        context.close()


@pytest.fixture
def page(new_page: Callable[..., Page]) -> Page:
    return new_page()


# -- what the reviewer does and sees -------------------------------------------------------


def visit(page: Page, url: str, status: int | None = 200) -> Response:
    """Open `url`; the page must come with `status` (None: any)."""
    response = page.goto(url)
    assert response is not None
    assert status is None or response.status == status, page.inner_text("body")
    return response


def press(page: Page, button: str, status: int | None = 200) -> Response:
    """Click a submit button and wait for the page the form POST brings back."""
    with page.expect_navigation() as navigation:
        page.click(button)
    response = navigation.value
    assert response is not None
    assert response.request.method == "POST"
    assert status is None or response.status == status, page.inner_text("body")
    return response


def headline(page: Page) -> str:
    return page.inner_text("h1").strip()


def text(page: Page) -> str:
    """What the page says, as one line per block and single spaces."""
    return re.sub(r"[ \t]+", " ", page.inner_text("body"))


def has_form(page: Page) -> bool:
    return page.locator("form").count() > 0


def choose(page: Page, value: str) -> None:
    page.locator(f'input[type=radio][value="{value}"]').check()


# -- what the run records ------------------------------------------------------------------


def parked(reviewed: ReviewedSystem, agent: str, text_in: str, open_count: int = 1
           ) -> dict[str, Any]:
    """Start a run and wait until it waits on `open_count` interrupts; returns the run."""
    run_id = reviewed.start_run(agent, text_in)["id"]

    def waiting() -> dict[str, Any] | None:
        run = reviewed.system.run(run_id)
        return run if len(reviewed.system.open_interrupts(run)) >= open_count else None
    return wait_until(waiting, 30, what=f"{agent} to park with {open_count} interrupt(s)")


def open_interrupt(reviewed: ReviewedSystem, run_id: str, after: set[str] = frozenset()
                   ) -> dict[str, Any]:
    """The run's open interrupt, waiting for one not in `after` (the next round)."""
    def fresh() -> dict[str, Any] | None:
        run = reviewed.system.run(run_id)
        return next((i for i in reviewed.system.open_interrupts(run) if i["id"] not in after),
                    None)
    return wait_until(fresh, 30, what=f"a new open interrupt on {run_id}")


def mail_for(reviewed: ReviewedSystem, run_id: str, interrupt_id: str) -> EmailMessage:
    """Alice's notification about one interrupt (its id is in the mail's footer)."""
    def found() -> EmailMessage | None:
        for mail in reviewed.smtp.mails_to(ALICE, run_id):
            body = mail.get_body(preferencelist=("plain",))
            if body is not None and interrupt_id in body.get_content():
                return mail
        return None
    return wait_until(found, 30, what=f"alice's mail about {interrupt_id}")


def interrupt(run: dict[str, Any], interrupt_id: str) -> dict[str, Any]:
    return next(i for i in run["interrupts"] if i["id"] == interrupt_id)


def answered_on_page(reviewed: ReviewedSystem, run_id: str, interrupt_id: str
                     ) -> dict[str, Any]:
    answer = interrupt(reviewed.system.run(run_id), interrupt_id).get("answer")
    assert answer is not None, "no answer recorded"
    assert answer["answeredBy"] == BY_ALICE
    assert answer["channel"] == "page"
    return answer


def still_waiting(reviewed: ReviewedSystem, run_id: str, interrupt_id: str) -> None:
    run = reviewed.system.run(run_id)
    assert run["status"] == "interrupted"
    assert interrupt(run, interrupt_id)["state"] == "open"
    assert interrupt(run, interrupt_id).get("answer") is None


def completed(reviewed: ReviewedSystem, run_id: str, result: str) -> dict[str, Any]:
    run = reviewed.system.wait_status(run_id, "completed", "failed", "cancelled", timeout=60)
    assert run["status"] == "completed", run.get("error")
    assert run["result"] == result
    return run


def transfers_of(reviewed: ReviewedSystem, run_id: str) -> list[dict[str, Any]]:
    return [t for t in reviewed.system.ledger()["transfers"] if t["run"] == run_id]


def _sent_notifications(reviewed: ReviewedSystem, run_id: str) -> int:
    """How many `notification.sent` events the run's stored events hold (read, not followed)."""
    with reviewed.system.api() as api:
        stream = api.get(f"/v1/runs/{run_id}/events", params={"follow": "false"}).text
    return stream.count("event: notification.sent")


def parked_transfer(reviewed: ReviewedSystem) -> tuple[str, str, EmailMessage]:
    run = parked(reviewed, "demo.transfer", "Send 250 to Bob")
    intr = reviewed.system.open_interrupts(run)[0]
    return run["id"], intr["id"], mail_for(reviewed, run["id"], intr["id"])


# -- each demo agent, answered on the page -------------------------------------------------


def test_transfer_approved_from_the_mails_approve_link(reviewed: ReviewedSystem,
                                                       page: Page) -> None:
    """Alice opens Approve in her mail: she sees who asks, what and the tool input, with
    Approve preselected; opening it records nothing; Approve with a note sends the money."""
    run_id, interrupt_id, mail = parked_transfer(reviewed)
    url = link_in(mail, "approve")
    assert url.endswith("?decision=approve")
    # The mail lands before its sender records it sent: the run's timeline (below) shows
    # both notifications once both are recorded.
    wait_until(lambda: _sent_notifications(reviewed, run_id) >= 2, 30,
               what=f"both notifications of {run_id} recorded as sent")

    response = visit(page, url)
    assert headline(page) == "Approval needed"
    meta = page.inner_text(".meta")
    assert "demo.transfer" in meta and "Alice Martin" in meta
    assert page.inner_text(".message").strip() == "Send 250 to Bob?"
    assert page.inner_text("dd code").strip() == "transfer_funds"
    shown = page.locator("dl.input").first
    assert [t.strip() for t in shown.locator("dt").all_inner_texts()] == ["To", "Amount"]
    assert [t.strip() for t in shown.locator("dd").all_inner_texts()] == ["Bob", "250"]
    assert "you chose Approve" in text(page)
    assert "chosen" in (page.get_attribute("button.approve", "class") or "")
    assert page.get_attribute("button.approve", "autofocus") is not None
    assert "chosen" not in (page.get_attribute("button.decline", "class") or "")
    assert response.headers["cache-control"] == "no-store"
    # What the run did so far, folded away: the step that parked, and whom it notified.
    page.click("details.timeline summary")
    rows = [[c.strip() for c in row.locator("td").all_inner_texts()]
            for row in page.locator("details.timeline tbody tr").all()]
    whats = [row[1] for row in rows]
    assert whats[:3] == ["created", "step", "parked"], rows
    parked = rows[2]
    assert parked[2] == f"waits for {interrupt_id} (confirmation)" and parked[3].endswith("ms")
    notified = {row[4] for row in rows if row[1] == "notified"}
    assert "alice via email" in notified, rows

    # A mail scanner (or Alice) opening the link twice: still nothing recorded.
    visit(page, url)
    still_waiting(reviewed, run_id, interrupt_id)
    assert transfers_of(reviewed, run_id) == []

    page.fill("#f-note", "Rent for March")
    press(page, "button.approve")
    assert headline(page) == "Thank you"
    assert "you approved this request" in text(page)
    assert "Note: Rent for March" in text(page)
    assert not has_form(page)

    completed(reviewed, run_id, "Sent 250 to Bob.")
    answer = answered_on_page(reviewed, run_id, interrupt_id)
    assert answer["payload"] == {"approved": True, "note": "Rent for March"}
    assert [(t["to"], t["amount"]) for t in transfers_of(reviewed, run_id)] == [("Bob", 250)]


def test_transfer_declined_from_the_mails_decline_link(reviewed: ReviewedSystem,
                                                       page: Page) -> None:
    """The Decline link preselects Decline; declining with a reason sends no money."""
    run_id, interrupt_id, mail = parked_transfer(reviewed)
    visit(page, link_in(mail, "decline"))
    assert "you chose Decline" in text(page)
    assert "chosen" in (page.get_attribute("button.decline", "class") or "")
    assert "chosen" not in (page.get_attribute("button.approve", "class") or "")
    still_waiting(reviewed, run_id, interrupt_id)

    page.fill("#f-note", "Not this month")
    press(page, "button.decline")
    assert headline(page) == "Thank you"
    assert "you declined this request" in text(page)
    assert "Note: Not this month" in text(page)

    completed(reviewed, run_id, "The transfer was not approved; no money was sent.")
    answer = answered_on_page(reviewed, run_id, interrupt_id)
    assert answer["payload"] == {"approved": False, "note": "Not this month"}
    assert transfers_of(reviewed, run_id) == []


@pytest.mark.parametrize("js", [False, True], ids=["scripts-off", "scripts-on"])
def test_trivia_answered_by_picking_a_radio(reviewed: ReviewedSystem,
                                            new_page: Callable[..., Page], js: bool) -> None:
    """The question shows its four choices as radios; picking Jaws is right. The page works
    the same with scripts on, and then reports no errors (nothing the page's policy blocks)."""
    page = new_page(js=js)
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    run = parked(reviewed, "demo.trivia", "quiz me")
    intr = reviewed.system.open_interrupts(run)[0]
    mail = mail_for(reviewed, run["id"], intr["id"])

    visit(page, link_in(mail, "review"))
    assert headline(page) == "Your answer is needed"
    assert "Don't go in the water" in page.inner_text(".message")
    # What was observed: the input showed as escaped JSON ({"question": …, "choices": […]}).
    # Now each field is a labelled row, and the choices a list.
    shown = page.locator("dl.input").first
    assert [t.strip() for t in shown.locator(":scope > dt").all_inner_texts()] == ["Question",
                                                                            "Choices"]
    assert shown.locator("ul.input > li").all_inner_texts() == [
        "Jaws", "Alien", "Star Wars", "Close Encounters of the Third Kind"]
    assert "{" not in shown.inner_text() and '["Jaws"' not in shown.inner_text()
    radios = page.locator("input[type=radio][name=payload]")
    assert [radios.nth(i).get_attribute("value") for i in range(radios.count())] == [
        "Jaws", "Alien", "Star Wars", "Close Encounters of the Third Kind"]
    assert page.get_by_label("Jaws", exact=True).is_visible()

    page.get_by_label("Jaws", exact=True).check()
    press(page, "button[type=submit].primary")
    assert headline(page) == "Thank you"
    assert "Your answer was recorded." in text(page)
    assert page.inner_text("pre.answer").strip() == "Jaws"

    completed(reviewed, run["id"], "Right! It was Jaws (1975).")
    assert answered_on_page(reviewed, run["id"], intr["id"])["payload"] == "Jaws"
    assert problems == []


def test_the_mail_catcher_shows_the_html_mail_and_its_links_open_the_review_page(
        reviewed: ReviewedSystem, isolated: Callable[..., Any], tmp_path: Path,
        new_page: Callable[..., Page]) -> None:
    """What was observed: the local mail pages (`/mail`) showed only the plain-text part, so
    the Approve and Decline buttons were not clickable. Now the HTML part is shown in a
    sandboxed frame (no scripts, an origin of its own), and its Approve button opens the
    review page in a new tab, where it works."""
    run_id, interrupt_id, mail = parked_transfer(reviewed)
    folder = tmp_path / "caught"
    folder.mkdir()
    (folder / f"{time.time_ns():020d}.eml").write_bytes(mail.as_bytes())
    catcher = isolated(LAYBY_MAIL_CATCHER_DIR=str(folder)).start()
    page = new_page()

    visit(page, f"{catcher.base_url}/mail")
    page.get_by_role("link", name=str(mail["Subject"])).click()
    frame = page.locator("iframe.mail")
    sandbox = set((frame.get_attribute("sandbox") or "").split())
    assert sandbox == {"allow-popups", "allow-popups-to-escape-sandbox"}, sandbox
    inside = page.frame_locator("iframe.mail")
    approve = inside.get_by_role("link", name="Approve", exact=True)
    assert approve.is_visible()
    assert approve.get_attribute("href") == link_in(mail, "decision=approve")
    assert inside.get_by_role("link", name="Decline", exact=True).is_visible()
    assert "Send 250 to Bob?" in inside.locator("body").inner_text()

    with page.expect_popup() as opened:
        approve.click()
    review = opened.value
    review.wait_for_load_state()
    assert headline(review) == "Approval needed"
    assert "you chose Approve" in text(review)
    still_waiting(reviewed, run_id, interrupt_id)
    press(review, "button.approve")
    assert headline(review) == "Thank you" and "you approved this request" in text(review)
    completed(reviewed, run_id, "Sent 250 to Bob.")
    assert answered_on_page(reviewed, run_id, interrupt_id)["payload"] == {"approved": True}


def test_parallel_two_mails_two_pages(reviewed: ReviewedSystem,
                                      new_page: Callable[..., Page]) -> None:
    """One turn asks a question and a transfer approval: Alice gets two mails and answers
    each on its own page; the run goes on once both are answered."""
    run = parked(reviewed, "demo.parallel", "pay Carol", open_count=2)
    run_id = run["id"]
    opened = {i["toolName"]: i for i in reviewed.system.open_interrupts(run)}
    question, confirmation = opened["ask_question"], opened["transfer_funds"]
    question_page, confirmation_page = new_page(), new_page()
    # Both pages opened before either is answered, as from two mails side by side.
    visit(question_page, link_in(mail_for(reviewed, run_id, question["id"]), "review"))
    visit(confirmation_page, link_in(mail_for(reviewed, run_id, confirmation["id"]),
                                     "approve"))
    assert "Which account should we pay from?" in question_page.inner_text(".message")
    assert confirmation_page.inner_text(".message").strip() == "Send 40 to Carol?"

    choose(question_page, "main")
    press(question_page, "button.primary")
    assert headline(question_page) == "Thank you"
    still_waiting(reviewed, run_id, confirmation["id"])

    press(confirmation_page, "button.approve")
    assert headline(confirmation_page) == "Thank you", text(confirmation_page)
    assert "you approved this request" in text(confirmation_page)

    completed(reviewed, run_id, "Paying from main; transfer sent; balance was 1000.")
    assert answered_on_page(reviewed, run_id, question["id"])["payload"] == "main"
    assert answered_on_page(reviewed, run_id, confirmation["id"])["payload"] == {
        "approved": True}


def test_bbq_three_rounds_one_page_each(reviewed: ReviewedSystem,
                                        new_page: Callable[..., Page]) -> None:
    """Three questions one after another, each in its own mail: a free-text field first,
    then two sets of radios. Afterwards the first mail's link shows that round answered."""
    run = parked(reviewed, "demo.bbq", "plan a bbq")
    run_id, links = run["id"], {}
    for answer, control in (("12", "text"), ("vegetarian", "radio"), ("charcoal", "radio")):
        intr = open_interrupt(reviewed, run_id, after=set(links))
        links[intr["id"]] = link_in(mail_for(reviewed, run_id, intr["id"]), "review")
        page = new_page()
        visit(page, links[intr["id"]])
        assert headline(page) == "Your answer is needed"
        assert page.inner_text(".message").strip() == intr["message"]
        if control == "text":
            assert page.locator("input[type=radio]").count() == 0
            page.fill("#f-payload", answer)
        else:
            choose(page, answer)
        press(page, "button.primary")
        assert headline(page) == "Thank you"
        assert page.inner_text("pre.answer").strip() == answer
        assert answered_on_page(reviewed, run_id, intr["id"])["payload"] == answer

    completed(reviewed, run_id, "BBQ plan: 12 guests, vegetarian menu, on a charcoal grill. "
                                "Light it an hour before they arrive.")
    first_round = new_page()
    visit(first_round, next(iter(links.values())))
    assert headline(first_round) == "Already answered"
    assert first_round.inner_text("pre.answer").strip() == "12"
    assert not has_form(first_round)


def test_expiring_request_approved_in_time(reviewed: ReviewedSystem, page: Page) -> None:
    """A request that expires shows when; approved before then, the deployment goes ahead."""
    run = parked(reviewed, "demo.expiring", "deploy")
    intr = reviewed.system.open_interrupts(run)[0]
    visit(page, link_in(mail_for(reviewed, run["id"], intr["id"]), "approve"))
    assert headline(page) == "Approval needed"
    assert page.inner_text(".message").strip() == "Deploy v2.0 to production?"
    assert "Expires" in page.inner_text("dl")
    assert page.get_attribute("dl time", "datetime") == intr["expiresAt"]

    press(page, "button.approve")
    assert "you approved this request" in text(page)
    completed(reviewed, run["id"], "Deployed v2.0.")
    assert answered_on_page(reviewed, run["id"], intr["id"])["payload"] == {"approved": True}


# -- a wrong answer ------------------------------------------------------------------------


def test_a_wrong_answer_is_shown_beside_the_field_and_nothing_is_recorded(
        reviewed: ReviewedSystem, page: Page) -> None:
    """bbq's first question left empty: the browser itself will not send it (the field is
    required); blanks get through and come back (422) with the error beside the field,
    what was typed kept and nothing recorded; a real answer then goes through."""
    run = parked(reviewed, "demo.bbq", "plan a bbq")
    intr = reviewed.system.open_interrupts(run)[0]
    url = link_in(mail_for(reviewed, run["id"], intr["id"]), "review")
    visit(page, url)
    assert page.get_attribute("#f-payload", "required") is not None

    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    page.click("button.primary")  # empty: the browser refuses to submit
    page.wait_for_timeout(1000)
    assert posts == []
    assert page.locator("#f-payload:invalid").count() == 1
    assert page.locator(".errors").count() == 0
    still_waiting(reviewed, run["id"], intr["id"])

    page.fill("#f-payload", "   ")
    press(page, "button.primary", status=422)
    assert headline(page) == "Your answer is needed"
    assert "Your answer was not recorded" in page.inner_text(".errors")
    assert page.inner_text("#f-payload-error").strip() == "Your answer is required."
    assert page.get_attribute("#f-payload", "aria-invalid") == "true"
    assert "f-payload-error" in (page.get_attribute("#f-payload", "aria-describedby") or "")
    assert page.input_value("#f-payload") == "   "
    still_waiting(reviewed, run["id"], intr["id"])

    # A client that skips the browser's checks and posts nothing at all: the same refusal.
    posted = httpx.post(url, data={"payload": ""}, timeout=30)
    assert posted.status_code == 422
    assert "Your answer is required." in posted.text
    still_waiting(reviewed, run["id"], intr["id"])

    page.fill("#f-payload", "12")
    press(page, "button.primary")
    assert headline(page) == "Thank you"
    assert answered_on_page(reviewed, run["id"], intr["id"])["payload"] == "12"
    with reviewed.system.api() as api:  # the rest of the bbq is not this test's business
        api.post(f"/v1/runs/{run['id']}/cancel")


# -- an answered request -------------------------------------------------------------------


def test_an_answered_request_says_so_and_a_stale_form_changes_nothing(
        reviewed: ReviewedSystem, new_page: Callable[..., Page]) -> None:
    """Two pages on one link: the first approves; the second, opened earlier, is refused
    (409) saying who approved, how and when; reopening the link shows the same, no form."""
    run_id, interrupt_id, mail = parked_transfer(reviewed)
    url = link_in(mail, "approve")
    first, earlier = new_page(), new_page()
    visit(earlier, url)
    visit(first, url)
    first.fill("#f-note", "first")
    press(first, "button.approve")
    completed(reviewed, run_id, "Sent 250 to Bob.")
    recorded = answered_on_page(reviewed, run_id, interrupt_id)

    earlier.fill("#f-note", "second thoughts")
    press(earlier, "button.decline", status=409)
    assert headline(earlier) == "Already approved"
    said = text(earlier)
    assert re.search(r"This request was already approved by reviewer:alice via page at "
                     r"\d\d \w{3} \d{4}, \d\d:\d\d:\d\d UTC\.", said), said
    assert "Note: first" in said
    assert not has_form(earlier)
    assert answered_on_page(reviewed, run_id, interrupt_id) == recorded
    assert len(transfers_of(reviewed, run_id)) == 1

    again = new_page()
    visit(again, url)
    assert headline(again) == "Already approved"
    assert "already approved by reviewer:alice via page at" in text(again)
    assert again.get_attribute("time", "datetime") is not None
    assert not has_form(again)

    # Back from the thank-you page: the page is not cached (no-store), so the browser asks
    # again and shows it answered; should a browser keep the old form, resending it fails.
    first.go_back()
    if has_form(first):
        press(first, "button.approve", status=409)
    assert headline(first) == "Already approved"
    assert not has_form(first)
    assert answered_on_page(reviewed, run_id, interrupt_id) == recorded


# -- an expired request --------------------------------------------------------------------


@pytest.fixture
def quick_expiry(reviewer_redis: EmbeddedRedis, tmp_path: Path) -> Iterator[ReviewedSystem]:
    """A reviewed system of its own whose demo requests expire after 10 seconds (time
    enough to open the page before, on a loaded machine)."""
    with own_reviewed(reviewer_redis, tmp_path, 7, SmtpServer().start(),
                      WebhookReceiver().start(), LAYBY_DEMO_EXPIRY_S="10") as rs:
        yield rs


def test_an_expired_request_says_it_expired(quick_expiry: ReviewedSystem,
                                            new_page: Callable[..., Page]) -> None:
    """Alice is too late: a page she opened in time no longer takes her answer, and the
    link says the request expired, without a form."""
    run = parked(quick_expiry, "demo.expiring", "deploy")
    intr = quick_expiry.system.open_interrupts(run)[0]
    url = link_in(mail_for(quick_expiry, run["id"], intr["id"]), "approve")
    in_time = new_page()
    visit(in_time, url)
    assert has_form(in_time)
    assert "Expires" in in_time.inner_text("dl")

    done = quick_expiry.system.wait_status(run["id"], "completed", timeout=60)
    assert re.fullmatch(r"The deployment was not approved in time \(no answer before "
                        r"\S+\); nothing was deployed\.", done["result"]), done["result"]
    stale = press(in_time, "button.approve", status=None)
    late = new_page()
    shown = visit(late, url, status=None)

    # Nothing was recorded from the pages and they offer no form.
    assert not has_form(in_time) and not has_form(late)
    expired = interrupt(quick_expiry.system.run(run["id"]), intr["id"])
    assert expired["state"] == "expired"
    assert (expired.get("answer") or {}).get("channel") != "page"
    assert shown.status == 200
    assert headline(late) == "This request has expired"
    assert "This request expired at" in text(late)
    assert "It was declined automatically." in text(late)
    assert stale.status == 409
    assert headline(in_time) == "This request has expired"


# -- bad links -----------------------------------------------------------------------------


def forged(token: str) -> str:
    kid, ref, signature = token.split("-")
    return f"{kid}-{ref}-{signature[:-1]}{'a' if signature[-1] != 'a' else 'b'}"


@pytest.mark.parametrize("damage, reason", [
    ("forged", "signature does not match"),
    ("unknown", "unknown or has expired"),
    ("garbage", "does not hold a valid layby token"),
    ("cut short", "does not hold a valid layby token"),
    ("cut after /review/", "does not hold a valid layby token"),
    ("retired key", "key layby no longer accepts"),
])
def test_a_bad_link_is_refused_without_showing_the_request(
        reviewed: ReviewedSystem, page: Page, damage: str, reason: str) -> None:
    """A forged, unknown, garbled, cut-short or retired-key link: a refusal page (403)
    saying why and what to do, and nothing of the request behind it."""
    run_id, interrupt_id, mail = parked_transfer(reviewed)
    url = link_in(mail, "review").split("?")[0]
    base, token = url.rsplit("/", 1)
    bad = {"forged": forged(token), "unknown": "t2-" + "a" * 16 + "-" + "b" * 16,
           "garbage": "%3Cb%3Enot-a-token%3C%2Fb%3E", "cut short": token[:-6],
           "cut after /review/": "",
           "retired key": "zz-" + token.split("-", 1)[1]}[damage]

    visit(page, f"{base}/{bad}", status=403)
    assert headline(page) == "This link cannot be used"
    said = text(page)
    assert reason in page.inner_text("[role=alert]")
    assert "ask for a new link" in said
    for hidden in ("Send 250 to Bob", "transfer_funds", "demo.transfer", "Alice", "Bob",
                   "not-a-token"):
        assert hidden not in said
    assert not has_form(page)

    refused = httpx.post(f"{base}/{bad}", data={"decision": "approve"}, timeout=30)
    assert refused.status_code == 403
    assert "This link cannot be used" in refused.text
    still_waiting(reviewed, run_id, interrupt_id)
    with reviewed.system.api() as api:
        api.post(f"/v1/runs/{run_id}/cancel")


# -- a cancelled run -----------------------------------------------------------------------


def test_a_cancelled_runs_link_says_it_is_over(reviewed: ReviewedSystem,
                                              new_page: Callable[..., Page]) -> None:
    """The run is cancelled while Alice has the page open: the link says the request is
    closed, and her answer from the open page is refused."""
    run_id, interrupt_id, mail = parked_transfer(reviewed)
    url = link_in(mail, "approve")
    before = new_page()
    visit(before, url)
    with reviewed.system.api() as api:
        assert api.post(f"/v1/runs/{run_id}/cancel").status_code == 200
    assert reviewed.system.wait_status(run_id, "cancelled")["status"] == "cancelled"

    after = new_page()
    visit(after, url)
    assert headline(after) == "This request is closed"
    assert "the run it belongs to was cancelled or has finished" in text(after)
    assert not has_form(after)

    press(before, "button.approve", status=409)
    assert headline(before) == "This request is closed"
    assert interrupt(reviewed.system.run(run_id), interrupt_id).get("answer") is None
    assert transfers_of(reviewed, run_id) == []


# -- the HTML itself -----------------------------------------------------------------------


def assert_private(response: httpx.Response | Response) -> None:
    headers = {k.lower(): v for k, v in response.headers.items()}
    assert headers["cache-control"] == "no-store"
    assert headers["referrer-policy"] == "no-referrer"
    assert headers["x-frame-options"] == "DENY"
    assert "default-src 'none'" in headers["content-security-policy"]


def test_pages_carry_no_script_and_private_headers_and_escape_everything(
        reviewed: ReviewedSystem, page: Page) -> None:
    """A request full of HTML shows as the literal text it is, on every page (open, thanks,
    answered, refused): no script anywhere, never cached, never sent as a referrer."""
    run = parked(reviewed, "test.markup", "go")
    intr = reviewed.system.open_interrupts(run)[0]
    url = link_in(mail_for(reviewed, run["id"], intr["id"]), "review")

    raw = httpx.get(url, timeout=30)
    assert raw.status_code == 200
    assert_private(raw)
    assert "<script" not in raw.text.lower()
    assert "&lt;script&gt;alert(" in raw.text and "&lt;b&gt;bold&lt;/b&gt;" in raw.text

    assert_private(visit(page, url))
    assert page.inner_text(".message").strip() == MARKUP_QUESTION
    assert page.locator("script").count() == 0
    assert page.locator(".message b, .message script").count() == 0
    assert page.locator("label.choice b").count() == 0
    assert page.get_by_label("<b>yes</b>", exact=True).count() == 1

    page.get_by_label("<b>yes</b>", exact=True).check()
    assert_private(press(page, "button.primary"))
    assert page.inner_text("pre.answer").strip() == "<b>yes</b>"
    assert page.locator("script, pre.answer b").count() == 0
    completed(reviewed, run["id"], "You chose <b>yes</b>.")

    answered = httpx.get(url, timeout=30)
    assert_private(answered)
    assert "<script" not in answered.text.lower()
    assert "&lt;b&gt;yes&lt;/b&gt;" in answered.text

    refused = httpx.get(url.rsplit("/", 1)[0] + "/nonsense", timeout=30)
    assert refused.status_code == 403
    assert_private(refused)
    assert "<script" not in refused.text.lower()
