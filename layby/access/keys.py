"""API keys with a tenant and rights: the keys file (LAYBY_KEYS_FILE), read again when it
changes, and the keys of LAYBY_API_KEYS beside it (every right, tenant `default`).

    [keys.billing]
    secret = "lby_…"          # or sha256 = "<hex digest of the key>": the file need not hold it
    tenant = "acme"
    agents = ["shop.*"]       # fnmatch patterns of the agents it may start; default ["*"]
    can = ["start", "read", "answer", "approve", "cancel"]   # the default

A key is known by the SHA-256 of what a caller presents, compared with every key's digest
in constant time: the file may hold digests alone (`layby keys new` writes one), and a
secret read from it is kept only as its digest. A file that does not parse, names a right
that does not exist, or gives a name or a key twice is refused as a whole, naming the file
and the line (`KeysFileError`): the gateway keeps the keys it had, `layby up` and `layby
doctor` say what is wrong.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import threading
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layby.access.rights import DEFAULT_RIGHTS, RIGHTS, Identity
from layby.broker_config.settings import KEY_NAME, MAX_KEY_BYTES, ApiKey
from layby.errors import ConfigError

DEFAULT_TENANT = "default"
# A tenant's name: it names the store's keys of its lists, so no spaces, braces or colons.
TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_FIELDS = {"secret", "sha256", "tenant", "agents", "can"}
_HEX = re.compile(r"[0-9a-f]{64}")


class KeysFileError(ConfigError):
    """The keys file cannot be used as it is; nothing of it is."""


@dataclass(frozen=True)
class Key:
    """One key: who it is (`api:<name>`), the SHA-256 of its secret, and what it may do."""

    name: str
    digest: bytes
    tenant: str = DEFAULT_TENANT
    agents: tuple[str, ...] = ("*",)
    can: frozenset[str] = DEFAULT_RIGHTS
    line: int = 0  # where the file declares it (0: LAYBY_API_KEYS)

    @property
    def caller(self) -> str:
        return self.name if ":" in self.name else f"api:{self.name}"

    def identity(self) -> Identity:
        return Identity(self.caller, self.tenant, self.can, self.agents)


def digest_of(secret: bytes | str) -> bytes:
    return hashlib.sha256(secret.encode() if isinstance(secret, str) else secret).digest()


def of_api_keys(entries: Iterable[ApiKey]) -> list[Key]:
    """The keys of LAYBY_API_KEYS: every right, tenant `default`, as before keys had any."""
    return [Key(k.caller, digest_of(k.secret), can=RIGHTS) for k in entries]


def _line_of(text: str, name: str) -> int:
    """The line that declares `[keys.<name>]` (1-based; 0 when it cannot be found)."""
    header = re.compile(r"^[ \t]*\[[ \t]*keys[ \t]*\.[ \t]*\"?" + re.escape(name)
                        + r"\"?[ \t]*\]", re.MULTILINE)
    found = header.search(text)
    return text.count("\n", 0, found.start()) + 1 if found else 0


def parse(text: str, path: str = "LAYBY_KEYS_FILE") -> list[Key]:
    """The keys a keys file declares; KeysFileError naming the file and the line of the
    first thing wrong."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise KeysFileError(f"{path}: not TOML: {exc}") from None
    extra = sorted(set(data) - {"keys"})
    if extra:
        raise KeysFileError(f"{path}: unknown section {extra[0]!r}: a keys file holds "
                            "[keys.<name>] tables only")
    table = data.get("keys", {})
    if not isinstance(table, dict):
        raise KeysFileError(f"{path}: `keys` must be tables, [keys.<name>]")
    keys = [_key(path, text, name, fields) for name, fields in table.items()]
    seen: dict[bytes, Key] = {}
    for key in keys:
        first = seen.setdefault(key.digest, key)
        if first is not key:
            raise KeysFileError(f"{path}:{key.line}: key {key.name!r} is the same key as "
                                f"{first.name!r} (line {first.line}): give each caller a key "
                                "of its own")
    return keys


