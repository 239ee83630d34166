"""Review forms and the review page, in process: schemas to forms, posted forms to answers,
and the HTML a reviewer reads (parsed, not grepped)."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

import pytest

from layby.answering.forms import (
    Field,
    Form,
    entry_from_form,
    form_for,
    input_fields,
    input_from_form,
)
from layby.answering.pages import render_review
from layby.demo.agents import TRIVIA_CHOICES, Approval
from layby.errors import Invalid
from layby.generation.interrupts import Interrupt, OnExpire
from layby.http.errors import status_of
from layby.reviewers.schemas import is_confirmation
from layby.wire import Answer, InterruptView

APPROVAL = Approval.model_json_schema()
# tests/support/agents.py's two_approvals: a bare object, then a sign-off that must be `true`.
BARE_OBJECT = {"type": "object"}
SIGN_OFF = {"type": "object", "properties": {"second": {"const": True}}, "required": ["second"]}
# What the demo's ask_question sends, with and without choices.
TRIVIA = {"type": "string", "enum": TRIVIA_CHOICES}
FREE_TEXT = {"type": "string", "minLength": 1}

ORDER = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 50, "title": "Customer name"},
        "notes": {"type": "string", "description": "Anything the kitchen should know"},
        "guests": {"type": "integer", "minimum": 1, "maximum": 40},
        "budget": {"type": "number"},
        "outdoor": {"type": "boolean", "default": True},
        "grill": {"type": "string", "enum": ["charcoal", "gas"]},
        "tables": {"enum": [1, 2, 3]},
        "menu": {"type": "object"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "nickname": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        "checked": {"const": True},
        "version": {"const": 2},
    },
    "required": ["name", "guests", "grill", "checked"],
}


def interrupt(schema: dict[str, Any] | None, reason: str = "input_required",
              **extra: Any) -> Interrupt:
    return Interrupt(id="int_1", reason=reason, tool_call_id="call_1", tool_name="ask",
                     mode="respond", response_schema=schema, **extra)


def view(schema: dict[str, Any] | None = APPROVAL, reason: str = "confirmation",
         state: str = "open", answer: Answer | None = None, **extra: Any) -> InterruptView:
    fields: dict[str, Any] = {
        "message": "Send 250 to Bob?", "tool_name": "transfer_funds",
        "tool_input": {"to": "Bob", "amount": 250}, "mode": "restart",
        "expires_at": "2025-06-01T12:00:00Z"} | extra
    return InterruptView(id="int_1", reason=reason, tool_call_id="call_1",
                         response_schema=schema, state=state, answer=answer, **fields)


def answer(payload: Any = None, status: str = "resolved", state: str = "resolved",
           by: str = "alice", channel: str = "email",
           metadata: dict[str, Any] | None = None) -> Answer:
    return Answer(interrupt_id="int_1", status=status, payload=payload, metadata=metadata,
                  state=state, answered_by=by, channel=channel,
                  answered_at="2025-06-01T11:30:00Z")


def fields(form: Form) -> dict[str, Field]:
    return {f.name: f for f in form.fields}


def errors_of(exc: pytest.ExceptionInfo[Invalid]) -> dict[str, str]:
    return {e["path"]: e["message"] for e in exc.value.detail["errors"]}


class Page(HTMLParser):
    """The parts of a page the tests look at: elements with attributes, text, textareas."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.textareas: dict[str, str] = {}
        self._parts: list[str] = []
        self._open: list[str] = []
        self._textarea: str | None = None
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))
        if tag in ("style", "title", "textarea"):
            self._open.append(tag)
        if tag == "textarea":
            self._textarea = dict(attrs)["name"]
            self.textareas[self._textarea] = ""

    def handle_endtag(self, tag: str) -> None:
        if self._open and self._open[-1] == tag:
            self._open.pop()
        if tag == "textarea":
            self._textarea = None

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self.textareas[self._textarea] += data
        if not self._open:  # what a reader sees in the page body
            self._parts.append(data)

    @property
    def text(self) -> str:
        return " ".join("".join(self._parts).split())

    def find(self, tag: str, **attrs: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.elements
                if t == tag and all(a.get(k.rstrip("_")) == v for k, v in attrs.items())]

    def one(self, tag: str, **attrs: str) -> dict[str, str | None]:
        found = self.find(tag, **attrs)
        assert len(found) == 1, (tag, attrs, found)
        return found[0]


