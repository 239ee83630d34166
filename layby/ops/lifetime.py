"""Children that die with their parent: what `layby up` starts (and its embedded Valkey) must
not outlive it, even when it is killed with SIGKILL and has no chance to stop them.

The children run in sessions of their own (so Ctrl-C in the terminal reaches the supervisor
only, which stops them in order); the kernel's parent-death signal (Linux `prctl
PR_SET_PDEATHSIG`) sends each one SIGTERM when its parent goes. It fires when the *thread*
that started the child ends, not the process: only a child started from the main thread
gets it (elsewhere a thread that finishes would take its children with it).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable
from functools import cache

PR_SET_PDEATHSIG = 1


@cache
def _libc() -> ctypes.CDLL | None:
    # Loaded in the parent: the child between fork and exec should do as little as it can.
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` for `subprocess.Popen` that has the child sent `sig` when this
    process dies; None where that cannot be had (not Linux, not the main thread)."""
    libc = _libc()
    if libc is None or threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()

    def arm() -> None:
        libc.prctl(PR_SET_PDEATHSIG, sig)
        # The parent may have died between fork and prctl: then nothing would ever fire.
        if os.getppid() != parent:
            os._exit(1)

    return arm
