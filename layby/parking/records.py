"""What the store hands its callers besides the API's shapes (`layby.wire`): outbox entries,
the Celery messages a transition queued, to publish after it."""

from __future__ import annotations

from typing import Any

from layby.generation.messages import Wire


class OutboxEntry(Wire):
    id: str
    task: str
    queue: str
    args: list[Any]
