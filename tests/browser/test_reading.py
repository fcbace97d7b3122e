"""Reading quality of the built book (issue 14): width on a laptop (1366 px) and a phone (390 px),
sharp and numbered figures, numbering by chapter, Chinese labels, one search field, readable
search snippets, solutions on paper; and (expected to fail until the chapters are rewritten) the
reading goals of the chapter issues 22-26, measured as scripts/page_metrics.py does.

Run with the other browser tests (``make browser``, after ``make book``).
"""

from __future__ import annotations

import re
import string
from pathlib import Path
from urllib.parse import quote

import pytest
from bookbrowser import METRIC_COLUMNS, MIN_FIGURES, SETTLE_JS, SHOT_DIR, Book, chapter_goal_failures, page_metrics

# --------------------------------------------------------------------------- page scripts

# The page's own horizontal overflow, and the elements of the article and its header that stick
# out of the right edge of the window without being inside a box that scrolls or clips (the
# outermost ones only). The sidebars are left out: on a phone they are drawers, placed off-screen
# until opened.
OVERFLOW_JS = """
() => {
  const vw = document.documentElement.clientWidth;
  const describe = (el) => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") +
    [...el.classList].slice(0, 3).map((c) => "." + c).join("") +
    ` "${el.textContent.replace(/\\s+/g, " ").trim().slice(0, 40)}"`;
  const inBox = (el) => {
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      if (["auto", "scroll", "hidden", "clip"].includes(getComputedStyle(p).overflowX)) return true;
    }
    return false;
  };
  const offenders = [];
  for (const el of document.querySelectorAll(".bd-header-article *, article *")) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.right <= vw + 1 || !el.checkVisibility()) continue;
    if (inBox(el) || offenders.some((o) => o.el.contains(el))) continue;
    offenders.push({ el, text: `${describe(el)} (right edge at ${Math.round(r.right)} px)` });
  }
  return { viewport: vw, scrollWidth: document.scrollingElement.scrollWidth,
           offenders: offenders.slice(0, 8).map((o) => o.text) };
}
"""

# Code blocks (inputs, listings, outputs; collapsed inputs opened for the measurement) whose
# text is wider than their box, i.e. that scroll sideways.
CODE_SCROLL_JS = """
() => {
  const closed = [...document.querySelectorAll("article details:not([open])")];
  closed.forEach((d) => { d.open = true; });
  const wide = [...document.querySelectorAll("article div.highlight pre, article .cell_output pre")]
    .filter((pre) => pre.clientWidth > 0 && pre.scrollWidth > pre.clientWidth + 1)
    .map((pre) => {
      const lines = pre.textContent.split("\\n");
      const longest = lines.reduce((a, b) => (b.length > a.length ? b : a), "");
      return `${pre.scrollWidth} px in a ${pre.clientWidth} px box: ${longest.trim().slice(0, 70)}`;
    });
  closed.forEach((d) => { d.open = false; });
  return wide;
}
"""

# Display formulas and tables: clipped (wider than a box that hides the rest) or spilling out of
# the text column. Scrolling inside their own box is fine, if that box stays in the column.
CLIPPED_JS = """
() => {
  const article = document.querySelector("article.bd-article");
  const col = article.getBoundingClientRect();
  const problems = [];
  const short = (el) => el.textContent.replace(/\\s+/g, " ").trim().slice(0, 60);
  const check = (el, kind) => {
    if (el.getBoundingClientRect().width === 0) return;
    for (let p = el; p && p !== article; p = p.parentElement) {
      const overflow = getComputedStyle(p).overflowX;
      if (overflow === "auto" || overflow === "scroll") {
        const r = p.getBoundingClientRect();
        if (r.right > col.right + 1 || r.left < col.left - 1)
          problems.push(`${kind} scrolls in a box wider than the text column: ${short(el)}`);
        return;
      }
      if ((overflow === "hidden" || overflow === "clip") && p.scrollWidth > p.clientWidth + 1) {
        problems.push(`${kind} clipped (${p.scrollWidth} px in ${p.clientWidth} px): ${short(el)}`);
        return;
      }
    }
    const r = el.getBoundingClientRect();
    if (r.right > col.right + 1 || r.left < col.left - 1)
      problems.push(`${kind} spills out of the text column: ${short(el)}`);
  };
  document.querySelectorAll("article mjx-container[display='true']").forEach(
    (el) => check(el.querySelector("mjx-math") || el, "display math"));
  document.querySelectorAll("article table").forEach((el) => check(el, "table"));
  document.querySelectorAll("article div.proof, article div.exercise, article div.solution, article div.theorem")
    .forEach((el) => check(el, "box"));
  return problems;
}
"""

