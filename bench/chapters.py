"""Benchmark 5: execution time of each chapter notebook, from an nbval run's JUnit XML.

``--full`` runs ``pytest --nbval-lax --nbval-current-env -p no:cacheprovider -n JOBS
--dist loadfile book/ --junitxml=...`` (the book's own test command); ``--nbval-junit PATH``
reads an existing report instead (e.g. from ``make nbval`` with ``--junitxml``). Each test case
is one notebook cell; the cell times are summed per notebook. Notebooks of ``book/`` that the
report does not mention are listed as missing.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import matplotlib.pyplot as plt

from .common import REPO_ROOT, Context, log, save_figure, sig

BOOK = REPO_ROOT / "book"


def book_notebooks() -> list[str]:
    """Jupytext notebooks in book/ (Markdown files whose front matter declares a kernelspec)."""
    names = []
    for path in sorted(BOOK.glob("*.md")):
        text = path.read_text(encoding="utf-8")
        if text.startswith("---") and "kernelspec:" in text.split("\n---", 1)[0]:
            names.append(path.name)
    return names


def _notebook_of(case: ET.Element) -> str | None:
    """The notebook of a test case: nbval's classname is 'book.ch01_x.md' (or a 'file' attribute)."""
    value = (case.get("file") or case.get("classname") or "").replace("\\", "/").rsplit("/", 1)[-1]
    if not value.endswith((".md", ".ipynb")):
        return None
    stem, ext = value.rsplit(".", 1)
    return f"{stem.rsplit('.', 1)[-1]}.{ext}"


def parse_junit(path: Path) -> dict[str, dict]:
    """Per notebook: summed cell seconds, number of cells, failed/errored cells."""
    root = ET.parse(path).getroot()
    out: dict[str, dict] = {}
    for case in root.iter("testcase"):
        nb = _notebook_of(case)
        if nb is None:
            continue
        row = out.setdefault(nb, {"seconds": 0.0, "cells": 0, "failed": 0})
        row["seconds"] += float(case.get("time", 0.0))
        row["cells"] += 1
        if case.find("failure") is not None or case.find("error") is not None:
            row["failed"] += 1
    for row in out.values():
        row["seconds"] = sig(row["seconds"])
    return out


def run_nbval(junit: Path, jobs: int) -> tuple[int, float]:
    cmd = [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "-p", "no:cacheprovider",
           "-q", f"--junitxml={junit}", "book/"]  # fmt: skip
    if jobs > 1:
        cmd[5:5] = ["-n", str(jobs), "--dist", "loadfile"]
    log("  chapters: " + " ".join(cmd[2:]))
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    if proc.returncode not in (0, 5):
        log(proc.stdout[-3000:])
    return proc.returncode, time.perf_counter() - start


def run(ctx: Context) -> dict:
    notebooks = book_notebooks()
    result: dict = {"notebooks_in_book": notebooks}
    if ctx.nbval_junit is not None:
        junit = Path(ctx.nbval_junit)
        result["source"] = f"existing report {junit.name}"
    elif ctx.quick or ctx.skip_chapters:
        result["skipped"] = "no --nbval-junit given (the nbval run only happens with --full)"
        return result
    else:
        junit = Path(tempfile.mkdtemp(prefix="tc-bench-")) / "nbval.xml"
        rc, wall = run_nbval(junit, ctx.jobs)
        result.update(source=f"pytest nbval run, {ctx.jobs} worker(s)", returncode=rc, wall_s=sig(wall))
        log(f"  chapters: JUnit report {junit}")
    if not junit.exists():
        result["skipped"] = f"no JUnit report at {junit}"
        return result
    per = parse_junit(junit)
    suite = next(ET.parse(junit).getroot().iter("testsuite"), None)
    if suite is not None:
        result["report_timestamp"] = suite.get("timestamp")
        result["report_time_s"] = sig(float(suite.get("time", 0.0)))
    result["per_notebook"] = dict(sorted(per.items()))
    result["missing"] = [nb for nb in notebooks if nb not in per]
    result["total_cell_s"] = sig(sum(r["seconds"] for r in per.values()))
    for nb, r in result["per_notebook"].items():
        log(f"  {nb}: {r['seconds']:.1f} s in {r['cells']} cells, {r['failed']} failed")
    return result


def plot(result: dict, ctx: Context) -> str | None:
    per = result.get("per_notebook")
    if not per:
        return None
    names = list(per)
    fig, ax = plt.subplots(figsize=(6, 0.45 * len(names) + 1.2))
    ax.barh(names, [per[n]["seconds"] for n in names], color=["C3" if per[n]["failed"] else "C0" for n in names])
    ax.invert_yaxis()
    ax.set_xlabel("seconds (sum of cell times; red: some cell failed)")
    machine = ctx.label.split(",")[0]  # the notebooks choose their own thread counts
    ax.set_title(f"Chapter execution under nbval ({machine})", fontsize=9)
    return save_figure(fig, ctx.figure_path("chapters"))
