"""Hostile input costs little: every HTTP route stops reading a body at its limit and
answers 413 with a JSON reason (whether the body declares its length or streams it), the
sender reads that answer instead of a reset connection, the gateway's memory stays flat
under a body far past the limit, and a reply mail past a limit of size or shape (100,000
MIME parts, nesting, a giant header) is refused with its reason, by SMTP (552) and by the
inbound-mail webhook (413), before it is parsed. A reply to a token that answers nothing
(unknown, spent) is refused at RCPT, before a byte of it is sent. A start whose history
cannot begin a run is a 422 saying why. Nothing is recorded; the run still answers; the
gateway keeps serving."""

from __future__ import annotations

import smtplib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.answering.test_reviewer_answers import (
    compose,
    finished,
    inbound,
    notification,
    reply,
    reply_address,
    smtp_refusal,
    smtp_send,
    start,
    token_of,
    unknown_ref,
)
from tests.support.harness import API_KEY, LaybySystem
from tests.support.reviewers import ReviewedSystem

ANSWER_LIMIT = 256 * 1024  # LAYBY_MAX_ANSWER_BYTES's default
MAIL_LIMIT = 10 * 1024 * 1024  # LAYBY_MAX_MAIL_BYTES's default


def _chunks(total: int, size: int = 64 * 1024) -> Iterator[bytes]:
    """A body streamed without Content-Length (chunked), as a hostile sender would."""
    sent = 0
    while sent < total:
        piece = min(size, total - sent)
        sent += piece
        yield b"x" * piece


def _too_large(reply: httpx.Response, setting: str) -> str:
    assert reply.status_code == 413, f"{reply.status_code}: {reply.text[:300]}"
    assert reply.headers["content-type"].startswith("application/json")
    error = reply.json()["error"]
    assert error["code"] == "toolarge"
    assert setting in error["message"], error["message"]
    return str(error["message"])


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc status")


def test_every_route_stops_reading_at_its_limit(system: LaybySystem) -> None:
    run = system.start_run("demo.transfer", "Send 40 to Ann")
    parked = system.wait_status(run["id"], "interrupted")
    (approval,) = system.open_interrupts(parked)
    keyed = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    routes = [
        ("/v1/runs", keyed),
        (f"/v1/runs/{run['id']}/interrupts/{approval['id']}", keyed),
        (f"/v1/runs/{run['id']}/resume", keyed),
        (f"/v1/runs/{run['id']}/cancel", keyed),
        ("/agui/demo.transfer", keyed),
        ("/callbacks/answers", {"Content-Type": "application/json"}),
        ("/review/t1-notatoken", {"Content-Type": "application/x-www-form-urlencoded"}),
    ]
    over = ANSWER_LIMIT + 1
    with httpx.Client(base_url=system.base_url, timeout=60) as http:
        for path, headers in routes:
            declared = http.post(path, content=b"x" * over, headers=headers)
            streamed = http.post(path, content=_chunks(4 * over), headers=headers)
            assert str(over) in _too_large(declared, "LAYBY_MAX_ANSWER_BYTES"), path
            _too_large(streamed, "LAYBY_MAX_ANSWER_BYTES")
        mail = {"Content-Type": "message/rfc822"}
        _too_large(http.post("/inbound/email", content=b"x" * (MAIL_LIMIT + 1),
                             headers=mail), "LAYBY_MAX_MAIL_BYTES")
        _too_large(http.post("/inbound/email", content=_chunks(MAIL_LIMIT + 1),
                             headers=mail), "LAYBY_MAX_MAIL_BYTES")
        # A body within the limit on the same connection still works: nothing was left
        # half-read, and nothing above was recorded.
        assert http.get("/healthz").status_code == 200
    assert system.run(run["id"])["status"] == "interrupted"
    assert system.answer(run["id"], approval["id"], payload={"approved": True}
                         ).status_code == 200
    assert system.wait_status(run["id"], "completed")["result"] == "Sent 40 to Ann."