# -- form_for ------------------------------------------------------------------------------

def test_demo_question_with_choices_is_one_radio_group() -> None:
    form = form_for(interrupt(TRIVIA))
    assert form.kind == "fields"
    [field] = form.fields
    assert (field.name, field.kind, field.required) == ("payload", "radio", True)
    assert field.choices == TRIVIA_CHOICES


def test_demo_free_text_question_is_one_textarea() -> None:
    [field] = form_for(interrupt(FREE_TEXT)).fields
    assert (field.name, field.kind, field.required) == ("payload", "textarea", True)


def test_demo_approval_is_a_confirmation_with_a_note() -> None:
    intr = interrupt(APPROVAL, reason="confirmation")
    form = form_for(intr)
    assert is_confirmation(intr)
    assert form.kind == "confirmation" and form.decision is None
    [note] = form.fields
    assert (note.name, note.kind, note.required) == ("note", "textarea", False)


def test_a_schema_with_approved_is_a_confirmation_whatever_the_reason() -> None:
    assert form_for(interrupt(APPROVAL, reason="acme:sign_off")).kind == "confirmation"


@pytest.mark.parametrize("schema", [None, BARE_OBJECT, SIGN_OFF])
def test_confirmations_without_approved_offer_a_reason(schema: dict[str, Any] | None) -> None:
    form = form_for(interrupt(schema, reason="confirmation"))
    assert form.kind == "confirmation"
    # The sign-off constant is not asked for: pressing Approve is the sign-off.
    assert [(f.name, f.kind) for f in form.fields] == [("reason", "textarea")]


def test_a_link_decision_preselects_a_button_and_junk_is_ignored() -> None:
    intr = interrupt(APPROVAL, reason="confirmation")
    assert form_for(intr, "approve").decision == "approve"
    assert form_for(intr, "decline").decision == "decline"
    assert form_for(intr, "<b>yes</b>").decision is None
    assert form_for(interrupt(TRIVIA), "approve").decision is None


def test_a_confirmation_whose_answer_cannot_be_an_object_asks_for_the_value() -> None:
    form = form_for(interrupt({"type": "string"}, reason="confirmation"))
    assert form.kind == "fields" and form.fields[0].name == "payload"


def test_object_properties_become_one_field_each() -> None:
    form = form_for(interrupt(ORDER))
    assert form.kind == "fields"
    got = fields(form)
    assert {name: f.kind for name, f in got.items()} == {
        "name": "text", "notes": "textarea", "guests": "integer", "budget": "number",
        "outdoor": "radio", "grill": "radio", "tables": "radio", "menu": "json",
        "tags": "json", "nickname": "textarea", "checked": "checkbox"}
    assert "version" not in got  # a fixed value: nothing to ask
    assert got["name"].label == "Customer name"
    assert got["notes"].description == "Anything the kitchen should know"
    assert got["outdoor"].choices == ["yes", "no"] and got["outdoor"].value == "yes"
    assert got["tables"].choices == ["1", "2", "3"]
    assert {n for n, f in got.items() if f.required} == {"name", "guests", "grill", "checked"}


@pytest.mark.parametrize(("schema", "kind"), [
    ({"type": "integer"}, "integer"),
    ({"type": "number"}, "number"),
    ({"type": "boolean"}, "radio"),
    ({"type": "string", "maxLength": 80}, "text"),
    ({"type": "array"}, "json"),
    (BARE_OBJECT, "json"),
    (None, "json"),
])
def test_a_non_object_answer_is_a_single_payload_field(schema: dict[str, Any] | None,
                                                       kind: str) -> None:
    [field] = form_for(interrupt(schema)).fields
    assert (field.name, field.kind, field.required) == ("payload", kind, True)


# -- entry_from_form: answers --------------------------------------------------------------

def test_posted_strings_convert_to_the_schema_types() -> None:
    entry = entry_from_form(interrupt(ORDER), {
        "name": "  Ada ", "notes": "line one\r\nline two", "guests": "12", "budget": "99.5",
        "outdoor": "no", "grill": "gas", "tables": "2", "menu": '{"main": "ribs"}',
        "tags": '["family"]', "nickname": "", "checked": "true", "csrf": "ignored"})
    assert entry.interrupt_id == "int_1" and entry.status == "resolved"
    assert entry.payload == {
        "name": "Ada", "notes": "line one\nline two", "guests": 12, "budget": 99.5,
        "outdoor": False, "grill": "gas", "tables": 2, "menu": {"main": "ribs"},
        "tags": ["family"], "checked": True, "version": 2}


