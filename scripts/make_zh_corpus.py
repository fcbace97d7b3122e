"""Extract the book's own Chinese prose into the package's Chinese corpus.

    python scripts/make_zh_corpus.py            # rewrite src/transformer_course/corpus/zh_book.txt
    python scripts/make_zh_corpus.py --check    # exit 1 if the file differs from what book/ gives

(`make zh-corpus` runs the first.) The pages are read in a fixed order: the appendices, then
chapters 1 to 5, so that the last paragraphs (which ``tc.split_paragraphs`` holds out for
validation) are chapter prose. The preface and the project pages are not read (the project page
studies this corpus, so its own text would change what it measures).

Removed: the YAML header, code cells and every other fenced block that is not prose (math,
code, figures), display math, tables, labels, comments and cell markers, directive options,
inline math and inline code, URLs; kept: headings, list items, the prose inside admonitions,
exercises, solutions and proofs, the titles of those blocks, and the visible text of links and
cross-references. One paragraph per line, paragraphs separated by a blank line (as in the
English corpus); a paragraph is kept only if it has a Chinese character.
``tests/test_zh_corpus.py`` checks that the committed file is what this script derives from book/.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
OUT = ROOT / "src" / "transformer_course" / "corpus" / "zh_book.txt"

# Directives whose body is prose; every other fenced block (code-cell, math, figure, ...) is dropped.
PROSE = ("admonition", "note", "tip", "warning", "important", "hint", "seealso", "caution", "attention",
         "prf:", "exercise", "solution", "dropdown", "epigraph")  # fmt: skip
FENCE = re.compile(r"^(`{3,}|:{3,})\s*(\{([\w:-]+)\})?\s*(.*)$")
HAN_CLASS = r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]"
HAN = re.compile(HAN_CLASS)
INLINE = [  # applied in this order
    (re.compile(r"\{[\w:-]+\}`([^`<]*?)\s*<[^`>]*>`"), r"\1"),  # {ref}`text <label>` -> text
    (re.compile(r"\{[\w:-]+\}`[^`]*`"), ""),  # {eq}`label`, {ref}`label`: no visible text of their own
    (re.compile(r"`+[^`]*`+"), ""),  # inline code
    (re.compile(r"\$[^$]+\$"), ""),  # inline math
    (re.compile(r"!?\[([^\]]*)\]\([^)]*\)"), r"\1"),  # [text](url) -> text
    (re.compile(r"<?https?://[^\s>)]+>?"), ""),  # bare URLs
    (re.compile(r"<[^>\n]+>"), ""),  # HTML tags
    (re.compile(r"\*\*|__|(?<!\w)\*(?=\S)|(?<=\S)\*(?!\w)"), ""),  # bold, italic markers
    (re.compile(r"%s"), ""),  # the number placeholder of {numref}`图 %s <...>`
    (re.compile(r"[ \t]+"), " "),
    (re.compile(r" ?([，。；：、！？）」』”])"), r"\1"),  # a gap left before Chinese punctuation
    (re.compile(r"([（「『“]) "), r"\1"),
    (re.compile(f"(?<={HAN_CLASS}) (?={HAN_CLASS})"), ""),  # the gap a removed formula left between 汉字
]
LINE_DROP = re.compile(r"^\s*(\([\w:-]+\)=|%|\+\+\+|\||:[\w-]+:)")  # labels, comments, cell markers, tables, options
BULLET = re.compile(r"^\s*([-*+]|\d+[.)])\s+")


def clean_inline(text: str) -> str:
    """One line of prose without inline markup, code or math."""
    for pattern, repl in INLINE:
        text = pattern.sub(repl, text)
    return text.strip()


def _blocks(lines: list[str]):
    """Yield ``(kind, text)``: ``("line", prose line)``, ``("break", "")`` between paragraphs."""
    stack: list[str] = []  # the closing fences of the open prose directives
    skip_until: str | None = None  # the closing fence (or $$) of a dropped block
    for line in lines:
        stripped = line.strip()
        if skip_until is not None:
            if stripped == skip_until or (skip_until == "$$" and stripped.startswith("$$")):
                skip_until = None
            continue
        match = FENCE.match(stripped)
        if match and stack and stripped == stack[-1]:
            stack.pop()
            yield "break", ""
        elif match:
            fence, name, title = match.group(1), match.group(3) or "", match.group(4)
            if name.startswith(PROSE):
                stack.append(fence)
                yield "break", ""
                yield "line", re.sub(r"^[★☆\s]+", "", title)
                yield "break", ""
            else:
                skip_until = fence
        elif stripped.startswith("$$"):
            if not (len(stripped) > 2 and stripped.rstrip().endswith("$$") and stripped != "$$"):
                skip_until = "$$"
        elif not stripped or LINE_DROP.match(line):
            yield "break", ""
        else:
            heading = stripped.startswith("#")
            item = BULLET.match(line)
            if heading or item:
                yield "break", ""
            yield "line", BULLET.sub("", stripped.lstrip("#").lstrip() if heading else stripped)
            if heading:
                yield "break", ""


def _join(parts: list[str]) -> str:
    """Join wrapped lines: no space between Chinese text, one space between other words."""
    out = ""
    for part in parts:
        if out and not (HAN.search(out[-1]) or HAN.search(part[0])):
            out += " "
        out += part
    return out


def page_paragraphs(markdown: str) -> list[str]:
    """The Chinese prose paragraphs of one MyST page."""
    lines = markdown.splitlines()
    if lines and lines[0].strip() == "---":  # the YAML header
        lines = lines[lines.index("---", 1) + 1 :]
    paragraphs, current = [], []
    for kind, text in [*_blocks(lines), ("break", "")]:
        text = clean_inline(text) if kind == "line" else ""
        if text:
            current.append(text)
        elif kind == "break" and current:
            paragraphs.append(_join(current))
            current = []
    return [p for p in paragraphs if HAN.search(p)]


def pages(book: Path = BOOK) -> list[Path]:
    """The pages read, in order: the appendices, the chapters, the chapters' deep dives."""
    kinds = ("appendix_*.md", "ch[0-9]*.md", "deep_dive_*.md")
    return [page for kind in kinds for page in sorted(book.glob(kind))]


def build_corpus(book: Path = BOOK) -> str:
    """The corpus text: every page's paragraphs, separated by blank lines."""
    paragraphs = [p for page in pages(book) for p in page_paragraphs(page.read_text(encoding="utf-8"))]
    return "\n\n".join(paragraphs) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if the file is out of date")
    args = parser.parse_args(argv)
    text = build_corpus()
    if args.check:
        current = OUT.read_text(encoding="utf-8") if OUT.exists() else ""
        if current != text:
            print(f"{OUT.relative_to(ROOT)} is out of date: run `make zh-corpus`", file=sys.stderr)
            return 1
        print(f"{OUT.relative_to(ROOT)} is up to date ({len(text):,} characters)")
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(text):,} characters, {text.count(chr(10) * 2) + 1} paragraphs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
