"""The whole book as one PDF: ``make pdf`` -> ``_build/pdf/book.pdf``, then checks the PDF.

1. ``jupyter-book build . --builder singlehtml`` writes every page of ``_toc.yml`` into one HTML
   page (``_build/singlehtml``). It shares ``_build/.doctrees`` with the HTML build, so after
   ``make book`` no page is executed again (the executed pages are read from there); on a clean
   tree the pages are executed once, as in ``make book``.
2. Headless Chromium (the system browser of the browser tests, driven by Playwright) loads that
   page from a local server, waits for MathJax, and prints it with the book's print style
   (``book/_static/book.css``: no navigation, solutions expanded) to A4, with page numbers and
   a bookmark outline. Fonts are embedded by Chromium (subsets).
3. Checks, with poppler-utils (``pdffonts``, ``pdftotext``; installed by
   ``scripts/install_browser_deps.sh``): every font is embedded and one of them has Chinese
   glyphs; the text holds the title of every page of the table of contents, every numbered
   figure caption of the single page, and the text of every exercise solution. Before printing,
   the page in print media at the printed column's width (``LAYOUT_JS``) has no empty box (such
   as the frame a hidden input would leave above its output), no table wider than the column or
   with cut cells, and every 选读 block open; solutions are expanded.

    python scripts/book_pdf.py                # build, print, check
    python scripts/book_pdf.py --check-only   # check an existing _build/pdf/book.pdf
"""

from __future__ import annotations

import argparse
import functools
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "browser"))
from bookbrowser import CHROMIUM_ARGS, SETTLE_JS, TIMEOUT_MS, chromium_executable, serve, toc_pages  # noqa: E402

BUILD = ROOT / "_build"  # --path-output moves it (as jupyter-book's option does)

CJK_FONT_RE = re.compile(r"CJK|Han|Hei|Song|Ming|Kai|WenQuanYi|PingFang|YaHei", re.I)

# What the printed page must contain, read from the single page in print media: the page
# titles (h1 of each document), the numbered figure captions, and the solutions' text.
CONTENT_JS = """
() => {
  const text = (el) => el.innerText.replace(/\\s+/g, " ").trim();
  return {
    // the title of each page: the root page's h1, then the first heading after each
    // <span id="document-DOCNAME"> (the single page's mark where a page begins)
    titles: [[null, text(document.querySelector("article h1"))], ...[
      ...document.querySelectorAll('article span[id^="document-"]')].map((span) => {
        let el = span.nextElementSibling;
        while (el && el.tagName !== "SECTION") el = el.nextElementSibling;
        const heading = el ? el.querySelector("h1, h2, h3") : null;
        return [span.id.slice("document-".length), heading ? text(heading) : null];
      })],
    captions: [...document.querySelectorAll("article figure figcaption .caption-number")].map(text),
    solutions: [...document.querySelectorAll("article div.solution")].map((el) => {
      const body = [...el.children].filter((c) => !c.classList.contains("admonition-title"));
      return body.map(text).join(" ");
    }),
    optional: [...document.querySelectorAll("article details.optional > .optional-content")].map(text),
    hiddenSolutions: [...document.querySelectorAll("article div.solution")].filter((el) =>
      [...el.children].some((c) => !c.classList.contains("admonition-title") &&
                                   !c.checkVisibility({ visibilityProperty: true }))).length,
  };
}
"""
# Layout problems of the printed page, read in print media at the width of the printed column
# (A4 minus the margins): empty boxes (a frame with no text, figure or formula in it, such as the
# frame a hidden input would leave above its output), tables wider than the column or with
# cells whose content is cut, and 选读 blocks whose content is not shown.
PRINT_WIDTH_PX = round((210 - 2 * 16) / 25.4 * 96)  # A4, 16 mm margins: 673 CSS px
LAYOUT_JS = """
() => {
  const article = document.querySelector("article.bd-article");
  const col = article.getBoundingClientRect();
  const shown = (el) => el.checkVisibility({ visibilityProperty: true, opacityProperty: true }) &&
    el.getBoundingClientRect().height > 2;
  const where = (el) => {
    const doc = [...document.querySelectorAll('article span[id^="document-"]')]
      .filter((s) => s.compareDocumentPosition(el) & Node.DOCUMENT_POSITION_FOLLOWING).pop();
    const section = el.closest("section[id]");
    return (doc ? doc.id.slice("document-".length) : "?") + (section ? "#" + section.id : "");
  };
  const short = (el) => el.innerText.replace(/\\s+/g, " ").trim().slice(0, 50);
  // some visible text (a text node whose element is rendered), figure or formula
  const hasContent = (el) => {
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      if (n.data.trim() && n.parentElement.checkVisibility({ visibilityProperty: true }) &&
          n.parentElement.getBoundingClientRect().height > 0) return true;
    }
    return [...el.querySelectorAll("img, svg, canvas, mjx-container, iframe, video")].some(shown);
  };
  const empty = [...article.querySelectorAll(
      ".cell, .cell_input, .cell_output, details, div.highlight, .admonition, figure, table")]
    .filter((el) => shown(el) && !hasContent(el))
    .map((el) => `${where(el)}: empty ${el.tagName.toLowerCase()}.${[...el.classList].join(".")}`);
  const tables = [];
  for (const table of article.querySelectorAll("table")) {
    if (!shown(table)) continue;
    const r = table.getBoundingClientRect();
    if (r.right > col.right + 1 || r.left < col.left - 1 || table.scrollWidth > table.clientWidth + 1) {
      tables.push(`${where(table)}: table ${Math.round(r.width)} px wide in a ${Math.round(col.width)} px ` +
                  `column: ${short(table)}`);
      continue;
    }
    const cut = [...table.querySelectorAll("th, td")].filter((c) => c.scrollWidth > c.clientWidth + 1);
    if (cut.length) tables.push(`${where(table)}: ${cut.length} cells cut, e.g. ${short(cut[0])}`);
  }
  const closedOptional = [...article.querySelectorAll("details.optional")].filter((d) => {
    const content = d.querySelector(":scope > .optional-content");
    return content && content.innerText.trim() !== "" && !shown(content);
  }).map((d) => `${where(d)}: 选读 block closed: ${short(d.querySelector("summary"))}`);
  return { empty, tables, closedOptional, optional: article.querySelectorAll("details.optional").length };
}
"""
FOOTER = (
    '<div style="width:100%;font-size:8px;text-align:center;color:#666;">'
    '<span class="pageNumber"></span> / <span class="totalPages"></span></div>'
)


