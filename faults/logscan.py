"""Secrets in logs: a reviewed system with every process at DEBUG answers runs through
every channel (the answer page opened first, as a mail scanner would), and refuses what
logs what it refuses (late answers, a forged link, a forged token, the inbound-mail webhook
without its secret); then every line of every process's log is searched for every secret
the system was given, as written and as it crosses the wire, and for every reviewer token
it issued, whole or its signature alone (with the token's id and ref, which are no
secret, a signature is the token)."""

from __future__ import annotations

import base64
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from faults.common import Outcome, Size
from faults.reviewing import (
    CHANNELS,
    INBOUND_SECRET,
    SMTP_LOGIN,
    Attempt,
    Parked,
    approve,
    park,
    reviewed,
)
from tests import slack
from tests.harness import API_KEY
from tests.reviewers import HOOK_SECRET, TOKEN_KEYS, ReviewedSystem, issued_tokens
from tests.test_reviewer_answers import (
    callback_body,
    compose,
    finished,
    forged,
    inbound,
    post_callback,
    reply_address,
    token_of,
)

NAME = "secrets in logs"


def run(size: Size, folder: Path) -> Outcome:
    rounds = size.pick(short=1, full=3)
    with reviewed(folder) as system:
        answers: list[Attempt] = []
        refusals: list[int] = []
        for n in range(rounds):
            runs = park(system, len(CHANNELS), first=100 * n + 1)
            answers += _round_trip(system, runs, n)
            refusals += _refusals(system, runs)
    # Searched once every process has stopped: their logs whole, the last lines too.
    return outcome(system, answers, refusals)


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
        **{f"token key {kid}": secret for kid, _, secret in
           (pair.partition(":") for pair in TOKEN_KEYS.split(","))},
    }


def _searched(system: ReviewedSystem) -> dict[str, str]:
    tokens = issued_tokens(system)
    return {**secrets(),
            **{f"reviewer token {t[:6]}…": t for t in tokens},
            **{f"the signature of token {t[:6]}…": t.rsplit("-", 1)[-1] for t in tokens}}


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


def outcome(system: ReviewedSystem, answers: list[Attempt], refusals: list[int]
            ) -> Outcome:
    searched = _searched(system)
    procs = system.system.procs
    outputs = {name: proc.output() for name, proc in procs.items()}
    found = leaks(system, searched)
    figures: dict[str, Any] = {
        "runs answered": len(answers),
        "answers taken by channel": dict(Counter(a.channel for a in answers if a.taken)),
        "refusals by status": dict(sorted(Counter(refusals).items())),
        "SMTP logins by the mailer": system.smtp.logins,
        "logs scanned": sorted(outputs),
        "log lines scanned": sum(len(text.splitlines()) for text in outputs.values()),
        "secrets searched for": len(secrets()),
        "tokens searched for": len(issued_tokens(system)),
        # Where a log would have held a token, and holds "<token>" instead.
        "log lines with a token scrubbed": sum(1 for text in outputs.values()
                                               for line in text.splitlines()
                                               if "<token>" in line),
        "leaks": len(found),
    }
    if found:
        figures["leaks (first 5)"] = found[:5]
    return Outcome(NAME, figures, {
        "every channel took its answer": all(a.taken for a in answers),
        "every refusal a 4xx over HTTP or a 550 by SMTP":
            all(400 <= code < 500 or code == 550 for code in refusals),
        # A scan of quiet logs would find nothing, and prove nothing.
        "every process logged at DEBUG": all("DEBUG" in text for text in outputs.values()),
        "the gateway's access log names the answer page": "/review/" in outputs["gateway"],
        "0 leaks": not found,
    })
