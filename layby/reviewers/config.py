"""The notifier's configuration in one process: the reviewer directory (re-read when its file
changes, so adding a reviewer needs no restart) and the token keys."""

from __future__ import annotations

import threading
from pathlib import Path

from layby.broker_config import get_settings
from layby.errors import ConfigError
from layby.reviewers.directory import Directory, load_directory
from layby.reviewers.tokens import parse_keys

_lock = threading.Lock()
_cache: dict[str, tuple[object, object]] = {}


def directory() -> Directory:
    path = get_settings().reviewers_file
    stamp = _mtime(path)
    with _lock:
        cached = _cache.get("directory")
        if cached is None or cached[0] != (path, stamp):
            _cache["directory"] = ((path, stamp), load_directory(path))
        return _cache["directory"][1]  # type: ignore[return-value]


def token_keys() -> dict[str, bytes]:
    settings = get_settings()
    spec = settings.resolved_token_keys()
    if not spec:
        raise ConfigError("reviewer links cannot be signed: set LAYBY_TOKEN_KEYS to "
                          f"'id:secret' (or let `layby up` write {settings.token_keys_file})")
    with _lock:
        cached = _cache.get("keys")
        if cached is None or cached[0] != spec:
            try:
                _cache["keys"] = (spec, parse_keys(spec))
            except ValueError as exc:
                raise ConfigError(f"LAYBY_TOKEN_KEYS is invalid: {exc}") from exc
        return _cache["keys"][1]  # type: ignore[return-value]


def _mtime(path: Path | None) -> float | None:
    try:
        return path.stat().st_mtime if path else None
    except OSError:
        return None
