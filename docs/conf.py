"""Sphinx configuration for layby's documentation: Markdown pages (MyST), the API reference
from the docstrings (autodoc), the Furo theme.

Built strictly, as `./dev docs` and tests/journeys/test_docs.py do:

    python -m sphinx -W --keep-going -n -b html docs docs/_build/html

so a broken cross-reference, a missing page or a bad heading anchor fails the build.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sphinx.application import Sphinx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # document this checkout's layby, whatever is installed

project = "layby"
author = "layby's authors"
copyright = "layby's authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
root_doc = "index"

# MyST: `page.md#section` links are checked against the headings' GitHub-style anchors.
myst_heading_anchors = 3

# Every reference must resolve.
nitpicky = True
# Types of other packages and of the standard library, where a base class or a signature
# names one: their inventories cannot be fetched here (no intersphinx), so they are taken
# as they are. layby's own names are never listed here: each must resolve.
_EXTERNAL = ("pydantic", "pydantic_core", "httpx", "typing_extensions", "annotated_types",
             "celery", "kombu", "enum", "collections", "typing", "types", "datetime")
nitpick_ignore_regex = [(r"py:.*", rf"({'|'.join(_EXTERNAL)})(\..*)?")]

# autodoc reads docstrings as reStructuredText; their `names` are code, as in the Markdown.
default_role = "literal"
autodoc_member_order = "bysource"
# Signatures without their annotations: the docstrings say what each parameter takes, and
# pydantic's field annotations (`Annotated[..., FieldInfo(...)]`) read as noise.
autodoc_typehints = "none"
# A dataclass without a docstring gets `Name(field: 'type', ...)` as one; not a signature.
autodoc_docstring_signature = False
autodoc_default_options = {"members": True, "undoc-members": True,
                           "exclude-members": "model_config, model_post_init"}

html_theme = "furo"
html_title = "layby"


def _drop_dataclass_docstrings(app: Sphinx, what: str, name: str, obj: Any,
                               options: Any, lines: list[str]) -> None:
    """A dataclass without a docstring of its own has `Name(field: 'type', ...)` as one:
    the signature above says that already."""
    if (what == "class" and isinstance(obj, type) and dataclasses.is_dataclass(obj)
            and lines and lines[0].startswith(f"{obj.__name__}(")):
        lines.clear()


def setup(app: Sphinx) -> None:
    app.connect("autodoc-process-docstring", _drop_dataclass_docstrings)
