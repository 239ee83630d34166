"""Task messages a worker cannot read are handed back to their queue, for a worker that
can: never acked and dropped, as Celery does with them on Redis (it rejects them without
requeueing, and kombu's Redis transport then deletes them).

While a deployment rolls, a worker of the older release can receive a message only the
newer one knows (a task it added). The message goes back to its queue after a pause that
doubles each time the same worker is handed the same message (0.5 s up to 10 s), so a
worker with nothing else to do does not spin on it while a newer one is started; one that
comes straight back to the same worker (Redis served it before the others waiting) is
handed back at once, a few times, each a new chance for another worker. All the while it
stays unacked, so a worker killed meanwhile loses nothing (kombu's visibility timeout
gives it back)."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kombu.asynchronous import Hub
    from kombu.message import Message

log = logging.getLogger("layby.worker")

FIRST_PAUSE_S = 0.5
LONGEST_PAUSE_S = 10.0
BURST = 20  # hand-backs at once of a message that came straight back, between pauses
BURST_WITHIN_S = 1.0
REMEMBERED = 1000  # messages whose hand-backs a worker counts (the oldest forgotten first)


@dataclass
class Handed:
    """One message's hand-backs by this worker."""

    pauses: int = 0
    burst: int = 0
    requeued_at: float = float("-inf")


class HandBack:
    """Mixed into the worker's consumer (`layby.broker_config.events.Consumer`)."""

    if TYPE_CHECKING:
        hub: Hub | None
        connection_errors: tuple[type[BaseException], ...]

    _handed: OrderedDict[str, Handed] | None = None

    def on_unknown_task(self, body: Any, message: Message, exc: BaseException) -> None:
        name = (message.headers or {}).get("task") or "?"
        self._hand_back(message, f"task {name!r} is not registered in this worker (a newer "
                                 "release's?)")

    def on_invalid_task(self, body: Any, message: Message, exc: BaseException) -> None:
        self._hand_back(message, f"this worker cannot read it ({exc})")

    def on_unknown_message(self, body: Any, message: Message) -> None:
        self._hand_back(message, "it is not a task message this worker knows")

    def _hand_back(self, message: Message, why: str) -> None:
        headers = message.headers or {}
        task_id = str(headers.get("id") or message.delivery_tag)
        if self._handed is None:
            self._handed = OrderedDict()
        seen = self._handed.pop(task_id, None) or Handed()
        self._handed[task_id] = seen
        while len(self._handed) > REMEMBERED:
            self._handed.popitem(last=False)
        if time.monotonic() - seen.requeued_at < BURST_WITHIN_S and seen.burst < BURST:
            # Back from its queue at once, taken again by this worker before another
            # could: handed back at once a few times, each a new chance for the others
            # (which of the workers blocked on a queue gets a message is not up to us).
            seen.burst += 1
            self._requeue(message, seen)
            return
        pause = min(LONGEST_PAUSE_S, FIRST_PAUSE_S * 2 ** seen.pauses)
        seen.pauses, seen.burst = seen.pauses + 1, 0
        log.warning("task message %s handed back to its queue in %.1f s, for a worker that "
                    "can read it: %s", task_id, pause, why)
        if self.hub is None:
            self._requeue(message, seen)
        else:
            self.hub.call_later(pause, self._requeue, message, seen)

    def _requeue(self, message: Message, seen: Handed) -> None:
        seen.requeued_at = time.monotonic()
        try:
            message.reject(requeue=True)
        except self.connection_errors:
            # The connection is gone, and the message with it back to the queue (kombu's
            # visibility timeout): nothing is lost.
            log.warning("task message not handed back: the broker connection was lost; "
                        "the broker gives it back")