def test_a_huge_body_leaves_the_gateways_memory_flat(system: LaybySystem) -> None:
    """100 MB streamed at `POST /v1/runs` with a valid key: a 413, and the gateway's peak
    memory grows by less than the limit's few chunks, not by the body."""
    pid = system.procs["gateway"].process.pid  # type: ignore[union-attr]
    before = _peak_rss_kib(pid)
    with system.api() as api:
        got = api.post("/v1/runs", content=_chunks(100 * 1024 * 1024),
                       headers={"Content-Type": "application/json"}, timeout=120)
        _too_large(got, "LAYBY_MAX_ANSWER_BYTES")
        assert api.get("/v1/agents").status_code == 200
    assert _peak_rss_kib(pid) - before < 20 * 1024


def _many_parts(count: int, sender: str, to: str) -> bytes:
    parts = b"".join(b"--b\r\nContent-Type: text/plain\r\n\r\napprove\r\n" for _ in range(count))
    return (f"From: {sender}\r\nTo: {to}\r\nSubject: Re: approval\r\n"
            "Content-Type: multipart/mixed; boundary=b\r\n\r\n").encode() + parts + b"--b--\r\n"


def _nested(depth: int, sender: str, to: str) -> bytes:
    head = (f"From: {sender}\r\nTo: {to}\r\nSubject: Re: approval\r\n"
            "Content-Type: multipart/mixed; boundary=b0\r\n\r\n").encode()
    inner = b"".join(b"--b%d\r\nContent-Type: multipart/mixed; boundary=b%d\r\n\r\n" % (i, i + 1)
                     for i in range(depth))
    return head + inner + b"--b%d\r\nContent-Type: text/plain\r\n\r\napprove\r\n" % depth


def _many_headers(count: int, sender: str, to: str) -> bytes:
    noise = "".join(f"X-Noise-{i}: {i}\r\n" for i in range(count))
    return (f"From: {sender}\r\nTo: {to}\r\n{noise}Subject: Re: approval\r\n\r\n"
            "approve\r\n").encode()


@pytest.mark.parametrize(("hostile", "reason"), [
    (lambda s, t: _many_parts(100_000, s, t), "at most 250 parts are read"),
    (lambda s, t: _nested(40, s, t), "nests MIME parts more than 10 deep"),
    (lambda s, t: _many_headers(5_000, s, t), "more than 500 header fields"),
], ids=["100k-parts", "nested-40", "5000-headers"])
def test_a_hostile_reply_is_refused_before_it_is_parsed(reviewed: ReviewedSystem, hostile,
                                                        reason: str) -> None:
    """From the reviewer's own address, to the right reply address: refused for its shape
    by SMTP (552 5.3.4) and by the inbound-mail webhook (413), with the reason; the genuine
    reply afterwards answers."""
    run_id = start(reviewed, "demo.transfer", "Send 250 to Bob")
    mail = notification(reviewed, run_id)
    to = reply_address(mail)
    raw = hostile("alice@example.com", to)

    with pytest.raises(smtplib.SMTPDataError) as refused:
        smtp_send(reviewed.reply_port, raw, "alice@example.com", to)
    posted = inbound(reviewed, raw, to)

    code, why = smtp_refusal(refused.value)
    assert (code, why.split()[0]) == (552, "5.3.4") and reason in why, why
    assert posted.status_code == 413 and reason in posted.json()["error"]["message"]
    assert reviewed.system.run(run_id)["status"] == "interrupted"
    reply(reviewed, mail, "approve")
    assert finished(reviewed, run_id)["result"] == "Sent 250 to Bob."


def test_a_reply_past_the_size_limit_gets_552(reviewed: ReviewedSystem) -> None:
    run_id = start(reviewed, "demo.transfer", "Send 250 to Bob")
    mail = notification(reviewed, run_id)
    big = compose(mail, "approve")
    big.add_attachment(b"\0" * (MAIL_LIMIT + 1024), maintype="application",
                       subtype="octet-stream", filename="big.bin")

    with pytest.raises((smtplib.SMTPDataError, smtplib.SMTPSenderRefused)) as refused:
        smtp_send(reviewed.reply_port, big.as_bytes(), "alice@example.com",
                  reply_address(mail))

    assert smtp_refusal(refused.value)[0] == 552
    assert token_of(mail)  # the request is still open to the genuine reply
    reply(reviewed, mail, "approve")
    assert finished(reviewed, run_id)["result"] == "Sent 250 to Bob."