# Images of the page's content: how they are stored and shown, and their caption.
FIGURES_JS = """
() => [...document.querySelectorAll("article img")].map((img) => {
  const figure = img.closest("figure");
  const number = figure ? figure.querySelector("figcaption .caption-number") : null;
  return {
    src: img.currentSrc || img.src, naturalWidth: img.naturalWidth, shownWidth: img.clientWidth,
    caption: number ? number.innerText.trim() : null,
  };
})
"""

NUMBERS_JS = """
() => ({
  labels: [...document.querySelectorAll("article .caption-number")].map((e) => e.innerText.trim()),
  equations: [...document.querySelectorAll("article span.eqno")].map((e) => e.innerText.trim()),
  exercises: [...document.querySelectorAll("article div.exercise > .admonition-title")].map(
    (e) => e.innerText.trim()),
  titles: [...document.querySelectorAll("article .admonition-title")].map((e) => e.innerText.trim()),
  proofs: [...document.querySelectorAll("article div.proof.admonition")].filter(
    (e) => !e.querySelector(":scope > .admonition-title")).map((e) => {
      const strong = e.querySelector("strong");
      return strong ? strong.innerText.trim() : e.innerText.trim().slice(0, 20);
    }),
})
"""

# Search entry points a reader can see: search fields and search buttons.
SEARCH_ENTRIES_JS = """
() => [...document.querySelectorAll(
  "input[type=search], input[name=q], button.search-button__button, button.search-button, .search-button-field"
)].filter((el) => el.checkVisibility({ visibilityProperty: true, opacityProperty: true }) &&
                  !el.closest(".search-button__wrapper:not(.show)") && el.getBoundingClientRect().width > 0)
  .map((el) => el.tagName.toLowerCase() + "." + [...el.classList].join("."))
"""

SOLUTION_VISIBILITY_JS = """
() => [...document.querySelectorAll("article div.solution")].map((el) => {
  const parts = [...el.children].filter((c) => !c.classList.contains("admonition-title"));
  return { id: el.id, parts: parts.length,
           visible: parts.filter((c) => c.checkVisibility({ visibilityProperty: true }) &&
                                        c.getBoundingClientRect().height > 0).length };
})
"""

SNIPPETS_LOADED_JS = """
() => [...document.querySelectorAll("#search-results ul.search > li")].every((li) => li.querySelector("p.context"))
"""

ENGLISH_CHROME = re.compile(r"\b(Proof|Solution|Exercise|Theorem|Definition|Lemma|Fig\.|Figure|Table)\b")
RAW_TEX = re.compile(r"\$|\\[A-Za-z]+|\\\(|\\\[")


# --------------------------------------------------------------------------- helpers


def _fmt(items) -> str:
    return "\n  ".join(str(i) for i in items)


def chapter_prefix(docname: str, pages: list[str]) -> str:
    """The number prefix of a page's figures/exercises/...: "3" for book/ch03_x, "A" for the first
    appendix of the table of contents, "" for other pages (book/_ext/book_numbering.py)."""
    name = Path(docname).name
    if match := re.match(r"ch(\d+)_", name):
        return str(int(match.group(1)))
    appendices = [p for p in pages if Path(p).name.startswith("appendix_")]
    if docname in appendices:
        return string.ascii_uppercase[appendices.index(docname)]
    return ""


def _number_re(prefix: str) -> str:
    return rf"{re.escape(prefix)}\.(\d+)" if prefix else r"(\d+)"


def _check_sequence(kind: str, numbers: list[int]) -> list[str]:
    return [] if numbers == list(range(1, len(numbers) + 1)) else [f"{kind} numbered {numbers}, not 1..{len(numbers)}"]


# --------------------------------------------------------------------------- width


@pytest.mark.parametrize("viewport", ["desktop", "phone"])
def test_no_horizontal_page_overflow(book: Book, phone_book: Book, docname: str, viewport: str):
    """The page is never wider than the window: header, sidebars, text, code, math, tables."""
    visit = (book if viewport == "desktop" else phone_book).visit(docname)
    info = visit.page.evaluate(OVERFLOW_JS)
    assert info["scrollWidth"] <= info["viewport"] + 1 and not info["offenders"], (
        f"{docname} at {info['viewport']} px is {info['scrollWidth']} px wide; sticking out:\n  "
        f"{_fmt(info['offenders'])}"
    )


def test_code_blocks_fit_on_desktop(book: Book, docname: str):
    """On a laptop no code block or cell output scrolls sideways (code <= 88 columns, outputs wrap)."""
    wide = book.visit(docname).page.evaluate(CODE_SCROLL_JS)
    assert not wide, f"{docname}: {len(wide)} code blocks scroll sideways:\n  {_fmt(wide)}"


