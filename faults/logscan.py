"""Secrets in logs: a reviewed system with every process at DEBUG answers runs through
every channel (the answer page opened first, as a mail scanner would), and refuses what
logs what it refuses (late answers, a forged link, a forged token, the inbound-mail webhook
without its secret), and breaks each access rule once (four eyes, another tenant, a
read-only key, run tokens used elsewhere, beyond their rights, revoked); then every line
of every process's log, and the audit trail, is searched for every secret the system was
given (the keys file's keys too), as written and as it crosses the wire, and for every
reviewer token and run token it issued, whole or its signature alone (with the token's id
and ref, which are no secret, a signature is the token)."""

from __future__ import annotations

import base64
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from faults.common import Outcome, Size
from faults.reviewing import (
    CHANNELS,
    INBOUND_SECRET,
    KEYS,
    SMTP_LOGIN,
    Attempt,
    Parked,
    approve,
    park,
    reviewed,
)
from tests.answering.test_reviewer_answers import (
    callback_body,
    compose,
    finished,
    forged,
    inbound,
    post_callback,
    reply_address,
    token_of,
)
from tests.support import slack
from tests.support.harness import API_KEY
from tests.support.reviewers import HOOK_SECRET, TOKEN_KEYS, ReviewedSystem, issued_tokens

NAME = "secrets in logs"


def run(size: Size, folder: Path) -> Outcome:
    rounds = size.pick(short=1, full=3)
    with reviewed(folder) as system:
        answers: list[Attempt] = []
        refusals: list[int] = []
        access: list[Access] = []
        for n in range(rounds):
            runs = park(system, len(CHANNELS), first=100 * n + 1)
            answers += _round_trip(system, runs, n)
            refusals += _refusals(system, runs)
            access.append(_access(system, n))
        trail = _audit_trail(system)
    # Searched once every process has stopped: their logs whole, the last lines too.
    return outcome(system, answers, refusals, access, trail)


def _round_trip(system: ReviewedSystem, runs: list[Parked], n: int) -> list[Attempt]:
    """Each run answered through a channel of its own, its page opened first."""
    sent = []
    for run, channel in zip(runs, CHANNELS, strict=True):
        httpx.get(run.page, timeout=60)
        sent.append(approve(system, run, channel, f"{channel} {n}"))
    for run in runs:
        finished(system, run.run_id)
    return sent


def _refusals(system: ReviewedSystem, runs: list[Parked]) -> list[int]:
    """What layby refuses, and logs that it refused: each run answered again through the
    next channel, a forged page link and callback token, a reply posted without the
    inbound-mail secret. Their statuses (SMTP reply codes for SMTP)."""
    late = [approve(system, run, CHANNELS[(i + 1) % len(CHANNELS)], "late").code
            for i, run in enumerate(runs)]
    run = runs[0]
    token = token_of(run.mail)
    bad_page = httpx.post(run.page.replace(token, forged(token)),
                          data={"decision": "approve"}, timeout=60)
    bad_token = post_callback(system, callback_body(
        run.run_id, run.interrupt_id, {"approved": True}, reviewer=None,
        token=forged(run.hook_token)))
    no_secret = inbound(system, compose(run.mail, "approve").as_bytes(),
                        reply_address(run.mail))
    return [*late, bad_page.status_code, bad_token.status_code, no_secret.status_code]


@dataclass(frozen=True)
class Access:
    """One round of the access rules: what each refusal was answered with (against what
    the rules say), the run tokens minted, and whether the right key's approval was
    taken."""

    refused: dict[str, tuple[int, int]]  # what: (status, the status the rules say)
    tokens: list[str]
    approved: bool


def _access(system: ReviewedSystem, n: int) -> Access:
    """Keys, tenants, four eyes and run tokens, each rule broken once: a key approving the
    transfer it started, another tenant's key reading and answering it, a read-only key
    starting one, a run token used on another run, beyond its rights, and once revoked;
    then another key of the tenant approves it. Every refusal of a known caller is logged
    and audited, so a key or token they carried would show there."""
    base = system.system.base_url
    approval = {"status": "resolved", "payload": {"approved": True}}

    def as_(key: str) -> httpx.Client:
        return httpx.Client(base_url=base, timeout=60,
                            headers={"Authorization": f"Bearer {KEYS[key]}"})

    with as_("shop") as shop, as_("checker") as checker, as_("reader") as reader, \
            as_("rival") as rival:
        run_id = shop.post("/v1/runs", json={"agent": "demo.transfer",
                                             "input": f"Send {900 + n} to Ann"}).json()["id"]
        other = shop.post("/v1/runs", json={"agent": "demo.transfer",
                                            "input": f"Send {950 + n} to Ann"}).json()["id"]
        intr = system.system.open_interrupts(system.parked(run_id))[0]["id"]
        system.parked(other)
        answer = f"/v1/runs/{run_id}/interrupts/{intr}"
        minted = [shop.post(f"/v1/runs/{run_id}/tokens",
                            json={"can": ["read"], "ttlS": 600}).json()["token"]
                  for _ in range(2)]
        with httpx.Client(base_url=base, timeout=60,
                          headers={"Authorization": f"Bearer {minted[0]}"}) as token:
            refused = {
                "four eyes": (shop.post(answer, json=approval).status_code, 403),
                "another tenant's read": (rival.get(f"/v1/runs/{run_id}").status_code, 404),
                "another tenant's answer": (rival.post(answer, json=approval).status_code,
                                            404),
                "a read-only start": (reader.post("/v1/runs", json={
                    "agent": "demo.transfer", "input": "Send 1 to Ann"}).status_code, 403),
                "a token on another run": (token.get(f"/v1/runs/{other}").status_code, 404),
                "a token beyond its rights": (token.post(answer, json=approval).status_code,
                                              403),
                "a token listing runs": (token.get("/v1/runs").status_code, 403),
            }
            read = token.get(f"/v1/runs/{run_id}").status_code == 200
            shop.delete(f"/v1/runs/{run_id}/tokens")
            refused["a revoked token"] = (token.get(f"/v1/runs/{run_id}").status_code, 401)
        approved = checker.post(answer, json=approval).status_code == 200 and read
        shop.post(f"/v1/runs/{other}/cancel", json={})
    finished(system, run_id)
    return Access(refused, minted, approved)


