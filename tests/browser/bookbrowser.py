"""Helpers of the browser tests: the book's pages (from ``_toc.yml``) and a browser tab
that may only talk to the local server and records every problem it sees.

Environment variables: ``BOOK_HTML`` (the built book, default ``_build/html``),
``BOOK_TOC`` (the table of contents it was built from, default ``_toc.yml``),
``BOOK_SCREENSHOTS`` (default ``_build/screenshots``), ``CHROMIUM`` (the browser,
default ``chromium`` on ``PATH``, i.e. Debian's ``/usr/bin/chromium``).
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urldefrag, urlsplit

import yaml

ROOT = Path(__file__).resolve().parents[2]
HTML_DIR = Path(os.environ.get("BOOK_HTML", ROOT / "_build" / "html")).resolve()
TOC = Path(os.environ.get("BOOK_TOC", ROOT / "_toc.yml")).resolve()
SHOT_DIR = Path(os.environ.get("BOOK_SCREENSHOTS", ROOT / "_build" / "screenshots")).resolve()

# The flags that work for headless Chromium here (COURSE_GUIDE.md, section 5).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--disable-dev-shm-usage",
]
# A desktop window: the book navigation (primary sidebar) and the section navigation
# (secondary sidebar) are both shown at this width.
VIEWPORT = {"width": 1366, "height": 900}
# A phone (the width of a common 6.1" phone in CSS pixels): the sidebars become drawers.
PHONE_VIEWPORT = {"width": 390, "height": 844}
TIMEOUT_MS = 60_000  # generous: CI machines are small and may be busy


# --------------------------------------------------------------------------- the book's pages


def _toc_files(entries: list[dict] | None) -> Iterator[str]:
    for entry in entries or []:
        if "file" in entry:
            yield entry["file"]
        yield from _toc_files(entry.get("sections"))
        yield from _toc_files(entry.get("chapters"))


def toc_pages() -> list[str]:
    """Docnames of every page in ``_toc.yml`` (jb-book format), in reading order."""
    toc = yaml.safe_load(TOC.read_text(encoding="utf-8"))
    files = [toc["root"], *_toc_files(toc.get("chapters")), *_toc_files(toc.get("sections"))]
    for part in toc.get("parts") or []:
        files += _toc_files(part.get("chapters"))
    # "book/intro.md" and "book/intro" name the same page
    pages = [f[: -len(Path(f).suffix)] if Path(f).suffix in {".md", ".ipynb"} else f for f in files]
    assert len(pages) == len(set(pages)), f"a page is listed twice in {TOC}: {pages}"
    return pages


def html_path(docname: str) -> Path:
    return HTML_DIR / f"{docname}.html"


def is_notebook_source(docname: str) -> bool:
    """True if the page's source is a notebook: an .ipynb, or a jupytext .md with a kernelspec."""
    if (ROOT / f"{docname}.ipynb").exists():
        return True
    source = ROOT / f"{docname}.md"
    text = source.read_text(encoding="utf-8") if source.exists() else ""
    if not text.startswith("---"):
        return False
    try:
        meta = yaml.safe_load(text[3:].split("\n---", 1)[0])
    except yaml.YAMLError:
        return False
    return isinstance(meta, dict) and "kernelspec" in meta


def screenshot_path(pages: list[str], docname: str, suffix: str = "") -> Path:
    """``_build/screenshots/NN-book-name{suffix}.png``, numbered in reading order."""
    return SHOT_DIR / f"{pages.index(docname):02d}-{docname.replace('/', '-')}{suffix}.png"


# --------------------------------------------------------------------------- a watched tab


@dataclass
class Traffic:
    """What one tab did on the network and in its console."""

    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        return (
            [f"console error: {m}" for m in self.console_errors]
            + [f"uncaught exception: {m}" for m in self.page_errors]
            + [f"failed request: {m}" for m in self.failed]
            + [f"non-local request (blocked): {m}" for m in self.blocked]
        )


def is_local(url: str, base: str) -> bool:
    return url.startswith(base) or urlsplit(url).scheme in {"data", "blob", "about"}


