"""Helpers of the browser tests: the book's pages (from ``_toc.yml``) and a browser tab
that may only talk to the local server and records every problem it sees.

Environment variables: ``BOOK_HTML`` (the built book, default ``_build/html``),
``BOOK_TOC`` (the table of contents it was built from, default ``_toc.yml``),
``BOOK_SCREENSHOTS`` (default ``_build/screenshots``), ``CHROMIUM`` (the browser,
default ``chromium`` on ``PATH``, i.e. Debian's ``/usr/bin/chromium``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
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


@dataclass
class Visit:
    docname: str
    url: str
    page: object  # the Playwright Page, kept open for the checks that interact with it
    traffic: Traffic
    status: int | None
    screenshot: Path


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

    def visit(self, docname: str) -> Visit:
        """Load a page, wait until it has settled, save its full-page screenshot."""
        if self._visit is None or self._visit.docname != docname:
            if self._visit is not None:
                self._visit.page.close()
            page, traffic = self.open_page()
            response = page.goto(self.url(docname), wait_until="load")
            page.evaluate(SETTLE_JS)
            shot = screenshot_path(self.pages, docname, self.shot_suffix)
            page.screenshot(path=str(shot), full_page=True, animations="disabled")
            self._visit = Visit(
                docname=docname,
                url=page.url,
                page=page,
                traffic=traffic,
                status=response.status if response else None,
                screenshot=shot,
            )
        return self._visit
