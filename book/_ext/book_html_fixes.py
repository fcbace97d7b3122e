"""Sphinx extension: small fixes to the HTML pages that Jupyter Book 1.x (Sphinx 7.4) writes.

Listed in ``_config.yml`` under ``sphinx: local_extensions`` (folder ``book/_ext/``).

* Every inline script that an extension adds with ``app.add_js_file(None, body=...)`` after
  the HTML builder was set up ends up **twice** in every page (a Sphinx bug, fixed in Sphinx
  8.2 by sphinx-doc/sphinx#13402; jupyter-book 1.x needs Sphinx < 8). For sphinx-thebe's
  ``const THEBE_JS_URL = ...`` the second copy throws "Identifier 'THEBE_JS_URL' has already
  been declared" in every reader's browser console. Exact duplicates are dropped here.
* With ``exercise_style: solution_follow_exercise`` the title of a solution is sphinx-exercise's
  message "Solution", which its Chinese catalogue (1.2.1) lacks, so Chinese pages would say
  "Solution". The missing translations are added as a fallback catalogue (compiled into the
  build's doctree folder).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# sphinx-exercise messages missing from its own catalogue, per language
EXERCISE_MESSAGES = {"zh_CN": {"Solution": "解答"}}


def _script_key(script: Any) -> tuple:
    filename = getattr(script, "filename", script) or ""
    attributes = getattr(script, "attributes", {}) or {}
    return (str(filename), tuple(sorted((str(k), str(v)) for k, v in attributes.items())))


def drop_duplicate_scripts(app, pagename, templatename, context, doctree) -> None:
    scripts = context.get("script_files")
    if not isinstance(scripts, list):
        return
    seen: set[tuple] = set()
    unique = []
    for script in scripts:
        key = _script_key(script)
        if key not in seen:
            seen.add(key)
            unique.append(script)
    # In place: the list is the builder's own, which Sphinx restores before the next page.
    scripts[:] = unique


def add_exercise_translations(app) -> None:
    messages = EXERCISE_MESSAGES.get(app.config.language or "")
    if not messages:
        return
    from babel.messages.catalog import Catalog
    from babel.messages.mofile import write_mo

    catalog = Catalog(locale=app.config.language, domain="exercise")
    for msgid, msgstr in messages.items():
        catalog.add(msgid, msgstr)
    locale_dir = Path(app.doctreedir) / "book_html_fixes_locale"
    mo_path = locale_dir / app.config.language / "LC_MESSAGES" / "exercise.mo"
    mo_path.parent.mkdir(parents=True, exist_ok=True)
    with mo_path.open("wb") as f:
        write_mo(f, catalog)
    # Merged into sphinx-exercise's "exercise" catalogue as a fallback.
    app.add_message_catalog("exercise", str(locale_dir))


def setup(app) -> dict[str, Any]:
    add_exercise_translations(app)
    # Late, so that scripts added by other html-page-context handlers are seen too.
    app.connect("html-page-context", drop_duplicate_scripts, priority=900)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