def open_page(context, base: str):
    """A new tab that may only load from ``base``; returns ``(page, traffic)``.

    Console errors, uncaught exceptions, failed requests (network errors and HTTP
    status >= 400) and non-local requests (blocked, never sent) go into ``traffic``.
    """
    page = context.new_page()
    traffic = Traffic()

    def on_console(msg):
        if msg.type == "error":
            traffic.console_errors.append(f"{msg.text} ({msg.location.get('url', '')})")

    def on_request_failed(request):
        if is_local(request.url, base):  # the non-local ones are reported as blocked
            traffic.failed.append(f"{request.url}: {request.failure}")

    def on_response(response):
        if response.status >= 400:
            traffic.failed.append(f"{response.url}: HTTP {response.status}")

    def route(route):
        if is_local(route.request.url, base):
            route.continue_()
        else:
            traffic.blocked.append(route.request.url)
            route.abort("blockedbyclient")

    page.on("console", on_console)
    page.on("pageerror", lambda exc: traffic.page_errors.append(str(exc)))
    page.on("requestfailed", on_request_failed)
    page.on("response", on_response)
    page.route("**/*", route)
    return page, traffic


# Run after "load": wait until MathJax (where the page loads it) has typeset everything,
# every image has finished (loaded or failed), the fonts are ready and no resource has
# finished loading for half a second. (Playwright's "networkidle" is not used: with
# pytest's fd capture it never fires on long pages here, although nothing is pending.)
SETTLE_JS = """
async () => {
  if (document.querySelector('script[src*="mathjax"]')) {
    const t0 = Date.now();
    while (!(window.MathJax && MathJax.startup && MathJax.startup.promise)) {
      if (Date.now() - t0 > 30000) throw new Error("MathJax did not start within 30 s");
      await new Promise((r) => setTimeout(r, 50));
    }
    await MathJax.startup.promise;
  }
  await Promise.all([...document.images].map((img) => img.complete ? null :
    new Promise((r) => { img.addEventListener("load", r); img.addEventListener("error", r); })));
  await document.fonts.ready;
  for (let n = -1; n !== performance.getEntriesByType("resource").length; ) {
    n = performance.getEntriesByType("resource").length;
    await new Promise((r) => setTimeout(r, 500));
  }
  return true;
}
"""


# Opens every 选读 block (book/_ext/book_optional.py: <details class="optional">); returns
# [blocks, blocks that were closed].
OPEN_OPTIONAL_JS = """
() => {
  const blocks = [...document.querySelectorAll("details.optional")];
  const closed = blocks.filter((d) => !d.open).length;
  blocks.forEach((d) => { d.open = true; });
  return [blocks.length, closed];
}
"""


@dataclass
class Visit:
    docname: str
    url: str
    page: object  # the Playwright Page, kept open for the checks that interact with it
    traffic: Traffic
    status: int | None
    screenshot: Path
    # 选读 blocks on the page, and how many of them were closed when it loaded
    optional_blocks: int = 0
    optional_closed_on_load: int = 0


