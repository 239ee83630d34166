"""The documentation: the site under docs/ builds as `./dev docs` builds it, strictly (every
warning an error, every cross-reference and `page.md#section` link resolved, the API
reference's docstrings read without a complaint), and README.md stays a landing page whose
links into docs/ name pages that exist. Starts no layby process."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
from sphinx.cmd.build import build_main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


# An extension's use of an API Sphinx 11 removes: theirs to mend, not an error of the docs.
@pytest.mark.filterwarnings("ignore::sphinx.deprecation.RemovedInSphinx11Warning")
def test_docs_build_strictly(tmp_path: Path) -> None:
    # In this process, as `./dev docs` builds it (`python -m sphinx` is this entry point):
    # the quick tier starts no process.
    out = tmp_path / "html"
    said = io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
        status = build_main(["-W", "--keep-going", "-n", "-q", "-E", "-b", "html",
                             str(ROOT / "docs"), str(out)])
    assert status == 0, f"sphinx exited {status}\n{said.getvalue()}"
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
