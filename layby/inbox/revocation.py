"""Ending a reviewer's inbox sessions early (`layby inbox revoke ADDRESS`): a lost laptop, a
reviewer who left. The time is noted in the store, and every session and sign-in link of that
reviewer signed before it is refused from then on, by every gateway; a new link signs them in
again. The note lives as long as the longest session could, then goes by itself."""

from __future__ import annotations

from layby.control import audit
from layby.control.runtime import Runtime
from layby.reviewers.directory import Reviewer


def _key(reviewer_id: str) -> str:
    return f"inbox-revoked:{reviewer_id}"


def revoke(rt: Runtime, reviewer: Reviewer, *, by: str) -> int:
    """End every session and sign-in link of `reviewer` made until now; returns when (the
    store's clock, ms). Recorded in the audit trail as `by`'s."""
    ttl = max(rt.settings.inbox_session_ttl_s, rt.settings.inbox_link_ttl_s) + 60
    since = rt.store.marks.note_since(_key(reviewer.id), ttl)
    rt.store.audit.record([audit.entry(by, "default", "inbox.revoke",
                                       subject=f"reviewer:{reviewer.id}")], of=reviewer.id)
    return since


def is_revoked(rt: Runtime, reviewer_id: str, issued_ms: int) -> bool:
    """Whether what was signed for the reviewer at `issued_ms` (a session, a link; the
    gateway's clock) was made before their sessions were ended (the store's clock)."""
    return _before(rt.store.marks.noted_since(_key(reviewer_id)), issued_ms)


def session_over(rt: Runtime, signed_out: str, reviewer_id: str, issued_ms: int) -> bool:
    """Whether a session signed at `issued_ms` is over before its time: signed out
    (`signed_out`, what its sign-out marked as seen) or revoked (`is_revoked`). One round
    trip: a signed-in reviewer's every request asks it, the live inbox's every 2 s."""
    out, since = rt.store.marks.seen_and_since(signed_out, _key(reviewer_id))
    return out or _before(since, issued_ms)


def _before(since: int | None, issued_ms: int) -> bool:
    return since is not None and issued_ms <= since