class Book:
    """The built book in the browser. ``visit`` loads a page and keeps it open for the
    following checks; only the latest page stays open (pytest runs the tests of one page
    together, see ``pytest_generate_tests``), so a long book does not pile up tabs."""

    def __init__(self, context, server: str, pages: list[str], shot_suffix: str = ""):
        self.context = context
        self.server = server
        self.pages = pages
        self.shot_suffix = shot_suffix  # "-phone": the screenshots of the phone viewport
        self._visit: Visit | None = None

    def url(self, docname: str) -> str:
        return f"{self.server}{docname}.html"

    def docname_of(self, url: str) -> str | None:
        """The docname of a page URL of this server (fragment and query dropped)."""
        url = urldefrag(url).url.split("?", 1)[0]
        if not url.startswith(self.server) or not url.endswith(".html"):
            return None
        return url[len(self.server) : -len(".html")]

    def open_page(self):
        return open_page(self.context, self.server)

    def _load(self, docname: str, attempts: int = 3):
        """Open a fresh tab on the page and wait until it has settled (SETTLE_JS); a load that a
        busy machine let time out is tried again in a new tab (the old tab's records go with it)."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        for attempt in range(1, attempts + 1):
            page, traffic = self.open_page()
            try:
                response = page.goto(self.url(docname), wait_until="load")
                page.evaluate(SETTLE_JS)
                return page, traffic, response
            except PlaywrightTimeout:
                page.close()
                if attempt == attempts:
                    raise
                print(f"{docname}: load timed out (attempt {attempt}); trying again")

    def visit(self, docname: str) -> Visit:
        """Load a page, wait until it has settled, save its full-page screenshot."""
        if self._visit is None or self._visit.docname != docname:
            if self._visit is not None:
                self._visit.page.close()
            page, traffic, response = self._load(docname)
            shot = screenshot_path(self.pages, docname, self.shot_suffix)
            page.screenshot(path=str(shot), full_page=True, animations="disabled")
            # The screenshot shows the page as read (选读 blocks closed); the checks that follow
            # look at every figure, number, solution and code block, those of the 选读 blocks too.
            blocks, closed = page.evaluate(OPEN_OPTIONAL_JS)
            self._visit = Visit(
                docname=docname,
                url=page.url,
                page=page,
                traffic=traffic,
                status=response.status if response else None,
                screenshot=shot,
                optional_blocks=blocks,
                optional_closed_on_load=closed,
            )
        return self._visit


# --------------------------------------------------------------------------- local server, browser


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # the base class's signature
        pass


@contextmanager
def serve(directory: Path) -> Iterator[str]:
    """Serve ``directory`` on 127.0.0.1 (a free port); yields the base URL, ending in '/'."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, name="book-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def chromium_executable() -> str | None:
    """The system Chromium: ``$CHROMIUM``, else ``chromium``/``chromium-browser`` on ``PATH``."""
    return os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


CHROMIUM_MISSING = (
    "Chromium not found: install the Debian package `chromium` (scripts/install_browser_deps.sh does) "
    "or set CHROMIUM=/path/to/chromium"
)


@contextmanager
def launch_chromium() -> Iterator:
    """The system Chromium, headless, driven by Playwright; closed on exit. Raises ``RuntimeError``
    (:data:`CHROMIUM_MISSING`) when there is none."""
    from playwright.sync_api import sync_playwright

    exe = chromium_executable()
    if not exe:
        raise RuntimeError(CHROMIUM_MISSING)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


# --------------------------------------------------------------------------- the page as read
# What a reader sees of a page with every box closed (dropdowns, solutions, hidden inputs, 选读
# blocks): scripts/page_metrics.py prints it, tests/browser/test_reading.py holds the chapters to
# the goals of the chapter issues (COURSE_GUIDE.md section 6).

# Phrases about how or when the book was written: they mean nothing to a reader.
DEV_NOTE_PHRASES = [
    "开发时",
    "开发过程中",
    "早先的版本",
    "早先版本",
    "评审",
    "审稿",
    "构建本书的机器",
    "写作本书时",
    "本书的上一版",
]
# A line of check code: an assert, nb.claim / nb.claim_close / nb.claims (not a learner's
# tc.exercises.check_… call, which is the visible half of a build exercise).
CHECK_LINE_RE = r"\bassert\b|(?<![\w.])(?:nb\.)?claim(?:s|_close)?\("

