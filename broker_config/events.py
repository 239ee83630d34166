"""Task events for Flower at one message a task: the worker's consumer flushes the task
events it buffers once a task ends (or a second after the first of them, so a long task
shows as started), instead of at the next turn of its event loop.

Celery's worker buffers task events (`task-received`, `task-started`, `task-succeeded` …)
and sends a batch as one `task.multi` message, which Flower and every event receiver read
as the events it holds; but it flushes at the loop's next turn, so a short task's events
go out in two or three messages, each a PUBLISH on Redis. Flushing when a task ends sends
them together. `LAYBY_TASK_EVENTS=false` turns task events off altogether.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery.worker.consumer import Consumer as CeleryConsumer

from layby.broker_config.handback import HandBack

if TYPE_CHECKING:
    from celery.events.dispatcher import EventDispatcher
    from kombu.asynchronous import Hub

# Where the consumer class is named in the app's settings (`worker_consumer`).
CONSUMER = "layby.broker_config.events:Consumer"
ENDED = frozenset({"task-succeeded", "task-failed", "task-retried", "task-rejected",
                   "task-revoked"})
LINGER_S = 1.0  # the longest a buffered event waits for its task to end


class Consumer(HandBack, CeleryConsumer):
    """Celery's consumer, flushing task events when a task ends, and handing back the
    messages it cannot read (`layby.broker_config.handback`)."""

    _lingering: Any = None

    if TYPE_CHECKING:  # Celery's Consumer has them; celery-types leaves them out
        hub: Hub | None
        event_dispatcher: EventDispatcher | None

        def _flush_events(self) -> None: ...

    # celery-types says this returns a callable; Celery's own returns None.
    def on_send_event_buffered(self) -> None:  # type: ignore[override]
        dispatcher, hub = self.event_dispatcher, self.hub
        # Celery's own buffer (EventDispatcher._group_buffer); if it is not there, Celery's
        # own behaviour.
        buffered = getattr(dispatcher, "_group_buffer", {}).get("task") if dispatcher else None
        if hub is None or not buffered or buffered[-1].get("type") in ENDED:
            super().on_send_event_buffered()
        elif self._lingering is None:
            self._lingering = hub.call_later(LINGER_S, self._flush_lingering)

    def _flush_lingering(self) -> None:
        self._lingering = None
        self._flush_events()
