"""Measure built pages as a reader sees them: one row per page.

    python scripts/page_metrics.py $TMPDIR/check-ch01_core_concepts/_build/html/book/ch01_core_concepts.html
    python scripts/page_metrics.py _build/html/book/ch0*.html            # after `make book`
    python scripts/page_metrics.py --goals _build/html/book/ch0*.html    # also the chapter goals
    python scripts/page_metrics.py --json …                              # machine-readable

Each page is served from its build folder (the one holding ``_static``) on 127.0.0.1 and opened
in the browser tests' headless Chromium (``tests/browser/bookbrowser.py``; nothing is fetched
from outside). Every dropdown, solution, hidden input and 选读 block is closed, then it counts:

* 汉字: CJK characters of the visible text of the article outside code blocks and cell outputs
  (the main-path prose; a closed 选读 block contributes its title and lead only);
* code lines: non-empty visible lines of code (cell inputs and code blocks, not outputs);
* ✓ lines: visible lines (code or output) that start with ✓;
* check lines: visible code lines with ``assert``, ``nb.claim(…)``, ``nb.claim_close(…)`` or
  ``nb.claims(…)`` (a learner's ``tc.exercises.check_…(…)`` call is not one);
* figures: visible ``<figure>`` elements and visible output images outside a figure;
* dev notes: occurrences of phrases about how the book was written (开发时, 早先的版本, 评审, …)
  in the visible prose (``--verbose`` prints them with their context).

The goals (``--goals``) are those of the chapter issues (COURSE_GUIDE.md section 6):
``CHAPTER_GOALS`` in ``tests/browser/bookbrowser.py``, also used by ``tests/browser/test_reading.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "browser"))
from bookbrowser import (  # noqa: E402
    CHROMIUM_MISSING,
    METRIC_COLUMNS,
    SETTLE_JS,
    TIMEOUT_MS,
    VIEWPORT,
    chapter_goal_failures,
    chromium_executable,
    launch_chromium,
    open_page,
    page_metrics,
    serve,
)


def build_root(html: Path) -> Path:
    """The build folder of a page: the nearest parent that holds ``_static``."""
    for parent in html.parents:
        if (parent / "_static").is_dir():
            return parent
    raise SystemExit(f"{html}: no _static folder above it; is this a page of a built book?")


def measure(pages: list[Path]) -> list[dict]:
    if not chromium_executable():
        raise SystemExit(CHROMIUM_MISSING)
    rows = []
    with launch_chromium() as browser:
        context = browser.new_context(viewport=VIEWPORT, locale="zh-CN")
        context.set_default_timeout(TIMEOUT_MS)
        for html in pages:
            root = build_root(html)
            with serve(root) as server:
                page, traffic = open_page(context, server)
                page.goto(server + html.relative_to(root).as_posix(), wait_until="load")
                page.evaluate(SETTLE_JS)
                rows.append({"page": html.stem, "path": str(html), **page_metrics(page)})
                page.close()
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="+", type=Path, help="built HTML pages")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--verbose", action="store_true", help="print the check lines and dev notes found")
    parser.add_argument("--goals", action="store_true", help="exit 1 if a chapter misses its goals")
    args = parser.parse_args(argv)
    pages = [p.resolve() for p in args.pages]
    missing = [str(p) for p in pages if not p.is_file()]
    if missing:
        raise SystemExit(f"no such page: {missing}")
    rows = measure(pages)
    if args.json:
        print(json.dumps(rows, ensure_ascii=False, indent=1))
    else:
        width = max(len(r["page"]) for r in rows)
        print(f"{'page':<{width}}  " + "  ".join(f"{title:>11}" for _, title in METRIC_COLUMNS))
        for row in rows:
            cells = "  ".join(f"{row[key]:>11,}" for key, _ in METRIC_COLUMNS)
            print(f"{row['page']:<{width}}  {cells}")
            if args.verbose:
                for line in row["examples"]["checks"]:
                    print(f"    check line: {line.strip()}")
                for note in row["examples"]["notes"]:
                    print(f"    dev note: …{note}…")
    failed = 0
    if args.goals:
        for row in rows:
            failures = chapter_goal_failures(row["page"], row)
            if failures:
                failed += 1
                print(f"{row['page']}: misses its goals: " + "; ".join(failures))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
