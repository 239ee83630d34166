"""The sweeper's questions to a broker of its own (its server's id, a queue's length), on a
connection the process keeps: a connection asked for each sweep cost a TCP handshake and a
login on the broker every sweep interval, for one command. It is dropped when it fails and
opened again at the next question; a forked child opens its own (sockets are not shared
across a fork)."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from celery import Celery

log = logging.getLogger(__name__)

T = TypeVar("T")


class BrokerProbe:
    """A kept connection and channel to the broker, for short questions, one at a time."""

    def __init__(self, celery: Celery) -> None:
        self._celery = celery
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._connection: Any = None
        self._channel: Any = None
        # A lock held by another thread at fork would stay held in the child for good.
        me = weakref.ref(self)

        def forked() -> None:
            probe = me()
            if probe is not None:
                probe._lock = threading.Lock()

        os.register_at_fork(after_in_child=forked)

    def ask(self, question: Callable[[Any], T], about: str, *,
            refused: T | None = None) -> T | None:
        """`question(channel)` on the kept channel. None, logged, when the broker does not
        answer now (asked again next time); `refused` when it refuses the question (a
        channel error: a queue that is not there)."""
        with self._lock:
            if self._pid != os.getpid():  # the parent's, in a forked child: not ours
                self._connection = self._channel = None
                self._pid = os.getpid()
            if self._connection is None:
                self._connection = self._celery.connection_for_write()
            connection = self._connection
            lost = (*connection.connection_errors, OSError)
            try:
                if self._channel is None:
                    # A channel of its own: the connection's default one retries for ever.
                    self._channel = connection.channel()
                return question(self._channel)
            except tuple(connection.channel_errors):
                # RabbitMQ closes a channel that asked about a missing queue; kombu's Redis
                # channel stays open (a new one would be a new connection pool).
                if getattr(self._channel, "is_open", True) is False:
                    self._channel = None
                return refused
            except lost as exc:
                log.warning("the broker does not answer about %s (%s); asked again later",
                            about, exc)
                self._drop()
                return None

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):  # a connection already lost: nothing to free
                connection.release()
