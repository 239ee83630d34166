"""Reading reviewers' email replies: raw mail from real clients, the reviewer's own words, and
the answer each kind of interrupt gets from them (notifier.replies). Pure: no servers."""

from __future__ import annotations

import base64
import json
from email.message import EmailMessage
from typing import Any

import pytest

from layby.answering.mime import MalformedMail, parse_mail, reply_text, token_from_address
from layby.answering.reading import Unreadable, read_answer
from layby.demo.agents import TRIVIA_CHOICES, Approval
from layby.generation.answers import check_answer
from layby.generation.interrupts import Interrupt, ResumeEntry
from layby.http.errors import status_of
from layby.reviewers.schemas import how_to_answer, is_confirmation

APPROVAL = Approval.model_json_schema()
CONFIRM_HOWTO = ('Reply with "approve" or "decline" on the first line; anything after it is '
                 'kept as your reason.')


def interrupt(schema: dict[str, Any] | None, reason: str = "input_required",
              mode: str = "respond") -> Interrupt:
    return Interrupt(id="int_0123456789abcdef0123", reason=reason, message="A question?",
                     tool_call_id="call_1", response_schema=schema, tool_name="ask_question",
                     tool_input={"question": "A question?"}, mode=mode)


def transfer() -> Interrupt:
    """As demo.transfer's transfer_funds asks: a confirmation with an Approval schema."""
    return interrupt(APPROVAL, reason="confirmation", mode="restart")


def trivia() -> Interrupt:
    return interrupt({"type": "string", "enum": TRIVIA_CHOICES})


def unreadable(intr: Interrupt, text: str) -> str:
    with pytest.raises(Unreadable) as caught:
        read_answer(intr, text)
    assert status_of(caught.value) == 422
    message = caught.value.message
    problem, _, howto = message.partition("\n\n")
    assert howto.startswith(how_to_answer(intr)), message  # every bounce says how to answer
    return problem


def test_approval_schema_is_what_confirmations_carry() -> None:
    assert APPROVAL["type"] == "object"
    assert APPROVAL["properties"]["approved"]["type"] == "boolean"
    assert "note" in APPROVAL["properties"] and APPROVAL["required"] == ["approved"]


# --- raw mail from real clients -----------------------------------------------------------

GMAIL = b"""\
Delivered-To: reply+k7q2m-x4bza@layby.example.com
Received: by 2002:a05:6402:1234 with SMTP id abc; Mon, 3 Nov 2026 01:05:13 -0800 (PST)
MIME-Version: 1.0
References: <notify-1@layby.example.com>
In-Reply-To: <notify-1@layby.example.com>
From: Alice Martin <Alice.Martin@Gmail.com>
Date: Mon, 3 Nov 2026 10:05:12 +0100
Message-ID: <CAF+xyz=abc123@mail.gmail.com>
Subject: Re: [layby] Send 250 to Bob?
To: layby <reply+K7Q2M-X4BZA@layby.example.com>
Content-Type: multipart/alternative; boundary="000000000000a1b2c3d4"

--000000000000a1b2c3d4
Content-Type: text/plain; charset="UTF-8"

Approve, Bob is expecting it today.

On Mon, 3 Nov 2026 at 10:02, layby <reply+k7q2m-x4bza@layby.example.com>
wrote:

> Send 250 to Bob?
>
> Reply with "approve" or "decline" on the first line; anything after it is
> kept as your reason.
>

--000000000000a1b2c3d4
Content-Type: text/html; charset="UTF-8"

<div dir="ltr">Approve, Bob is expecting it today.</div><br><div class="gmail_quote">\
<div dir="ltr" class="gmail_attr">On Mon, 3 Nov 2026 at 10:02, layby &lt;\
<a href="mailto:reply+k7q2m-x4bza@layby.example.com">reply+k7q2m-x4bza@layby.example.com</a>\
&gt; wrote:<br></div><blockquote class="gmail_quote">Send 250 to Bob?</blockquote></div>

--000000000000a1b2c3d4--
"""