def build_single_page(path_output: Path | None) -> None:
    exe = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(exe) if exe.exists() else "jupyter-book", "build", ".", "--builder", "singlehtml"]
    cmd += ["-W", "-n", "--keep-going"]
    if path_output is not None:
        cmd += ["--path-output", str(path_output)]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def single_page(single_dir: Path) -> Path:
    """The single page, copied to the build's top folder: Sphinx writes it at the root page's
    path (book/intro.html) but with links relative to the top folder (_static/, _images/)."""
    built = single_dir / f"{toc_pages()[0]}.html"
    if not built.is_file():
        raise SystemExit(f"no single-page book at {built}: the singlehtml build failed")
    page = single_dir / "book.html"
    shutil.copyfile(built, page)
    return page


def print_pdf(page: Path, out: Path) -> dict:
    from playwright.sync_api import sync_playwright

    exe = chromium_executable()
    if not exe:
        raise SystemExit("Chromium not found: run scripts/install_browser_deps.sh or set CHROMIUM")
    out.parent.mkdir(parents=True, exist_ok=True)
    with serve(page.parent) as server, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS, headless=True)
        context = browser.new_context(locale="zh-CN")
        context.set_default_timeout(4 * TIMEOUT_MS)
        tab = context.new_page()
        tab.goto(server + page.name, wait_until="load")
        tab.evaluate(SETTLE_JS)
        # 选读 blocks open on paper (the print style shows them too, book/_static/book.css)
        tab.evaluate("() => document.querySelectorAll('details.optional').forEach((d) => { d.open = true; })")
        tab.emulate_media(media="print")
        content = tab.evaluate(CONTENT_JS)
        # the layout checks at the printed column's width; printing lays the page out anew
        tab.set_viewport_size({"width": PRINT_WIDTH_PX, "height": 1000})
        content["layout"] = tab.evaluate(LAYOUT_JS)
        tab.pdf(
            path=str(out),
            format="A4",
            margin={"top": "18mm", "bottom": "18mm", "left": "16mm", "right": "16mm"},
            print_background=True,
            display_header_footer=True,
            header_template="<span></span>",
            footer_template=FOOTER,
            outline=True,
        )
        browser.close()
    return content


def pdf_fonts(pdf: Path) -> list[dict]:
    """``pdffonts`` as a list of {name, type, emb}."""
    lines = subprocess.run(["pdffonts", str(pdf)], check=True, capture_output=True, text=True).stdout.splitlines()
    header, rule = lines[0], lines[1]
    # column boundaries from the "---- ----" rule under the header
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", rule)]
    names = [header[a:b].strip() for a, b in spans]
    rows = []
    for line in lines[2:]:
        cells = dict(zip(names, (line[a : b + 1].strip() for a, b in spans), strict=True))
        rows.append({"name": cells["name"], "type": cells["type"], "emb": cells["emb"]})
    return rows


