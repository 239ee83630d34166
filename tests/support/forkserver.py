"""A fork server for the harness's processes: the same command lines (`python -m celery
…`, `python -m uvicorn …`, `layby …`), started by forking a process that has already
imported what they load, instead of a new interpreter importing it all again.

Why: started by a new interpreter, a worker, the sweeper and the gateway took 0.85, 0.7
and 0.86 s of CPU to be ready, most of it importing (Celery, kombu, redis-py, pydantic,
FastAPI, uvicorn, layby's own modules); forked, 0.27, 0.08 and 0.10. The suite starts
about 550 such processes and `layby` commands on two cores. What runs is unchanged: the
module's `__main__` (or the `layby` script's `main`) with the same argv, environment,
working folder and output, in a session of its own when the harness asks for one, its
signals as a new interpreter sets them. Imported before the fork: libraries and layby's
modules, never an entry that builds an app from the settings (`layby.tasks.app`), nor a
package's `__main__`.

What could differ is what a module reads from the environment at import: the server notes
each variable read by name while it imports (`os.environ` replaced by one that notes), and
a process whose environment differs in any of them, in the interpreter's own (PYTHON*,
which set `sys.path`) or in its working folder gets a process of its own, as before
(`spawn` returns None); so does a module the server imported, run as `__main__`, and any
other command line. `LAYBY_TEST_FORKSERVER=0` turns it off.

The server (`python -m tests.support.forkserver SOCKET`) is the parent of what it starts:
it reaps them and writes each one's exit code beside its socket (`<serial>.exit`, by the
number it gave the process), which `Forked`, the test's handle, reads (a process a test
did not start cannot be waited on).
It exits when the test process that started it closes its stdin (at exit, or dead).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

# What the worker's, the sweeper's, the gateway's and the command line's entries import;
# never a package's `__main__`, which `runpy` must be the first to run.
PRELOAD = (
    "celery.bin.celery", "celery.apps.worker", "celery.worker.consumer",
    "celery.concurrency.prefork", "celery.concurrency.solo", "kombu.transport.redis",
    "uvicorn.main", "uvicorn.protocols.http.h11_impl",
    "uvicorn.protocols.http.httptools_impl", "uvicorn.lifespan.on", "uvicorn.loops.auto",
    "layby.broker_config.celery_app", "layby.control", "layby.tasks", "layby.http.app",
    "layby.ops.cli",
)
LAYBY = str(Path(sys.executable).parent / "layby")


# -- the server -------------------------------------------------------------------------


class _Noting(os._Environ):  # type: ignore[type-arg]
    """`os.environ`, noting which variables are read by name. Not those read while the
    whole environment is copied: `wsgiref.handlers` copies it at import, for a WSGI server
    none of these processes runs, and the copy would make every variable of the test
    process (PYTEST_CURRENT_TEST, which changes at each test) one to compare."""

    read: ClassVar[set[str]] = set()
    copying: ClassVar[int] = 0

    def __getitem__(self, key: str) -> str:
        if not _Noting.copying:
            _Noting.read.add(key)
        return super().__getitem__(key)  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[str]:
        _Noting.copying += 1
        try:
            yield from super().__iter__()
        finally:
            _Noting.copying -= 1


def _preload() -> dict[str, str | None]:
    """Import PRELOAD; returns each variable read meanwhile, with its value (None: unset)."""
    plain: Any = os.environ
    # The same variables (`_data`), read through one that notes: not a copy.
    os.environ = _Noting(plain._data, plain.encodekey, plain.decodekey,  # noqa: B003
                         plain.encodevalue, plain.decodevalue)
    try:
        for name in PRELOAD:
            __import__(name)
    finally:
        os.environ = plain  # noqa: B003
    return {name: plain.get(name) for name in sorted(_Noting.read)}


def _taken_as_main() -> list[str]:
    """What `python -m NAME` cannot run here: `runpy` executes NAME (NAME.__main__ for a
    package) as `__main__`, and warns that it may misbehave when that module is imported."""
    return sorted({name.removesuffix(".__main__") for name, module in sys.modules.items()
                   if name.endswith(".__main__") or not hasattr(module, "__path__")})


def _serve(path: str) -> dict[str, Any]:
    """Serve spawn requests on `path` until stdin closes (the test process gone); returns
    only in a child, with its request."""
    read = _preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    folder = Path(path).parent
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(sys.stdin, selectors.EVENT_READ)
    print(json.dumps({"read": read, "taken": _taken_as_main()}), flush=True)
    started: dict[int, int] = {}  # pid → serial, of those running
    serials = itertools.count()
    while True:
        for key, _ in selector.select(timeout=0.05):
            if key.fileobj is not listener:
                if not sys.stdin.readline():
                    sys.exit(0)
                continue
            conn, _ = listener.accept()
            with conn:
                request = json.loads(conn.makefile().readline())
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    listener.close()
                    return request  # type: ignore[no-any-return]
                started[pid] = next(serials)
                conn.sendall(f"{pid} {started[pid]}\n".encode())
        _reap(folder, started)


def _reap(folder: Path, started: dict[int, int]) -> None:
    """Write the exit code of each process that ended to `<serial>.exit`: by the number
    the server gave it, not its pid, which a later process may get (pids wrap at 32,768
    here, Chromium's and Valkey's threads taking theirs)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = folder / f"{started.pop(pid)}.exit"
        code.with_suffix(".part").write_text(str(os.waitstatus_to_exitcode(status)))
        code.with_suffix(".part").rename(code)