def _rcpt_then_data(port: int, sender: str, to: str, raw: bytes) -> tuple[tuple[int, str],
                                                                          tuple[int, str]]:
    """RCPT's reply, and DATA's (sent anyway, as a careless sender would)."""
    with smtplib.SMTP("127.0.0.1", port, timeout=60) as smtp:
        smtp.ehlo("mail.example.com")
        smtp.mail(sender)
        rcpt_code, rcpt_why = smtp.rcpt(to)
        data_code, data_why = smtp.docmd("DATA")
        if data_code == 354:  # it would read the mail: send it, to see what it answers
            data_code, data_why = smtp.data(raw)
    return (rcpt_code, rcpt_why.decode()), (data_code, data_why.decode())


def test_a_reply_to_an_unknown_or_spent_token_is_refused_at_rcpt(reviewed: ReviewedSystem
                                                                 ) -> None:
    """What was observed: any reply+<token>@ recipient got 250 at RCPT, and a 5 MB mail to
    a made-up token was read and parsed before the 552. Now the token is checked at RCPT:
    550 with the reason, and DATA is refused (no valid recipient) without reading a byte.
    The same for a token already spent (its request answered by email)."""
    run_id = start(reviewed, "demo.transfer", "Send 250 to Bob")
    mail = notification(reviewed, run_id)
    fake = f"reply+{unknown_ref(token_of(mail))}@{reply_address(mail).split('@')[1]}"
    big = compose(mail, "approve", to=fake)
    big.add_attachment(b"\0" * (5 * 1024 * 1024), maintype="application",
                       subtype="octet-stream", filename="big.bin")

    rcpt, data = _rcpt_then_data(reviewed.reply_port, "alice@example.com", fake,
                                 big.as_bytes())

    assert rcpt[0] == 550 and "unknown or has expired" in rcpt[1], rcpt
    assert data[0] == 503, data  # "no valid recipients": the mail is never read
    assert reviewed.system.run(run_id)["status"] == "interrupted"

    reply(reviewed, mail, "approve")
    finished(reviewed, run_id)
    rcpt, data = _rcpt_then_data(reviewed.reply_port, "alice@example.com",
                                 reply_address(mail), compose(mail, "decline").as_bytes())
    assert rcpt[0] == 550 and "already resolved by reviewer:alice via email" in rcpt[1], rcpt
    assert data[0] == 503, data


def test_a_start_whose_messages_cannot_begin_a_run_is_a_422_saying_why(
        system: LaybySystem) -> None:
    """What was observed: `messages` without a user message was accepted, and the scripted
    model then failed the run with `TypeError: string indices must be integers`."""
    with system.api() as api:
        no_user = api.post("/v1/runs", json={"agent": "demo.trivia", "messages": [
            {"role": "system", "content": [{"text": "You are a quiz master."}]}]})
        orphan = api.post("/v1/runs", json={"agent": "demo.trivia", "messages": [
            {"role": "user", "content": [{"text": "Quiz me"}]},
            {"role": "tool", "content": [{"toolResponse": {
                "name": "ask_question", "ref": "q1", "output": "Jaws"}}]}]})
        fine = api.post("/v1/runs", json={"agent": "demo.trivia", "messages": [
            {"role": "system", "content": [{"text": "You are a quiz master."}]},
            {"role": "user", "content": [{"text": "Quiz me"}]}]})

    assert no_user.status_code == 422, no_user.text
    error = no_user.json()["error"]
    assert "holds no user message" in error["message"], error
    assert error["detail"][0]["path"] == "/messages"
    assert orphan.status_code == 422, orphan.text
    assert ("tool response to 'ask_question' (ref 'q1') that no earlier model message "
            "requested") in orphan.json()["error"]["message"]
    assert fine.status_code == 202, fine.text
    assert system.wait_status(fine.json()["id"], "interrupted")["status"] == "interrupted"
