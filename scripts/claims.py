"""``make claims``: run every notebook page under nbval with several base seeds.

Every random choice in the book derives from ``COURSE_SEED`` (``nb.course_seed``), so a claim
that holds only for the seed on the page fails here. For each base seed the pages are executed
by nbval (as in ``make nbval``); the result, page by page, goes to ``_build/claims/summary.md``
and the exit status is non-zero if any page fails for any seed.

    python scripts/claims.py --seeds 1 2 3 [--jobs 2] [pages ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "_build" / "claims"


def run_seed(seed: int, pages: list[str], jobs: int) -> dict[str, list[str]]:
    """Run nbval with ``COURSE_SEED=seed``; return ``{page: [failed cell names]}`` for every page."""
    report = OUT / f"seed{seed}.xml"
    cmd = [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "-p", "no:cacheprovider",
           "-q", f"--junitxml={report}", *pages]  # fmt: skip
    if jobs > 1:
        cmd += ["-n", str(jobs), "--dist", "loadfile"]
    env = dict(os.environ, COURSE_SEED=str(seed), OMP_NUM_THREADS="1")
    subprocess.run(cmd, cwd=ROOT, env=env, check=False)
    if not report.is_file():
        raise SystemExit(f"claims: pytest wrote no report for COURSE_SEED={seed}")
    results: dict[str, list[str]] = defaultdict(list)
    for case in ET.parse(report).iter("testcase"):
        # nbval's classname is the page's path with dots: "book.ch01_core_concepts.md"
        page = case.get("classname", "?").rsplit(".", 2)[-2] + ".md"
        results.setdefault(page, [])
        if case.find("failure") is not None or case.find("error") is not None:
            results[page].append(case.get("name", "?"))
    return dict(results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="base seeds (default: 1 2 3)")
    parser.add_argument("--jobs", type=int, default=2, help="pytest-xdist workers (default: 2)")
    parser.add_argument("pages", nargs="*", default=["book/"], help="pages or folders (default: book/)")
    args = parser.parse_args()
    if any(s < 0 for s in args.seeds) or args.jobs < 1:
        parser.error(f"seeds must be >= 0 and jobs >= 1, got seeds={args.seeds}, jobs={args.jobs}")
    OUT.mkdir(parents=True, exist_ok=True)
    table = {seed: run_seed(seed, args.pages, args.jobs) for seed in args.seeds}
    pages = sorted({p for res in table.values() for p in res})
    lines = ["| page | " + " | ".join(f"COURSE_SEED={s}" for s in args.seeds) + " |",
             "|---|" + "---|" * len(args.seeds)]  # fmt: skip
    failed = False
    for page in pages:
        cells = []
        for seed in args.seeds:
            bad = table[seed].get(page)
            failed |= bad is None or bool(bad)
            cells.append("not run" if bad is None else ("pass" if not bad else "FAIL: " + ", ".join(bad)))
        lines.append(f"| {page} | " + " | ".join(cells) + " |")
    summary = "\n".join(lines) + "\n"
    (OUT / "summary.md").write_text(summary, encoding="utf-8")
    print(summary + f"claims: written to {OUT / 'summary.md'}")
    return 1 if failed or not pages else 0


if __name__ == "__main__":
    sys.exit(main())
