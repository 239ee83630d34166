"""The reviewer configuration of one process: the directory and the policy rules (each re-read
when its file changes, so adding a reviewer or a rule needs no restart; rules that do not
load leave the previous ones in force) and the token keys (re-parsed when the setting
changes)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from layby.broker_config import Settings, logs
from layby.errors import ConfigError
from layby.reviewers import routing
from layby.reviewers.directory import Directory, Reviewer, load_directory
from layby.reviewers.policy import Policy, load_rules
from layby.reviewers.tokens import parse_keys
from layby.wire import InterruptView

log = logging.getLogger(__name__)


class Reviewers:
    """Who may answer, and the keys that sign their tokens, read from `settings`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._directory: tuple[tuple[Path | None, float | None], Directory] | None = None
        self._keys: tuple[str, dict[str, bytes]] | None = None
        self._policy: tuple[object, Policy | None] | None = None
        # Why the rules on disk are not the rules in force (None when they are).
        self.policy_problem: str | None = None

    def directory(self) -> Directory:
        path = self.settings.reviewers_file
        stamp = (path, _mtime(path))
        with self._lock:
            if self._directory is None or self._directory[0] != stamp:
                self._directory = (stamp, load_directory(path))
                logs.keep_out(*(part for r in self._directory[1].reviewers.values()
                                if r.webhook for part in
                                (r.webhook.secret, r.webhook.secret.removeprefix("whsec_"))))
            return self._directory[1]

    def policy(self) -> Policy | None:
        """The rules in force: re-read when their file (or the directory they are checked
        against) changes; rules that do not load are refused, with the reason logged and
        kept in `policy_problem`, and the previous rules stay."""
        path = self.rules_file()
        try:
            directory = self.directory()
        except ConfigError:
            # A directory that does not load is reported where reviewers are needed (the
            # notifier); runs still park, under the rules last loaded.
            return self._policy[1] if self._policy else None
        stamp = (path, _mtime(path), id(directory))
        with self._lock:
            if self._policy is not None and self._policy[0] == stamp:
                return self._policy[1]
            previous = self._policy[1] if self._policy else None
            try:
                policy = load_rules(path) if path else None
                if policy is not None:
                    policy.check(directory)
            except ConfigError as exc:
                if self.policy_problem != exc.message:
                    log.error("%s; the %s stay in force", exc.message,
                              f"{len(previous.rules)} previous rule(s)" if previous
                              else "interrupts' own reviewers (no rules were loaded)")
                self.policy_problem = exc.message
                self._policy = (stamp, previous)
                return previous
            self.policy_problem = None
            self._policy = (stamp, policy)
            return policy

    def rules_file(self) -> Path | None:
        return self.settings.policy_file or self.settings.reviewers_file

    def get(self, reviewer_id: str) -> Reviewer | None:
        return self.directory().reviewers.get(reviewer_id)

    def asked_for(self, interrupt: InterruptView) -> list[Reviewer]:
        """Who may answer `interrupt` through the reviewer channels now: its first
        reviewers (or the default group), the escalation levels reached, each replaced by
        whom they handed it to (`layby.reviewers.routing`)."""
        return routing.asked_now(self.directory(), interrupt, time.time())

    def token_keys(self) -> dict[str, bytes]:
        spec = self.settings.resolved_token_keys()
        if not spec:
            raise ConfigError("reviewer links cannot be signed: set LAYBY_TOKEN_KEYS to "
                              "'id:secret' (or let `layby up` write "
                              f"{self.settings.token_keys_file})")
        with self._lock:
            if self._keys is None or self._keys[0] != spec:
                try:
                    self._keys = (spec, parse_keys(spec))
                    logs.keep_out(*(pair.partition(":")[2] for pair in spec.split(",")))
                except ValueError as exc:
                    raise ConfigError(f"LAYBY_TOKEN_KEYS is invalid: {exc}") from exc
            return self._keys[1]


def _mtime(path: Path | None) -> float | None:
    try:
        return path.stat().st_mtime if path else None
    except OSError:
        return None
