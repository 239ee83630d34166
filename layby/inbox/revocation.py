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
    since = rt.store.marks.noted_since(_key(reviewer_id))
    return since is not None and issued_ms <= since
