"""Sphinx extension: the run-time line under the title of every executed notebook page.

Listed in ``_config.yml`` under ``sphinx: local_extensions`` (folder ``book/_ext/``).

myst-nb keeps an execution record for every notebook it executes (or takes from its cache):
``env.nb_metadata[docname]["exec_data"]``, with the run time in seconds. Right after a page is
read, this extension puts one line under the page's title, in a ``page-runtime`` container
(styled by ``book/_static/book.css``, checked by ``tests/browser``)::

    本页在构建本书时完整运行了一遍：在 2 核 CPU 上用时 41.3 秒 ……

with the CPU count of the machine that built the book, a link to the preface's chapter/source
table (label ``chapter-sources``) and, for a chapter that has a coverage table labelled
``chNN-coverage``, a link to it. The line exists only in the HTML book: nothing in the page's
source, so the notebook a learner opens in Jupyter has no raw ``{glue}`` roles.

A page whose source still has its own ``page-runtime`` container keeps it (no second line).
"""

from __future__ import annotations

import os
import re
from typing import Any

from docutils import nodes
from sphinx import addnodes
from sphinx.util import logging

logger = logging.getLogger(__name__)

CLASS = "page-runtime"
SOURCES_LABEL = "chapter-sources"  # the preface's table: chapter <- source document


def build_cpus() -> int:
    """CPU cores this build (and the notebook kernels it starts) may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _ref(docname: str, target: str, text: str) -> addnodes.pending_xref:
    xref = addnodes.pending_xref(
        "", refdomain="std", reftype="ref", reftarget=target, refexplicit=True, refwarn=True, refdoc=docname
    )
    xref += nodes.inline(text, text, classes=["std", "std-ref"])
    return xref


def runtime_line(docname: str, seconds: float, cpus: int, coverage_label: str | None) -> nodes.container:
    para = nodes.paragraph()
    para += nodes.Text(
        f"本页在构建本书时完整运行了一遍：在 {cpus} 核 CPU 上从第一个单元格到最后一个单元格用时 "
        f"{seconds:.1f} 秒（每次构建重新测量，因机器而异）。各章与底本的对应关系见前言的"
    )
    para += _ref(docname, SOURCES_LABEL, "章节与原文对照表")
    if coverage_label:
        para += nodes.Text("，本章各节与原文各节的对应见")
        para += _ref(docname, coverage_label, "本章末尾的对照表")
    para += nodes.Text("。")
    return nodes.container("", para, classes=[CLASS])


def _coverage_label(docname: str, doctree: nodes.document) -> str | None:
    match = re.search(r"(?:^|/)(ch\d+)_", docname)
    label = f"{match.group(1)}-coverage" if match else None
    return label if label and label in doctree.ids else None


def add_runtime_line(app, doctree: nodes.document) -> None:
    env = app.env
    docname = env.docname
    record = getattr(env, "nb_metadata", {}).get(docname, {}).get("exec_data")
    if not record or record.get("runtime") is None:
        return  # not a notebook, or not executed in this build (execute_notebooks: off)
    if any(CLASS in node.get("classes", []) for node in doctree.findall(nodes.Element)):
        return  # the page writes its own line
    section = doctree.next_node(nodes.section)
    if section is None or not isinstance(section[0], nodes.title):
        logger.warning(f"{docname}: no page title to put the run-time line under", location=docname)
        return
    line = runtime_line(docname, float(record["runtime"]), build_cpus(), _coverage_label(docname, doctree))
    section.insert(1, line)


def setup(app) -> dict[str, Any]:
    app.connect("doctree-read", add_runtime_line)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