def pdf_text(pdf: Path) -> str:
    text = subprocess.run(["pdftotext", "-enc", "UTF-8", str(pdf), "-"], check=True, capture_output=True, text=True)
    return re.sub(r"\s+", "", text.stdout)


def check(pdf: Path, content: dict | None) -> list[str]:
    """Problems of the PDF (empty list: all good)."""
    problems = []
    fonts = pdf_fonts(pdf)
    not_embedded = [f["name"] for f in fonts if f["emb"] != "yes"]
    if not_embedded:
        problems.append(f"fonts not embedded: {not_embedded}")
    cjk = [f["name"] for f in fonts if CJK_FONT_RE.search(f["name"]) and f["emb"] == "yes"]
    if not cjk:
        named = sorted({f["name"] for f in fonts if f["name"] != "[none]"})
        problems.append(f"no embedded Chinese font among {named} (and {len(fonts) - len(named)} Type 3 fonts)")
    text = pdf_text(pdf)
    if content is None:
        return problems
    squeeze = functools.partial(re.sub, r"\s+", "")
    pages = toc_pages()
    included = {doc for doc, _ in content["titles"][1:]}
    if set(pages[1:]) - included:
        problems.append(f"pages missing from the single page: {sorted(set(pages[1:]) - included)}")
    missing_titles = [t for _, t in content["titles"] if not t or squeeze(t).rstrip("#") not in text]
    if missing_titles:
        problems.append(f"page titles missing from the PDF: {missing_titles}")
    missing_captions = [c for c in content["captions"] if squeeze(c) not in text]
    if missing_captions:
        problems.append(f"figure numbers missing from the PDF: {missing_captions}")
    if content["hiddenSolutions"]:
        problems.append(f"{content['hiddenSolutions']} solutions are collapsed in print media")
    layout = content.get("layout", {})
    for kind in ("empty", "tables", "closedOptional"):
        found = layout.get(kind, [])
        if found:
            problems.append(f"{len(found)} {kind} problems in print media:\n    " + "\n    ".join(found[:15]))

    # each solution's (and 选读 block's) runs of Chinese text (>= 4 characters between formulas and code), compared with
    # the Chinese characters of the PDF only: pdftotext puts the pieces of formulas (subscripts,
    # display math) between and around the words. At least half of the runs must be there.
    def chinese(t: str) -> str:
        return re.sub(r"[^\u4e00-\u9fff]", "", t)

    pdf_chinese = chinese(text)
    for kind in ("solutions", "optional"):
        missing = []
        for block in content.get(kind, []):
            runs = re.findall(r"[\u4e00-\u9fff]{4,}", block)
            if runs and sum(run in pdf_chinese for run in runs) < max(1, len(runs) // 2):
                missing.append(runs[0])
        if missing:
            name = "solutions" if kind == "solutions" else "选读 blocks"
            problems.append(f"{len(missing)} {name} missing from the PDF, e.g. {missing[:3]}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check-only", action="store_true", help="only check an existing PDF")
    parser.add_argument("--skip-build", action="store_true", help="print the existing _build/singlehtml")
    parser.add_argument(
        "--path-output", type=Path, default=None, help="jupyter-book's --path-output (default: the repository)"
    )
    parser.add_argument("--out", type=Path, default=None, help="the PDF (default: <build>/pdf/book.pdf)")
    args = parser.parse_args()
    build = (args.path_output / "_build") if args.path_output else BUILD
    args.out = args.out or build / "pdf" / "book.pdf"
    content = None
    if not args.check_only:
        if not args.skip_build:
            build_single_page(args.path_output)
        content = print_pdf(single_page(build / "singlehtml"), args.out)
    if not args.out.is_file():
        raise SystemExit(f"no PDF at {args.out}")
    problems = check(args.out, content)
    pages = subprocess.run(["pdfinfo", str(args.out)], capture_output=True, text=True).stdout
    count = re.search(r"^Pages:\s+(\d+)", pages, re.M)
    summary = f"{args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}: "
    summary += f"{count.group(1) if count else '?'} PDF pages"
    if content:
        summary += f", {len(content['titles'])} book pages, {len(content['captions'])} numbered figures, "
        summary += f"{len(content['solutions'])} solutions, "
        summary += f"{content.get('layout', {}).get('optional', 0)} 选读 blocks (open)"
    print(summary)
    for problem in problems:
        print("PDF check failed:", problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
