"""Sphinx extension: figures, tables, equations, exercises and theorems numbered by chapter.

Listed in ``_config.yml`` under ``sphinx: local_extensions`` (folder ``book/_ext/``).

The chapters type their own section numbers into their headings ("## 3.2 ..."), so the toctree
is not numbered (Sphinx would print every number twice). Without section numbers Sphinx counts
every enumerable kind across the whole book ("练习 54", "定理 18" in chapter 4). After Sphinx has
assigned those numbers (``env-get-updated``), this extension renumbers every kind per page and
puts the page's chapter in front:

* ``book/chNN_...``      -> NN       ("图 3.2", "练习 3.4", "定理 3.1", equation "(3.4)")
* ``book/appendix_...``  -> A, B, …  (in the order of the table of contents: "练习 D.1")
* any other page          -> no prefix ("图 1")

Every consumer of the numbers reads them from ``env.toc_fignumbers`` (captions, ``{numref}``,
``{eq}``, equation labels, sphinx-proof and sphinx-exercise titles and references, the
single-page HTML of ``make pdf``), so all of them follow.
"""

from __future__ import annotations

import re
import string
from typing import Any

CHAPTER_RE = re.compile(r"(?:^|/)ch(\d+)_")
APPENDIX_RE = re.compile(r"(?:^|/)appendix_")


def reading_order(env) -> list[str]:
    """Docnames in the order of the table of contents (depth first from the root page)."""
    order: list[str] = []
    seen: set[str] = set()

    def walk(docname: str) -> None:
        if docname in seen:
            return
        seen.add(docname)
        order.append(docname)
        for child in env.toctree_includes.get(docname, []):
            walk(child)

    walk(env.config.root_doc)
    return order


def chapter_prefixes(docnames: list[str]) -> dict[str, tuple]:
    """The number prefix of each page: ``(3,)`` for a chapter, ``("A",)`` for the first appendix."""
    prefixes: dict[str, tuple] = {}
    letters = iter(string.ascii_uppercase)
    for docname in docnames:
        if match := CHAPTER_RE.search(docname):
            prefixes[docname] = (int(match.group(1)),)
        elif APPENDIX_RE.search(docname):
            prefixes[docname] = (next(letters),)
        else:
            prefixes[docname] = ()
    return prefixes


def renumber(app, env) -> list[str]:
    prefixes = chapter_prefixes(reading_order(env))
    changed = []
    for docname, kinds in env.toc_fignumbers.items():
        prefix = prefixes.get(docname, ())
        for figtype, numbers in kinds.items():
            # the book-wide numbers are increasing in reading order: sort them to get page order
            ids = sorted(numbers, key=lambda node_id: numbers[node_id])
            kinds[figtype] = {node_id: (*prefix, i) for i, node_id in enumerate(ids, start=1)}
        changed.append(docname)
    return changed


def setup(app) -> dict[str, Any]:
    # after Sphinx's TocTreeCollector (priority 500) has assigned the book-wide numbers
    app.connect("env-get-updated", renumber, priority=900)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
