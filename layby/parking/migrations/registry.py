"""What a numbered migration is (`Migration`), and the registry the migrations of this
package enter themselves in, in order; apart from the runner (the package), which imports
them, so that they need not import it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatchcase

from redis import Redis

from layby.errors import ConfigError
from layby.parking.keys import Keys

# One key rewritten: (client, keys, the key, dry run) → whether it changed (or would).
Rewrite = Callable[[Redis, Keys, str, bool], bool]
# Before the scan: (client, keys, the shard count the store gets if it has none).
Prepare = Callable[[Redis, Keys, int], None]
# After the scan: (client, keys, dry run) → (what it looked at, what it changed or would).
Finish = Callable[[Redis, Keys, bool], tuple[int, int]]

@dataclass(frozen=True)
class Migration:
    number: int  # the format it brings records to
    title: str
    patterns: tuple[str, ...]  # the keys it rewrites, after "<prefix>:" (globs)
    rewrite: Rewrite
    prepare: Prepare | None = None
    # Whether the store has keys it rewrites (False: the scan is skipped); asked after
    # `prepare`.
    scans: Callable[[Redis, Keys], bool] | None = None
    finish: Finish | None = None

    def needs_scan(self, client: Redis, keys: Keys) -> bool:
        return self.scans is None or self.scans(client, keys)

    def rewrites(self, keys: Keys, key: str) -> bool:
        """Whether `key` is one of those it rewrites."""
        name = key.removeprefix(f"{keys.prefix}:")
        return name != key and any(fnmatchcase(name, p) for p in self.patterns)


_REGISTERED: dict[int, Migration] = {}


def register(migration: Migration) -> Migration:
    """Add a migration; numbers follow each other from 1 (a gap would leave records of a
    format nothing migrates)."""
    known = _REGISTERED.get(migration.number)
    if known is not None and known is not migration:
        raise ConfigError(f"two migrations are numbered {migration.number}")
    last = max(_REGISTERED, default=0)  # (not `newest`: the built-in ones register so)
    if known is None and migration.number != last + 1:
        raise ConfigError(f"migration {migration.number} is not the next one after {last}")
    _REGISTERED[migration.number] = migration
    return migration




def known() -> dict[int, Migration]:
    """The migrations registered so far, by number."""
    return dict(_REGISTERED)