OUTLOOK = (
    b'From: "Stone, Bob" <Bob.Stone@contoso.com>\r\n'
    b'To: "layby" <reply+d3pl0y-v2@layby.example.com>\r\n'
    b'CC: "Carol Ng" <carol@contoso.com>, <BOB.STONE@contoso.com>\r\n'
    b'Subject: RE: [layby] Deploy v2.0 to production?\r\n'
    b'Thread-Topic: [layby] Deploy v2.0 to production?\r\n'
    b'Date: Mon, 3 Nov 2026 09:15:00 +0000\r\n'
    b'Message-ID: <DB7PR01MB1234@DB7PR01MB1234.eurprd01.prod.outlook.com>\r\n'
    b'Content-Type: text/plain; charset="iso-8859-1"\r\n'
    b'Content-Transfer-Encoding: quoted-printable\r\n'
    b'MIME-Version: 1.0\r\n'
    b'\r\n'
    b'Decline - the change freeze starts today (r=E9union at 10).\r\n'
    b'\r\n'
    b'-----Original Message-----\r\n'
    b'From: layby <reply+d3pl0y-v2@layby.example.com>=20\r\n'
    b'Sent: Monday, November 3, 2026 9:02 AM\r\n'
    b'To: Stone, Bob <Bob.Stone@contoso.com>\r\n'
    b'Subject: [layby] Deploy v2.0 to production?\r\n'
    b'\r\n'
    b'Deploy v2.0 to production?\r\n'
)

IPHONE = b"""\
From: Carol Ng <carol@icloud.com>
Content-Type: text/plain; charset=utf-8
Content-Transfer-Encoding: quoted-printable
Mime-Version: 1.0 (1.0)
Subject: Re: [layby] Which account should we pay from?
Message-Id: <5F1C2D3E-AAAA-BBBB-CCCC-0123456789AB@icloud.com>
Date: Mon, 3 Nov 2026 10:07:41 +0100
To: reply+q1w2e3-r4t5@layby.example.com
X-Original-To: reply+q1w2e3-r4t5@layby.example.com
X-Mailer: iPhone Mail (22A3354)

Savings =E2=80=93 main is low this month

Sent from my iPhone

> On 3 Nov 2026, at 10:02, layby <reply+q1w2e3-r4t5@layby.example.com> wrot=
e:
>=20
> =EF=BB=BFWhich account should we pay from?
> 1. main
> 2. savings
"""

HTML_ONLY = b"""\
From: dana@example.org
To: reply+zz9-yy8@layby.example.com
Subject: Re: [layby] How many guests are coming?
Message-ID: <html-only-1@example.org>
Content-Type: text/html; charset=utf-8

<html><head><style>p { margin: 0 }</style></head><body>
<p>12 guests &amp; maybe&nbsp;a dog</p><div>Tom &lt;tom@x&gt; can&#39;t come<br>Sam can</div>
<blockquote type="cite"><p>How many guests are coming?</p></blockquote>
</body></html>
"""


def test_gmail_reply_gives_sender_recipients_and_the_reviewers_words() -> None:
    mail = parse_mail(GMAIL)
    assert mail.sender == "alice.martin@gmail.com"
    assert mail.recipients == ["reply+k7q2m-x4bza@layby.example.com"]  # To and Delivered-To
    assert mail.subject == "Re: [layby] Send 250 to Bob?"
    assert mail.message_id == "<CAF+xyz=abc123@mail.gmail.com>"
    assert mail.text.startswith("Approve, Bob is expecting it today.\n")  # text/plain chosen
    assert reply_text(mail.text) == "Approve, Bob is expecting it today."


def test_gmail_reply_end_to_end_answers_the_transfer() -> None:
    mail = parse_mail(GMAIL)
    tokens = [t for t in map(token_from_address, mail.recipients) if t]
    assert tokens == ["k7q2m-x4bza"]
    entry = read_answer(transfer(), reply_text(mail.text))
    assert entry == ResumeEntry(interrupt_id=transfer().id, status="resolved",
                                payload={"approved": True, "note": "Bob is expecting it today."})


