"""Reviewer tokens: HMAC-signed, bound to run, interrupt, reviewer and run version, expiring
with the interrupt, verifiable with any of several keys (so keys can rotate).

A token reads `<key id>.<payload>.<signature>` (URL-safe base64, no padding), short enough
for a plus-address (`reply+<token>@…`) and a link. It is accepted once by construction: it
names one interrupt at one run version, and an interrupt takes one answer.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from dataclasses import dataclass

from generation.errors import LaybyError


class BadToken(LaybyError):
    """The token is forged, damaged, expired or signed with a retired key."""

    status_code = 403


@dataclass(frozen=True)
class Grant:
    run_id: str
    interrupt_id: str
    reviewer: str
    version: int
    expires: int  # epoch seconds


def parse_keys(spec: str) -> dict[str, bytes]:
    """`kid:secret,kid2:secret2`: the first signs, all verify."""
    keys: dict[str, bytes] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        kid, sep, secret = item.partition(":")
        if not sep or not kid or not secret or "." in kid:
            raise ValueError(f"token key {item[:8]}… must read 'id:secret' (no dot in the id)")
        keys[kid] = secret.encode()
    return keys


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(key: bytes, kid: str, payload: str) -> str:
    return _b64(hmac.new(key, f"{kid}.{payload}".encode(), hashlib.sha256).digest()[:20])


def issue(keys: dict[str, bytes], grant: Grant) -> str:
    kid, key = next(iter(keys.items()))
    body = [grant.run_id, grant.interrupt_id, grant.reviewer, grant.version, grant.expires]
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    return f"{kid}.{payload}.{_sign(key, kid, payload)}"


def verify(keys: dict[str, bytes], token: str, *, now: float | None = None) -> Grant:
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise BadToken("this link or address does not hold a valid layby token")
    kid, payload, signature = parts
    key = keys.get(kid)
    if key is None:
        raise BadToken("this token was signed with a key layby no longer accepts; ask for a "
                       "new notification")
    if not hmac.compare_digest(_sign(key, kid, payload), signature):
        raise BadToken("this token's signature does not match: it was altered or forged")
    try:
        run_id, interrupt_id, reviewer, version, expires = json.loads(_unb64(payload))
        grant = Grant(str(run_id), str(interrupt_id), str(reviewer), int(version),
                      int(expires))
    except (ValueError, TypeError) as exc:
        raise BadToken("this token's content is damaged") from exc
    if grant.expires <= (time.time() if now is None else now):
        raise BadToken("this token has expired, as has the request it answers")
    return grant
