"""Packages from npm for the tests that need the real thing (the AG-UI client, Grafana's
dashboard types): each test keeps a `package.json` and its lock file in a folder beside it,
and `installed` runs `npm ci` there once per checkout."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def installed(folder: Path, package: str, why: str) -> Path:
    """`folder`'s node_modules, with `package` in it (`npm ci` from the lock file when it is
    not). A machine without Node.js and npm fails the test that asks, saying `why` it needs
    them: these tests need the real package, not a stand-in."""
    assert shutil.which("node") and shutil.which("npm"), \
        f"{why} needs Node.js and npm on the machine (apt-get install nodejs npm)"
    modules = folder / "node_modules"
    if not (modules / package).exists():
        done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=folder,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"npm ci in {folder} failed:\n{done.stderr[-3000:]}"
    return modules