@pytest.mark.parametrize("viewport", ["desktop", "phone"])
def test_math_tables_and_boxes_not_clipped(book: Book, phone_book: Book, docname: str, viewport: str):
    """Display math, tables and exercise/proof boxes fit the text column or scroll inside it."""
    visit = (book if viewport == "desktop" else phone_book).visit(docname)
    problems = visit.page.evaluate(CLIPPED_JS)
    assert not problems, f"{docname} ({viewport}): {len(problems)} clipped or spilling:\n  {_fmt(problems)}"


# --------------------------------------------------------------------------- figures


def test_figures_sharp(book: Book, docname: str):
    """Every figure is SVG, or a bitmap with at least 1.5x the pixels of its displayed width."""
    images = book.visit(docname).page.evaluate(FIGURES_JS)
    if not images:
        pytest.skip("no images on this page")
    blurry = [
        f"{img['src'].rsplit('/', 1)[-1]}: {img['naturalWidth']} px shown at {img['shownWidth']} px"
        for img in images
        if not re.search(r"\.svg(\?|$)|^data:image/svg", img["src"])
        and img["shownWidth"] > 0
        and img["naturalWidth"] < 1.5 * img["shownWidth"]
    ]
    assert not blurry, f"{docname}: {len(blurry)} blurry figures:\n  {_fmt(blurry)}"


def test_figures_numbered_by_chapter(book: Book, docname: str, pages: list[str]):
    """Every figure has a caption numbered by chapter ("图 3.2 …"), numbered 1, 2, … on the page."""
    images = book.visit(docname).page.evaluate(FIGURES_JS)
    if not images:
        pytest.skip("no images on this page")
    pattern = re.compile(rf"^图 {_number_re(chapter_prefix(docname, pages))}$")
    unnumbered = [img["src"].rsplit("/", 1)[-1] for img in images if not img["caption"]]
    assert not unnumbered, f"{docname}: {len(unnumbered)} figures without a numbered caption:\n  {_fmt(unnumbered)}"
    wrong = [img["caption"] for img in images if not pattern.match(img["caption"])]
    assert not wrong, f"{docname}: figure numbers not of the form {pattern.pattern}: {wrong}"
    numbers = sorted({int(pattern.match(img["caption"]).group(1)) for img in images})
    assert not _check_sequence("figures", numbers), f"{docname}: {_check_sequence('figures', numbers)}"


# --------------------------------------------------------------------------- numbering, labels


def test_numbered_by_chapter_with_chinese_labels(book: Book, docname: str, pages: list[str]):
    """Exercises, theorems, figures, tables and equations carry the page's chapter ("练习 3.2",
    "定理 3.1", "(3.4)"), counted 1, 2, … per kind; labels are Chinese (练习, 定理, 图, 证明, 解答)."""
    info = book.visit(docname).page.evaluate(NUMBERS_JS)
    prefix = chapter_prefix(docname, pages)
    number = _number_re(prefix)
    problems = []
    by_kind: dict[str, list[int]] = {}
    for label in info["labels"]:
        match = re.match(rf"^(\S+) {number}$", label)
        if not match:
            problems.append(f"label {label!r} is not '<kind> {prefix + '.' if prefix else ''}N'")
            continue
        by_kind.setdefault(match.group(1), []).append(int(match.group(2)))
    for kind, numbers in by_kind.items():
        if kind != "图":  # one figure may show several images; figures are checked above
            problems += _check_sequence(kind, numbers)
    equations = []
    for eqno in info["equations"]:
        match = re.match(rf"^\({number}\)$", eqno)
        if match:
            equations.append(int(match.group(1)))
        else:
            problems.append(f"equation number {eqno!r} is not '({prefix + '.' if prefix else ''}N)'")
    problems += _check_sequence("equations", equations)
    problems += [f"exercise title {t!r} has no number of this page" for t in info["exercises"]
                 if not re.match(rf"^练习 {number}\b", t)]  # fmt: skip
    problems += [f"English label in {t!r}" for t in info["titles"] if ENGLISH_CHROME.search(t)]
    problems += [f"proof labelled {p!r}, not 证明" for p in info["proofs"] if p != "证明"]
    assert not problems, f"{docname}:\n  {_fmt(problems)}"


# --------------------------------------------------------------------------- solutions on paper