# Close every box a reader opens by hand, then measure the visible text. A text node counts when
# its element is rendered (not inside a closed <details>, not display:none/visibility:hidden/
# opacity 0) and has a size.
PAGE_METRICS_JS = r"""
async ({ devNotes, checkLine }) => {
  const article = document.querySelector("article.bd-article") || document.body;
  article.querySelectorAll("details[open]").forEach((d) => { d.open = false; });
  for (const t of article.querySelectorAll(".toggle:not(.toggle-hidden)")) {
    const button = t.querySelector("button.toggle-button");
    if (button) button.click();
  }
  await new Promise((r) => setTimeout(r, 300));  // togglebutton's transition
  const seen = new Map();
  const visible = (el) => {
    if (!el) return false;
    if (!seen.has(el)) {
      const r = el.getBoundingClientRect();
      seen.set(el, el.checkVisibility({ visibilityProperty: true, opacityProperty: true }) &&
                   r.width > 0 && r.height > 0);
    }
    return seen.get(el);
  };
  const isCode = (el) => !!el.closest("pre, div.highlight, .cell_output, script, style");
  // prose: the visible text of the article outside code blocks and outputs
  let prose = "";
  const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const el = node.parentElement;
    if (!el || isCode(el) || !visible(el)) continue;
    prose += node.data;
  }
  const han = (prose.match(/[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]/g) || []).length;
  const linesOf = (pres) => pres.filter(visible).flatMap((pre) =>
    pre.innerText.replace(/\n$/, "").split("\n")).filter((l) => l.trim() !== "");
  const pres = [...article.querySelectorAll("pre")];
  const code = linesOf(pres.filter((pre) => !pre.closest(".cell_output")));
  const output = linesOf(pres.filter((pre) => pre.closest(".cell_output")));
  const checkRe = new RegExp(checkLine);
  const checks = code.filter((l) => checkRe.test(l));
  const ticks = [...code, ...output].filter((l) => l.trim().startsWith("✓"));
  // figures: visible <figure>s, and visible images of cell outputs outside a figure
  const figures = [...article.querySelectorAll("figure")].filter(visible).length +
    [...article.querySelectorAll(".cell_output img, .cell_output svg")]
      .filter((img) => !img.closest("figure") && !img.parentElement.closest(".cell_output svg"))
      .filter(visible).length;
  const notes = [];
  for (const phrase of devNotes) {
    let i = prose.indexOf(phrase);
    while (i >= 0) {
      notes.push(prose.slice(Math.max(0, i - 20), i + phrase.length + 20).replace(/\s+/g, " "));
      i = prose.indexOf(phrase, i + phrase.length);
    }
  }
  return { han, codeLines: code.length, outputLines: output.length, tickLines: ticks.length,
           checkLines: checks.length, figures, devNotes: notes.length,
           examples: { checks: checks.slice(0, 10), notes: notes.slice(0, 20) } };
}
"""

METRIC_COLUMNS = [
    ("han", "汉字"),
    ("codeLines", "code lines"),
    ("tickLines", "✓ lines"),
    ("checkLines", "check lines"),
    ("figures", "figures"),
    ("devNotes", "dev notes"),
]


def page_metrics(page) -> dict:
    """Measure a loaded, settled Playwright page (see ``PAGE_METRICS_JS``). Closes every box."""
    return page.evaluate(PAGE_METRICS_JS, {"devNotes": DEV_NOTE_PHRASES, "checkLine": CHECK_LINE_RE})


# The goals of the chapter issues 22-26 for the main path of each chapter (COURSE_GUIDE.md
# section 6): at most so many 汉字 / code lines / ✓ lines, no check code and no development note
# in view, at least so many figures.
MAX_HAN, MAX_CODE_LINES, MAX_TICK_LINES = 9000, 250, 30
MIN_FIGURES = {
    "ch01_core_concepts": 10,
    "ch02_formula_derivations": 9,
    "ch03_math_essence_minigpt": 11,
    "ch04_design_deep_dive": 14,
    "ch05_hands_on_roadmap": 9,
}


def chapter_goal_failures(page: str, metrics: dict) -> list[str]:
    """The goals that a chapter page (``ch01_core_concepts`` …) misses; [] for other pages."""
    name = Path(page).name
    if name not in MIN_FIGURES:
        return []
    failures = []
    if metrics["han"] > MAX_HAN:
        failures.append(f"{metrics['han']:,} 汉字 > {MAX_HAN:,}")
    if metrics["codeLines"] > MAX_CODE_LINES:
        failures.append(f"{metrics['codeLines']} code lines > {MAX_CODE_LINES}")
    if metrics["tickLines"] > MAX_TICK_LINES:
        failures.append(f"{metrics['tickLines']} ✓ lines > {MAX_TICK_LINES}")
    if metrics["checkLines"]:
        failures.append(f"{metrics['checkLines']} check lines in view (goal 0)")
    if metrics["devNotes"]:
        failures.append(f"{metrics['devNotes']} development notes (goal 0)")
    if metrics["figures"] < MIN_FIGURES[name]:
        failures.append(f"{metrics['figures']} figures < {MIN_FIGURES[name]}")
    return failures
