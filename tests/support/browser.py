"""Headless Chromium for page tests: Debian's `chromium` (what `.ci/run` installs), driven by
Playwright without Playwright's own browser downloads."""

from __future__ import annotations

import shutil
from typing import Any

CHROMIUM = "/usr/bin/chromium"
# A closed network: without these, Chromium keeps trying to reach Google's services.
ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def launch(playwright: Any) -> Any:
    path = shutil.which("chromium") or CHROMIUM
    if not shutil.which(path):
        raise AssertionError("Chromium is not installed: the page tests need Debian's "
                             "`chromium` (apt-get install chromium; .ci/run does it)")
    return playwright.chromium.launch(executable_path=path, args=ARGS)