def test_empty_optional_fields_are_left_out() -> None:
    entry = entry_from_form(interrupt(ORDER), {"name": "Ada", "guests": "3", "grill": "gas",
                                               "checked": "on", "budget": " ", "menu": ""})
    assert entry.payload == {"name": "Ada", "guests": 3, "grill": "gas", "checked": True,
                             "version": 2}


@pytest.mark.parametrize(("schema", "raw", "expected"), [
    (TRIVIA, "Jaws", "Jaws"),
    (FREE_TEXT, " 12 people ", "12 people"),
    ({"type": "integer"}, "7", 7),
    ({"type": "integer"}, "7.0", 7),
    ({"type": "number"}, "3", 3),
    ({"type": "number"}, "-2.5", -2.5),
    ({"type": "boolean"}, "yes", True),
    ({"type": "array"}, "[1, 2]", [1, 2]),
    (None, '{"a": 1}', {"a": 1}),
    (None, "just text", "just text"),  # no schema: plain text is an answer, as in the CLI
])
def test_single_payload_answers(schema: dict[str, Any] | None, raw: str, expected: Any) -> None:
    entry = entry_from_form(interrupt(schema), {"payload": raw})
    assert entry.status == "resolved" and entry.payload == expected


# -- entry_from_form: refusals -------------------------------------------------------------

def test_values_that_do_not_convert_are_refused_naming_the_field() -> None:
    with pytest.raises(Invalid) as exc:
        entry_from_form(interrupt(ORDER), {
            "name": "Ada", "guests": "abc", "budget": "nan", "grill": "propane",
            "menu": "{main: ribs}", "checked": "true"})
    assert status_of(exc.value) == 422
    errors = errors_of(exc)
    assert set(errors) == {"/guests", "/budget", "/grill", "/menu"}
    assert errors["/guests"] == "Guests: 'abc' is not a whole number"
    assert errors["/budget"].startswith("Budget: ")
    assert errors["/grill"] == "Grill: 'propane' is not one of the choices (charcoal, gas)"
    assert errors["/menu"].startswith("Menu: not valid JSON")
    assert "Guests" in exc.value.message and "Menu" in exc.value.message


def test_missing_required_fields_are_refused() -> None:
    with pytest.raises(Invalid) as exc:
        entry_from_form(interrupt(ORDER), {"guests": "3"})
    assert errors_of(exc) == {"/name": "Customer name is required.",
                              "/grill": "Grill is required.",
                              "/checked": "Checked must be ticked."}


def test_schema_rules_are_checked_and_name_the_field() -> None:
    with pytest.raises(Invalid) as exc:
        entry_from_form(interrupt(ORDER), {"name": "Ada", "guests": "41", "grill": "gas",
                                           "checked": "true", "tags": "[1]"})
    errors = errors_of(exc)
    assert errors["/guests"] == "Guests: 41 is greater than the maximum of 40"
    assert errors["/tags/0"].startswith("Tags: 1 is not of type 'string'")


def test_a_single_payload_error_points_at_the_payload_field() -> None:
    with pytest.raises(Invalid) as exc:
        entry_from_form(interrupt({"type": "string", "minLength": 3}), {"payload": "ab"})
    assert errors_of(exc) == {"/payload": "Your answer: 'ab' is too short"}
    with pytest.raises(Invalid) as exc:
        entry_from_form(interrupt(FREE_TEXT), {"payload": "  "})
    assert errors_of(exc) == {"/payload": "Your answer is required."}
    with pytest.raises(Invalid) as exc:
        entry_from_form(interrupt({"type": "array"}), {"payload": "[1,"})
    assert errors_of(exc)["/payload"].startswith("Your answer: not valid JSON")
    with pytest.raises(Invalid) as exc:
        entry_from_form(interrupt(TRIVIA), {"payload": "Jurassic Park"})
    assert list(errors_of(exc)) == ["/payload"]


# -- entry_from_form: confirmations --------------------------------------------------------

def test_approval_schema_approve_and_decline_are_answers() -> None:
    intr = interrupt(APPROVAL, reason="confirmation")
    entry = entry_from_form(intr, {"decision": "approve", "note": "go ahead"})
    assert (entry.status, entry.payload) == ("resolved", {"approved": True, "note": "go ahead"})
    entry = entry_from_form(intr, {"decision": "decline", "note": ""})
    assert (entry.status, entry.payload) == ("resolved", {"approved": False})


