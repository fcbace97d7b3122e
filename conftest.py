"""Collect the book's MyST-Markdown notebooks for nbval.

nbval only collects ``.ipynb`` files, and converting the chapters into a temporary
folder would break relative paths (the kernel starts in the notebook's folder).
Instead, this hook hands nbval each ``book/**/*.md`` file that is a jupytext
notebook (it has a YAML header with a ``kernelspec``); the collector reads it with
``jupytext.read`` and is otherwise nbval's own, so the kernel runs in ``book/``.

Usage (see the Makefile):

    pytest --nbval-lax --nbval-current-env -p no:cacheprovider -n 2 --dist loadfile book/

``--dist loadfile`` keeps all cells of one notebook on one xdist worker (one kernel).
Outputs cannot be compared for ``.md`` notebooks (they store none): cells check
themselves with ``assert``.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from pathlib import Path

import jupytext
import pytest
import yaml
from nbval.plugin import IPyNbCell, IPyNbFile, find_comment_markers, find_metadata_tags

BOOK_DIR = "book"


def _front_matter(path: Path) -> dict:
    """Return the YAML front matter of a Markdown file ({} if there is none)."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}
    for end, line in enumerate(lines[1:], start=1):
        if line.strip() == "---":
            try:
                data = yaml.safe_load("\n".join(lines[1:end]))
            except yaml.YAMLError:
                return {}
            return data if isinstance(data, dict) else {}
    return {}


def is_jupytext_notebook(path: Path) -> bool:
    """True for a Markdown file whose front matter declares a kernel."""
    return "kernelspec" in _front_matter(path)


class JupytextNbFile(IPyNbFile):
    """nbval's notebook collector, reading a jupytext (MyST) Markdown notebook."""

    def collect(self):
        self.nb = jupytext.read(str(self.path))
        cell_num = 0
        for cell in self.nb.cells:
            if cell.cell_type != "code":
                continue
            # Same option handling as nbval's IPyNbFile.collect (metadata tags and
            # "# NBVAL_..." comment markers; comments win on overlap).
            with warnings.catch_warnings(record=True) as caught:
                options = defaultdict(bool, find_metadata_tags(cell.metadata))
                comment_opts = dict(find_comment_markers(cell.source))
            loc = f"{self.path}:Cell {cell_num}"
            overlap = set(comment_opts) & set(options)
            if overlap:
                warnings.warn_explicit(
                    f"Overlapping options from comments and metadata, using options from comments: {overlap}",
                    category=UserWarning,
                    filename=loc,
                    lineno=0,
                )
            for w in caught:
                warnings.warn_explicit(str(w.message), category=UserWarning, filename=loc, lineno=0)
            options.update(comment_opts)
            options.setdefault("check", self.compare_outputs)
            yield IPyNbCell.from_parent(self, name=f"Cell {cell_num}", cell_num=cell_num, cell=cell, options=options)
            cell_num += 1


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    opt = parent.config.option
    if not (getattr(opt, "nbval", False) or getattr(opt, "nbval_lax", False)):
        return None
    if file_path.suffix != ".md":
        return None
    book = parent.config.rootpath / BOOK_DIR
    if book not in file_path.parents:
        return None
    if any(part.startswith((".", "_")) for part in file_path.relative_to(book).parts):
        return None  # hidden folders, _build, _static, ...
    if not is_jupytext_notebook(file_path):
        return None  # a plain Markdown page (preface, appendices)
    return JupytextNbFile.from_parent(parent, path=file_path)