def test_outlook_reply_decodes_latin1_quoted_printable_and_drops_the_original() -> None:
    mail = parse_mail(OUTLOOK)
    assert mail.sender == "bob.stone@contoso.com"
    assert mail.recipients == ["reply+d3pl0y-v2@layby.example.com", "carol@contoso.com",
                               "bob.stone@contoso.com"]
    assert "(réunion at 10)" in mail.text
    assert "\r" not in mail.text
    text = reply_text(mail.text)
    assert text == "Decline - the change freeze starts today (réunion at 10)."
    entry = read_answer(interrupt(APPROVAL, reason="confirmation"), text)
    assert entry.payload == {"approved": False,
                             "note": "the change freeze starts today (réunion at 10)."}


def test_iphone_reply_drops_signature_and_quote() -> None:
    mail = parse_mail(IPHONE)
    assert mail.sender == "carol@icloud.com"
    assert mail.recipients == ["reply+q1w2e3-r4t5@layby.example.com"]  # X-Original-To deduped
    assert "Savings – main is low" in mail.text
    assert reply_text(mail.text) == "Savings – main is low this month"


def test_html_only_body_becomes_text_with_line_breaks_and_entities() -> None:
    mail = parse_mail(HTML_ONLY)
    assert "p { margin" not in mail.text  # styles are not text
    assert "12 guests & maybe a dog" in mail.text
    assert "Tom <tom@x> can't come\nSam can" in mail.text
    assert "> How many guests are coming?" in mail.text  # blockquote reads as a quote
    assert reply_text(mail.text) == "12 guests & maybe a dog\n\nTom <tom@x> can't come\nSam can"
    entry = read_answer(interrupt({"type": "integer"}), reply_text(mail.text))
    assert entry.payload == 12


def test_gmail_html_only_reply_drops_the_attribution_and_blockquote() -> None:
    html = GMAIL.split(b'Content-Type: text/html; charset="UTF-8"\n\n')[1].split(b"\n--")[0]
    msg = EmailMessage()
    msg["From"] = "alice@example.com"
    msg["To"] = "reply+abc@layby.example.com"
    msg.set_content(html.decode(), subtype="html")
    text = parse_mail(msg.as_bytes()).text
    assert "wrote:" in text
    assert reply_text(text) == "Approve, Bob is expecting it today."


def _message(body: str, **content: Any) -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = '"Martin, Alice" <alice@example.com>'
    msg["To"] = "Layby Reviews <reply+abc-def@layby.example.com>"
    msg["Subject"] = "Re: Which film?"
    msg.set_content(body, **content)
    return msg


@pytest.mark.parametrize("cte", ["quoted-printable", "base64"])
def test_transfer_encodings_are_decoded(cte: str) -> None:
    body = "Close Encounters of the Third Kind — obviously, ça va de soi\n" + "x" * 120 + "\n"
    msg = _message(body, cte=cte)
    raw = msg.as_bytes()
    assert "ça".encode() not in raw and f"Content-Transfer-Encoding: {cte}".encode() in raw
    assert parse_mail(raw).text == body


def test_iso_8859_1_charset_is_decoded() -> None:
    msg = EmailMessage()
    msg["From"] = "jose@example.es"
    msg["To"] = "reply+abc@layby.example.com"
    msg.set_content("Sí, aprobado: año fiscal\n".encode("iso-8859-1"), maintype="text",
                    subtype="plain", cte="8bit")
    msg.set_param("charset", "iso-8859-1")
    assert parse_mail(msg.as_bytes()).text == "Sí, aprobado: año fiscal\n"


def test_a_body_mislabelled_as_utf8_still_reads() -> None:
    raw = (b"From: a@example.com\nContent-Type: text/plain; charset=utf-8\n"
           b"Content-Transfer-Encoding: 8bit\n\ncaf\xe9 approved\n")
    assert parse_mail(raw).text == "café approved\n"