def test_confirmation_without_approved_declines_by_cancelling() -> None:
    intr = interrupt(None, reason="confirmation")
    entry = entry_from_form(intr, {"decision": "decline", "reason": "wrong account"})
    assert entry.status == "cancelled" and entry.payload is None
    assert entry.metadata == {"reason": "wrong account"}
    assert entry_from_form(intr, {"decision": "decline"}).metadata is None
    entry = entry_from_form(intr, {"decision": "approve", "reason": "checked with Bob"})
    # The same payload `layby runs answer --approve` sends.
    assert (entry.status, entry.payload) == ("resolved", {"approved": True})
    assert entry.metadata == {"note": "checked with Bob"}


def test_approving_a_sign_off_fills_in_its_constant() -> None:
    entry = entry_from_form(interrupt(SIGN_OFF, reason="confirmation"), {"decision": "approve"})
    assert entry.payload == {"second": True, "approved": True}
    entry = entry_from_form(interrupt(BARE_OBJECT, reason="confirmation"),
                            {"decision": "approve"})
    assert entry.payload == {"approved": True}


def test_a_closed_schema_gets_no_extra_approved_key() -> None:
    closed = SIGN_OFF | {"additionalProperties": False}
    entry = entry_from_form(interrupt(closed, reason="confirmation"), {"decision": "approve"})
    assert entry.payload == {"second": True}


@pytest.mark.parametrize("posted", [{}, {"decision": "maybe"}, {"note": "hi"}])
def test_a_confirmation_needs_a_decision(posted: dict[str, str]) -> None:
    with pytest.raises(Invalid) as exc:
        entry_from_form(interrupt(APPROVAL, reason="confirmation"), posted)
    assert errors_of(exc) == {"/decision": "Choose Approve or Decline."}


def test_a_confirmation_with_extra_fields_reads_them() -> None:
    schema = {"type": "object", "properties": {
        "approved": {"type": "boolean"}, "limit": {"type": "integer"}}, "required": ["approved"]}
    intr = interrupt(schema, reason="confirmation")
    assert [f.name for f in form_for(intr).fields] == ["limit", "reason"]
    entry = entry_from_form(intr, {"decision": "approve", "limit": "500"})
    assert entry.payload == {"approved": True, "limit": 500}
    with pytest.raises(Invalid) as exc:
        entry_from_form(intr, {"decision": "approve", "limit": "lots"})
    assert errors_of(exc) == {"/limit": "Limit: 'lots' is not a whole number"}


# -- render_review -------------------------------------------------------------------------

def render(state: str, intr: InterruptView | None = None, **kwargs: Any) -> Page:
    intr = intr if intr is not None or state == "refused" else view()
    form = kwargs.pop("form", form_for(intr) if intr is not None and state == "open" else None)
    return Page(render_review(agent=kwargs.pop("agent", "demo.transfer"), interrupt=intr,
                              reviewer_label=kwargs.pop("reviewer_label", "Alice Martin"),
                              state=state, form=form, **kwargs))


def test_every_page_is_private_and_has_no_script() -> None:
    for state in ("open", "answered", "expired", "cancelled", "done", "refused"):
        page = render(state)
        assert page.one("meta", name="robots")["content"] == "noindex"
        assert page.one("meta", name="referrer")["content"] == "no-referrer"
        assert not page.find("script")


def test_open_confirmation_shows_the_request_and_the_buttons() -> None:
    page = render("open")
    assert "Approval needed" in page.text
    assert "Send 250 to Bob?" in page.text
    assert "transfer_funds" in page.text
    # The tool input as labelled rows, not JSON.
    assert "Amount" in page.text and "250" in page.text and '"amount"' not in page.text
    assert "01 Jun 2025, 12:00:00 UTC" in page.text
    assert "Reviewing as Alice Martin" in page.text
    form = page.one("form")
    assert form["method"] == "post" and form["action"] == ""
    buttons = page.find("button", type="submit")
    # A disabled first button keeps Enter from submitting (and so from approving).
    assert "disabled" in buttons[0]
    assert [(b.get("name"), b.get("value")) for b in buttons[1:]] == [
        ("decision", "approve"), ("decision", "decline")]
    assert "Approve" in page.text and "Decline" in page.text
    assert page.one("textarea", name="note")
    assert "Confirm your decision below" not in page.text


