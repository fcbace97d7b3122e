"""Each notebook page, converted to ``.ipynb`` and executed by nbclient in a temporary folder
outside the repository, as a learner who downloads it or runs ``make notebooks`` would."""

from __future__ import annotations

from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

BOOK = Path(__file__).resolve().parents[2] / "book"
NOTEBOOKS = [p for p in sorted(BOOK.glob("*.md")) if "kernelspec" in jupytext.read(p).metadata]


@pytest.mark.parametrize("page", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_page_runs_outside_the_repository(page, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ipynb = tmp_path / f"{page.stem}.ipynb"
    nbformat.write(jupytext.read(page), ipynb)
    nb = nbformat.read(ipynb, as_version=4)
    assert BOOK.parent not in tmp_path.parents
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
