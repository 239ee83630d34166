"""A process announces itself while it lives: its beat in the store's registry of
processes (`store.processes.beat_worker`) says its kind, the newest store format its code knows and
its release, every LAYBY_HEARTBEAT_S. The registry is how a rolling deployment knows when
no process of the older release is left (`layby.parking.formats`: the switch to the newer
format waits for that), and how `layby doctor` lists what runs.

Each beat also brings back the format the store writes now. A process whose code cannot
read it (a switch it was too late to stop: it started as the last older process went)
stops itself with SIGTERM, the way it stops in a deployment."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Sequence

import redis

from layby.parking import Store
from layby.parking.formats import FormatError, release

log = logging.getLogger(__name__)


def about(kind: str, newest_format: int) -> str:
    """What a process says it is, as `workers:about` keeps it."""
    return f"{kind} {newest_format} {release()}"


def process_name(kind: str) -> str:
    """The registry's name of a process that is not a worker: "<kind> <host>:<pid>"."""
    return f"{kind} {socket.gethostname()}:{os.getpid()}"


def withdraw(store_of: Callable[[], Store], name: str) -> None:
    """Take `name` out of the registry now (a process that stops cleanly): a rolling
    deployment's switch need not wait for its beat to lapse."""
    try:
        store_of().processes.forget_worker(name)
    except redis.RedisError:
        pass  # its beat lapses instead


def announce(store_of: Callable[[], Store], name: str, told: str, newest_format: int,
             every_s: float, stop: threading.Event,
             hosting: Sequence[str] | None = None) -> threading.Thread:
    """Beat for `name` until `stop`, once now (before the process serves: a switch sees
    it) and then in a thread; at the end, take it out of the registry. `store_of` gives
    the process's store (it may be away at first)."""

    def beat_once() -> bool:
        try:
            store = store_of()
            store.processes.beat_worker(name, told, hosting)
        except redis.RedisError as exc:  # the store away: beat again when it is back
            log.warning("%s: heartbeat failed (%s); trying again", name, exc)
            return True
        except FormatError as exc:  # back, in a format this code does not read
            log.critical("%s: %s: stopping", name, exc.message)
            os.kill(os.getpid(), signal.SIGTERM)
            return False
        if store.writing > newest_format:
            log.critical("%s: the store writes format %d now, which this layby (%s) does not "
                         "read: stopping", name, store.writing, release())
            os.kill(os.getpid(), signal.SIGTERM)
            return False
        return True

    def beat() -> None:
        while not stop.wait(every_s):
            if not beat_once():
                return
        withdraw(store_of, name)

    beat_once()
    thread = threading.Thread(target=beat, name=f"heartbeat {name}", daemon=True)
    thread.start()
    return thread
