"""When a tool's failure is tried again: `RetryPolicy`, the default every tool has, and
`RetryLater`, raised by a tool that knows when to try again.

A tool call that raises an error its policy names as passing (a connection reset, a timeout,
a store failing over) is not handed to the model: the run waits, and the call is tried
again later, up to `max_attempts` in all. The wait is durable (a timer in the store, as an
interrupt's expiry is; `layby.tasks.steps`): no worker sleeps through it, and a worker's
death changes nothing. Everything that holds for the call's first attempt holds for the
next: the same `ctx.idempotency_key`, the same `ctx.resumed` after an approval, the
outputs of its siblings in the turn kept. Only once the attempts run out does the model
hear of the error (or the run fail, with `on_exhausted="fail"`).

Errors are matched by type, or by the dotted name of a type (`"redis.exceptions.
ConnectionError"`): the default names the errors of libraries this room does not import,
and a user may name one of a library they would rather not import either.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from layby.errors import ConfigError, Unavailable

ErrorMatch = type[BaseException] | str

# Errors that pass: a connection refused, reset or timed out, a Redis or Valkey server
# failing over (a cluster's slots moving, a replica not promoted yet, a primary loading its
# data), an HTTP client's transport giving up, a layby gateway saying "try again".
TRANSIENT: tuple[ErrorMatch, ...] = (
    ConnectionError, TimeoutError, Unavailable,
    "redis.exceptions.ConnectionError", "redis.exceptions.TimeoutError",
    "redis.exceptions.ClusterError", "redis.exceptions.RedisClusterException",
    "redis.exceptions.TryAgainError", "redis.exceptions.ReadOnlyError",
    "httpx.TimeoutException", "httpx.NetworkError", "httpx.RemoteProtocolError",
    "requests.exceptions.ConnectionError", "requests.exceptions.Timeout",
)
# Errors among those above that do not pass: wrong credentials stay wrong.
NOT_TRANSIENT: tuple[ErrorMatch, ...] = (
    "redis.exceptions.AuthenticationError", "redis.exceptions.AuthorizationError",
)


def _matches(exc: BaseException, patterns: Iterable[ErrorMatch]) -> bool:
    names = {f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__}
    return any(isinstance(exc, p) if isinstance(p, type) else p in names for p in patterns)


@dataclass(frozen=True)
class RetryPolicy:
    """How often, and how far apart, a tool's failing call is tried.

    The wait after the n-th failed attempt is `initial_interval_s * backoff ** (n - 1)`, at
    most `max_interval_s`, less up to `jitter` of it drawn at random (so that calls that
    failed together do not all try again together). Only errors that match `retry_on` and
    not `non_retryable` are tried again; the rest reach the model at once.

    `on_exhausted`: when the attempts run out, "model" gives the error to the model (as
    any tool error, saying how many attempts were made and over how long); "fail" ends the
    run, failed with code `tool_failed`.
    """

    max_attempts: int = 5
    initial_interval_s: float = 1.0
    backoff: float = 2.0
    max_interval_s: float = 30.0
    retry_on: tuple[ErrorMatch, ...] = TRANSIENT
    non_retryable: tuple[ErrorMatch, ...] = NOT_TRANSIENT
    jitter: float = 0.2
    on_exhausted: Literal["model", "fail"] = "model"

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            problems.append(f"max_attempts must be 1 or more, not {self.max_attempts!r}")
        for name in ("initial_interval_s", "max_interval_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                problems.append(f"{name} must be a number of seconds, 0 or more, not {value!r}")
        if not (isinstance(self.backoff, int | float) and self.backoff >= 1):
            problems.append(f"backoff must be 1 or more, not {self.backoff!r}")
        if not (isinstance(self.jitter, int | float) and 0 <= self.jitter <= 1):
            problems.append(f"jitter must be between 0 and 1, not {self.jitter!r}")
        if self.on_exhausted not in ("model", "fail"):
            problems.append(f"on_exhausted must be 'model' or 'fail', not {self.on_exhausted!r}")
        for name in ("retry_on", "non_retryable"):
            for p in getattr(self, name):
                if not (isinstance(p, str) or (isinstance(p, type)
                                               and issubclass(p, BaseException))):
                    problems.append(f"{name} holds {p!r}: give exception types, or their "
                                    "dotted names ('module.ClassName')")
        if problems:
            raise ConfigError("RetryPolicy: " + "; ".join(problems))

    def retries(self, exc: BaseException) -> bool:
        """Whether `exc` is a failure this policy tries again."""
        return _matches(exc, self.retry_on) and not _matches(exc, self.non_retryable)

    def wait_s(self, failed: int, draw: float | None = None) -> float:
        """The wait after attempt `failed` (1, 2, …) failed. `draw` in [0, 1): the jitter's
        (random unless given)."""
        base = min(self.max_interval_s,
                   self.initial_interval_s * self.backoff ** max(0, failed - 1))
        share = random.random() if draw is None else draw
        return base * (1 - self.jitter * share)


# Every tool's policy unless its agent or the tool says otherwise. Five attempts, waits of
# about 1, 2, 4 and 8 seconds: together longer than a Valkey or Redis primary's failover
# (a replica is promoted a few seconds after its primary stops answering) and a service's
# restart, short enough that an outage that lasts reaches the model within half a minute.
DEFAULT_RETRY = RetryPolicy()


class RetryLater(Exception):
    """Raised by a tool to be tried again in `after_s` seconds (a 429's `Retry-After`, a job
    not ready yet). It counts as an attempt of the tool's policy (of the default policy when
    the tool's retries are off), and `reason` is what the model is told once they run out."""

    def __init__(self, after_s: float, reason: str | None = None) -> None:
        if not (isinstance(after_s, int | float) and math.isfinite(after_s) and after_s >= 0):
            raise ValueError(f"RetryLater: after_s must be a number of seconds, 0 or more, "
                             f"not {after_s!r}")
        super().__init__(reason or f"try again in {after_s:g} s")
        self.after_s = float(after_s)
        self.reason = reason


@dataclass(frozen=True)
class Tried:
    """A call's failed attempts so far within one step of a run: kept beside its checkpoints
    (as "try:<ref>"), so that the step, taken again when the wait is over, knows them."""

    failed: int  # attempts made, all failed
    first_at: str  # when the first began (ISO 8601)
    error: str  # the last one's error, "Type: message"

    def dump(self) -> dict[str, Any]:
        return {"failed": self.failed, "firstAt": self.first_at, "error": self.error}

    @classmethod
    def load(cls, data: Any) -> Tried | None:
        if not isinstance(data, dict):
            return None
        return cls(int(data.get("failed", 0)), str(data.get("firstAt", "")),
                   str(data.get("error", "")))


def checkpoint_key(ref: str) -> str:
    return f"try:{ref}"


@dataclass(frozen=True)
class RetryCall:
    """One call of a turn that failed and waits to be tried again."""

    ref: str
    tool: str
    tried: Tried
    max_attempts: int
    wait_s: float
    error_type: str  # the error's type alone: what logs and Flower may show

    @property
    def next_attempt(self) -> int:
        return self.tried.failed + 1