def test_display_names_encoded_subject_and_every_recipient_header() -> None:
    msg = _message("2\n")
    msg.replace_header("Subject", "Re: Quel film ? Réponse")
    msg["Cc"] = "Bob <BOB@Example.com>, alice@example.com, Layby <reply+abc-def@layby.example.com>"
    msg["Delivered-To"] = "Reply+ABC-DEF@layby.example.com"
    msg["X-Original-To"] = "<reply+abc-def@relay.example.net>"
    mail = parse_mail(msg.as_bytes())
    assert mail.sender == "alice@example.com"  # the comma in the display name is harmless
    assert mail.subject == "Re: Quel film ? Réponse"
    assert mail.recipients == ["reply+abc-def@layby.example.com", "bob@example.com",
                               "alice@example.com", "reply+abc-def@relay.example.net"]
    assert mail.message_id is None


def test_format_flowed_lines_are_joined() -> None:
    raw = (b"From: a@example.com\nContent-Type: text/plain; charset=utf-8; format=flowed\n\n"
           b"We should go with the second \noption, it is cheaper.\n\n-- \nAnn\n")
    text = parse_mail(raw).text
    assert "We should go with the second option, it is cheaper.\n" in text
    assert reply_text(text) == "We should go with the second option, it is cheaper."


def test_attached_text_is_not_taken_for_the_body() -> None:
    msg = _message("decline\n")
    msg.add_attachment("approve\n", filename="notes.txt")
    assert reply_text(parse_mail(msg.as_bytes()).text) == "decline"


def test_an_empty_body_parses_and_reads_as_an_empty_reply() -> None:
    mail = parse_mail(b"From: a@example.com\nTo: reply+abc@x.example\n\n")
    assert mail.text == ""
    assert unreadable(transfer(), reply_text(mail.text)).startswith("your reply was empty")


def _image_only() -> bytes:
    msg = EmailMessage()
    msg["From"] = "a@example.com"
    msg.add_attachment(b"\x89PNG\r\n\x1a\n", maintype="image", subtype="png",
                       filename="approve.png")
    return msg.as_bytes()


@pytest.mark.parametrize(("raw", "says"), [
    (b"", "the message is empty"),
    (b"  \r\n\r\n", "the message is empty"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe\x00", "it has no headers"),
    (b"approve\nthanks\n", "it has no headers"),
    (b"To: reply+abc@x.example\nSubject: hi\n\napprove\n", "no From: header"),
    (b"From: Alice Martin\nTo: reply+abc@x.example\n\napprove\n", "holds no email address"),
    (b"From: <>\n\napprove\n", "holds no email address"),
    (_image_only(), "no text/plain or text/html part"),
])
def test_malformed_mail_says_what_is_wrong(raw: bytes, says: str) -> None:
    with pytest.raises(MalformedMail) as caught:
        parse_mail(raw)
    assert says in caught.value.message
    assert status_of(caught.value) == 400


# --- token_from_address ---------------------------------------------------------------------

@pytest.mark.parametrize(("address", "token"), [
    ("reply+k7q2m-x4bza@layby.example.com", "k7q2m-x4bza"),
    ("REPLY+K7Q2M-X4BZA@Layby.Example.com", "k7q2m-x4bza"),
    ("<reply+abc2@x.io>", "abc2"),
    ('"Layby Reviews" <Reply+abc2-def3@x.io>', "abc2-def3"),
    ("  reply+abc@sub.domain.example  ", "abc"),
    ("reply@x.io", None),
    ("reply+@x.io", None),
    ("noreply+abc@x.io", None),
    ("reply+abc.def@x.io", None),
    ("reply+abc_def@x.io", None),
    ("reply+abc+def@x.io", None),
    ("reply+abc", None),
    ("reply+abc@", None),
    ("alice@example.com", None),
    ("", None),
])
def test_token_from_address(address: str, token: str | None) -> None:
    assert token_from_address(address) == token


# --- reply_text -----------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "kept"), [
    ("  approve  \n\n", "approve"),
    ("Jaws\n\nOn Mon, 3 Nov 2026 at 10:02, layby <\nlayby@layby.example.com> wrote:\n\n"
     "> Which film?\n> 1. Jaws\n", "Jaws"),
    ("Jaws\n\nOn Mon, 3 Nov 2026 at 10:02, layby <layby@layby.example.com>\nwrote:\n\n"
     "> Which film?\n", "Jaws"),
    ("approve\n\nOn Mon, 3 Nov 2026 at 10:02 layby <layby@x.io> wrote:\n> q\n", "approve"),
    ("ja\n\nAm Mo., 3. Nov. 2026 um 10:02 Uhr schrieb layby <layby@x.io>:\n> Frage\n", "ja"),
    ("decline: over budget\r\n\r\n-----Original Message-----\r\nFrom: layby\r\n"
     "Sent: Monday, November 3, 2026 9:02 AM\r\nSubject: x\r\n\r\nSend 250?\r\n",
     "decline: over budget"),
    ("decline: over budget\n\n________________________________\nFrom: layby <layby@x.io>\n"
     "Sent: Monday, November 3, 2026 10:02 AM\nTo: Alice\nSubject: Approve?\n\nSend 250?\n",
     "decline: over budget"),
    ("approve\n\n*From:* layby <layby@x.io>\n*Date:* Monday, 3 November 2026\n*To:* Alice\n\n"
     "Send 250?\n", "approve"),
    ("decline\n\nToo expensive.\n\n-- \nBob Stone\nCFO, Contoso\n", "decline\n\nToo expensive."),
    ("-- \nBob Stone\n", ""),
    ("approve\n\nSent from my iPhone\n\n> On 3 Nov 2026, at 10:02, layby wrote:\n> q\n",
     "approve"),
    ("Decline\nNot this week.\n\nGet Outlook for iOS\n", "Decline\nNot this week."),
    ("yes\n> Send 250 to Bob?\nand pay Carol too\n> Reply approve\n", "yes\nand pay Carol too"),
    # a reply that only looks a little like a header or a sign-off stays whole
    ("approve\nTo: finance, for the record\nthanks",
     "approve\nTo: finance, for the record\nthanks"),
    ("On second thought, decline.\nWe cannot afford it.",
     "On second thought, decline.\nWe cannot afford it."),
    ('{"guests": 12,\n "note": "-veg"}', '{"guests": 12,\n "note": "-veg"}'),
])
def test_reply_text_keeps_only_what_the_reviewer_wrote(text: str, kept: str) -> None:
    assert reply_text(text) == kept


