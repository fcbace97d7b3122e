"""The built book in a real browser: every page of ``_toc.yml``, as a reader sees it.

Run with ``make browser`` (after ``make book``); ``make test`` runs it last. The pages are
discovered from ``_toc.yml``, never listed here, so the tests cover whatever the book
contains. A full-page screenshot of each page is saved in ``_build/screenshots/``.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest
import yaml
from bookbrowser import ROOT, SETTLE_JS, SHOT_DIR, Book, html_path, is_notebook_source
from playwright.sync_api import expect

SEARCH_TERM = "注意力"

# After MathJax has finished: every element that Sphinx marked as math must contain
# typeset output, and MathJax must have produced no error. Error nodes are looked up in
# the page and in MathJax's own MathML trees; the latter also finds undefined macros,
# which MathJax's "noundefined" extension shows as red text instead of an error node.
MATH_JS = r"""
() => {
  const short = (s) => s.replace(/\s+/g, " ").trim().slice(0, 120);
  const math = [...document.querySelectorAll(".math")];
  const untypeset = math.filter((el) => !el.querySelector("mjx-container")).map((el) => short(el.textContent));
  const errors = new Set([...document.querySelectorAll("mjx-merror, [data-mjx-error]")].map(
    (el) => short(el.getAttribute("data-mjx-error") || el.textContent)));
  const undefinedMacros = new Set();
  if (window.MathJax && MathJax.startup && MathJax.startup.document) {
    for (const item of MathJax.startup.document.math) {
      item.root.walkTree((node) => {
        if (node.isKind("merror")) errors.add("in " + short(item.math));
        if (node.isKind("mtext") && node.attributes.get("mathcolor") === "red")
          undefinedMacros.add(short(item.math));
      });
    }
  }
  // TeX that never reached MathJax (e.g. "$...$" that the parser did not recognise):
  // visible text outside code and math that still looks like TeX.
  const rawTex = [];
  const walker = document.createTreeWalker(document.querySelector("article") || document.body,
                                           NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n.parentElement.closest("pre, code, script, style, .math, mjx-container, .highlight")) continue;
    if (/\$[^$\n]*\\[A-Za-z]+|\\\(|\\\[|\$\$/.test(n.textContent)) rawTex.push(short(n.textContent));
  }
  return {
    mathElements: math.length,
    containers: document.querySelectorAll("mjx-container").length,
    version: window.MathJax && MathJax.version ? MathJax.version : null,
    untypeset, errors: [...errors], undefinedMacros: [...undefinedMacros], rawTex,
  };
}
"""

# Every <img> in the page's main content (figures, plots in cell outputs, images in
# collapsed solutions too): its final URL, whether it has finished, its natural size.
IMAGES_JS = """
() => [...document.querySelectorAll("article img")].map((img) => ({
  src: img.currentSrc || img.src, complete: img.complete,
  width: img.naturalWidth, height: img.naturalHeight,
}))
"""

# For each solution admonition: is it a toggle, how many parts has its body (everything
# but the title) and how many of them are visible, and the toggle button's aria-expanded.
SOLUTION_STATE_JS = """
(solutions) => solutions.map((el) => {
  const parts = [...el.children].filter((c) => !c.classList.contains("admonition-title"));
  const button = el.querySelector(":scope > .admonition-title button.toggle-button");
  return {
    id: el.id, toggle: el.classList.contains("toggle"), bodyParts: parts.length,
    visibleParts: parts.filter((c) => c.checkVisibility({ visibilityProperty: true })).length,
    expanded: button ? button.getAttribute("aria-expanded") : null,
  };
})
"""
# The links of the primary sidebar (the book's navigation), resolved to absolute URLs.
SIDEBAR_JS = """
() => [...document.querySelectorAll("nav.bd-docs-nav a")].map((a) => a.href)
"""
# Sections of a chapter sit in collapsed <details> in the sidebar: open them as a reader would.
OPEN_DETAILS_JS = """
(a) => { for (let d = a.closest("details"); d; d = d.parentElement.closest("details")) d.open = true; }
"""
SEARCH_RESULTS_JS = """
() => [...document.querySelectorAll("#search-results ul.search li > a")].map((a) => a.href)
"""
# The run-time line at the top of a notebook page (book/_ext/book_runtime.py).
RUNTIME_RE = re.compile(r"(\d+(\.\d+)?) 秒")


def _fmt(items) -> str:
    return "\n  ".join(str(i) for i in items)


# --------------------------------------------------------------------------- every page


def test_toc_pages_are_built(pages: list[str], html_dir: Path):
    missing = [p for p in pages if not html_path(p).is_file()]
    assert not missing, f"pages in _toc.yml without HTML in {html_dir}: {missing}"


def test_page_loads_cleanly(book: Book, docname: str):
    """HTTP 200, no console error, no uncaught exception, every request local and successful."""
    visit = book.visit(docname)
    assert visit.status == 200, f"{visit.url}: HTTP {visit.status}"
    problems = visit.traffic.problems()
    assert not problems, f"{docname}:\n  {_fmt(problems)}"
    title = visit.page.locator("article h1").first
    expect(title).to_be_visible()
    assert visit.screenshot.stat().st_size > 0


def test_math_typeset_offline(book: Book, docname: str):
    """MathJax (the bundled copy: only local requests are allowed) typesets every formula."""
    visit = book.visit(docname)
    info = visit.page.evaluate(MATH_JS)
    assert not info["rawTex"], f"{docname}: TeX outside math, never typeset:\n  {_fmt(info['rawTex'])}"
    if info["mathElements"] == 0:
        assert info["containers"] == 0
        return  # a page without math (MathJax is not even loaded)
    assert info["version"] and info["version"].startswith("3."), f"{docname}: MathJax not loaded"
    assert info["containers"] >= info["mathElements"]
    assert not info["untypeset"], f"{docname}: math left untypeset:\n  {_fmt(info['untypeset'])}"
    assert not info["errors"], f"{docname}: MathJax errors:\n  {_fmt(info['errors'])}"
    assert not info["undefinedMacros"], f"{docname}: undefined TeX macros in:\n  {_fmt(info['undefinedMacros'])}"


def test_images_load(book: Book, docname: str):
    """Every image of the page's content (figures, plots) has loaded with a non-zero size."""
    visit = book.visit(docname)
    images = visit.page.evaluate(IMAGES_JS)
    if not images:
        pytest.skip("no images on this page")
    broken = [img for img in images if not img["complete"] or img["width"] == 0 or img["height"] == 0]
    assert not broken, f"{docname}: images that did not load:\n  {_fmt(broken)}"


def test_optional_blocks_closed_on_load(book: Book, docname: str):
    """Every 选读 block (book/_ext/book_optional.py) is closed when the page loads: the main path
    is what a reader sees first."""
    visit = book.visit(docname)
    if not visit.optional_blocks:
        pytest.skip("no 选读 blocks on this page")
    assert visit.optional_closed_on_load == visit.optional_blocks, (
        f"{docname}: {visit.optional_blocks - visit.optional_closed_on_load} of {visit.optional_blocks} "
        "选读 blocks open on load"
    )


def test_solutions_collapsed_and_open_on_click(book: Book, docname: str):
    """Exercise solutions start collapsed; a click on the title shows one (another click hides it)."""
    visit = book.visit(docname)
    page = visit.page
    solutions = page.locator("article div.solution")
    count = solutions.count()
    if count == 0:
        pytest.skip("no solutions on this page")
    problems_before = visit.traffic.problems()
    states = solutions.evaluate_all(SOLUTION_STATE_JS)
    not_toggles = [s["id"] for s in states if not s["toggle"]]
    assert not not_toggles, (
        f"{docname}: solutions that cannot be collapsed (`:class: dropdown` missing?): {not_toggles}"
    )
    empty = [s["id"] for s in states if not s["bodyParts"]]
    assert not empty, f"{docname}: empty solutions: {empty}"
    shown = [s["id"] for s in states if s["visibleParts"]]
    assert not shown, f"{docname}: solutions visible before any click: {shown}"
    for i in range(count):
        solution = solutions.nth(i)
        title = solution.locator(":scope > .admonition-title")
        title.click()  # where a reader clicks; scrolls the title into view first
        state = solution.evaluate(f"(el) => ({SOLUTION_STATE_JS})([el])[0]")
        assert state["visibleParts"] == state["bodyParts"], f"{docname}: solution {state['id']} did not open: {state}"
        assert state["expanded"] == "true", f"{docname}: solution {state['id']}: aria-expanded is {state['expanded']}"
        if i == 0:  # the artifact shows an opened solution
            solution.screenshot(path=str(visit.screenshot.with_name(visit.screenshot.stem + "-solution.png")))
        # a second click closes it again: the page is left as a reader finds it for the next checks
        title.click()
        state = solution.evaluate(f"(el) => ({SOLUTION_STATE_JS})([el])[0]")
        assert state["visibleParts"] == 0, f"{docname}: solution {state['id']} did not close: {state}"
    new_problems = [p for p in visit.traffic.problems() if p not in problems_before]
    assert not new_problems, f"{docname}: clicking the solutions caused:\n  {_fmt(new_problems)}"


def test_download_button_offers_notebook(book: Book, docname: str):
    """Notebook pages offer their executed .ipynb (and the .md source) in the download menu."""
    visit = book.visit(docname)
    page = visit.page
    menu_button = page.locator(".dropdown-download-buttons > button")
    expect(menu_button).to_be_visible()
    menu_button.click()
    links = page.locator(".dropdown-download-buttons a[href]")
    expect(links.first).to_be_visible()
    hrefs = [links.nth(i).evaluate("a => a.href") for i in range(links.count())]
    page.keyboard.press("Escape")
    sources = [h for h in hrefs if h.endswith(".md")]
    assert sources, f"{docname}: no .md source in the download menu: {hrefs}"
    assert page.request.get(sources[0]).ok
    notebooks = [h for h in hrefs if h.endswith(".ipynb")]
    if not is_notebook_source(docname):
        assert not notebooks, f"{docname} is not a notebook but offers {notebooks}"
        pytest.skip("not a notebook page: no .ipynb to offer")
    assert notebooks, f"{docname}: the download menu offers no .ipynb: {hrefs}"
    response = page.request.get(notebooks[0])
    assert response.ok, f"{notebooks[0]}: HTTP {response.status}"
    nb = json.loads(response.body())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert nb["nbformat"] == 4 and code, f"{notebooks[0]} is not a notebook with code cells"
    assert any(c.get("outputs") for c in code), f"{notebooks[0]} has no outputs (not the executed notebook)"


def test_launch_buttons_open_the_page_on_binder(book: Book, docname: str):
    """Notebook pages offer Binder (JupyterLab, this page's file in the repository of
    _config.yml) and no Colab button (Colab cannot open the .md chapters)."""
    if not is_notebook_source(docname):
        pytest.skip("not a notebook page: no launch buttons")
    page = book.visit(docname).page
    hrefs = page.locator(".dropdown-launch-buttons a[href]").evaluate_all("(links) => links.map((a) => a.href)")
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    repo = urlsplit(config["repository"]["url"]).path.strip("/")  # owner/name
    branch = config["repository"].get("branch", "main")
    binder = f"{config['launch_buttons']['binderhub_url'].rstrip('/')}/v2/gh/{repo}/{branch}"
    expected = f"{binder}?urlpath=lab/tree/{docname}.md"
    assert expected in hrefs, f"{docname}: no Binder link {expected} in {hrefs}"
    assert not [h for h in hrefs if "colab" in h], f"{docname}: a Colab link cannot open a .md chapter: {hrefs}"


def test_notebook_page_states_its_run_time(book: Book, docname: str):
    """A page with code says at its top how long it took to run in this build (myst-nb's execution
    record, put under the title by book/_ext/book_runtime.py)."""
    if not is_notebook_source(docname):
        pytest.skip("no code on this page")
    page = book.visit(docname).page
    line = page.locator("article .page-runtime")
    assert line.count() == 1, (
        f"{docname}: {line.count()} run-time lines at the top of the page (book/_ext/book_runtime.py adds "
        "one to every executed notebook page; a page must not write its own `page-runtime` container)"
    )
    expect(line).to_be_visible()
    text = line.inner_text()
    assert RUNTIME_RE.search(text), f"{docname}: no measured time in {text!r}"
    # at the top: before the first section heading of the page
    first_h2 = page.locator("article h2").first
    if first_h2.count():
        assert line.bounding_box()["y"] < first_h2.bounding_box()["y"], f"{docname}: run-time line is not at the top"
    # a chapter (book/chNN_*, as in `make notebooks`) also links to the chapter/source
    # mapping of the preface; appendices have no source document
    if Path(docname).name.startswith("ch"):
        hrefs = line.locator("a[href]").evaluate_all("(links) => links.map((a) => a.href)")
        assert any(urlsplit(h).fragment == "chapter-sources" for h in hrefs), (
            f"{docname}: the run-time line does not link to the preface's chapter/source table "
            f"(label chapter-sources): {hrefs}"
        )


# --------------------------------------------------------------------------- the whole book


def test_sidebar_reaches_every_page(book: Book, pages: list[str]):
    """From the book's front door, the sidebar of each page leads to the next page, and every
    page's sidebar lists exactly the pages of the table of contents."""
    page, traffic = book.open_page()
    page.goto(book.server + "index.html")  # redirects to the root page
    page.wait_for_url(book.url(pages[0]))
    expected = set(pages)
    for target in pages[1:] + pages[:1]:
        current = book.docname_of(page.url)
        hrefs = page.evaluate(SIDEBAR_JS)
        listed = [book.docname_of(href) for href in hrefs]
        assert set(listed) == expected, (
            f"sidebar of {current}: missing {sorted(expected - set(listed))}, extra {sorted(set(listed) - expected)}"
        )
        link = page.locator("nav.bd-docs-nav a").nth(listed.index(target))
        link.evaluate(OPEN_DETAILS_JS)
        expect(link).to_be_visible()
        with page.expect_navigation(wait_until="domcontentloaded") as navigation:
            link.click()
        assert navigation.value.ok, f"{target}: HTTP {navigation.value.status}"
        assert book.docname_of(page.url) == target
        expect(page.locator("article h1").first).to_be_visible()
    # Leaving a page before it has finished loading aborts its pending requests: not a problem
    # here (every page's own loading is checked by test_page_loads_cleanly).
    problems = [p for p in traffic.problems() if "net::ERR_ABORTED" not in p]
    assert not problems, _fmt(problems)
    page.close()


def _article_text(docname: str) -> str:
    """The text of a built page's article (no navigation, scripts or styles)."""
    text = html_path(docname).read_text(encoding="utf-8")
    start = text.find('<article class="bd-article"')
    end = text.find("</article>", start)
    assert start >= 0 and end > start, f"no <article> in {html_path(docname)}"
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", text[start:end], flags=re.S | re.I)
    return html.unescape(re.sub(r"<[^>]+>", " ", body))


def test_search_chinese_term(book: Book, pages: list[str]):
    """Typing a Chinese term into the search box finds exactly the pages whose text contains it."""
    expected = {doc for doc in pages if SEARCH_TERM in _article_text(doc)}
    assert expected, f"no page contains {SEARCH_TERM!r}: nothing to search for"
    page, traffic = book.open_page()
    page.goto(book.url(pages[0]))
    # the search field of the header, as a reader uses it (it opens a search dialog)
    page.locator("button.search-button__button").first.click()
    field = page.locator("form.bd-search input[name=q]").first
    expect(field).to_be_visible()
    field.fill(SEARCH_TERM)
    field.press("Enter")
    page.wait_for_url(f"**/search.html?q={quote(SEARCH_TERM)}*")
    summary = page.locator("#search-results p.search-summary")
    expect(summary).not_to_be_empty()
    found = {book.docname_of(href) for href in page.evaluate(SEARCH_RESULTS_JS)}
    page.evaluate(SETTLE_JS)  # the result summaries are fetched pages
    page.screenshot(path=str(SHOT_DIR / "search.png"), full_page=True, animations="disabled")
    assert found == expected, (
        f"search for {SEARCH_TERM!r}: missing {sorted(expected - found)}, unexpected {sorted(found - expected)}"
    )
    problems = traffic.problems()
    assert not problems, _fmt(problems)
    page.close()
