"""Strict build of ONE chapter, for chapter authors working in parallel.

    python scripts/check_chapter.py book/ch03_math_essence_minigpt.md
    make check-chapter CH=book/ch03_math_essence_minigpt.md      # same thing

Builds, into a private folder (default: $TMPDIR/check-<chapter name>), a book whose
table of contents is a stub preface plus that chapter (placed at book/<name>.md;
the file may also be a draft outside the repository), with the repository's own
_config.yml, and exits non-zero on any warning (`-W -n --keep-going`, executed
like the real build). Several authors can run it at once: nothing is written into
the repository and the shared `_build/` is left alone.

The build's source folder mirrors the repository with symbolic links (src/, data,
book/ figures and other non-page files), so relative paths such as
`../src/transformer_course/attention.py` in a `{literalinclude}` resolve as in the
real book. The preface is replaced by a stub because the real one links every
chapter, and links to pages outside this small book cannot resolve. For the same
reason, cross-references from the chapter to *other* chapters fail here; pass
`--allow-missing-refs` to downgrade exactly those warnings (missing documents,
labels and equations) while every other warning still fails.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
# Top-level entries of the repository that are not mirrored into the build source.
SKIP_TOP = {".git", ".venv", "venv", "_build", "book", "_config.yml", "_toc.yml"}
PAGE_SUFFIXES = {".md", ".ipynb", ".rst"}
# Warning types that only mean "points at a page that is not in this small book".
XREF_WARNINGS = ["ref.doc", "ref.ref", "ref.numref", "ref.eq", "myst.xref_missing"]

STUB_PREFACE = """\
# 前言（占位页）

本页由 `make check-chapter` 生成，只用于单独检查 `{chapter}`。
完整的前言请用 `make book` 构建。

(chapter-sources)=
## 章节与原文的对应（占位）

每个笔记本页标题下的运行时间行（book/_ext/book_runtime.py）链接到这里。
"""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chapter", help="the page to check, e.g. book/ch01_core_concepts.md")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="build folder (default: $TMPDIR/check-<chapter name>); it is emptied first",
    )
    parser.add_argument(
        "--allow-missing-refs",
        action="store_true",
        help="do not fail on references to pages outside this one-chapter book",
    )
    return parser.parse_args(argv)


def resolve_chapter(arg: str) -> Path:
    path = Path(arg)
    if not path.is_absolute():
        path = Path.cwd() / path
    path = path.resolve()
    if path.suffix != ".md" or not path.is_file():
        sys.exit(f"check-chapter: {arg!r} is not an existing .md file")
    return path


def mirror_sources(src: Path, chapter: Path, is_root: bool) -> None:
    """Fill `src` with symlinks to the repository, keeping only `chapter` as a page."""
    src.mkdir(parents=True)
    for entry in ROOT.iterdir():
        if entry.name not in SKIP_TOP:
            (src / entry.name).symlink_to(entry)
    (src / "book").mkdir()
    for entry in BOOK.iterdir():
        if entry.name != chapter.name and entry.suffix not in PAGE_SUFFIXES:
            (src / "book" / entry.name).symlink_to(entry)
    # The page itself always sits in book/, even when it is a draft kept elsewhere.
    (src / "book" / chapter.name).symlink_to(chapter)
    if not is_root:
        stub = STUB_PREFACE.format(chapter=f"book/{chapter.name}")
        (src / "book" / "intro.md").write_text(stub, "utf-8")


def write_config(src: Path, allow_missing_refs: bool) -> None:
    text = (ROOT / "_config.yml").read_text("utf-8")
    if allow_missing_refs:
        config = yaml.safe_load(text)
        sphinx_config = config.setdefault("sphinx", {}).setdefault("config", {})
        suppressed = sphinx_config.setdefault("suppress_warnings", [])
        suppressed.extend(w for w in XREF_WARNINGS if w not in suppressed)
        text = yaml.safe_dump(config, allow_unicode=True, sort_keys=False)
    (src / "_config.yml").write_text(text, "utf-8")


def write_toc(src: Path, docname: str) -> None:
    toc: dict = {"format": "jb-book", "root": "book/intro"}
    if docname != "book/intro":
        caption = "附录" if Path(docname).name.startswith("appendix") else "章节"
        toc["parts"] = [{"caption": caption, "chapters": [{"file": docname}]}]
    (src / "_toc.yml").write_text(yaml.safe_dump(toc, allow_unicode=True), "utf-8")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    chapter = resolve_chapter(args.chapter)
    docname = f"book/{chapter.stem}"
    out = args.out or Path(tempfile.gettempdir()) / f"check-{chapter.stem}"
    out = out.resolve()
    if out == ROOT or ROOT in out.parents:
        sys.exit(f"check-chapter: the build folder {out} must be outside the repository")
    if out.exists():
        shutil.rmtree(out)
    src = out / "src"
    mirror_sources(src, chapter, is_root=docname == "book/intro")
    write_config(src, args.allow_missing_refs)
    write_toc(src, docname)

    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    cmd = [str(jupyter_book), "build", str(src), "--path-output", str(out)]
    cmd += ["-W", "-n", "--keep-going"]
    print("check-chapter:", " ".join(cmd), flush=True)
    # Run from the repository root: paths in _config.yml (the jieba dictionary for
    # the search index) are relative to it, exactly as in `make book`.
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    rc = subprocess.call(cmd, cwd=ROOT, env=env)
    html = out / "_build" / "html" / Path(docname).with_suffix(".html")
    if rc == 0:
        print(f"check-chapter: OK, no warnings. HTML: {html}")
    else:
        print(f"check-chapter: FAILED (exit {rc}); see the warnings above. Output in {out}")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
