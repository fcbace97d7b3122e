"""Static checks of the book's pages: what a learner gets when opening them in Jupyter.

* Every jupytext page survives Jupyter's open-and-save round trip (MyST Markdown -> notebook ->
  MyST Markdown) byte for byte, so saving an unchanged chapter leaves no diff.
* Package code is shown with ``tc.show_source`` (a code cell, visible in Jupyter too), never with
  a ``literalinclude`` directive that only Sphinx can render.
* Prose carries no ``{glue}`` roles, which Jupyter shows as raw text.
* Code cells fit in 88 columns (wide characters count twice), so they never scroll sideways.
* Code never reaches outside the page with ``..`` paths: it runs from any working directory.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import jupytext
import pytest

BOOK = Path(__file__).resolve().parents[1] / "book"
PAGES = sorted(BOOK.glob("*.md"))
NOTEBOOKS = [p for p in PAGES if "kernelspec" in jupytext.read(p).metadata]
MAX_COLUMNS = 88


def _ids(paths):
    return [p.name for p in paths]


def _width(line: str) -> int:
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in line)


def test_pages_found():
    assert len(NOTEBOOKS) >= 5, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("page", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_round_trip_through_ipynb_is_byte_identical(page):
    text = page.read_text(encoding="utf-8")
    ipynb = jupytext.writes(jupytext.reads(text, fmt="md:myst"), fmt="ipynb")
    again = jupytext.writes(jupytext.reads(ipynb, fmt="ipynb"), fmt="md:myst")
    assert again == text, f"{page.name} is not in jupytext's canonical form; rewrite it with jupytext"


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_no_sphinx_only_constructs(page):
    text = page.read_text(encoding="utf-8")
    assert "literalinclude" not in text, "show package code with tc.show_source(obj) instead"
    glue = re.findall(r"\{glue(?::\w+)?\}`[^`]*`|```\{glue(?::\w+)?\}", text)
    assert not glue, f"glue renders as raw text in Jupyter: {glue[:3]}"


@pytest.mark.parametrize("page", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_code_cells_fit_the_page(page):
    wide = []
    for i, cell in enumerate(jupytext.read(page).cells):
        if cell.cell_type != "code":
            continue
        for line in cell.source.splitlines():
            if _width(line) > MAX_COLUMNS:
                wide.append(f"cell {i}: {line[:60]}...")
    assert not wide, f"{len(wide)} code lines wider than {MAX_COLUMNS} columns: {wide[:5]}"


@pytest.mark.parametrize("page", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_code_runs_from_any_directory(page):
    bad = []
    for i, cell in enumerate(jupytext.read(page).cells):
        if cell.cell_type == "code" and re.search(r"""["']\.\.(/|["'])""", cell.source):
            bad.append(i)
    assert not bad, f"cells {bad} use '..' paths; find package files with importlib.resources"


@pytest.mark.parametrize("chapter", range(1, 6))
def test_errata_appendix_lists_every_erratum_box(chapter):
    """The errata appendix's section for a chapter has one row per 勘误 box, linked by label."""
    (page,) = BOOK.glob(f"ch{chapter:02d}_*.md")
    text = page.read_text(encoding="utf-8")
    boxes = re.findall(r"^\((ch\d\d-errata-[\w-]+)\)=\n+:{3,}\{admonition\} 勘误", text, flags=re.M)
    assert len(boxes) == text.count("{admonition} 勘误"), "every 勘误 box needs a (chNN-errata-...)= label"
    appendix = (BOOK / "appendix_errata.md").read_text(encoding="utf-8")
    section = appendix.split(f"### 第 {chapter} 章", 1)[1].split("###", 1)[0]
    listed = re.findall(r"<(ch\d\d-errata-[\w-]+)>", section)
    assert sorted(listed) == sorted(boxes)
