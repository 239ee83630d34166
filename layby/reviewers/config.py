"""The reviewer configuration of one process: the directory (re-read when its file changes, so
adding a reviewer needs no restart) and the token keys (re-parsed when the setting changes)."""

from __future__ import annotations

import threading
from pathlib import Path

from layby.broker_config import Settings, logs
from layby.errors import ConfigError
from layby.generation.interrupts import Interrupt
from layby.reviewers.directory import Directory, Reviewer, load_directory
from layby.reviewers.tokens import parse_keys


class Reviewers:
    """Who may answer, and the keys that sign their tokens, read from `settings`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._directory: tuple[tuple[Path | None, float | None], Directory] | None = None
        self._keys: tuple[str, dict[str, bytes]] | None = None

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

    def get(self, reviewer_id: str) -> Reviewer | None:
        return self.directory().reviewers.get(reviewer_id)

    def asked_for(self, interrupt: Interrupt) -> list[Reviewer]:
        """Who may answer `interrupt` through the reviewer channels: the people and groups
        it names, or the default group."""
        return self.directory().resolve(interrupt.reviewers)

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
