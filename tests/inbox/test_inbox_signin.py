"""The inbox's sign-in links, sessions and CSRF tokens (`layby.inbox.signin`), and the log
lines that must never show a link."""

from __future__ import annotations

import time

import pytest

from layby.broker_config.logs import scrub
from layby.inbox import signin
from layby.reviewers.tokens import parse_keys

KEYS = parse_keys("new:new-key-0123456789abcdef,old:old-key-0123456789abcdef")
OLD_ONLY = parse_keys("old:old-key-0123456789abcdef")


def test_a_link_says_whose_it_is_until_when() -> None:
    link = signin.make(KEYS, "link", "alice", 900)
    signed = signin.read(KEYS, "link", link)
    assert signed.reviewer == "alice"
    assert abs(signed.expires - (time.time() + 900)) < 5
    # Two links for the same reviewer differ: each is used up on its own.
    assert signin.read(KEYS, "link", signin.make(KEYS, "link", "alice", 900)).nonce \
        != signed.nonce


def test_a_session_is_not_a_link_nor_a_link_a_session() -> None:
    session = signin.make(KEYS, "session", "alice", 3600)
    with pytest.raises(signin.BadSignIn, match="signature does not match"):
        signin.read(KEYS, "link", session)
    with pytest.raises(signin.BadSignIn, match="signature does not match"):
        signin.read(KEYS, "session", signin.make(KEYS, "link", "alice", 900))


def test_a_link_made_with_a_retired_key_or_altered_is_refused() -> None:
    made_by_old = signin.make(OLD_ONLY, "link", "alice", 900)
    assert signin.read(KEYS, "link", made_by_old).reviewer == "alice"  # rotation: still read
    with pytest.raises(signin.BadSignIn, match="no longer accepts"):
        signin.read(parse_keys("new:new-key-0123456789abcdef"), "link", made_by_old)
    kid, _, mac = signin.make(KEYS, "link", "alice", 900).split(".")
    other = signin.make(KEYS, "link", "mallory", 900).split(".")[1]
    with pytest.raises(signin.BadSignIn, match="signature does not match"):
        signin.read(KEYS, "link", f"{kid}.{other}.{mac}")
    for junk in ("", "a.b", "x" * 5000, "new.!!.??", "new.x.\u00e9", "new.\u00e9.x"):
        with pytest.raises(signin.BadSignIn):
            signin.read(KEYS, "link", junk)


def test_an_expired_link_says_so() -> None:
    stale = signin.make(KEYS, "link", "alice", 900, now=time.time() - 901)
    with pytest.raises(signin.ExpiredLink, match="expired"):
        signin.read(KEYS, "link", stale)


def test_the_csrf_token_belongs_to_its_session() -> None:
    token = signin.csrf_token(KEYS, "session-1")
    assert signin.csrf_ok(KEYS, "session-1", token)
    assert not signin.csrf_ok(KEYS, "session-2", token)
    assert not signin.csrf_ok(KEYS, "session-1", "")
    assert not signin.csrf_ok(KEYS, "session-1", "\u00e9" * 22)
    # Made before a rotation, it still holds for the session's life.
    assert signin.csrf_ok(KEYS, "s", signin.csrf_token(OLD_ONLY, "s"))


def test_logs_never_show_a_sign_in_link() -> None:
    link = signin.make(KEYS, "link", "alice", 900)
    line = f'127.0.0.1:5555 - "GET /inbox/sign-in/{link} HTTP/1.1" 200'
    assert link not in scrub(line)
    assert "/inbox/sign-in/<token> HTTP/1.1" in scrub(line)


def test_doctor_says_how_reviewers_sign_in_and_refuses_cookies_in_clear() -> None:
    from layby.broker_config import Settings
    from layby.ops.doctor import check_inbox

    nothing = check_inbox(Settings(smtp_host=None))
    assert nothing.ok and "no way to sign in" in nothing.message
    mailed = check_inbox(Settings(smtp_host="smtp.example.com",
                                  public_url="https://layby.example.com"))
    assert mailed.ok and "link mailed" in mailed.message
    proxied = check_inbox(Settings(inbox_trusted_header="X-Forwarded-Email",
                                   public_url="https://layby.example.com"))
    assert proxied.ok and "X-Forwarded-Email" in proxied.message
    clear = check_inbox(Settings(smtp_host="smtp.example.com",
                                 public_url="http://layby.example.com"))
    assert not clear.ok and "unencrypted" in clear.message
    local = check_inbox(Settings(smtp_host="127.0.0.1", public_url="http://127.0.0.1:8000"))
    assert local.ok