# --- read_answer: confirmations -----------------------------------------------------------

@pytest.mark.parametrize(("text", "payload"), [
    ("approve", {"approved": True}),
    ("Approved!", {"approved": True}),
    ("LGTM.", {"approved": True}),
    ("y", {"approved": True}),
    ("Confirm, go ahead", {"approved": True, "note": "go ahead"}),
    ("yes: Bob is expecting it", {"approved": True, "note": "Bob is expecting it"}),
    ("Decline", {"approved": False}),
    ("no - over budget", {"approved": False, "note": "over budget"}),
    ("Rejected,\nThe change freeze starts today.\nAsk again Monday.",
     {"approved": False, "note": "The change freeze starts today.\nAsk again Monday."}),
])
def test_confirmation_with_approval_schema(text: str, payload: dict[str, Any]) -> None:
    entry = read_answer(transfer(), text)
    assert entry.status == "resolved"
    assert entry.interrupt_id == transfer().id
    assert entry.payload == payload


def test_confirmation_recognised_by_schema_alone() -> None:
    entry = read_answer(interrupt(APPROVAL, reason="layby:sign_off"), "decline: nope")
    assert entry.payload == {"approved": False, "note": "nope"}


def test_confirmation_without_a_note_property_drops_the_reason() -> None:
    schema = {"type": "object", "properties": {"approved": {"type": "boolean"}},
              "required": ["approved"], "additionalProperties": False}
    intr = interrupt(schema, reason="confirmation")
    assert read_answer(intr, "approve, looks fine").payload == {"approved": True}
    assert how_to_answer(intr) == 'Reply with "approve" or "decline" on the first line.'


def test_confirmation_without_schema_declines_by_cancelling() -> None:
    intr = interrupt(None, reason="confirmation", mode="restart")
    assert read_answer(intr, "Deny - not during the freeze") == ResumeEntry(
        interrupt_id=intr.id, status="cancelled", metadata={"reason": "not during the freeze"})
    assert read_answer(intr, "no") == ResumeEntry(interrupt_id=intr.id, status="cancelled")
    assert read_answer(intr, "lgtm") == ResumeEntry(interrupt_id=intr.id, status="resolved")
    # "OK, let me check first" says nothing yet: it is no approval.
    with pytest.raises(Unreadable):
        read_answer(intr, "OK, let me check with finance first")


