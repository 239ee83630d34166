"""Marks: what was seen once (a webhook's id, a mail), how often something was seen in a
window (a rate limit's count), and since when something holds (a reviewer's sessions
ended)."""

from __future__ import annotations

from typing import cast

from layby.parking.store.core import Part


class Marks(Part):
    """What was seen, counted, or holds since (`store.marks`)."""

    def first_sight(self, what: str, ttl_s: int) -> bool:
        """True the first time `what` is seen within `ttl_s` (a webhook-id, a mail)."""
        return bool(self.redis.set(self.core.keys.seen(what), "1", nx=True, ex=ttl_s))

    def tally(self, what: str, window_s: int) -> int:
        """How often `what` was seen in the window that began at its first sight, this one
        included: a rate limit's count, one round trip."""
        key = self.core.keys.seen(what)
        pipe = self.redis.pipeline(transaction=True)
        pipe.incr(key)
        pipe.expire(key, window_s, nx=True)
        count, _ = pipe.execute()
        return int(count)

    def forget_sight(self, what: str) -> None:
        self.redis.delete(self.core.keys.seen(what))

    def has_seen(self, what: str) -> bool:
        """Whether `what` was seen (by `first_sight`) and not yet forgotten."""
        return bool(self.redis.exists(self.core.keys.seen(what)))

    def note_since(self, what: str, ttl_s: int) -> int:
        """Note that `what` holds from now on (the server's clock, ms), for `ttl_s`: a
        reviewer's sessions ended early. Returns when."""
        now = self.core.now_ms()
        self.redis.set(self.core.keys.seen(what), str(now), ex=max(1, ttl_s))
        return now

    def seen_and_since(self, seen: str, since: str) -> tuple[bool, int | None]:
        """Whether `seen` was seen (`first_sight`), and since when `since` holds
        (`note_since`): one round trip, for what a request asks on every page."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.exists(self.core.keys.seen(seen))
        pipe.get(self.core.keys.seen(since))
        found, noted = pipe.execute()
        return bool(found), int(noted) if noted and str(noted).isdigit() else None

    def noted_since(self, what: str) -> int | None:
        """Since when `what` holds (`note_since`), or None."""
        found = cast("str | None", self.redis.get(self.core.keys.seen(what)))
        return int(found) if found and found.isdigit() else None
