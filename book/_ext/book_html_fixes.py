"""Sphinx extension: small fixes to the HTML pages that Jupyter Book 1.x (Sphinx 7.4) writes.

Listed in ``_config.yml`` under ``sphinx: local_extensions`` (folder ``book/_ext/``).

* Every inline script that an extension adds with ``app.add_js_file(None, body=...)`` after
  the HTML builder was set up ends up **twice** in every page (a Sphinx bug, fixed in Sphinx
  8.2 by sphinx-doc/sphinx#13402; jupyter-book 1.x needs Sphinx < 8). For sphinx-thebe's
  ``const THEBE_JS_URL = ...`` the second copy throws "Identifier 'THEBE_JS_URL' has already
  been declared" in every reader's browser console. Exact duplicates are dropped here.
* Messages missing from the extensions' own Chinese catalogues are added as fallback catalogues
  (compiled into the build's doctree folder): with ``exercise_style: solution_follow_exercise``
  the title of a solution is sphinx-exercise's message "Solution" (its catalogue 1.2.1 lacks
  it), and every ``prf:proof`` box is titled with sphinx-proof's message "Proof" (its
  catalogue 0.4.0 lacks it): the pages would say "Solution" instead of 解答.
* ``make pdf`` prints the single-page HTML build (builder ``singlehtml``). Sphinx looks up the
  HTML handlers of extension nodes by builder name, and falls back to the format ("html") only
  when no extension registered a handler for that name; sphinx-exercise registers
  ``singlehtml`` handlers, so every other extension's nodes (myst-nb's hidden code cells, ...)
  would have none there and the build fails. The missing ones are copied from "html".
* sphinx-proof's ``prf:proof`` directive types "Proof. " in front of the proof's first line,
  untranslated. That text is replaced by the translated label, in bold ("**证明** ...").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from docutils import nodes

# Messages missing from the extensions' own catalogues: catalogue -> language -> msgid -> text
MISSING_MESSAGES = {
    "exercise": {"zh_CN": {"Solution": "解答"}},  # sphinx-exercise
    "proof": {"zh_CN": {"Proof": "证明"}},  # sphinx-proof
}


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


def add_missing_translations(app) -> None:
    from babel.messages.catalog import Catalog
    from babel.messages.mofile import write_mo

    language = app.config.language or ""
    locale_dir = Path(app.doctreedir) / "book_html_fixes_locale"
    for domain, languages in MISSING_MESSAGES.items():
        messages = languages.get(language)
        if not messages:
            continue
        catalog = Catalog(locale=language, domain=domain)
        for msgid, msgstr in messages.items():
            catalog.add(msgid, msgstr)
        mo_path = locale_dir / language / "LC_MESSAGES" / f"{domain}.mo"
        mo_path.parent.mkdir(parents=True, exist_ok=True)
        with mo_path.open("wb") as f:
            write_mo(f, catalog)
        # Merged into the extension's own catalogue as a fallback.
        app.add_message_catalog(domain, str(locale_dir))


def translate_proof_label(app, doctree: nodes.document) -> None:
    from sphinx.locale import get_translation

    label = str(get_translation("proof")("Proof"))
    for box in doctree.findall(nodes.admonition):
        if "proof" not in box["classes"]:
            continue
        first = next(box.findall(nodes.Text), None)
        if first is None or not first.startswith("Proof."):
            continue
        rest = first[len("Proof.") :].lstrip()
        parent = first.parent
        index = parent.index(first)
        parent[index : index + 1] = [nodes.strong(label, label), nodes.Text(" " + rest)]


def inherit_html_handlers(app) -> None:
    builder = app.builder
    if builder.format != "html" or builder.name == "html":
        return
    handlers = app.registry.translation_handlers
    if builder.name not in handlers:
        return  # Sphinx falls back to the "html" handlers by itself
    for node_name, pair in handlers.get("html", {}).items():
        handlers[builder.name].setdefault(node_name, pair)


def setup(app) -> dict[str, Any]:
    add_missing_translations(app)
    # Late, so that scripts added by other html-page-context handlers are seen too.
    app.connect("html-page-context", drop_duplicate_scripts, priority=900)
    app.connect("doctree-read", translate_proof_label)
    app.connect("builder-inited", inherit_html_handlers)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