def _key(path: str, text: str, name: str, fields: Any) -> Key:
    line = _line_of(text, name)
    where = f"{path}:{line}: key {name!r}"
    if not KEY_NAME.fullmatch(name):
        raise KeysFileError(f"{where}: a key's name is 1 to 64 letters, digits, '.', '_' or '-'")
    if not isinstance(fields, dict):
        raise KeysFileError(f"{where}: must be a table")
    unknown = sorted(set(fields) - _FIELDS)
    if unknown:
        raise KeysFileError(f"{where}: unknown field {unknown[0]!r} (a key has {sorted(_FIELDS)})")
    secret, sha = fields.get("secret"), fields.get("sha256")
    if (secret is None) == (sha is None):
        raise KeysFileError(f"{where}: give its `secret` or its `sha256`, one of the two")
    if secret is not None:
        if not isinstance(secret, str) or not secret or len(secret.encode()) > MAX_KEY_BYTES \
                or not all(33 <= ord(c) <= 126 for c in secret):
            raise KeysFileError(f"{where}: `secret` must be printable ASCII without spaces, "
                                f"1 to {MAX_KEY_BYTES} bytes")
        digest = digest_of(secret)
    else:
        if not isinstance(sha, str) or not _HEX.fullmatch(sha.lower()):
            raise KeysFileError(f"{where}: `sha256` must be 64 hex digits (the SHA-256 of the "
                                "key, as `layby keys new` writes it)")
        digest = bytes.fromhex(sha)
    tenant = fields.get("tenant", DEFAULT_TENANT)
    if not isinstance(tenant, str) or not TENANT.fullmatch(tenant):
        raise KeysFileError(f"{where}: `tenant` must be 1 to 64 letters, digits, '.', '_' or "
                            f"'-', not {tenant!r}")
    agents = fields.get("agents", ["*"])
    if not (isinstance(agents, list) and agents and all(isinstance(a, str) and a
                                                        for a in agents)):
        raise KeysFileError(f"{where}: `agents` must be a list of agent name patterns "
                            "(fnmatch: \"shop.*\")")
    can = fields.get("can", sorted(DEFAULT_RIGHTS))
    if not (isinstance(can, list) and all(isinstance(c, str) for c in can)):
        raise KeysFileError(f"{where}: `can` must be a list of rights: {sorted(RIGHTS)}")
    wrong = sorted(set(can) - RIGHTS)
    if wrong:
        raise KeysFileError(f"{where}: unknown right {wrong[0]!r}; the rights are "
                            f"{sorted(RIGHTS)}")
    return Key(name, digest, tenant, tuple(agents), frozenset(can), line)


@dataclass(frozen=True)
class _Read:
    stamp: tuple[int, int] | None  # (mtime_ns, size) of the file as read
    keys: tuple[Key, ...]


class Keyring:
    """Every key the gateway takes: LAYBY_API_KEYS's, and the keys file's, read again when
    the file changes (looked at once a second at most). A change that does not parse is
    logged by the caller of `refresh` and leaves the keys as they were."""

    def __init__(self, api_keys: Sequence[ApiKey], path: Path | None) -> None:
        self.path = path
        self._fixed = of_api_keys(api_keys)
        self._lock = threading.Lock()
        self._read = _Read(None, ())
        self._looked = 0.0
        if path is not None:
            self._read = self._load(path)

    def _load(self, path: Path) -> _Read:
        try:
            stat = path.stat()
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise KeysFileError(f"{path}: cannot be read: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise KeysFileError(f"{path}: is not UTF-8 text") from None
        keys = parse(text, str(path))
        fixed = {k.caller for k in self._fixed}
        clash = next((k for k in keys if k.caller in fixed), None)
        if clash is not None:
            raise KeysFileError(f"{path}:{clash.line}: key {clash.name!r} is named in "
                                "LAYBY_API_KEYS too: give it one place")
        return _Read((stat.st_mtime_ns, stat.st_size), tuple(keys))

    def refresh(self, now: float) -> None:
        """Read the file again if it changed since it was last read (at most once a
        second). Raises KeysFileError when the new file cannot be used (the keys stay)."""
        if self.path is None or now - self._looked < 1.0:
            return
        self._looked = now
        try:
            stat = self.path.stat()
            stamp: tuple[int, int] | None = (stat.st_mtime_ns, stat.st_size)
        except OSError:
            stamp = None
        if stamp == self._read.stamp:
            return
        fresh = self._load(self.path)
        with self._lock:
            self._read = fresh

    @property
    def keys(self) -> tuple[Key, ...]:
        return (*self._fixed, *self._read.keys)

    def find(self, presented: bytes) -> Key | None:
        """The key whose secret is `presented`; every key compared, so the time taken says
        nothing of which one matched."""
        digest = digest_of(presented)
        found = None
        for key in self.keys:
            if hmac.compare_digest(digest, key.digest) and found is None:
                found = key
        return found
