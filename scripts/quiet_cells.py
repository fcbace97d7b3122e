"""Collapse in JupyterLab what the HTML book hides: ``jupyter: {source_hidden: true}`` on cells.

    python scripts/quiet_cells.py book/ch01_core_concepts.md …   # add the flags, rewrite the files
    python scripts/quiet_cells.py --check book/*.md                # only report; exit 1 if one is missing

myst-nb hides the code of a cell tagged ``hide-input`` (or ``remove-input``) behind a "显示代码"
button; JupyterLab ignores tags and shows that code in full. JupyterLab collapses a cell's source
when the cell's metadata says ``jupyter: {source_hidden: true}`` (and its outputs when it says
``jupyter: {outputs_hidden: true}``). This script gives every code cell of the jupytext MyST files
the flags that match its tags:

===================================  ==========================================
cell                                 JupyterLab metadata added
===================================  ==========================================
tagged ``hide-input``/``remove-input``  ``jupyter.source_hidden: true``
tagged ``hide-output``/``remove-output``  ``jupyter.outputs_hidden: true``
tagged ``hide-cell``/``remove-cell``    both
inside a closed solution                both
===================================  ==========================================

A closed solution is the code between ``{solution-start}`` (with ``:class: dropdown``) and
``{solution-end}``: the HTML shows it only when the reader opens the dropdown, and JupyterLab
then shows only the first line of each of its cells, so a learner does not read the solution
right under the exercise before trying it.

The files are read and written with jupytext (the cells' header becomes the YAML form
``---`` … ``---`` that jupytext writes for nested metadata), and only when jupytext reproduces
the unchanged file exactly; jupytext 1.19 keeps ``jupyter.source_hidden`` through the round trip
``.md`` → notebook → ``.md`` (``tests/test_book_pages.py`` checks both). Files that are not
notebooks (no ``kernelspec``) are skipped.
"""

from __future__ import annotations

import argparse
import re
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


SOLUTION_FLAGS = ("source_hidden", "outputs_hidden")
GATE_RE = re.compile(r"^```\{solution-(start|end)\}[^\n]*\n((?::[\w-]+:[^\n]*\n)*)", re.M)


def solution_state(markdown: str, inside: bool) -> bool:
    """Whether the cells after this markdown cell are inside a closed (dropdown) solution."""
    for match in GATE_RE.finditer(markdown + "\n"):
        if match.group(1) == "start":
            inside = bool(re.search(r"^:class:.*\bdropdown\b", match.group(2), re.M))
        else:
            inside = False
    return inside


def missing_flags(cell, in_solution: bool = False) -> list[str]:
    """The ``jupyter.*`` flags that the cell's tags (or its place in a closed solution) call for
    and its metadata lacks."""
    if cell.cell_type != "code":
        return []
    wanted: list[str] = list(SOLUTION_FLAGS) if in_solution else []
    for tag in cell.metadata.get("tags", []):
        wanted += [f for f in FLAGS.get(tag, ()) if f not in wanted]
    flags = cell.metadata.get("jupyter", {})
    return [f for f in wanted if flags.get(f) is not True]


def wanted_flags(notebook) -> list[set[str]]:
    """For every cell of the notebook, the ``jupyter.*`` flags it should carry."""
    inside, wanted = False, []
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            inside = solution_state(cell.source, inside)
        stripped = type(cell)({**cell, "metadata": {k: v for k, v in cell.metadata.items() if k != "jupyter"}})
        wanted.append(set(missing_flags(stripped, inside)))
    return wanted


def cells_with_missing_flags(notebook):
    """(index, cell, missing flags) for every code cell that lacks a flag."""
    inside = False
    for i, cell in enumerate(notebook.cells):
        if cell.cell_type == "markdown":
            inside = solution_state(cell.source, inside)
            continue
        lacking = missing_flags(cell, inside)
        if lacking:
            yield i, cell, lacking


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
    for i, cell, lacking in cells_with_missing_flags(notebook):
        tags = ", ".join(cell.metadata.get("tags", []))
        flags = ", ".join(f"jupyter.{f}: true" for f in lacking)
        what = f"cell tagged [{tags}]" if tags else "cell of a closed solution"
        found.append(f"{path}:{cell_line(text, i, notebook)}: {what} lacks {flags}")
    return found


def quiet(path: Path) -> int:
    """Add the missing flags to ``path``; returns how many cells changed."""
    text = path.read_text(encoding="utf-8")
    notebook = jupytext.reads(text, FORMAT)
    if "kernelspec" not in notebook.metadata:
        return 0
    changed = 0
    for _, cell, lacking in list(cells_with_missing_flags(notebook)):
        flags = dict(cell.metadata.get("jupyter", {}))
        for flag in lacking:
            flags[flag] = True
        cell.metadata["jupyter"] = flags
        changed += 1
    if not changed:
        return 0
    if jupytext.writes(jupytext.reads(text, FORMAT), FORMAT) != text:
        raise SystemExit(
            f"{path}: jupytext does not reproduce this file unchanged, so it is not rewritten; "
            "add the flags by hand (see the docstring) or reformat it once with "
            f"`jupytext --to {FORMAT} {path}`"
        )
    # written in the form an md -> ipynb -> md round trip gives (metadata keys sorted), so
    # that saving the page from JupyterLab changes nothing
    canonical = jupytext.reads(jupytext.writes(notebook, "ipynb"), "ipynb")
    path.write_text(jupytext.writes(canonical, FORMAT), encoding="utf-8")
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
