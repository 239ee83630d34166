"""Signing in to the reviewers' inbox: the mailed sign-in link, the session cookie it opens,
the CSRF token every inbox form carries, and the notice an answer's redirect carries.

All three are HMAC-signed with the reviewer token keys (`LAYBY_TOKEN_KEYS`: the first key
signs, every key verifies, so keys rotate as reviewer tokens do), each under its own purpose,
so one can never pass for another. Nothing here touches the store: a link is made single-use,
and a session ended early, by the caller recording its nonce (`store.marks.first_sight`);
every session and link of a reviewer made before a time are refused by the caller
(`layby inbox revoke`).

    link     <kid>.<payload>.<signature>   payload: reviewer, expiry, issued, nonce
    session  <kid>.<payload>.<signature>   payload: reviewer, expiry, issued, session id
    csrf     <signature of the session id>
    flash    <kid>.<payload>.<signature>   payload: text, kind, expiry; signed with the session

A payload is URL-safe base64 of compact JSON; a signature is 16 bytes of HMAC-SHA256.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Literal

from layby.errors import Forbidden

Purpose = Literal["link", "session"]
# Longer than any value this module makes: refused before anything is decoded.
_MAX_LEN = 600
# The longest a session may be given (LAYBY_INBOX_SESSION_TTL_S's bound).
_LONGEST_S = 30 * 24 * 3600


class BadSignIn(Forbidden):
    """A sign-in link or session that is forged, damaged, signed with a retired key or out of
    date."""


class ExpiredLink(BadSignIn):
    """A genuine sign-in link past its time."""


@dataclass(frozen=True)
class Signed:
    """What a valid link or session says: whose it is, until when (epoch seconds), and its
    nonce (a link's, or the session's id)."""

    reviewer: str
    expires: int
    nonce: str
    issued_ms: int  # epoch ms: `layby inbox revoke` refuses what was signed before it


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, purpose: str, message: str) -> str:
    return _b64(hmac.new(key, f"layby-inbox\x00{purpose}\x00{message}".encode(),
                         hashlib.sha256).digest()[:16])


def make(keys: dict[str, bytes], purpose: Purpose, reviewer: str, ttl_s: int, *,
         now: float | None = None) -> str:
    """A new link or session for `reviewer`, good for `ttl_s`."""
    kid, key = next(iter(keys.items()))
    issued = time.time() if now is None else now
    payload = _b64(json.dumps({"r": reviewer, "e": int(issued + ttl_s), "i": int(issued * 1000),
                               "n": secrets.token_urlsafe(12)},
                              separators=(",", ":")).encode())
    return f"{kid}.{payload}.{_mac(key, purpose, f'{kid}.{payload}')}"


def read(keys: dict[str, bytes], purpose: Purpose, value: str, *,
         now: float | None = None) -> Signed:
    """What a link or session made by `make` says; BadSignIn (ExpiredLink for a genuine one
    out of date) says why not."""
    what = "sign-in link" if purpose == "link" else "session"
    # Only ASCII is ours (and `hmac.compare_digest` takes no other text).
    parts = value.split(".") if len(value) <= _MAX_LEN and value.isascii() else []
    if len(parts) != 3:
        raise BadSignIn(f"this {what} is not one layby made: use the link from the sign-in "
                        "mail as it was sent, or ask for a new one")
    kid, payload, signature = parts
    key = keys.get(kid)
    if key is None:
        raise BadSignIn(f"this {what} was signed with a key layby no longer accepts: ask for "
                        "a new sign-in link")
    if not hmac.compare_digest(_mac(key, purpose, f"{kid}.{payload}"), signature):
        raise BadSignIn(f"this {what}'s signature does not match: it was altered or forged")
    try:
        fields = json.loads(_unb64(payload))
        expires = int(fields["e"])
        # Made before sign-ins said when (0.2.0): taken as old as a session may be, so a
        # revocation ends it too.
        issued_ms = int(fields.get("i", (expires - _LONGEST_S) * 1000))
        signed = Signed(str(fields["r"]), expires, str(fields["n"]), issued_ms)
    except (ValueError, KeyError, TypeError, binascii.Error):
        # Signed by us yet unreadable: made by another release's format. Refused all the same.
        raise BadSignIn(f"this {what} cannot be read: ask for a new sign-in link") from None
    if signed.expires <= (time.time() if now is None else now):
        raise ExpiredLink(f"this {what} has expired: ask for a new sign-in link")
    return signed


def csrf_token(keys: dict[str, bytes], session_id: str) -> str:
    """The token an inbox form carries for the session `session_id`: only a page the
    session was shown has it, so a form another site makes a browser post is refused."""
    return _mac(next(iter(keys.values())), "csrf", session_id)


def csrf_ok(keys: dict[str, bytes], session_id: str, token: str) -> bool:
    """Whether `token` is this session's CSRF token, signed with any key in force."""
    given = token.encode("utf-8", "replace")
    return any(hmac.compare_digest(_mac(key, "csrf", session_id).encode(), given)
               for key in keys.values())


def flash(keys: dict[str, bytes], session_id: str, text: str, kind: str,
          ttl_s: int = 60) -> str:
    """A notice for the page a redirect lands on (post/redirect/get): signed, so a link
    cannot make the inbox say what layby did not, and bound to the session it was made
    for, so the next reviewer at the same browser is not told it."""
    kid, key = next(iter(keys.items()))
    payload = _b64(json.dumps({"m": text[:500], "k": kind, "e": int(time.time() + ttl_s)},
                              separators=(",", ":")).encode())
    return f"{kid}.{payload}.{_mac(key, 'flash', f'{session_id}.{kid}.{payload}')}"


def read_flash(keys: dict[str, bytes], value: str, session_id: str) -> tuple[str, str] | None:
    """The notice `flash` made for this session, or None (none, forged, another session's,
    out of date)."""
    parts = value.split(".") if len(value) <= _MAX_LEN * 2 and value.isascii() else []
    if len(parts) != 3 or parts[0] not in keys:
        return None
    kid, payload, signature = parts
    expected = _mac(keys[kid], "flash", f"{session_id}.{kid}.{payload}")
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        return None
    try:
        fields = json.loads(_unb64(payload))
        if int(fields["e"]) <= time.time():
            return None
        return str(fields["m"]), str(fields["k"])
    except (ValueError, KeyError, TypeError, binascii.Error):
        return None
