"""Static checks of the book's pages: what a learner gets when opening them in Jupyter.

* Every jupytext page survives Jupyter's open-and-save round trip (MyST Markdown -> notebook ->
  MyST Markdown) byte for byte, so saving an unchanged chapter leaves no diff.
* Package code is shown with ``tc.show_source`` (a code cell, visible in Jupyter too), never with
  a ``literalinclude`` directive that only Sphinx can render.
* Prose carries no ``{glue}`` roles, which Jupyter shows as raw text.
* Code cells fit in 88 columns (wide characters count twice), so they never scroll sideways.
* Code never reaches outside the page with ``..`` paths: it runs from any working directory.
* Cells that the HTML hides (hidden inputs, code of closed solutions) are collapsed in JupyterLab
  too (``jupyter.source_hidden``, added by ``scripts/quiet_cells.py``), and jupytext keeps that flag.
* 选读 blocks (an ``{admonition}`` with ``:class: optional`` … ``% optional-end``) are closed, not
  nested, hold no heading.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from pathlib import Path

import jupytext
import pytest

BOOK = Path(__file__).resolve().parents[1] / "book"
PAGES = sorted(BOOK.glob("*.md"))
NOTEBOOKS = [p for p in PAGES if "kernelspec" in jupytext.read(p).metadata]
CHAPTERS = sorted(BOOK.glob("ch[0-9][0-9]_*.md"))
MAX_COLUMNS = 88


def _ids(paths):
    return [p.name for p in paths]


def _width(line: str) -> int:
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in line)


def test_pages_found():
    assert len(NOTEBOOKS) >= 5, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("page", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_round_trip_through_ipynb_is_byte_identical(page):
    text = page.read_text(encoding="utf-8")
    ipynb = jupytext.writes(jupytext.reads(text, fmt="md:myst"), fmt="ipynb")
    again = jupytext.writes(jupytext.reads(ipynb, fmt="ipynb"), fmt="md:myst")
    assert again == text, f"{page.name} is not in jupytext's canonical form; rewrite it with jupytext"


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_no_sphinx_only_constructs(page):
    text = page.read_text(encoding="utf-8")
    assert "literalinclude" not in text, "show package code with tc.show_source(obj) instead"
    glue = re.findall(r"\{glue(?::\w+)?\}`[^`]*`|```\{glue(?::\w+)?\}", text)
    assert not glue, f"glue renders as raw text in Jupyter: {glue[:3]}"


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_exercise_references_are_not_doubled(page):
    """An exercise's reference already renders as "练习 1.8": "练习 {ref}`…`" reads "练习 练习 1.8"."""
    text = page.read_text(encoding="utf-8")
    doubled = re.findall(r"练习\s*\{(?:ref|numref)\}`[^`<]*-ex-[^`<]*`", text)
    assert not doubled, f"drop the word 练习 before these references: {doubled[:3]}"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=_ids(CHAPTERS))
def test_checker_calls_name_the_exercise_they_sit_in(chapter):
    """``exercise="N.k"`` inside the k-th exercise of chapter N (up to the next one): the
    number the checker prints and records is the number the book renders."""
    text = chapter.read_text(encoding="utf-8")
    number = int(re.match(r"ch(\d+)_", chapter.name).group(1))
    starts = [m.start() for m in re.finditer(r"^```\{exercise(?:-start)?\}", text, re.M)]
    wrong = []
    for k, start in enumerate(starts, 1):
        end = starts[k] if k < len(starts) else len(text)
        for m in re.finditer(r'exercise="(\d+)\.(\d+)"', text[start:end]):
            if (int(m.group(1)), int(m.group(2))) != (number, k):
                wrong.append(f"{m.group(0)} in exercise {number}.{k}")
    before = re.findall(r'exercise="[\d.]+"', text[: starts[0]] if starts else text)
    assert not wrong and not before, f"renumber: {wrong + before}"


