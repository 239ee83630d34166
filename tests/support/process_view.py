"""`python -m tests.support.process_view NAME…`: prints, as one line of JSON, what a process
sees of how it was started (variables NAME…, argv, working folder, session, signals,
`sys.path`, stdin), for tests/journeys/test_forkserver.py to compare a process the fork
server started with one of its own."""

import json
import os
import signal
import sys

SIGNALS = ("SIGINT", "SIGTERM", "SIGPIPE", "SIGCHLD", "SIGHUP", "SIGXFSZ", "SIGUSR1")


def _handler(name: str) -> str:
    handler = signal.getsignal(getattr(signal, name))
    return getattr(handler, "__name__", str(handler))


print(json.dumps({
    "env": {name: os.environ.get(name) for name in sys.argv[1:]},
    "argv": sys.argv[1:],
    "cwd": os.getcwd(),
    "own_session": os.getsid(0) == os.getpid(),
    "signals": {name: _handler(name) for name in SIGNALS},
    "path": sys.path,
    "stdin": os.readlink("/proc/self/fd/0"),
    "main": __name__,
}))
