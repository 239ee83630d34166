"""The documentation: the site under docs/ builds as `./dev docs` builds it, strictly (every
warning an error, every cross-reference and `page.md#section` link resolved, the API
reference's docstrings read without a complaint), and README.md stays a landing page whose
links into docs/ name pages that exist. Starts no layby process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


# A process of its own: Sphinx's autodoc leaves the process it builds in changed (pydantic
# models built after it fail), so the build is not for the quick tier's process.
# `./dev check` builds the site as its own step.
@pytest.mark.integration
@pytest.mark.timeout(330)  # the build's own limit (300 s) speaks first: a whole site, -E
def test_docs_build_strictly(tmp_path: Path) -> None:
    out = tmp_path / "html"
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-E", "-b", "html",
         "docs", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert build.returncode == 0, (
        f"sphinx exited {build.returncode}\n--- stdout\n{build.stdout}\n--- stderr\n"
        f"{build.stderr}")
    assert (out / "index.html").is_file()
    assert (out / "api-reference.html").is_file()


def test_readme_is_a_landing_page() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines; the manual lives in docs/"


def test_readme_links_into_docs_exist() -> None:
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)\s]*)?\)", text)
    assert targets, "README.md links to no page of docs/"
    missing = sorted({t for t in targets if not (ROOT / t).is_file()})
    assert not missing, f"README.md links to pages that do not exist: {missing}"