@pytest.mark.parametrize("page", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_code_cells_fit_the_page(page):
    wide = []
    for i, cell in enumerate(jupytext.read(page).cells):
        if cell.cell_type != "code":
            continue
        for line in cell.source.splitlines():
            if _width(line) > MAX_COLUMNS:
                wide.append(f"cell {i}: {line[:60]}...")
    assert not wide, f"{len(wide)} code lines wider than {MAX_COLUMNS} columns: {wide[:5]}"


@pytest.mark.parametrize("page", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_code_runs_from_any_directory(page):
    bad = []
    for i, cell in enumerate(jupytext.read(page).cells):
        if cell.cell_type == "code" and re.search(r"""["']\.\.(/|["'])""", cell.source):
            bad.append(i)
    assert not bad, f"cells {bad} use '..' paths; find package files with importlib.resources"


CORRECTION_BOX = re.compile(r"^(?:\((ch\d\d-errata-[\w-]+)\)=\n+)?[`:]{3,}\{admonition\} (勘误|常见误解|注)", re.M)


def _main_path(text: str) -> str:
    """The page without its 选读 blocks (``:class: optional`` ... ``% optional-end``)."""
    return re.sub(r"^[`:]{3,}\{admonition\} 选读.*?^% optional-end$", "", text, flags=re.M | re.S)


@pytest.mark.parametrize("chapter", range(1, 6))
def test_errata_live_in_the_appendix_and_at_most_three_boxes_on_the_main_path(chapter):
    """The main path keeps at most three correction boxes (勘误, 常见误解 or 注); each 勘误/常见误解
    box has a (chNN-errata-...)= label listed in the errata appendix, and every label the appendix
    lists for the chapter is defined in it (a one-line pointer keeps the label of a moved entry)."""
    (page,) = BOOK.glob(f"ch{chapter:02d}_*.md")
    text = page.read_text(encoding="utf-8")
    on_main_path = CORRECTION_BOX.findall(_main_path(text))
    assert len(on_main_path) <= 3, (
        f"{len(on_main_path)} correction boxes on the main path: move the rest to the appendix"
    )
    boxes = CORRECTION_BOX.findall(text)
    unlabeled = [kind for label, kind in boxes if kind != "注" and not label]
    assert not unlabeled, "every 勘误/常见误解 box needs a (chNN-errata-...)= label"
    appendix = (BOOK / "appendix_errata.md").read_text(encoding="utf-8")
    section = appendix.split(f"### 第 {chapter} 章", 1)[1].split("###", 1)[0]
    listed = set(re.findall(r"<(ch\d\d-errata-[\w-]+)>", section))
    defined = set(re.findall(r"^\((ch\d\d-errata-[\w-]+)\)=", text, flags=re.M))
    assert {label for label, kind in boxes if label} <= listed, "a correction box is missing from the appendix"
    assert listed <= defined, f"the appendix lists labels the chapter lacks: {sorted(listed - defined)}"


# --------------------------------------------------------------------------- quiet checks in Jupyter
# scripts/quiet_cells.py: a cell that the HTML hides (hide-input, remove-input, ...) carries the
# metadata that makes JupyterLab collapse it (jupyter.source_hidden: true).
sys.path.insert(0, str(BOOK.parent / "scripts"))
import quiet_cells  # noqa: E402

HIDDEN_CELL_WITHOUT_FLAG = """\
---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
    format_version: 0.13
    jupytext_version: 1.19.6
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

# 标题

```{code-cell} ipython3
x = 1
```

```{code-cell} ipython3
:tags: [hide-input]

assert x == 1
```
"""


@pytest.mark.parametrize("page", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_hidden_cells_are_collapsed_in_jupyterlab(page):
    """Every hide-input/remove-input cell has jupyter.source_hidden (run scripts/quiet_cells.py)."""
    lacking = quiet_cells.problems(page)
    assert not lacking, (
        f"{len(lacking)} hidden cells would be expanded in JupyterLab; "
        f"run `python scripts/quiet_cells.py {page.relative_to(BOOK.parent)}`:\n" + "\n".join(lacking[:5])
    )


def test_quiet_cells_adds_the_flag_and_jupytext_keeps_it(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(HIDDEN_CELL_WITHOUT_FLAG, encoding="utf-8")
    assert len(quiet_cells.problems(page)) == 1  # the check sees the missing flag
    assert quiet_cells.quiet(page) == 1
    text = page.read_text(encoding="utf-8")
    assert "jupyter:\n  source_hidden: true\ntags: [hide-input]" in text
    assert quiet_cells.problems(page) == []
    assert quiet_cells.quiet(page) == 0  # idempotent
    # what JupyterLab's jupytext does when it opens and saves the page: md -> notebook -> md
    notebook = jupytext.reads(text, fmt="md:myst")
    assert notebook.cells[-1].metadata["jupyter"] == {"source_hidden": True}
    ipynb = jupytext.writes(notebook, fmt="ipynb")
    assert jupytext.reads(ipynb, fmt="ipynb").cells[-1].metadata["jupyter"] == {"source_hidden": True}
    assert jupytext.writes(jupytext.reads(ipynb, fmt="ipynb"), fmt="md:myst") == text
    # the unhidden cell is left alone
    assert "jupyter" not in notebook.cells[-2].metadata


def test_quiet_cells_collapses_closed_solutions(tmp_path):
    """Code of a dropdown solution is collapsed (source and outputs); an open solution is not."""
    page = tmp_path / "page.md"
    body = (
        "\n```{solution-start} ex-1\n:class: dropdown\n```\n\n解答。\n\n"
        "```{code-cell} ipython3\nsolution = 1\n```\n\n```{solution-end}\n```\n\n"
        "```{code-cell} ipython3\nafter = 2\n```\n\n```{solution-start} ex-2\n```\n\n"
        "```{code-cell} ipython3\nopen_solution = 3\n```\n\n```{solution-end}\n```\n"
    )
    page.write_text(HIDDEN_CELL_WITHOUT_FLAG + body, encoding="utf-8")
    assert len(quiet_cells.problems(page)) == 2  # the hide-input cell and the closed solution's cell
    assert quiet_cells.quiet(page) == 2
    cells = [c for c in jupytext.read(page).cells if c.cell_type == "code"]
    flags = [c.metadata.get("jupyter", {}) for c in cells]
    assert flags == [{}, {"source_hidden": True}, {"source_hidden": True, "outputs_hidden": True}, {}, {}]


# --------------------------------------------------------------------------- 选读 blocks
# book/_ext/book_optional.py gathers the cells from a ```{admonition} 选读：…``` with
# ":class: optional" to the comment line "% optional-end"; a heading in between, a missing end or
# a nested start fails the build. The same rules, read from the source with line numbers, and no
# {optional-start}/{optional-end} directives (JupyterLab shows them as unknown directives).
# JupyterLab shows the comment as nothing, so a visible line right before it tells the reader
# there where the deep dive ends (in the HTML it closes the folded block).
OPTIONAL_END_MARK = "*（选读结束）*"
OPTIONAL_RE = re.compile(
    r"^```\{admonition\}(?P<title>.*)\n(?P<options>(?::\w+:.*\n)*)"
    r"|^% optional-end[ \t]*$|^(?P<heading>#{1,6}) |^```\{(?P<retired>optional-(?:start|end))\}",
    re.M,
)
CODE_CELL_RE = re.compile(r"^```\{code-cell\}.*?^```[ \t]*$", re.M | re.S)


def _without_code_cells(text: str) -> str:
    """``text`` with the body of every code cell blanked (line numbers kept): a ``# comment``
    in code is no heading."""
    return CODE_CELL_RE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_optional_blocks_are_well_formed(page):
    text = _without_code_cells(page.read_text(encoding="utf-8"))
    open_at = None
    for m in OPTIONAL_RE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        assert not m.group("retired"), f"line {line}: {{{m.group('retired')}}} is retired (book_optional.py)"
        if m.group("title") is not None:
            if not re.search(r"^:class:.*\boptional\b", m.group("options"), re.M):
                continue  # an ordinary admonition
            assert open_at is None, f"line {line}: 选读 block inside the block of line {open_at}"
            assert m.group("title").strip().startswith("选读"), f"line {line}: the title starts with 选读"
            open_at = line
        elif m.group("heading"):
            assert open_at is None, f"line {line}: heading inside the 选读 block of line {open_at}"
        else:
            assert open_at is not None, f"line {line}: '% optional-end' without a 选读 block"
            assert text[: m.start()].rstrip().endswith(OPTIONAL_END_MARK), (
                f"line {line}: write {OPTIONAL_END_MARK} on the line before '% optional-end'"
            )
            open_at = None
    assert open_at is None, f"line {open_at}: 选读 block without '% optional-end'"


def test_optional_block_rules_catch_mistakes(tmp_path):
    good = (
        "```{admonition} 选读：标题\n:class: optional\n:name: x\n\n导语。\n```\n\n正文。\n\n"
        f"{OPTIONAL_END_MARK}\n\n% optional-end\n"
    )
    bad = {
        "no end": good.replace("% optional-end\n", ""),
        "no visible end": good.replace(OPTIONAL_END_MARK, ""),
        "heading inside": good.replace("正文。", "## 小节"),
        "title": good.replace("选读：标题", "标题"),
        "retired": "```{optional-start} 选读：标题\n```\n",
    }
    page = tmp_path / "page.md"
    commented = good.replace("正文。", "```{code-cell} ipython3\n# 代码里的注释不是标题\nx = 1\n```")
    for text in (good, commented):
        page.write_text(text, encoding="utf-8")
        test_optional_blocks_are_well_formed(page)
    for name, text in bad.items():
        page.write_text(text, encoding="utf-8")
        with pytest.raises(AssertionError):
            test_optional_blocks_are_well_formed(page)
        print("caught:", name)


def _sphinx_build(tmp_path, text: str) -> tuple[str, str]:
    """Build one MyST page with book/_ext/book_optional.py; returns (HTML of the page, warnings)."""
    import io

    from sphinx.application import Sphinx

    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(BOOK / '_ext')!r})\nextensions = ['myst_parser', 'book_optional']\n",
        encoding="utf-8",
    )
    (src / "index.md").write_text(text, encoding="utf-8")
    warnings = io.StringIO()
    app = Sphinx(
        str(src), str(src), str(tmp_path / "html"), str(tmp_path / "doctrees"), "html",
        status=None, warning=warnings, freshenv=True,
    )  # fmt: skip
    app.build()
    return (tmp_path / "html" / "index.html").read_text(encoding="utf-8"), warnings.getvalue()


def test_optional_block_html(tmp_path):
    page = (
        "# 标题\n\n## 一节\n\n见{ref}`opt-demo`。\n\n"
        "```{admonition} 选读：更深的推导\n:class: optional\n:name: opt-demo\n\n一句导语。\n```\n\n"
        "选读正文。\n\n```python\nx = 1\n```\n\n% optional-end\n\n主线继续。\n"
    )
    html, warnings = _sphinx_build(tmp_path, page)
    assert not warnings.strip(), warnings
    start = html.index('<details class="optional" id="opt-demo">')
    block = html[start : html.index("</details>", start)]
    assert '<span class="optional-title">选读：更深的推导</span>' in block
    assert '<div class="optional-lead"><p>一句导语。</p>' in block
    assert "选读正文。" in block and "x" in block and "主线继续" not in block
    assert '<a class="reference internal" href="#opt-demo"><span class="std std-ref">选读：更深的推导</span>' in html
    assert "optional-end" not in html


@pytest.mark.parametrize(
    ("page", "warning"),
    [
        ("```{admonition} 选读：甲\n:class: optional\n\n导语。\n```\n\n正文。\n", "has no '% optional-end'"),
        ("```{admonition} 选读：甲\n:class: optional\n\n导语。\n```\n\n## 小节\n\n% optional-end\n", "no '% optional"),
        ("正文。\n\n% optional-end\n", "without a 选读 block"),
        ("```{admonition} 甲\n:class: optional\n\n导语。\n```\n\n% optional-end\n", "starts with 选读"),
        ("```{optional-start} 选读：甲\n```\n", "is retired"),
    ],
)
def test_optional_block_mistakes_warn(tmp_path, page, warning):
    _, warnings = _sphinx_build(tmp_path, "# 标题\n\n## 一节\n\n" + page)
    assert warning in warnings, warnings


sys.path.insert(0, str(BOOK.parent / "scripts"))
import study_time  # noqa: E402


@pytest.mark.parametrize("page", CHAPTERS, ids=_ids(CHAPTERS))
def test_study_time_is_stated_as_computed_and_the_main_path_reads_in_an_hour(page):
    """The prose reads in an hour; prose, code and figures together take at most 80 minutes."""
    study = study_time.measure(page)
    lines = page.read_text(encoding="utf-8").splitlines()
    assert study.line() in lines, (
        f"the {study_time.LINE_PREFIX} line of the 本章导读 is missing or stale: "
        f"python scripts/study_time.py --write {page.relative_to(BOOK.parent)}"
    )
    assert not study.unmarked, f"exercises without a ★ difficulty mark: {study.unmarked}"
    assert study.reading_min <= study_time.READING_LIMIT_MIN, (
        f"main-path prose {study.reading_min} min > {study_time.READING_LIMIT_MIN}: "
        "move proofs, measurements and history into 选读 blocks"
    )
    assert study.main_min <= study_time.MAIN_PATH_LIMIT_MIN, (
        f"main path {study.main_min} min (prose {study.reading_min} + code and "
        f"{study.figures} figures {study.code_min}) > {study_time.MAIN_PATH_LIMIT_MIN}: "
        "move proofs, measurements and history into 选读 blocks"
    )


def test_study_time_counts_what_a_reader_meets(tmp_path):
    page = tmp_path / "ch99_x.md"
    page.write_text(
        "\n".join(
            [
                "# 标题",
                f"{study_time.LINE_PREFIX}：旧",
                "注意力" * 100,
                "$$",
                "x = 1",
                "$$",
                "```{code-cell} ipython3",
                "a = 1",
                "",
                "b = 2",
                "```",
                "```{code-cell} ipython3",
                "---",
                "tags: [hide-input]",
                "---",
                "assert a == 1",
                "```",
                "```{admonition} 选读：细节",
                ":class: optional",
                "```",
                "选读里的字不计" * 50,
                "% optional-end",
                "```{exercise-start} （必做）★★ 写一个函数",
                "```",
                "练习的字不计" * 50,
                "```{exercise-end}",
                "```",
                "```{code-cell} ipython3",
                "def my_f(): pass",
                "```",
                "```{solution-start} ex",
                "```",
                "```{solution-end}",
                "```",
                "```{exercise} ★ 预测",
                "题目",
                "```",
            ]
        ),
        encoding="utf-8",
    )
    study = study_time.measure(page)
    assert (study.chars, study.code_lines, study.equations) == (300 + 2, 2, 1)
    assert study.exercises == {1: 1, 2: 1, 3: 0} and study.exercise_min == 5 + 15
    assert study.core == {1: 0, 2: 1, 3: 0} and study.core_min == 15  # the （必做） one
    assert "练习约 0.3 小时（其中必做 1 道约 15 分钟；★ 1 道、★★ 1 道）" in study.line()
    assert study.reading_min == 5  # 302/150 + 1 = 3.0 min of prose and equations, rounded up to 5
    assert study.code_min == 5  # 2/4 = 0.5 min of code, rounded up to 5
    assert "主线约 10 分钟（读正文约 5 分钟，读代码、运行、看结果约 5 分钟）" in study.line()


def test_study_time_counts_the_code_a_cell_prints(tmp_path):
    page = tmp_path / "ch99_y.md"
    fence = "```"
    page.write_text(
        f"{fence}{{code-cell}} ipython3\n---\ntags: [hide-input]\n---\n"
        f"def helper(x):\n    y = x + 1\n\n    return y\n{fence}\n"
        f"{fence}{{code-cell}} ipython3\n---\ntags: [remove-input]\n---\nCode(inspect.getsource(helper))\n{fence}\n"
        f"{fence}{{code-cell}} ipython3\n---\ntags: [remove-input]\n---\ntc.show_source(tc.causal_mask)\n{fence}\n",
        encoding="utf-8",
    )
    import inspect

    import transformer_course as tc

    printed = len(inspect.getsource(tc.causal_mask).strip().splitlines())
    assert study_time.measure(page).code_lines == 3 + printed


def test_study_time_counts_the_figures_of_the_main_path(tmp_path):
    page = tmp_path / "ch99_z.md"
    fence = "```"
    page.write_text(
        f"{fence}{{code-cell}} ipython3\n---\ntags: [hide-input]\n---\n"
        f"plt.plot([1, 2])\nplt.show()\nfig = d.draw(width=6)\nplt.show()\n{fence}\n"
        f"{fence}{{code-cell}} ipython3\nd.draw()\n{fence}\n"
        f"{fence}{{code-cell}} ipython3\n---\ntags: [remove-cell]\n---\nplt.show()\n{fence}\n"
        f"{fence}{{admonition}} 选读：细节\n:class: optional\n\n说明\n{fence}\n\n"
        f"{fence}{{code-cell}} ipython3\nplt.show()\n{fence}\n\n*（选读结束）*\n\n% optional-end\n",
        encoding="utf-8",
    )
    study = study_time.measure(page)
    # the hidden cell's plot and diagram (drawn, then shown: one figure) and the visible
    # cell's diagram; not the removed cell, not the 选读
    assert study.figures == 3
    assert study.code_min == 5  # 1 line of visible code and 3 figures, rounded up to 5
    assert "，含 3 幅图）" in study.line()
