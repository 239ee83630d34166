"""Run tokens: bearer credentials for one run, for a browser (a CopilotKit or `@ag-ui/client`
page) that must not hold a service's key.

A key mints one (`POST /v1/runs/{id}/tokens`) with some of its own rights and a lifetime. The
token carries what it allows, signed with the reviewer token keys (LAYBY_TOKEN_KEYS: the
first signs, all verify, so keys rotate), so checking it reads nothing from the store:

    lbr.<key id>.<claims, base64url JSON>.<signature, base64url HMAC-SHA256>

The claims: the run, its tenant, the minting key's caller (who answers made with the token
are recorded as, so four eyes holds through it), the rights, when it was minted (ms) and when
it expires (s). What the store holds of the run (whether it ended, when its tokens were
revoked) is checked where the run is read anyway (`layby.control.commands`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from dataclasses import dataclass

from layby.access.rights import ANSWER, APPROVE, CANCEL, READ, SELF_APPROVE, Identity
from layby.errors import Unauthorized

PREFIX = "lbr."
# What a token may carry: a run's own rights (never start, admin).
TOKEN_RIGHTS = frozenset({READ, ANSWER, APPROVE, CANCEL, SELF_APPROVE})
MAX_TTL_S = 86_400
_SHAPE = re.compile(r"^lbr\.([a-z0-9]{1,8})\.([A-Za-z0-9_-]{1,1024})\.([A-Za-z0-9_-]{43})$")


@dataclass(frozen=True)
class RunToken:
    run_id: str
    tenant: str
    minted_by: str  # the minting key's caller
    can: frozenset[str]
    issued_ms: int
    expires_s: int

    def identity(self) -> Identity:
        return Identity(self.minted_by, self.tenant, self.can, (), run=self.run_id,
                        issued_ms=self.issued_ms)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(key: bytes, kid: str, claims: str) -> str:
    return _b64(hmac.new(key, f"run-token\x00{kid}\x00{claims}".encode(),
                         hashlib.sha256).digest())


def mint(keys: dict[str, bytes], token: RunToken) -> str:
    """`token` signed with the first of `keys`."""
    kid, key = next(iter(keys.items()))
    claims = _b64(json.dumps({"r": token.run_id, "t": token.tenant, "c": token.minted_by,
                              "can": sorted(token.can), "iat": token.issued_ms,
                              "exp": token.expires_s}, separators=(",", ":")).encode())
    return f"{PREFIX}{kid}.{claims}.{_sign(key, kid, claims)}"


def is_run_token(presented: str) -> bool:
    return presented.startswith(PREFIX)


def read(keys: dict[str, bytes], presented: str, now_s: float) -> RunToken:
    """The token's claims, or Unauthorized saying why not (forged, damaged, signed with a
    retired key, expired)."""
    found = _SHAPE.match(presented)
    if found is None:
        raise Unauthorized("this run token is damaged: use it as it was given")
    kid, claims, signature = found.groups()
    key = keys.get(kid)
    if key is None:
        raise Unauthorized("this run token was signed with a key layby no longer accepts: "
                           "ask for a new one")
    if not hmac.compare_digest(_sign(key, kid, claims), signature):
        raise Unauthorized("this run token's signature does not match: it was altered or "
                           "forged")
    try:
        data = json.loads(_unb64(claims))
        token = RunToken(str(data["r"]), str(data["t"]), str(data["c"]),
                         frozenset(data["can"]) & TOKEN_RIGHTS, int(data["iat"]),
                         int(data["exp"]))
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise Unauthorized("this run token's claims cannot be read") from exc
    if token.expires_s <= now_s:
        raise ExpiredRunToken(f"this run token expired; ask {token.minted_by} for a new one",
                              token)
    return token


class ExpiredRunToken(Unauthorized):
    """A genuine run token past its time: who it was minted by and for is known (the audit
    keeps its refusal), but it is taken no more."""

    def __init__(self, message: str, token: RunToken) -> None:
        super().__init__(message, run_id=token.run_id, code="unauthorized")
        self.token = token
