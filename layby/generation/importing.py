"""Importing the user's own modules (LAYBY_AGENT_MODULES, LAYBY_TASK_MODULES), with an error
that points at the user's code: a module that is not there is told apart from one that
failed while importing, and the latter's error is given with its file and line (where the
user can fix it), not as a traceback through layby's own code."""

from __future__ import annotations

import importlib
import sys
import sysconfig
import traceback
from pathlib import Path
from types import ModuleType

from layby.errors import ConfigError

# Files under these are not the user's: a line there is not where to fix their module.
_LIBRARY_DIRS = tuple(str(Path(p).resolve()) for p in {
    sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
    sysconfig.get_paths()["platlib"], str(Path(__file__).resolve().parents[1])})


def import_user_module(name: str, setting: str) -> ModuleType:
    """Import module `name`, named by the setting `setting`; a ConfigError in one line if
    it cannot be."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if _is_the_module(exc, name):
            raise ConfigError(
                f"{setting} names {name!r}, and no module {exc.name!r} is found: check the "
                f"name, and start layby in the folder that holds it (or add that folder to "
                f"PYTHONPATH); searched from {Path.cwd()}") from None
        raise ConfigError(_failed(name, setting, exc)) from None
    except SyntaxError as exc:
        where = f"{exc.filename}:{exc.lineno}" if exc.filename else "?"
        raise ConfigError(f"{setting}: module {name!r} has a syntax error at {where}: "
                          f"{exc.msg}") from None
    except Exception as exc:  # noqa: BLE001  (whatever the module raised is the finding)
        raise ConfigError(_failed(name, setting, exc)) from None


def _is_the_module(exc: ModuleNotFoundError, name: str) -> bool:
    """Whether what is not found is `name` itself (or a package on its way), rather than
    something the module imports."""
    parts = name.split(".")
    return exc.name in {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def _failed(name: str, setting: str, exc: BaseException) -> str:
    return (f"{setting}: module {name!r} failed while importing, at {_where(exc)}: "
            f"{type(exc).__name__}: {exc}; fix it there (or install what it needs in "
            f"{sys.prefix})")


def _where(exc: BaseException) -> str:
    """The file and line of the user's code nearest to where `exc` was raised."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith("<")]
    mine = [f for f in frames if not str(Path(f.filename).resolve()).startswith(_LIBRARY_DIRS)]
    if not (mine or frames):
        return "?"
    frame = (mine or frames)[-1]
    return f"{frame.filename}:{frame.lineno}"