def test_a_confirmation_answered_by_a_boolean_reads_yes_and_no_as_the_page_does() -> None:
    # The page shows yes/no for a boolean answer, whatever the reason: mail agrees.
    intr = interrupt({"type": "boolean"}, reason="confirmation")
    assert read_answer(intr, "confirm").payload is True
    declined = read_answer(intr, "declined")
    assert (declined.status, declined.payload) == ("resolved", False)


def test_a_confirmation_whose_answer_is_text_takes_the_text_as_the_page_does() -> None:
    intr = interrupt({"type": "string", "minLength": 1}, reason="confirmation")
    assert read_answer(intr, "only after the audit").payload == "only after the audit"


@pytest.mark.parametrize("text", ["maybe later", "I approve", "sure thing"])
def test_confirmation_with_another_first_word_is_unreadable(text: str) -> None:
    problem = unreadable(transfer(), text)
    assert problem == ('your reply should start with "approve" or "decline", but it starts '
                       f'with "{text.split()[0].lower()}".')


# --- read_answer: choices, text, numbers, yes/no ------------------------------------------

@pytest.mark.parametrize(("text", "choice"), [
    ("Jaws", "Jaws"),
    ("jaws", "Jaws"),
    ('"Star Wars".', "Star Wars"),
    ("close encounters of  the third kind!", "Close Encounters of the Third Kind"),
    ("2", "Alien"),
    ("2.", "Alien"),
    ("2)", "Alien"),
    ("4. Close Encounters of the Third Kind", "Close Encounters of the Third Kind"),
    ("Alien\n\nI am fairly sure, the chestburster scene was 1979 though", "Alien"),
])
def test_enum_choice_by_name_or_number(text: str, choice: str) -> None:
    assert read_answer(trivia(), text).payload == choice


def test_enum_choice_number_out_of_range() -> None:
    problem = unreadable(trivia(), "7")
    assert problem == "7 is not a choice number: the choices go from 1 to 4."


def test_a_long_run_of_digits_is_no_choice_number() -> None:
    assert unreadable(trivia(), "1" * 5000).startswith('"1111')


def test_json_nested_too_deeply_is_unreadable() -> None:
    assert unreadable(interrupt({"type": "array"}), "[" * 50000) == (
        "your reply's JSON is nested too deeply.")


@pytest.mark.parametrize("text", ["Titanic", "2. Jaws", "Jaws or Alien"])
def test_enum_wrong_choice_lists_the_choices(text: str) -> None:
    intr = trivia()
    with pytest.raises(Unreadable) as caught:
        read_answer(intr, text)
    message = caught.value.message
    assert message.startswith(f'"{text}" is not one of the choices.\n\n')
    assert "  1. Jaws\n  2. Alien\n  3. Star Wars\n  4. Close Encounters" in message


def test_string_answer_is_the_whole_reply() -> None:
    intr = interrupt({"type": "string", "minLength": 1})
    text = "Two vegetarians.\n\nOne guest is allergic to nuts."
    assert read_answer(intr, f"  {text}\n") == ResumeEntry(
        interrupt_id=intr.id, status="resolved", payload=text)


def test_string_answer_outside_the_schema() -> None:
    problem = unreadable(interrupt({"type": "string", "maxLength": 5}), "far too long")
    assert problem == "your answer does not fit what was asked:\n  - 'far too long' is too long"


def test_no_schema_takes_the_text() -> None:
    assert read_answer(interrupt(None), "whatever you think").payload == "whatever you think"


@pytest.mark.parametrize(("schema", "text", "value"), [
    ({"type": "integer"}, "12", 12),
    ({"type": "integer"}, "12 guests, maybe 13", 12),
    ({"type": "integer"}, "12.0", 12),
    ({"type": "integer"}, "-3", -3),
    ({"type": "number"}, "3.5 kg", 3.5),
    ({"type": "number"}, "3", 3),
    ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, "8", 8),
])
def test_numbers_from_the_first_line(schema: dict[str, Any], text: str, value: Any) -> None:
    payload = read_answer(interrupt(schema), text).payload
    assert payload == value and type(payload) is type(value)


