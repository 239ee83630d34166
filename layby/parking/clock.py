"""Times as the store keeps them (epoch milliseconds, stamped by the Redis server's clock in
the scripts) and as readers see them (RFC 3339, UTC)."""

from __future__ import annotations

from datetime import UTC, datetime


def iso(ms: int | str | None) -> str:
    moment = datetime.fromtimestamp(int(ms or 0) / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
