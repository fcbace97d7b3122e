"""Fixtures of the browser tests of the built book (``make browser``).

The tests drive Debian's headless Chromium (``/usr/bin/chromium``, package ``chromium``)
through Playwright's Python package, which is told where the browser is
(``executable_path``) and never downloads one. The built book (``_build/html``, from
``make book``) is served by a local HTTP server on 127.0.0.1 that the ``server`` fixture
starts; a tab may only load from that server (everything else is blocked and reported).

A plain ``pytest tests`` (the unit tests) does not collect this folder; name it::

    pytest tests/browser            # what `make browser` runs, after `make book`
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from bookbrowser import (
    CHROMIUM_MISSING,
    HTML_DIR,
    PHONE_VIEWPORT,
    SHOT_DIR,
    TIMEOUT_MS,
    VIEWPORT,
    Book,
    chromium_executable,
    launch_chromium,
    serve,
    toc_pages,
)

BROWSER_DIR = Path(__file__).resolve().parent


def _requested_explicitly(config: pytest.Config) -> bool:
    """True if a command-line argument names this folder or something inside it."""
    for arg in config.args:
        path = (config.invocation_params.dir / arg.split("::", 1)[0]).resolve()
        if path == BROWSER_DIR or BROWSER_DIR in path.parents:
            return True
    return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Keep the browser tests out of ``pytest tests`` (the unit-test run)."""
    if collection_path.suffix == ".py" and not _requested_explicitly(config):
        return True
    return None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test that takes ``docname`` runs once per page of the table of contents."""
    if "docname" in metafunc.fixturenames:
        metafunc.parametrize("docname", toc_pages(), scope="session")


@pytest.fixture(scope="session")
def html_dir() -> Path:
    if not (HTML_DIR / "index.html").is_file():
        pytest.fail(f"no built book in {HTML_DIR}: run `make book` first", pytrace=False)
    return HTML_DIR


@pytest.fixture(scope="session")
def server(html_dir: Path) -> Iterator[str]:
    """Serve the built book on 127.0.0.1 (a free port); yields the base URL, ending in '/'."""
    with serve(html_dir) as url:
        yield url


@pytest.fixture(scope="session")
def browser() -> Iterator:
    if not chromium_executable():
        pytest.fail(CHROMIUM_MISSING, pytrace=False)
    with launch_chromium() as browser:
        yield browser


@pytest.fixture(scope="session")
def pages() -> list[str]:
    return toc_pages()


@pytest.fixture(scope="session")
def shot_dir() -> Path:
    """``_build/screenshots``, emptied once per test session."""
    if SHOT_DIR.exists():
        shutil.rmtree(SHOT_DIR)
    SHOT_DIR.mkdir(parents=True)
    return SHOT_DIR


@pytest.fixture(scope="session")
def book(browser, server: str, pages: list[str], shot_dir: Path) -> Iterator[Book]:
    """The book, opened in a desktop-sized (1366 px) Chinese-locale browser context."""
    context = browser.new_context(viewport=VIEWPORT, locale="zh-CN", device_scale_factor=1)
    context.set_default_timeout(TIMEOUT_MS)
    try:
        yield Book(context, server, pages)
    finally:
        context.close()


@pytest.fixture(scope="session")
def phone_book(browser, server: str, pages: list[str], shot_dir: Path) -> Iterator[Book]:
    """The book on a phone: 390 px wide, touch (screenshots in CSS pixels)."""
    context = browser.new_context(
        viewport=PHONE_VIEWPORT, locale="zh-CN", device_scale_factor=1, is_mobile=True, has_touch=True
    )
    context.set_default_timeout(TIMEOUT_MS)
    try:
        yield Book(context, server, pages, shot_suffix="-phone")
    finally:
        context.close()