@pytest.mark.parametrize(("schema", "text", "says"), [
    ({"type": "integer"}, "about twelve", 'your first line, "about twelve", does not start '
                                          "with a number."),
    ({"type": "integer"}, "12.5", "12.5 is not a whole number."),
    ({"type": "number"}, "1" * 400, f"{'1' * 59}… is too large a number."),
    ({"type": "integer", "minimum": 1}, "0", "your answer does not fit what was asked:\n"
                                             "  - 0 is less than the minimum of 1"),
])
def test_numbers_unreadable(schema: dict[str, Any], text: str, says: str) -> None:
    assert unreadable(interrupt(schema), text) == says


def test_number_instructions_mention_bounds() -> None:
    intr = interrupt({"type": "integer", "minimum": 1, "maximum": 50})
    assert how_to_answer(intr) == "Reply with a whole number between 1 and 50 on the first line."


@pytest.mark.parametrize(("text", "value"), [("Yes.", True), ("no thanks", False),
                                             ("true", True), ("N", False)])
def test_boolean_answers(text: str, value: bool) -> None:
    assert read_answer(interrupt({"type": "boolean"}), text).payload is value


def test_boolean_unreadable() -> None:
    problem = unreadable(interrupt({"type": "boolean"}), "perhaps")
    assert problem == 'your reply should start with "yes" or "no", but it starts with "perhaps".'


# --- read_answer: JSON ------------------------------------------------------------------------

