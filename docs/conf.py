"""Sphinx configuration for the run-ledger documentation.

Build: `sphinx-build -W -b html docs docs/_build/html` (after `pip install -e '.[docs]'`).
The CLI, state, manifest and route reference pages are generated into `_generated/`
at every build from the code itself (`gen_cli.py`, `gen_reference.py`).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gen_cli  # noqa: E402
import gen_reference  # noqa: E402

gen_cli.generate(HERE / "_generated" / "cli.md")
gen_reference.generate(HERE)

project = "run-ledger"
author = "the run-ledger authors"
copyright = "the run-ledger authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_generated", "Thumbs.db", ".DS_Store"]

myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

# autodoc: the public names of `ledger`, documented from their docstrings. Type hints
# are left out of the signatures: they name internal modules (and forward references
# under TYPE_CHECKING) that the docs do not describe, which -W would turn into errors.
autodoc_typehints = "none"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "undoc-members": False}

html_theme = "furo"
html_title = "run-ledger"
html_static_path: list[str] = []


def _decisions_toc() -> None:
    """The decision records' table of contents, or a note when there are none yet."""
    records = sorted(p for p in (HERE / "decisions").glob("*.md") if p.name != "README.md")
    lines = [gen_reference.HEADER]
    if records:
        entries = (["decisions/README"] if (HERE / "decisions" / "README.md").exists() else []) + [
            f"decisions/{p.stem}" for p in records
        ]
        lines += ["```{toctree}", ":maxdepth: 1", "", *entries, "```", ""]
    else:
        lines += ["No decision record has been written yet.", ""]
    gen_reference._write(HERE / "_generated" / "decisions.md", "\n".join(lines))


_decisions_toc()