def test_a_link_decision_is_highlighted_with_a_hint() -> None:
    intr = view()
    page = render("open", intr, form=form_for(intr, "approve"))
    assert "Confirm your decision below" in page.text
    approve = page.one("button", value="approve")
    assert "chosen" in (approve["class"] or "") and "autofocus" in approve
    assert "chosen" not in (page.one("button", value="decline")["class"] or "")
    # The same with the decision passed straight to the page.
    page = render("open", intr, decision="decline")
    assert "chosen" in (page.one("button", value="decline")["class"] or "")


def test_open_fields_form_controls() -> None:
    intr = view(ORDER, reason="input_required", message="Plan the BBQ")
    page = render("open", intr)
    assert "Your answer is needed" in page.text
    assert page.one("input", name="name")["type"] == "text"
    assert page.one("input", name="guests")["type"] == "number"
    assert page.one("input", name="guests")["step"] == "1"
    assert page.one("input", name="budget")["step"] == "any"
    assert "required" in page.one("input", name="name")
    assert "required" not in page.one("input", name="budget")
    assert [r["value"] for r in page.find("input", type="radio", name="grill")] == [
        "charcoal", "gas"]
    outdoor = {r["value"]: "checked" in r for r in page.find("input", name="outdoor")}
    assert outdoor == {"yes": True, "no": False}  # the schema's default
    assert page.one("input", name="checked")["type"] == "checkbox"
    assert {"menu", "tags", "notes", "nickname"} <= set(page.textareas)
    assert page.find("button", type="submit", class_="primary")
    assert not page.find("button", name="decision")
    assert "Anything the kitchen should know" in page.text
    assert page.one("label", for_="f-name")


def test_errors_are_listed_on_top_and_next_to_fields_and_values_are_kept() -> None:
    intr = view(ORDER, reason="input_required")
    posted = {"name": "Ada <b>", "guests": "abc", "grill": "gas", "menu": "{bad",
              "outdoor": "no"}
    with pytest.raises(Invalid) as exc:
        entry_from_form(intr, posted)
    page = render("open", intr, errors=exc.value.detail["errors"], values=posted)
    alerts = page.find("div", role="alert")
    assert alerts[0]["class"] == "errors"
    assert "Your answer was not recorded" in page.text
    assert "Guests: 'abc' is not a whole number" in page.text
    assert page.one("div", id="f-guests-error")["role"] == "alert"
    assert page.one("div", id="f-menu-error")
    guests = page.one("input", name="guests")
    assert guests["value"] == "abc" and guests["aria-invalid"] == "true"
    assert page.one("input", name="name")["value"] == "Ada <b>"
    assert page.textareas["menu"] == "{bad"
    assert "checked" in page.one("input", name="grill", value="gas")
    assert "checked" in page.one("input", name="outdoor", value="no")
    # Posted without the box: it is shown unticked, not back at its default.
    assert "checked" not in page.one("input", name="checked")


def test_a_single_payload_error_shows_beside_the_payload_field() -> None:
    intr = view(FREE_TEXT, reason="input_required")
    page = render("open", intr, errors=[{"path": "/", "message": "Your answer: too short"}],
                  values={"payload": ""})
    assert page.one("div", id="f-payload-error")["role"] == "alert"


def test_answered_says_who_how_and_when() -> None:
    intr = view(state="resolved", answer=answer({"approved": True, "note": "fine"}))
    page = render("answered", intr)
    assert "already approved by alice via email at 01 Jun 2025, 11:30:00 UTC" in page.text
    assert "Note: fine" in page.text
    assert not page.find("form") and not page.find("button")


def test_answered_decline_and_plain_answers() -> None:
    declined = view(None, state="cancelled",
                    answer=answer(status="cancelled", state="cancelled", by="bob",
                                  channel="slack", metadata={"reason": "too much"}))
    page = render("answered", declined)
    assert "already declined by bob via slack" in page.text
    assert "Note: too much" in page.text
    said_no = view(state="resolved", answer=answer({"approved": False}))
    assert "already declined by alice" in render("answered", said_no).text
    question = view(TRIVIA, reason="input_required", state="resolved",
                    answer=answer("Jaws", channel="web"))
    page = render("answered", question)
    assert "already answered by alice via web" in page.text and "Jaws" in page.text


