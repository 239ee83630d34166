"""Reviewer tokens: HMAC-signed, bound to run, interrupt, reviewer and run version, expiring
with the interrupt, verifiable with any of several keys (so keys can rotate).

A token reads `<key id>-<ref>-<signature>`, lowercase base32: about 40 characters, so
`reply+<token>@…` stays within the 64 characters SMTP allows a local part and survives
mail servers that change the case of addresses. The `ref` names a grant stored in Redis
(run, interrupt, reviewer, version, expiry); the signature covers the ref and the grant
together, so neither a guessed ref nor an edited grant verifies. A token is accepted once
by construction: its grant names one interrupt at one run version, and an interrupt takes
one answer.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from layby.errors import Forbidden
from layby.ids import first_fitting

KID = re.compile(r"^[a-z0-9]{1,8}$")
TOKEN = re.compile(r"^([a-z0-9]{1,8})-([a-z2-7]{16})-([a-z2-7]{16})$")


class BadToken(Forbidden):
    """The token is forged, damaged, unknown, expired or signed with a retired key."""


class ExpiredToken(BadToken):
    """A genuine token past its time. It carries its grant, so a page can still say that
    the request it answers has expired; it answers nothing."""

    def __init__(self, message: str, grant: Grant) -> None:
        super().__init__(message, run_id=grant.run_id)
        self.grant = grant


@dataclass(frozen=True)
class Grant:
    run_id: str
    interrupt_id: str
    reviewer: str
    version: int
    expires: int  # epoch seconds

    def dumps(self) -> str:
        """What the signature covers."""
        return json.dumps(asdict(self), separators=(",", ":"))

    def stored(self) -> str:
        """As the store keeps it, for as long as the token lives: its values, space-separated
        (as JSON, with its names, it would be nearly twice as long). The reviewer comes last,
        as the rest of the line: the other values hold no space (a run id is letters,
        digits, `_`, `-` and `.`)."""
        return f"{self.run_id} {self.interrupt_id} {self.version} {self.expires} {self.reviewer}"

    @classmethod
    def loads(cls, raw: str) -> Grant:
        """A grant as `stored` wrote it."""
        run_id, interrupt_id, version, expires, reviewer = raw.split(" ", 4)
        return cls(run_id, interrupt_id, reviewer, int(version), int(expires))


def parse_keys(spec: str) -> dict[str, bytes]:
    """`kid:secret,kid2:secret2`: the first signs, all verify."""
    keys: dict[str, bytes] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        kid, sep, secret = item.partition(":")
        if not sep or not KID.match(kid) or len(secret) < 16:
            raise ValueError("each token key must read 'id:secret': an id of 1 to 8 lowercase "
                             "letters or digits, a secret of 16 characters or more")
        keys[kid] = secret.encode()
    if not keys:
        raise ValueError("no token keys given: set LAYBY_TOKEN_KEYS to 'id:secret'")
    return keys


def new_keys() -> str:
    """A fresh key spec, for `layby up` and for operators rotating keys."""
    return f"k{secrets.randbelow(10**6):06d}:{secrets.token_urlsafe(32)}"


def _b32(raw: bytes) -> str:
    return base64.b32encode(raw).decode().rstrip("=").lower()


def _sign(key: bytes, kid: str, ref: str, grant: Grant) -> str:
    message = f"{kid}\x00{ref}\x00{grant.dumps()}".encode()
    return _b32(hmac.new(key, message, hashlib.sha256).digest()[:10])


# A ref: 16 letters of lowercase base32 (80 bits), as `_b32` writes 10 bytes.
_REF_LETTERS = 16
_BASE32 = "abcdefghijklmnopqrstuvwxyz234567"


def issue(keys: dict[str, bytes], grant: Grant,
          fits: Callable[[str], bool] | None = None) -> tuple[str, str]:
    """A new token for `grant`: returns (ref, token). The caller stores the grant under ref.
    `fits`: which refs will do (in a sharded store, those in the shard of the grant's run,
    which is where the grant is stored and looked up: drawn until one fits)."""
    kid, key = next(iter(keys.items()))
    ref = first_fitting(_BASE32, _REF_LETTERS, fits)
    return ref, f"{kid}-{ref}-{_sign(key, kid, ref, grant)}"


def ref_of(token: str) -> str | None:
    found = TOKEN.match(token.strip().lower())
    return found.group(2) if found else None


def verify(keys: dict[str, bytes], token: str, lookup: Callable[[str], Grant | None], *,
           now: float | None = None) -> Grant:
    """The grant behind `token`, or BadToken saying why not. `lookup` reads a stored grant."""
    found = TOKEN.match(token.strip().lower())
    if not found:
        raise BadToken("this link or address does not hold a valid layby token; use the "
                       "link or reply address from the notification as it was sent")
    kid, ref, signature = found.groups()
    key = keys.get(kid)
    if key is None:
        raise BadToken("this token was signed with a key layby no longer accepts; ask the "
                       "run's owner to send the request again")
    grant = lookup(ref)
    if grant is None:
        raise BadToken("this token is unknown or has expired (tokens last as long as the "
                       "request they answer)")
    if not hmac.compare_digest(_sign(key, kid, ref, grant), signature):
        raise BadToken("this token's signature does not match: it was altered or forged")
    if grant.expires <= (time.time() if now is None else now):
        raise ExpiredToken("this token has expired, as has the request it answers", grant)
    return grant
