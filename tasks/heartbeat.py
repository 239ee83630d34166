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
import os
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType

import redis

from layby.control.announce import about, announce
from layby.parking import Store

log = logging.getLogger(__name__)


def beat_worker(store_of: Callable[[], Store], name: str, newest_format: int, every_s: float,
                stop: threading.Event, hosting: Sequence[str] | None = None,
                kind: str = "worker") -> None:
    """Beat for worker `name` (a `worker`, or the `sweeper`) until `stop`, in a thread of
    its main process (`layby.control.announce`), telling the agent versions it is `hosting`
    (`<agent>@<version>`; None: it takes no steps). `store_of` gives the process's store,
    which may be away when the worker starts: the beats go on until it answers."""
    noted = False

    def store() -> Store:
        nonlocal noted
        found = store_of()
        if not noted:
            # The first process up notes the server: a failover before the sweeper's first
            # sweep still shows to it as another server.
            found.processes.note_server(first=True)
            noted = True
        return found

    announce(store, name, about(kind, newest_format), newest_format, every_s, stop,
             hosting=hosting)


class Heartbeat:
    """Renews `owner`'s lease on the run at `version` until the `with` block ends. The loop
    that takes several turns in one task moves `version` on as it commits.

    One thread per process beats for every claim held there (`_Beater`): a step that ends
    before its first beat is due (most do) costs no thread and no call."""

    def __init__(self, store: Store, run_id: str, version: int, owner: str,
                 every_s: float) -> None:
        self.store = store
        self.run_id = run_id
        self.version = version
        self.owner = owner
        self.every_s = every_s
        self.lost = threading.Event()
        self.next_beat = 0.0
        self.released = False

    def __enter__(self) -> Heartbeat:
        _beater().hold(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        _beater().drop(self)

    def release(self) -> None:
        """The step gives its claim up without a commit (a wait to retry releases it): no
        more beats, and a refusal of one already on its way is no news."""
        self.released = True
        _beater().drop(self)

    def beat(self) -> None:
        version = self.version
        try:
            renewed = self.store.runs.renew(self.run_id, version, self.owner)
        except redis.RedisError as exc:  # the store away: the lease may lapse meanwhile
            log.warning("run %s: heartbeat failed (%s); trying again", self.run_id, exc)
            return
        # Refused at the version the step holds (not one its own commit just moved past):
        # the claim is another's, and the step's commit will be refused. Beating goes on,
        # at whatever version the step holds next, until the step ends.
        if not renewed and version == self.version and not self.lost.is_set() \
                and not self.released:
            log.warning("run %s: the claim on version %s is not this worker's any more; "
                        "the step will not commit", self.run_id, version)
            self.lost.set()


class _Beater:
    """The process's heartbeat thread: every claim held is renewed once `every_s` has
    passed since it was taken or last renewed."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.held: set[Heartbeat] = set()
        self.lock = threading.Lock()
        self.wake = threading.Event()
        # When the thread's wait ends (monotonic): a claim taken is due a beat after that,
        # at most, and then wakes nothing (a wake is a switch of threads at every step).
        self.until = 0.0
        threading.Thread(target=self._run, name="heartbeats", daemon=True).start()

    def hold(self, beat: Heartbeat) -> None:
        beat.next_beat = time.monotonic() + beat.every_s
        with self.lock:
            self.held.add(beat)
            sooner = beat.next_beat < self.until
        if sooner:
            self.wake.set()

    def drop(self, beat: Heartbeat) -> None:
        with self.lock:
            self.held.discard(beat)

    def _run(self) -> None:
        while True:
            with self.lock:
                beats = list(self.held)
            now = time.monotonic()
            for beat in beats:
                if beat.next_beat <= now:
                    beat.next_beat = now + beat.every_s
                    with self.lock:
                        still = beat in self.held
                    if still:
                        try:
                            beat.beat()
                        except Exception:  # one claim's trouble must not stop the others'
                            log.exception("run %s: heartbeat failed", beat.run_id)
            with self.lock:
                # Beats held since the list was taken count too: one due sooner than the
                # wait's end woke it (or finds it set), one due later waits for it.
                nearest = min((b.next_beat for b in self.held), default=now + 60)
                self.until = nearest
            self.wake.wait(max(0.0, nearest - time.monotonic()))
            self.wake.clear()


_the_beater: _Beater | None = None
_beater_lock = threading.Lock()


def _beater() -> _Beater:
    """The process's beater (a new one in a forked child: threads do not cross a fork)."""
    global _the_beater
    found = _the_beater
    if found is None or found.pid != os.getpid():
        with _beater_lock:
            if _the_beater is None or _the_beater.pid != os.getpid():
                _the_beater = _Beater()
            found = _the_beater
    return found


def _after_fork_in_child() -> None:
    # A lock held by another thread at the fork stays held in the child; the thread is gone.
    global _the_beater, _beater_lock
    _the_beater, _beater_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
