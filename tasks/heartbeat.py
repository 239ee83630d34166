"""Heartbeats. Of a claimed step: while a worker runs it, a thread renews the run's lease
every LAYBY_HEARTBEAT_S (a third of LAYBY_LEASE_S by default), so a step that takes ten
minutes keeps its claim, and one whose worker died (a process killed, a machine gone) is
taken up by the sweeper one lease after its last beat.

A beat that finds the claim taken (a cancel, or the lease lapsed during a long pause and
another worker took the step) stops beating; the step's own commit is refused by its
version and owner check, so it never commits twice.

Of a worker (`beat_worker`): its main process holds the task messages it reserved and has
not started yet; if it dies, they come back only after kombu's visibility timeout (an
hour). So it beats too, and the sweeper, finding a worker's beat lapsed, queues again
every run that was waiting when it died (a copy of a message that was not lost finds its
version taken and does nothing).
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType

import redis

from layby.parking import Store

log = logging.getLogger(__name__)


def beat_worker(store: Store, name: str, every_s: float, stop: threading.Event) -> None:
    """Beat for worker `name` until `stop`, in a thread of its main process."""

    def beat() -> None:
        while True:
            try:
                store.beat_worker(name)
            except redis.RedisError as exc:  # the store away: beat again when it is back
                log.warning("worker %s: heartbeat failed (%s); trying again", name, exc)
            if stop.wait(every_s):
                return

    threading.Thread(target=beat, name=f"heartbeat {name}", daemon=True).start()


class Heartbeat:
    """Renews `owner`'s lease on the run at `version` until the `with` block ends. The loop
    that takes several turns in one task moves `version` on as it commits."""

    def __init__(self, store: Store, run_id: str, version: int, owner: str,
                 every_s: float) -> None:
        self.store = store
        self.run_id = run_id
        self.version = version
        self.owner = owner
        self.every_s = every_s
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat {run_id}",
                                        daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(self.every_s + 5)

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            version = self.version
            try:
                renewed = self.store.renew(self.run_id, version, self.owner)
            except redis.RedisError as exc:  # the store away: the lease may lapse meanwhile
                log.warning("run %s: heartbeat failed (%s); trying again", self.run_id, exc)
                continue
            if not renewed and version == self.version and not self._stop.is_set():
                log.warning("run %s: the claim on version %s is not this worker's any more; "
                            "the step will not commit", self.run_id, version)
                self.lost.set()
                return
