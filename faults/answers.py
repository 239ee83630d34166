"""Concurrent answers: fifty answers fired at once at each run's one approval, over every
channel together (the API, the answer page, the inbound-mail webhook, an SMTP reply,
callbacks carrying Alice's or hookbot's token or signed by hookbot, Alice's Slack answer
modal, Alice's inbox), and at one more run's through the inbox alone (fifty presses of
Approve in one reviewer's session: tabs, double clicks), every process at DEBUG. Exactly
one may be taken and recorded; every other one is refused as answered already (409, 550 by
SMTP, the modal's errors in Slack's 200), the run resumes once, and the money moves once."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from faults.common import Outcome, Size, transfers
from faults.reviewing import (
    INBOX,
    RACING,
    SLACK_MODAL,
    Attempt,
    Parked,
    approve,
    park,
    reviewed,
    sign_in,
)
from tests.answering.test_reviewer_answers import finished
from tests.support.reviewers import ReviewedSystem
from tests.support.sse import history

NAME = "concurrent answers"
PER_INTERRUPT = 50


def run(size: Size, folder: Path) -> Outcome:
    count = size.pick(short=5, full=40)
    with reviewed(folder) as system:
        runs = park(system, count + 1, inbox=sign_in(system))
        attempts: dict[str, list[Attempt]] = {}
        took: list[float] = []
        for n, parked in enumerate(runs):
            started = time.monotonic()
            # The last run's answers all come from the one session: the inbox racing itself.
            channels = (INBOX,) if n == count else RACING
            attempts[parked.run_id] = burst(system, parked, channels)
            took.append(time.monotonic() - started)
        ends = {r.run_id: finished(system, r.run_id) for r in runs}
        result = outcome(system, runs, attempts, ends)
        result.figures["longest burst, all replies in (s)"] = round(max(took), 1)
        return result


def burst(system: ReviewedSystem, run: Parked, channels: tuple[str, ...] = RACING
          ) -> list[Attempt]:
    """PER_INTERRUPT answers to `run`, the channels taking turns, let go together (a
    barrier) so that they race for the one interrupt."""
    attempts: list[Attempt | None] = [None] * PER_INTERRUPT
    gate = threading.Barrier(PER_INTERRUPT)

    def send(i: int) -> None:
        channel = channels[i % len(channels)]
        gate.wait()
        attempts[i] = approve(system, run, channel, f"{channel} {i}")

    threads = [threading.Thread(target=send, args=(i,), daemon=True)
               for i in range(PER_INTERRUPT)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return [a for a in attempts if a is not None]


def _refused_as_answered(attempt: Attempt) -> bool:
    """The refusal a late answer must get: 409 over HTTP, 550 by SMTP, saying so (Slack's
    modal: a 200 whose errors say so)."""
    if attempt.channel == SLACK_MODAL:
        return attempt.code == 200 and "already" in attempt.said.lower()
    wanted = 550 if attempt.channel == "smtp" else 409
    return attempt.code == wanted and "already" in attempt.said


def _checked(system: ReviewedSystem, run: Parked, attempts: list[Attempt],
             end: dict[str, Any]) -> dict[str, Any]:
    """One run, as its owner and its reviewers see it afterwards."""
    answer = end["interrupts"][0].get("answer") or {}
    taken = [a for a in attempts if a.taken]
    events = Counter(e["event"] for e in history(system.system, run.run_id))
    return {
        "taken": len(taken),
        # The one answer taken is the one recorded: its note names its sender.
        "recorded its taker": len(taken) == 1 and
            (answer.get("payload") or {}).get("note") == taken[0].note,
        "winner": taken[0].channel if len(taken) == 1 else None,
        "answered events": events["interrupt.answered"],
        "resumes": events["run.resuming"],
        "completed": end["status"] == "completed",
    }


def outcome(system: ReviewedSystem, runs: list[Parked],
            attempts: dict[str, list[Attempt]], ends: dict[str, dict[str, Any]]) -> Outcome:
    every = [a for found in attempts.values() for a in found]
    refused = [a for a in every if not a.taken]
    odd = [a for a in refused if not _refused_as_answered(a)]
    checks = [_checked(system, r, attempts[r.run_id], ends[r.run_id]) for r in runs]
    moved, twice = transfers(system.system, [r.run_id for r in runs])
    figures: dict[str, Any] = {
        "runs": len(runs),
        "answers sent": len(every),
        "answers sent by channel": dict(Counter(a.channel for a in every)),
        "answers taken": sum(c["taken"] for c in checks),
        "taken by channel": dict(Counter(c["winner"] for c in checks if c["winner"])),
        "refusals by status": dict(sorted(Counter(a.code for a in refused).items())),
        "refusals by channel and status": dict(sorted(Counter(
            f"{a.channel} {a.code}" for a in refused).items())),
        "answered events": sum(c["answered events"] for c in checks),
        "resumes": sum(c["resumes"] for c in checks),
        "completed": sum(c["completed"] for c in checks),
        "transfers": moved,
        "duplicate side effects": twice,
    }
    if odd:  # what was refused otherwise, to read: the channel, the reply, its reason
        figures["other refusals (first 5)"] = [f"{a.channel} {a.code}: {a.said[:200]}"
                                               for a in odd[:5]]
    sent = len(runs) * PER_INTERRUPT
    return Outcome(NAME, figures, {
        "every answer got a reply": len(every) == sent and not
            any(a.code == 0 for a in every),
        "exactly one answer taken and recorded per interrupt":
            all(c["taken"] == 1 and c["recorded its taker"] and c["answered events"] == 1
                for c in checks),
        "one resume per run": all(c["resumes"] == 1 for c in checks),
        "every run completed": figures["completed"] == len(runs),
        "every run moved its money": moved == len(runs),
        "0 duplicate side effects": twice == 0,
        "every refusal a 409 (550 by SMTP, the modal's errors in Slack) saying it was "
        "answered already": not odd,
    })
