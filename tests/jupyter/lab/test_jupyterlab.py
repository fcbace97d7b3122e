"""Each chapter as a learner meets it in JupyterLab (``make lab-test``; part of ``make test``).

JupyterLab 4.4 with jupyterlab-myst 2.7 and jupytext 1.19 (``requirements-lab.txt``), driven in
headless Chromium like a reader: the chapter is opened from the file browser with the menu item
the README names (right-click → "Open With" → "Notebook"), run with "Run" → "Run All Cells", and
then the test looks at what is on the screen:

* every cell that the HTML book hides (tagged ``hide-input``/``remove-input``, or code of a
  closed solution) is collapsed (``jupyter.source_hidden``: ``scripts/quiet_cells.py``), so no
  check code and no solution is in view;
* no markdown cell shows a directive raw or as jupyterlab-myst's red "Unknown Directive" box
  (``{prf:…}``, ``{exercise…}``, ``{solution…}``, ``{optional…}``, …);
* no cell printed an error or anything on stderr (the book build fails on both, too);
* every code cell ran (it has an execution count), and every attention explorer (``tc.explorer``)
  in an output was drawn (its script ran).

The chapters run one at a time in the same server (each kernel is shut down afterwards).
A screenshot of each chapter after the run: ``_build/screenshots/jupyterlab-<chapter>.png``.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import quiet_cells  # noqa: E402

BOOK = ROOT / "book"
# LAB_CHAPTERS="book/ch02_formula_derivations.md …" checks only those pages
CHAPTERS = [Path(p).resolve() for p in os.environ.get("LAB_CHAPTERS", "").split()] or sorted(
    BOOK.glob("ch[0-9][0-9]_*.md")
)
SHOT_DIR = ROOT / "_build" / "screenshots"
RUN_TIMEOUT_S = 900  # one chapter, run top to bottom on a small, busy machine
RAW_DIRECTIVE = re.compile(r"\{(?:prf:[\w-]+|exercise[\w-]*|solution[\w-]*|optional[\w-]*|admonition|glue[\w:-]*)\}")

# What the notebook shows after the run, cell by cell (in document order): the DOM for what the
# reader sees, the notebook's model (window.jupyterapp) for execution counts.
CELLS_JS = """
() => {
  const panel = jupyterapp.shell.currentWidget;
  const shown = (el) => !!el && el.checkVisibility() && el.getBoundingClientRect().height > 0;
  return panel.content.widgets.map((widget) => {
    const cell = widget.node;
    const model = widget.model;
    const code = model.type === "code";
    return {
      kind: model.type,
      text: code ? "" : cell.innerText,
      // a collapsed input is replaced by a one-line placeholder (the editor leaves the DOM)
      collapsed: !!cell.querySelector(".jp-InputPlaceholder") &&
                 !shown(cell.querySelector(".jp-InputArea-editor")),
      count: code ? model.executionCount : null,
      errors: [...cell.querySelectorAll(
          ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr'], " +
          ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error']")]
        .map((o) => o.innerText.trim().slice(0, 300)),
      // attention explorers (tc.explorer) whose script did not run
      deadExplorers: [...cell.querySelectorAll(".tc-explorer")].filter((e) => !e.dataset.ready).length,
      unknown: [...cell.querySelectorAll("code")].filter((c) =>
        (c.parentElement.innerText || "").includes("Unknown Directive")).map((c) => c.innerText),
    };
  });
}
"""
# Cells queued or running, cells that ran, cells with an error, and the kernel's status.
BUSY_JS = """
() => {
  const panel = jupyterapp.shell.currentWidget;
  const cells = panel.content.widgets.filter((w) => w.model.type === "code");
  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
  return { pending: cells.filter((w) => w.model.executionState === "running").length,
           total: cells.length, ran: cells.filter((w) => w.model.executionCount !== null).length,
           errors: cells.filter((w) => w.model.outputs.toJSON().some((o) => o.output_type === "error")).length,
           kernel: kernel ? kernel.status : "none",
           connected: !!kernel && kernel.connectionStatus === "connected" };
}
"""


READY_TIMEOUT_MS = 300_000  # JupyterLab's start and a kernel's start on a small, busy machine
ATTEMPTS = 3  # a UI action that a slow machine dropped (a menu that did not open) is tried again


def _retry(action, what: str):
    """Run ``action`` up to ATTEMPTS times: a busy machine can drop a click or a menu."""
    from playwright.sync_api import Error as PlaywrightError

    for attempt in range(1, ATTEMPTS + 1):
        try:
            return action()
        except PlaywrightError as error:
            if attempt == ATTEMPTS:
                pytest.fail(f"{what}: failed {ATTEMPTS} times, last: {error}")
            print(f"{what}: attempt {attempt} failed ({str(error).splitlines()[0]}); trying again")


def _open_as_notebook(page, lab, name: str) -> None:
    """Right-click the file in the file browser → "Open With" → "Notebook" (jupytext's viewer),
    then wait until the notebook's kernel is connected and idle."""

    def open_it():
        page.goto(f"{lab.url}lab?reset&token={lab.token}", wait_until="load")
        item = page.locator(".jp-DirListing-item", has_text=name)
        item.wait_for(timeout=READY_TIMEOUT_MS)
        item.click(button="right")
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Open With$")).hover()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Notebook$")).click()
        page.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell", timeout=READY_TIMEOUT_MS)

    _retry(open_it, f"open {name} as a notebook")
    # the kernel named in the page's kernelspec starts by itself (JupyterLab may ask first)
    deadline = time.monotonic() + READY_TIMEOUT_MS / 1000
    while (state := page.evaluate(BUSY_JS))["kernel"] != "idle" or not state["connected"]:
        _accept_kernel_dialog(page)
        if time.monotonic() > deadline:
            pytest.fail(f"the kernel of {name} was not ready after {READY_TIMEOUT_MS // 1000} s: {state}")
        page.wait_for_timeout(500)


def _accept_kernel_dialog(page) -> None:
    """JupyterLab may ask "Select Kernel" (preselected: the page's Python 3): accept it."""
    dialog = page.locator(".jp-Dialog", has_text="Select Kernel")
    if dialog.count() and dialog.first.is_visible():
        dialog.first.locator(".jp-Dialog-button.jp-mod-accept").click()


def _run_all(page) -> None:
    """Menu "Run" → "Run All Cells" (again if the click was dropped: no cell started within a
    minute), then wait until the kernel is idle with no cell queued and either every code cell has
    an execution count or a cell shows an error ("Run All" stops there; the checks report it)."""

    def click_run_all():
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()

    _retry(click_run_all, "Run → Run All Cells")
    clicked, clicks = time.monotonic(), 1
    deadline = clicked + RUN_TIMEOUT_S
    while True:
        _accept_kernel_dialog(page)
        state = page.evaluate(BUSY_JS)
        started = state["ran"] > 0 or state["pending"] > 0
        if state["kernel"] == "idle" and state["pending"] == 0 and (state["ran"] == state["total"] or state["errors"]):
            return
        if not started and time.monotonic() - clicked > 60 and clicks < ATTEMPTS:
            print(f"no cell started within 60 s of 'Run All Cells' ({state}); clicking it again")
            _retry(click_run_all, "Run → Run All Cells")
            clicked, clicks = time.monotonic(), clicks + 1
        if time.monotonic() > deadline:
            pytest.fail(f"not finished after {RUN_TIMEOUT_S} s: {state}")
        page.wait_for_timeout(1000)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_chapter_reads_and_runs_in_jupyterlab(lab, browser, chapter: Path):
    shutil.copy(chapter, lab.root / chapter.name)
    notebook = jupytext.read(chapter)
    # the cells that the HTML hides: they must be collapsed (scripts/quiet_cells.py)
    hidden = [("source_hidden" in flags) for flags in quiet_cells.wanted_flags(notebook)]
    expected = [c for c in notebook.cells if c.cell_type in ("code", "markdown")]
    hidden = [h for h, c in zip(hidden, notebook.cells, strict=True) if c.cell_type in ("code", "markdown")]
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    context.set_default_timeout(60_000)
    page = context.new_page()
    try:
        start = time.monotonic()
        _open_as_notebook(page, lab, chapter.name)
        _run_all(page)
        elapsed = time.monotonic() - start
        cells = page.evaluate(CELLS_JS)
        SHOT_DIR.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOT_DIR / f"jupyterlab-{chapter.stem}.png"))
    finally:
        context.close()
        lab.shutdown_kernels()
    print(f"{chapter.stem}: opened and ran in JupyterLab in {elapsed:.0f} s")

    assert [c["kind"] for c in cells] == [c.cell_type for c in expected], "the notebook's cells differ from the page's"
    problems = []
    for i, (cell, source, collapse) in enumerate(zip(cells, expected, hidden, strict=True)):
        first = source.source.strip().splitlines()[0][:70] if source.source.strip() else ""
        where = f"cell {i} ({first!r})"
        if source.cell_type == "code":
            if collapse and not cell["collapsed"]:
                tags = source.metadata.get("tags", [])
                what = f"tagged {tags}" if tags else "in a closed solution"
                problems.append(f"{where}: {what} (hidden in the HTML) but expanded in JupyterLab")
            if cell["count"] is None:
                problems.append(f"{where}: did not run")
            problems += [f"{where}: error/stderr output: {e}" for e in cell["errors"]]
            if cell["deadExplorers"]:
                problems.append(f"{where}: {cell['deadExplorers']} attention explorer(s) not drawn")
        else:
            problems += [f"{where}: unknown directive {name!r}" for name in cell["unknown"]]
            problems += [f"{where}: raw directive {m!r}" for m in RAW_DIRECTIVE.findall(cell["text"])]
    assert not problems, f"{chapter.stem}: {len(problems)} problems in JupyterLab:\n  " + "\n  ".join(problems[:25])
