"""Collapse in JupyterLab what the HTML book hides: ``jupyter: {source_hidden: true}`` on cells.

    python scripts/quiet_cells.py book/ch01_core_concepts.md …   # add the flags, rewrite the files
    python scripts/quiet_cells.py --check book/*.md                # only report; exit 1 if one is missing

myst-nb hides the code of a cell tagged ``hide-input`` (or ``remove-input``) behind a "显示代码"
button; JupyterLab ignores tags and shows that code in full. JupyterLab collapses a cell's source
when the cell's metadata says ``jupyter: {source_hidden: true}`` (and its outputs when it says
``jupyter: {outputs_hidden: true}``). This script gives every code cell of the jupytext MyST files
the flags that match its tags:

=============================  ==========================================
tag                            JupyterLab metadata added
=============================  ==========================================
``hide-input``/``remove-input``  ``jupyter.source_hidden: true``
``hide-output``/``remove-output``  ``jupyter.outputs_hidden: true``
``hide-cell``/``remove-cell``    both
=============================  ==========================================

The files are read and written with jupytext (the cells' header becomes the YAML form
``---`` … ``---`` that jupytext writes for nested metadata), and only when jupytext reproduces
the unchanged file exactly; jupytext 1.19 keeps ``jupyter.source_hidden`` through the round trip
``.md`` → notebook → ``.md`` (``tests/test_book_pages.py`` checks both). Files that are not
notebooks (no ``kernelspec``) are skipped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext

FORMAT = "md:myst"
# tag -> the keys of the cell's "jupyter" metadata that must be true
FLAGS = {
    "hide-input": ("source_hidden",),
    "remove-input": ("source_hidden",),
    "hide-output": ("outputs_hidden",),
    "remove-output": ("outputs_hidden",),
    "hide-cell": ("source_hidden", "outputs_hidden"),
    "remove-cell": ("source_hidden", "outputs_hidden"),
}


def missing_flags(cell) -> list[str]:
    """The ``jupyter.*`` flags that the cell's tags call for and its metadata lacks."""
    if cell.cell_type != "code":
        return []
    wanted: list[str] = []
    for tag in cell.metadata.get("tags", []):
        wanted += [f for f in FLAGS.get(tag, ()) if f not in wanted]
    flags = cell.metadata.get("jupyter", {})
    return [f for f in wanted if flags.get(f) is not True]


def cell_line(text: str, index: int, notebook) -> int:
    """1-based line of the ``{code-cell}`` fence of the notebook's ``index``-th cell (best effort)."""
    number = sum(1 for c in notebook.cells[: index + 1] if c.cell_type == "code")
    seen = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.startswith("```{code-cell}"):
            seen += 1
            if seen == number:
                return lineno
    return 0


def problems(path: Path) -> list[str]:
    """One line per hidden cell of ``path`` that lacks its JupyterLab flag."""
    text = path.read_text(encoding="utf-8")
    notebook = jupytext.reads(text, FORMAT)
    if "kernelspec" not in notebook.metadata:
        return []
    found = []
    for i, cell in enumerate(notebook.cells):
        lacking = missing_flags(cell)
        if lacking:
            tags = ", ".join(cell.metadata.get("tags", []))
            flags = ", ".join(f"jupyter.{f}: true" for f in lacking)
            found.append(f"{path}:{cell_line(text, i, notebook)}: cell tagged [{tags}] lacks {flags}")
    return found


def quiet(path: Path) -> int:
    """Add the missing flags to ``path``; returns how many cells changed."""
    text = path.read_text(encoding="utf-8")
    notebook = jupytext.reads(text, FORMAT)
    if "kernelspec" not in notebook.metadata:
        return 0
    changed = 0
    for cell in notebook.cells:
        lacking = missing_flags(cell)
        if lacking:
            flags = dict(cell.metadata.get("jupyter", {}))
            for flag in lacking:
                flags[flag] = True
            # "jupyter" first, as CONTRACT.md and the chapters write it (jupytext keeps the order)
            rest = {k: v for k, v in cell.metadata.items() if k != "jupyter"}
            cell.metadata.clear()
            cell.metadata.update({"jupyter": flags, **rest})
            changed += 1
    if not changed:
        return 0
    if jupytext.writes(jupytext.reads(text, FORMAT), FORMAT) != text:
        raise SystemExit(
            f"{path}: jupytext does not reproduce this file unchanged, so it is not rewritten; "
            "add the flags by hand (see the docstring) or reformat it once with "
            f"`jupytext --to {FORMAT} {path}`"
        )
    path.write_text(jupytext.writes(notebook, FORMAT), encoding="utf-8")
    return changed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="jupytext MyST notebooks (book/chNN_*.md)")
    parser.add_argument("--check", action="store_true", help="only list the cells that lack a flag")
    args = parser.parse_args(argv)
    if args.check:
        found = [line for path in args.files for line in problems(path)]
        for line in found:
            print(line)
        print(f"quiet_cells: {len(found)} hidden cell(s) without their JupyterLab flag")
        return 1 if found else 0
    for path in args.files:
        changed = quiet(path)
        print(f"{path}: {changed} cell(s) given their JupyterLab flag" if changed else f"{path}: nothing to do")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
