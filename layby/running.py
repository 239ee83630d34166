"""What a running `layby up` leaves in its data folder for the commands started beside it.

Two files. `up.lock` is held (flock) by the `layby up` that runs on the folder, for as long as
it runs: the kernel drops the lock when its owner dies, however it dies, so a lock nobody
holds is stale whatever the file says. It holds the owner's PID and gateway URL, for the
message that refuses a second `layby up`. `up.json` is that `layby up`'s effective settings:
the gateway's URL, the agent and task modules, the reviewer directory, mail, and where the API
key is (its file, never the key: this file holds no secret). `layby run`, `agents`, `runs`,
`doctor` and `layby.Client()` started in the same folder use them for what they are not told
otherwise (LAYBY_* variables and arguments win).

Standard library only: `layby.client` reads it, and the client imports nothing of the server.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

if sys.platform != "win32":  # no flock on Windows: a live owner is told by its PID there
    import fcntl

LOCK_FILE = "up.lock"
STATE_FILE = "up.json"
DEFAULT_DATA_DIR = ".layby"


def data_dir() -> Path:
    """The data folder this process's settings name (LAYBY_DATA_DIR, or ./.layby)."""
    return Path(os.environ.get("LAYBY_DATA_DIR") or DEFAULT_DATA_DIR)


@dataclass(frozen=True)
class Stack:
    """A running `layby up`, as `up.json` describes it."""

    pid: int
    url: str  # the gateway
    # Where the API key is: a file of the data folder (None when the key came from
    # LAYBY_API_KEYS in the environment of the terminal that started it).
    api_key_file: str | None = None
    # LAYBY_* settings by field name (lowercase, no prefix), for the `layby` command.
    settings: dict[str, Any] = field(default_factory=dict)

    def api_key(self) -> str | None:
        if not self.api_key_file:
            return None
        try:
            return Path(self.api_key_file).read_text().strip() or None
        except OSError:
            return None


class Taken(Exception):
    """Another `layby up` holds the folder's lock."""

    def __init__(self, folder: Path, owner: str) -> None:
        super().__init__(f"another `layby up` runs on {folder} ({owner or 'starting'}): stop it "
                         "first, or give this one another LAYBY_DATA_DIR")
        self.owner = owner


@dataclass
class Lock:
    """The folder's lock, held until `release()` or the process's end."""

    path: Path
    handle: IO[str] | None = None

    @classmethod
    def take(cls, folder: Path, url: str) -> Lock:
        """Take the folder's lock and write this process's PID and `url` in it; raise
        `Taken`, naming the owner, when a live process holds it. A stale lock (its owner
        dead) is taken over."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / LOCK_FILE
        # Not truncated on open: a refused taker must still read the owner's line.
        handle = open(path, "a+")
        # Tried for a second: a command that only looks (`is_held`: a client, `doctor`)
        # holds the lock shared for a moment, and must not refuse a `layby up` starting.
        deadline = time.monotonic() + 1.0
        while not (got := _try_lock(handle, exclusive=True)) and time.monotonic() < deadline:
            time.sleep(0.02)
        if not got:
            handle.seek(0)
            owner = handle.read().strip()
            handle.close()
            raise Taken(folder, owner)
        handle.truncate(0)
        handle.write(f"PID {os.getpid()}, {url}\n")
        handle.flush()
        return cls(path, handle)

    def release(self) -> None:
        if self.handle is not None:
            self.handle.close()  # closing the only descriptor drops the flock
            self.handle = None


def _try_lock(handle: IO[str], *, exclusive: bool) -> bool:
    if sys.platform == "win32":
        return _owner_dead(handle)
    mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
    try:
        fcntl.flock(handle.fileno(), mode)
    except BlockingIOError:
        return False
    return True


def _owner_dead(handle: IO[str]) -> bool:
    handle.seek(0)
    words = handle.read().split()
    pid = int(words[1].rstrip(",")) if len(words) > 1 and words[0] == "PID" else 0
    if pid <= 0 or pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def is_held(folder: Path) -> bool:
    """Whether a live `layby up` holds the folder's lock."""
    try:
        with open(folder / LOCK_FILE) as handle:
            return not _try_lock(handle, exclusive=False)  # closing drops a lock we got
    except OSError:
        return False


def write(folder: Path, stack: Stack) -> None:
    """Write `up.json`, readable by its owner only (it says where secrets are), whole or
    not at all: written beside it, then renamed over it, so a reader (or a kill) never
    finds half a file."""
    path = folder / STATE_FILE
    partial = folder / f".{STATE_FILE}.{os.getpid()}"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a leftover of a killed writer may have had another mode
    with os.fdopen(fd, "w") as out:
        json.dump(asdict(stack), out, indent=2)
        out.write("\n")
    os.replace(partial, path)


def remove(folder: Path) -> None:
    (folder / STATE_FILE).unlink(missing_ok=True)


def running(folder: Path | None = None) -> Stack | None:
    """The `layby up` running on `folder` (this process's data folder by default), or None
    when none does (no lock held, or no readable `up.json`)."""
    folder = data_dir() if folder is None else folder
    if not is_held(folder):
        return None
    try:
        found = json.loads((folder / STATE_FILE).read_text())
        return Stack(pid=int(found["pid"]), url=str(found["url"]),
                     api_key_file=found.get("api_key_file"),
                     settings=dict(found.get("settings") or {}))
    except (OSError, ValueError, KeyError, TypeError):
        return None