def test_solutions_collapsed_on_screen_expanded_in_print(book: Book, docname: str):
    """Solutions start collapsed on screen; the print style (Ctrl+P, `make pdf`) shows them all."""
    # a fresh tab: other tests open solutions by clicking them
    page, _ = book.open_page()
    try:
        page.goto(book.url(docname), wait_until="load")
        screen = page.evaluate(SOLUTION_VISIBILITY_JS)
        page.emulate_media(media="print")
        printed = page.evaluate(SOLUTION_VISIBILITY_JS)
    finally:
        page.close()
    if not screen:
        pytest.skip("no solutions on this page")
    assert not [s["id"] for s in screen if s["visible"]], f"{docname}: solutions open on screen"
    hidden = [s["id"] for s in printed if s["visible"] < s["parts"]]
    assert not hidden, f"{docname}: solutions collapsed in print: {hidden}"


# --------------------------------------------------------------------------- search


@pytest.mark.parametrize("viewport", ["desktop", "phone"])
def test_one_search_field(book: Book, phone_book: Book, docname: str, viewport: str):
    """A reader sees one way to search (the header of the article), not two."""
    entries = (book if viewport == "desktop" else phone_book).visit(docname).page.evaluate(SEARCH_ENTRIES_JS)
    assert len(entries) == 1, f"{docname} ({viewport}): {len(entries)} search fields/buttons: {entries}"


@pytest.mark.parametrize("term", ["注意力", "缩放"])
def test_search_snippets_show_the_sentence(book: Book, pages: list[str], term: str):
    """Each result's snippet is readable text that holds the search term (not the page's table of
    contents), without raw TeX ($, \\frac, ...)."""
    page, traffic = book.open_page()
    page.goto(f"{book.server}search.html?q={quote(term)}", wait_until="load")
    results = page.locator("#search-results ul.search > li")
    page.wait_for_function("() => document.querySelector('#search-results p.search-summary')")
    page.evaluate(SETTLE_JS)
    page.wait_for_function(SNIPPETS_LOADED_JS)
    snippets = results.evaluate_all(
        "(lis) => lis.map((li) => [li.querySelector('a').href, li.querySelector('p.context').innerText])"
    )
    page.screenshot(path=str(SHOT_DIR / f"search-{term}.png"), full_page=True, animations="disabled")
    page.close()
    assert snippets, f"no results for {term!r}"
    without_term = [f"{book.docname_of(url)}: {text[:80]}" for url, text in snippets if term not in text]
    raw = [f"{book.docname_of(url)}: {text[:120]}" for url, text in snippets if RAW_TEX.search(text)]
    assert not without_term, f"snippets without {term!r}:\n  {_fmt(without_term)}"
    assert not raw, f"snippets with raw TeX:\n  {_fmt(raw)}"
    assert not traffic.problems(), _fmt(traffic.problems())


# --------------------------------------------------------------------------- attention explorers


def test_attention_explorers_are_drawn(book: Book, docname: str):
    """Every tc.explorer view on the page ran its script (tests/browser/test_explorer.py checks
    that choosing a head or a token redraws it)."""
    states = book.visit(docname).page.evaluate(
        "() => [...document.querySelectorAll('article .tc-explorer')].map((e) => ["
        "e.id, !!e.dataset.ready, e.querySelectorAll('.tcx-keys .tcx-key').length])"
    )
    if not states:
        pytest.skip("no attention explorer on this page")
    dead = [view_id for view_id, ready, keys in states if not ready or not keys]
    assert not dead, f"{docname}: attention explorers not drawn: {dead}"


# --------------------------------------------------------------------------- the chapter goals
# EXPECTED TO FAIL until the chapters are rewritten (issues 22-26): every chapter's main path, as
# measured by scripts/page_metrics.py (bookbrowser.page_metrics: every dropdown, solution, hidden
# input and 选读 block closed), meets the goals of its issue: <= 9,000 汉字, <= 250 visible code
# lines, <= 30 visible ✓ lines, no check code and no development note in view, at least 10/9/11/14/9
# figures (ch01..ch05). Measured on main (8489c97): every chapter misses several goals.


@pytest.mark.parametrize("chapter", sorted(MIN_FIGURES))
def test_chapter_meets_the_reading_goals(book: Book, pages: list[str], chapter: str):
    """The chapter goals of issues 22-26 (COURSE_GUIDE.md section 6): a main path of about an hour."""
    docname = next((p for p in pages if Path(p).name == chapter), None)
    if docname is None:
        pytest.skip(f"{chapter} is not in the table of contents")
    # a fresh tab: measuring closes every box of the page
    page, _ = book.open_page()
    try:
        page.goto(book.url(docname), wait_until="load")
        page.evaluate(SETTLE_JS)
        metrics = page_metrics(page)
    finally:
        page.close()
    failures = chapter_goal_failures(chapter, metrics)
    row = ", ".join(f"{title} {metrics[key]:,}" for key, title in METRIC_COLUMNS)
    assert not failures, f"{chapter} ({row}) misses its goals:\n  {_fmt(failures)}"