def _audit_trail(system: ReviewedSystem) -> str:
    """The whole audit trail, as an admin reads it (searched for secrets as the logs
    are)."""
    entries, cursor = [], None
    with system.system.api() as admin:
        while True:
            page = admin.get("/v1/audit", params={"limit": 500,
                                                  **({"cursor": cursor} if cursor else {})})
            page.raise_for_status()
            entries += page.json()["entries"]
            cursor = page.json().get("nextCursor")
            if not cursor:
                return "\n".join(json.dumps(e) for e in entries)


def secrets() -> dict[str, str]:
    """Every secret the system was given, as configured and as it crosses the wire."""
    user, password = SMTP_LOGIN
    hook_key = base64.b64decode(HOOK_SECRET.removeprefix("whsec_"))
    return {
        "the API key": API_KEY,
        "the SMTP password": password,
        "the SMTP password in AUTH LOGIN": base64.b64encode(password.encode()).decode(),
        "the SMTP login in AUTH PLAIN":
            base64.b64encode(f"\0{user}\0{password}".encode()).decode(),
        "the inbound-mail secret": INBOUND_SECRET,
        "hookbot's webhook secret": HOOK_SECRET,
        "hookbot's webhook key": hook_key.decode(),
        "the Slack bot token": slack.BOT_TOKEN,
        "the Slack signing secret": slack.SIGNING_SECRET,
        **{f"key {name} of the keys file": key for name, key in KEYS.items()},
        **{f"token key {kid}": secret for kid, _, secret in
           (pair.partition(":") for pair in TOKEN_KEYS.split(","))},
    }


def _searched(system: ReviewedSystem, run_tokens: list[str]) -> dict[str, str]:
    tokens = issued_tokens(system)
    return {**secrets(),
            **{f"reviewer token {t[:6]}…": t for t in tokens},
            **{f"the signature of token {t[:6]}…": t.rsplit("-", 1)[-1] for t in tokens},
            # A run token's claims are no secret; its signature is the token.
            **{f"run token {t[:8]}…": t for t in run_tokens},
            **{f"the signature of run token {t[:8]}…": t.rsplit(".", 1)[-1]
               for t in run_tokens}}


def leaks(system: ReviewedSystem, searched: dict[str, str]) -> list[str]:
    """Each secret found in a log, with the first line holding it."""
    found = []
    for name, proc in system.system.procs.items():
        lines = proc.output().splitlines()
        for what, secret in searched.items():
            line = next((line for line in lines if secret in line), None)
            if line is not None:
                found.append(f"{what} in the {name} log: {line[:300]}")
    return found


def outcome(system: ReviewedSystem, answers: list[Attempt], refusals: list[int],
            access: list[Access], trail: str) -> Outcome:
    run_tokens = [t for a in access for t in a.tokens]
    searched = _searched(system, run_tokens)
    procs = system.system.procs
    outputs = {name: proc.output() for name, proc in procs.items()}
    found = leaks(system, searched)
    found += [f"{what} in the audit trail" for what, secret in searched.items()
              if secret in trail]
    wrong = [f"{what}: {got}, not {said}" for a in access
             for what, (got, said) in a.refused.items() if got != said]
    figures: dict[str, Any] = {
        "runs answered": len(answers),
        "answers taken by channel": dict(Counter(a.channel for a in answers if a.taken)),
        "refusals by status": dict(sorted(Counter(refusals).items())),
        "SMTP logins by the mailer": system.smtp.logins,
        "logs scanned": sorted(outputs),
        "log lines scanned": sum(len(text.splitlines()) for text in outputs.values()),
        "secrets searched for": len(secrets()),
        "tokens searched for": len(issued_tokens(system)),
        "run tokens searched for": len(run_tokens),
        "access refusals by status": dict(sorted(Counter(
            got for a in access for got, _ in a.refused.values()).items())),
        "audit entries searched": len(trail.splitlines()),
        # Where a log would have held a token, and holds "<token>" instead.
        "log lines with a token scrubbed": sum(1 for text in outputs.values()
                                               for line in text.splitlines()
                                               if "<token>" in line),
        "leaks": len(found),
    }
    if found:
        figures["leaks (first 5)"] = found[:5]
    if wrong:
        figures["access rules broken"] = wrong
    return Outcome(NAME, figures, {
        "every channel took its answer": all(a.taken for a in answers),
        "every refusal a 4xx over HTTP or a 550 by SMTP":
            all(400 <= code < 500 or code == 550 for code in refusals),
        # Four eyes, tenants, a read-only key, run tokens: each refused as its rule says,
        # and the transfer then approved by another key of its tenant.
        "every access rule held": not wrong and all(a.approved for a in access),
        # A scan of quiet logs would find nothing, and prove nothing.
        "every process logged at DEBUG": all("DEBUG" in text for text in outputs.values()),
        "the gateway's access log names the answer page": "/review/" in outputs["gateway"],
        "0 leaks": not found,
    })
