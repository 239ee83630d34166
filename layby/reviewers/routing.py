"""Who is asked for an interrupt, and when: its first reviewers (the people and groups it
names, or the default group), then each escalation level once the request has waited that
long unanswered, each reviewer replaced by whom they handed the request to. The notifier
plans announcements from this and the inbox checks a reviewer's right to answer by it, so
the two always agree."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from layby.reviewers.directory import Directory, Reviewer
from layby.wire import InterruptView


@dataclass(frozen=True)
class Asked:
    """One reviewer asked: from which level (0 for the first reviewers) and from when
    (epoch seconds)."""

    reviewer: Reviewer
    level: int
    since: float


def epoch(moment: str | None) -> float | None:
    return datetime.fromisoformat(moment).timestamp() if moment else None


def levels(intr: InterruptView) -> list[tuple[int, float, list[str] | None]]:
    """(level, when it is asked, the people and groups it names) for every level; level
    0's names are None for the default group."""
    start = epoch(intr.created_at) or 0.0
    found: list[tuple[int, float, list[str] | None]] = [(0, start, intr.reviewers)]
    for number, step in enumerate(intr.escalation or [], 1):
        found.append((number, start + step.after_s, step.reviewers))
    return found


def handed_to(intr: InterruptView, reviewer_id: str) -> str:
    """Whom `reviewer_id`'s part in `intr` went to, following hand-overs to their end."""
    handed = {d.reviewer: d.to for d in intr.delegations}
    seen = {reviewer_id}
    while reviewer_id in handed and handed[reviewer_id] not in seen:
        reviewer_id = handed[reviewer_id]
        seen.add(reviewer_id)
    return reviewer_id


def everyone(directory: Directory, intr: InterruptView) -> list[Asked]:
    """Every reviewer asked for `intr`, now or later, with hand-overs applied; a reviewer
    asked by two levels counts from the first."""
    found: dict[str, Asked] = {}
    for level, since, names in levels(intr):
        for person in directory.resolve(names):
            rid = handed_to(intr, person.id)
            target = directory.reviewers.get(rid)
            if target is not None and rid not in found:
                found[rid] = Asked(target, level, since)
    return list(found.values())


def asked_now(directory: Directory, intr: InterruptView, now: float) -> list[Reviewer]:
    """The reviewers who may answer `intr` at `now`: the levels reached (by time, or
    marked reached by the notifier), hand-overs applied."""
    return [a.reviewer for a in everyone(directory, intr)
            if a.since <= now or a.level <= intr.escalation_level]