def _become(request: dict[str, Any]) -> None:
    """In the child: the process the command line would have started."""
    if request["session"]:  # Popen(start_new_session=True)
        os.setsid()
    # Signals: the server changed no handler, so they are the interpreter's own.
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, name in ((1, request["stdout"]), (2, request["stderr"])):
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(out, fd)
        os.close(out)
    sys.stdin = open(0, closefd=False)  # the process's own: never closed
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = request["argv"]
    if argv[0] == LAYBY:  # what pip's launcher of the console script does
        from layby.ops.cli import main

        sys.argv = argv
        main()
        sys.exit(0)
    import runpy

    sys.argv = [argv[2], *argv[3:]]
    runpy.run_module(argv[2], run_name="__main__", alter_sys=True)


# -- the test's side ----------------------------------------------------------------------


class Forked:
    """What the harness uses of `subprocess.Popen`, for a process the server started."""

    def __init__(self, pid: int, serial: int, argv: list[str], server: _Server) -> None:
        self.pid, self.args, self._server = pid, argv, server
        self._done = server.folder / f"{serial}.exit"
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and self._done.exists():
            self.returncode = int(self._done.read_text())
        elif self.returncode is None and self._server.process.poll() is not None:
            # The server is gone (killed): init reaps what it started, code unknown.
            self.returncode = None if _alive(self.pid) else -1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            time.sleep(0.02)
        return code

    def send_signal(self, number: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, number)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


@dataclass(frozen=True)
class _Server:
    process: subprocess.Popen[str]
    folder: Path
    # What a process's must be for the server to start it: the variables read at import,
    # the interpreter's own (`sys.path`, buffering, warnings: read at its start), and the
    # working folder `python -m` puts first in `sys.path`.
    read: dict[str, str | None]
    python_vars: dict[str, str]
    cwd: Path
    taken: frozenset[str]  # `_taken_as_main`

    def can_start(self, argv: list[str], env: dict[str, str], cwd: Path) -> bool:
        return (cwd == self.cwd and _interpreters(env) == self.python_vars
                and all(env.get(name) == value for name, value in self.read.items())
                and (argv[0] == LAYBY or argv[2] not in self.taken))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


_server: _Server | None = None
_lock = threading.Lock()


def server_started(env: dict[str, str], cwd: Path) -> _Server | None:
    """This process's fork server (started for `env` and `cwd` if none runs)."""
    return _started(env, cwd)


def _interpreters(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name.startswith("PYTHON")}


def _started(env: dict[str, str], cwd: Path) -> _Server | None:
    global _server
    with _lock:
        if _server is not None and _server.process.poll() is None:
            return _server
        folder = Path(tempfile.mkdtemp(prefix="layby-fork-"))
        wanted = _interpreters(env)
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.forkserver", str(folder / "socket")],
            env={**{k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
                 **wanted}, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            start_new_session=True)
        assert process.stdout is not None
        try:
            ready = json.loads(process.stdout.readline())
        except ValueError:  # it failed to start: it said why on stderr
            process.kill()
            return None
        _server = _Server(process, folder, ready["read"], wanted, cwd,
                          frozenset(ready["taken"]))
        return _server


def spawn(argv: list[str], env: dict[str, str], cwd: Path, log: Path) -> Forked | None:
    """`argv` (`python -m …` or `layby …`) started by the fork server, its output appended
    to `log`; None when it must have a process of its own."""
    return _spawn(argv, env, cwd, log, log, session=True)


def run(argv: list[str], env: dict[str, str], cwd: Path,
        timeout: float) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(argv, env=env, cwd=cwd, stdin=DEVNULL, capture_output=True,
    text=True, timeout=timeout)`, by the fork server when it can start `argv`."""
    with tempfile.TemporaryDirectory(prefix="layby-run-") as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        forked = _spawn(argv, env, cwd, out, err, session=False)
        if forked is None:
            return subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=timeout, check=False)
        try:
            code = forked.wait(timeout)
        except subprocess.TimeoutExpired:
            forked.kill()
            raise
        return subprocess.CompletedProcess(argv, code, out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))


def _spawn(argv: list[str], env: dict[str, str], cwd: Path, stdout: Path, stderr: Path, *,
           session: bool) -> Forked | None:
    if os.environ.get("LAYBY_TEST_FORKSERVER", "1") == "0" or not (
            argv[0] == LAYBY or (argv[:2] == [sys.executable, "-m"] and len(argv) > 2)):
        return None
    server = _started(env, cwd)
    if server is None or not server.can_start(argv, env, cwd):
        return None
    request = {"argv": argv, "env": env, "cwd": str(cwd), "stdout": str(stdout),
               "stderr": str(stderr), "session": session}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(server.folder / "socket"))
        conn.sendall((json.dumps(request) + "\n").encode())
        pid, serial = map(int, conn.makefile().readline().split())
    return Forked(pid, serial, argv, server)


def _stop() -> None:
    if _server is not None and _server.process.poll() is None:
        assert _server.process.stdin is not None and _server.process.stdout is not None
        _server.process.stdin.close()
        _server.process.wait(10)
        _server.process.stdout.close()
        shutil.rmtree(_server.folder, ignore_errors=True)


atexit.register(_stop)


if __name__ == "__main__":
    _become(_serve(sys.argv[1]))