def test_expired_page() -> None:
    intr = view(state="expired", on_expire=OnExpire(action="cancel"))
    page = render("expired", intr)
    assert "This request has expired" in page.text
    assert "expired at 01 Jun 2025, 12:00:00 UTC before anyone answered" in page.text
    assert "declined automatically" in page.text
    assert not page.find("form")
    resolved = view(state="expired", on_expire=OnExpire(action="resolve", payload="x"))
    assert "default answer" in render("expired", resolved).text


def test_cancelled_page() -> None:
    page = render("cancelled", view(state="cancelled"), message="The run was cancelled.")
    assert "no longer needs an answer" in page.text
    assert "The run was cancelled." in page.text
    assert not page.find("form")


def test_done_page_says_what_was_recorded_and_that_the_run_continues() -> None:
    intr = view(state="resolved", answer=answer({"approved": True, "note": "ok"}, channel="web"))
    page = render("done", intr)
    assert "Thank you" in page.text
    assert "you approved this request" in page.text
    assert "Note: ok" in page.text
    assert "The run continues" in page.text
    assert not page.find("form")
    question = view(ORDER, reason="input_required", state="resolved",
                    answer=answer({"name": "Ada", "guests": 3}, channel="web"))
    page = render("done", question)
    assert "Your answer was recorded" in page.text and '"guests": 3' in page.text
    declined = view(None, state="cancelled",
                    answer=answer(status="cancelled", state="cancelled", channel="web"))
    assert "you declined this request" in render("done", declined).text


def test_refused_page_explains_without_a_form() -> None:
    page = render("refused", None, agent="", reviewer_label=None,
                  message="This link has expired.")
    assert "This link cannot be used" in page.text
    assert "This link has expired." in page.text
    assert "ask for a new link" in page.text
    assert not page.find("form") and "Send 250" not in page.text


def test_everything_shown_is_escaped() -> None:
    hostile = "<script>alert('x')</script>"
    intr = view(message=f"Pay {hostile}?", tool_input={"to": hostile})
    html = render_review(agent=f"evil{hostile}", interrupt=intr, reviewer_label=hostile,
                         state="open", form=form_for(intr), values={"note": hostile},
                         errors=[{"path": "/note", "message": hostile}], message=hostile)
    page = Page(html)
    assert not page.find("script")
    assert f"Pay {hostile}?" in page.text
    assert page.textareas["note"] == hostile
    assert "&lt;script&gt;" in html


def test_unknown_state_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown review page state"):
        render_review(agent="a", interrupt=None, reviewer_label=None, state="pending",
                      form=None)


# -- editing a call's arguments (the inbox, for tools with allow_edit) ---------------------

PAY_INPUT = {"type": "object", "properties": {
    "to": {"type": "string"}, "amount": {"type": "integer", "exclusiveMinimum": 0},
    "memo": {"type": "string"}}, "required": ["to", "amount"]}


def paying(memo: str = "Rent\nfor March  ", to: str = "") -> Interrupt:
    return Interrupt(id="int_1", reason="confirmation", tool_call_id="call_1",
                     tool_name="pay", mode="restart", response_schema=APPROVAL,
                     input_schema=PAY_INPUT, tool_input={"to": to, "amount": 250, "memo": memo})


def test_arguments_posted_as_shown_are_no_edit() -> None:
    """What the edit fields showed, posted back untouched (line breaks as browsers post
    them, a required value that is empty), changes nothing: no replaceInput."""
    intr = paying()
    shown = {f.name: f.value for f in input_fields(intr)}
    assert shown == {"input.to": "", "input.amount": "250", "input.memo": "Rent\nfor March  "}
    assert {f.name: f.kind for f in input_fields(intr)}["input.memo"] == "textarea"
    assert not any(f.required for f in input_fields(intr))
    posted = {k: v.replace("\n", "\r\n") for k, v in shown.items()}
    assert input_from_form(intr, posted) is None
    assert input_from_form(intr, {}) is None


def test_an_edited_argument_is_converted_and_the_rest_kept() -> None:
    intr = paying(to="Bob")
    assert input_from_form(intr, {"input.to": "Bob", "input.amount": " 40 ",
                                  "input.memo": "Rent\r\nfor March  "}) == {
        "to": "Bob", "amount": 40, "memo": "Rent\nfor March  "}
    with pytest.raises(Invalid) as refused:
        input_from_form(intr, {"input.amount": "forty"})
    assert "Amount" in refused.value.message