PARTY = {
    "type": "object",
    "properties": {
        "guests": {"type": "integer", "minimum": 1, "description": "how many are coming"},
        "diet": {"type": "string", "enum": ["none", "vegetarian", "vegan"]},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
    },
    "required": ["guests", "diet"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("text", [
    '{"guests": 12, "diet": "vegan"}',
    'Here you go:\n\n{"guests": 12,\n "diet": "vegan"}\n\nCheers',
    "{“guests”: 12, “diet”: “vegan”}",  # a mail client's curly quotes
])
def test_object_answer_from_json_in_the_reply(text: str) -> None:
    assert read_answer(interrupt(PARTY), text).payload == {"guests": 12, "diet": "vegan"}


def test_array_answer() -> None:
    intr = interrupt({"type": "array", "items": {"type": "string"}})
    assert read_answer(intr, 'Both: ["main", "savings"] please').payload == ["main", "savings"]


def test_json_outside_the_schema_lists_each_problem() -> None:
    problem = unreadable(interrupt(PARTY), '{"guests": 0, "diet": "keto", "extra": 1}')
    assert problem.startswith("your answer does not fit what was asked:\n")
    assert "  - at /guests: 0 is less than the minimum of 1" in problem
    assert "  - at /diet: 'keto' is not one of ['none', 'vegetarian', 'vegan']" in problem
    assert "Additional properties are not allowed ('extra' was unexpected)" in problem


def test_missing_required_field() -> None:
    problem = unreadable(interrupt(PARTY), '{"guests": 3}')
    assert "'diet' is a required property" in problem


@pytest.mark.parametrize(("text", "says"), [
    ("twelve, all vegan", "your reply holds no JSON object I could read (Expecting value at "
                          "line 1 column 1)."),
    ("ok {guests: 12}", "your reply holds no JSON object I could read (Expecting property name "
                        "enclosed in double quotes at line 1 column 5)."),
])
def test_unparseable_json(text: str, says: str) -> None:
    assert unreadable(interrupt(PARTY), text) == says


@pytest.mark.parametrize("intr", [
    transfer(), trivia(), interrupt({"type": "string"}), interrupt(PARTY),
    interrupt({"type": "integer"}), interrupt(None, reason="confirmation"),
])
def test_empty_reply_is_unreadable(intr: Interrupt) -> None:
    assert unreadable(intr, " \n ") == ("your reply was empty: no text was found above the "
                                        "quoted message.")


# --- how_to_answer --------------------------------------------------------------------------

def test_how_to_answer_confirmation() -> None:
    assert how_to_answer(transfer()) == CONFIRM_HOWTO
    assert how_to_answer(interrupt(None, reason="confirmation")) == CONFIRM_HOWTO


def test_how_to_answer_enum_numbers_the_choices() -> None:
    assert how_to_answer(trivia()) == (
        "Reply with one of these choices on the first line (its number is enough):\n"
        "  1. Jaws\n  2. Alien\n  3. Star Wars\n  4. Close Encounters of the Third Kind")


def test_how_to_answer_text() -> None:
    assert how_to_answer(interrupt({"type": "string", "minLength": 1})) == \
        "Reply with your answer on the first lines."


def test_how_to_answer_object_lists_fields_and_a_valid_example() -> None:
    intr = interrupt(PARTY)
    text = how_to_answer(intr)
    assert text.startswith("Reply with a JSON object with these fields:\n")
    assert "  guests (integer, required): how many are coming\n" in text
    assert '  diet (one of "none", "vegetarian", "vegan", required)\n' in text
    assert "  note (string or null)\n" in text
    example = json.loads(text.split("For example:\n", 1)[1])
    assert example == {"guests": 1, "diet": "none", "note": "text"}
    # the example itself is an answer the reviewer could send back as is
    entry = read_answer(intr, json.dumps(example))
    assert check_answer(intr, entry) == [] and entry.payload == example


def test_how_to_answer_object_follows_refs() -> None:
    schema = {"type": "object", "properties": {"when": {"$ref": "#/$defs/Slot"}},
              "required": ["when"],
              "$defs": {"Slot": {"type": "object", "properties": {
                  "day": {"type": "string", "enum": ["sat", "sun"]},
                  "hour": {"type": "integer", "minimum": 12}}}}}
    text = how_to_answer(interrupt(schema))
    assert "  when (object, required)" in text
    assert json.loads(text.split("For example:\n", 1)[1]) == {"when": {"day": "sat", "hour": 12}}


def test_a_list_of_types_is_shown_and_read_as_any_value() -> None:
    # `type` may list several types: no example of one type, and any JSON value is read
    schema = {"type": "object", "properties": {"ref": {"type": ["string", "integer"]}}}
    text = how_to_answer(interrupt(schema))
    assert json.loads(text.split("For example:\n", 1)[1]) == {"ref": "…"}
    either = interrupt({"type": ["object", "array"]})
    assert read_answer(either, 'Here: [1, 2]').payload == [1, 2]


def test_base64_html_reply_end_to_end() -> None:
    html = "<div>2</div><div><br></div><blockquote><div>Which film?</div></blockquote>"
    raw = (b"From: Dana <dana@example.org>\nTo: reply+zz9-yy8@layby.example.com\n"
           b"Content-Type: text/html; charset=utf-8\nContent-Transfer-Encoding: base64\n\n"
           + base64.encodebytes(html.encode()))
    mail = parse_mail(raw)
    assert token_from_address(mail.recipients[0]) == "zz9-yy8"
    assert read_answer(trivia(), reply_text(mail.text)).payload == "Alien"


def test_the_page_and_replies_agree_on_what_a_schema_asks() -> None:
    """One reader of responseSchema: `approved` as an enum of booleans is a confirmation on
    the page and by email; a schema whose object sits behind a `$ref` is neither."""
    enum_approved = {"type": "object", "properties": {"approved": {"enum": [True, False]}},
                     "required": ["approved"]}
    asked = Interrupt(id="i-enum", reason="input_required", tool_call_id="c1",
                      tool_name="t", mode="respond", response_schema=enum_approved)
    assert is_confirmation(asked)
    assert read_answer(asked, "decline").payload == {"approved": False}
    behind_ref = {"$ref": "#/$defs/D", "$defs": {"D": {
        "type": "object", "properties": {"approved": {"type": "boolean"}}}}}
    wrapped = asked.model_copy(update={"id": "i-ref", "response_schema": behind_ref})
    assert not is_confirmation(wrapped)
    assert read_answer(wrapped, '{"approved": true}').payload == {"approved": True}
