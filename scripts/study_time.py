"""Reading and exercise time of a chapter, computed from its source: the one rule for every page.

The 本章导读 of each chapter carries one line that starts with ``**学习时间**``; this script
computes it from the page and ``--write`` puts it there (``tests/test_book_pages.py`` fails when a
chapter's line differs from what the script computes, so the stated time cannot go stale).

What counts as the main path: everything outside 选读 blocks (``:class: optional`` ...
``% optional-end``) and outside exercises (``{exercise-start}`` ... the end of its solution, or the
``{exercise}``/``{solution}`` directives). On the main path:

- prose: the Chinese characters (CJK ideographs) of the markdown, read at ``CHARS_PER_MIN``;
- display equations: ``MIN_PER_EQUATION`` each (prose and equations: the *reading* time);
- code: the lines of the code cells a reader sees (not ``hide-input``/``remove-input``/
  ``remove-cell``), plus the code that a cell prints: the package's with
  ``tc.show_source(...)``, the page's own functions with ``inspect.getsource(name)``, at
  ``CODE_LINES_PER_MIN`` (read, run, look at the output);
- figures: ``MIN_PER_FIGURE`` each; a main-path cell, hidden or not (the reader sees the figure
  either way), shows as many as its ``plt.show()`` calls or its diagram ``.draw(`` and
  ``attention_explorer(`` calls, whichever is more (a diagram is often drawn, then shown);
- display equations: ``MIN_PER_EQUATION`` each.

Exercises: by their ★ mark, ``MIN_PER_STAR`` minutes for ★, ★★ and ★★★; those whose title
says （必做） are also summed on their own (the core a learner should not skip).

Usage: python scripts/study_time.py book/chNN_x.md [...] [--write | --check]
"""

from __future__ import annotations

import argparse
import inspect
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

CHARS_PER_MIN = 150  # technical Chinese with inline formulas, read with care
CODE_LINES_PER_MIN = 4  # read the code, run it, look at what it prints or draws
MIN_PER_EQUATION = 1
MIN_PER_FIGURE = 1  # look at a plot or a diagram and find in it what the prose says
MIN_PER_STAR = {1: 5, 2: 15, 3: 30}
READING_LIMIT_MIN = 60  # the house style: the main path's prose and equations read in at most an hour
MAIN_PATH_LIMIT_MIN = 80  # and the whole main path, with its code, outputs and figures, in at most 80 minutes

LINE_PREFIX = "**学习时间**"
HANZI = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")
FENCE = re.compile(r"^(`{3,}|~{3,})(.*)$")
HIDDEN_TAGS = ("hide-input", "remove-input", "remove-cell")
SHOW_SOURCE = re.compile(r"tc\.show_source\((.+)\)\s*$", re.M)
# what a cell shows: matplotlib figures (plt.show()), package diagrams (.draw(), often
# followed by plt.show() for the same figure) and the interactive attention explorer
SHOWN = re.compile(r"plt\.show\(\)")
DRAWN = re.compile(r"\.draw\(|attention_explorer\(")
# a function of the page itself shown as code: Code(inspect.getsource(name), ...)
GET_SOURCE = re.compile(r"inspect\.getsource\((\w+)\)")


@dataclass
class Study:
    chars: int = 0
    code_lines: int = 0
    figures: int = 0
    equations: int = 0
    exercises: dict[int, int] = field(default_factory=lambda: {1: 0, 2: 0, 3: 0})
    core: dict[int, int] = field(default_factory=lambda: {1: 0, 2: 0, 3: 0})  # titled （必做）
    unmarked: list[str] = field(default_factory=list)  # exercise titles without ★

    @property
    def reading_min(self) -> int:
        """Prose and display equations, rounded up to 5 minutes."""
        minutes = self.chars / CHARS_PER_MIN + self.equations * MIN_PER_EQUATION
        return math.ceil(minutes / 5) * 5

    @property
    def code_min(self) -> int:
        """The code a reader sees or a cell prints, and the figures, rounded up to 5 minutes."""
        minutes = self.code_lines / CODE_LINES_PER_MIN + self.figures * MIN_PER_FIGURE
        return math.ceil(minutes / 5) * 5

    @property
    def main_min(self) -> int:
        """The main path: reading plus code, each rounded up to 5 minutes."""
        return self.reading_min + self.code_min

    @property
    def exercise_min(self) -> int:
        return sum(MIN_PER_STAR[s] * n for s, n in self.exercises.items())

    @property
    def core_min(self) -> int:
        return sum(MIN_PER_STAR[s] * n for s, n in self.core.items())

    def line(self) -> str:
        stars = "、".join(f"{'★' * s} {n} 道" for s, n in self.exercises.items() if n)
        hours = f"{self.exercise_min / 60:.1f}".removesuffix(".0")
        n_core = sum(self.core.values())
        core = f"其中必做 {n_core} 道约 {self.core_min} 分钟；" if n_core else ""
        main = self.main_min
        figures = f"，含 {self.figures} 幅图" if self.figures else ""
        return (
            f"{LINE_PREFIX}：主线约 {main} 分钟（读正文约 {self.reading_min} 分钟，"
            f"读代码、运行、看结果约 {self.code_min} 分钟{figures}）；"
            f"练习约 {hours} 小时（{core}{stars}）；折叠的选读块不计在内。"
        )


def _printed_lines(call: str) -> int:
    """Lines of the package code that ``tc.show_source(call)`` prints."""
    import transformer_course as tc

    try:
        obj = eval(call.split(",")[0], {"tc": tc})  # the pages pass tc.<name> or tc.<mod>.<name>
        return len(inspect.getsource(obj).strip().splitlines())
    except Exception:  # an argument built in the page (a local object): a typical printed function
        return 20


def _page_function_lines(text: str, name: str) -> int:
    """Lines of ``def name(...)`` defined in the page (up to the next unindented line)."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith(f"def {name}(")), None)
    if start is None:
        return 20
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end].startswith((" ", "\t"))):
        end += 1
    return sum(1 for ln in lines[start:end] if ln.strip())


def _cells(text: str):
    """Yield ("markdown" | "code", lines, tags) blocks of a jupytext MyST page."""
    lines = text.splitlines()
    i, md = 0, []
    while i < len(lines):
        line = lines[i]
        if line.startswith("```{code-cell}"):
            if md:
                yield "markdown", md, ()
                md = []
            j = i + 1
            tags: tuple[str, ...] = ()
            if j < len(lines) and lines[j] == "---":
                end = lines.index("---", j + 1)
                meta = "\n".join(lines[j + 1 : end])
                tags = tuple(t for t in HIDDEN_TAGS if t in meta)
                j = end + 1
            k = j
            while lines[k] != "```":
                k += 1
            yield "code", lines[j:k], tags
            i = k + 1
            continue
        md.append(line)
        i += 1
    if md:
        yield "markdown", md, ()


def _count_markdown(lines: list[str], study: Study, state: dict) -> None:
    in_math = False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("```{admonition}") and "选读" in stripped:
            state["optional"] = True
        if stripped == "% optional-end":
            state["optional"] = False
            continue
        m = re.match(r"^`{3,}\{(exercise-start|exercise|solution-end|solution|exercise-end)\}(.*)$", stripped)
        if m:
            kind, title = m.groups()
            if kind in ("exercise-start", "exercise"):
                state["exercise"] = True
                stars = title.count("★")
                if stars in MIN_PER_STAR:
                    study.exercises[stars] += 1
                    if "必做" in title:
                        study.core[stars] += 1
                else:
                    study.unmarked.append(title.strip())
            elif kind == "solution-end":
                state["exercise"] = False
            continue
        if state["optional"] or state["exercise"] or stripped.startswith(LINE_PREFIX):
            continue
        if stripped.startswith("$$") or stripped.startswith("```{math}"):
            if not in_math:
                study.equations += 1
            in_math = not in_math if stripped.count("$$") != 2 else in_math
        study.chars += len(HANZI.findall(line))


def _solution_closes_exercise(lines: list[str]) -> bool:
    """A ``{solution}`` directive (not -start) ends its exercise at the directive's closing fence."""
    return any(re.match(r"^`{3,}\{solution\}", ln.strip()) for ln in lines)


def measure(path: Path) -> Study:
    study = Study()
    state = {"optional": False, "exercise": False}
    text = path.read_text(encoding="utf-8")
    for kind, lines, tags in _cells(text):
        if kind == "markdown":
            _count_markdown(lines, study, state)
            if _solution_closes_exercise(lines):
                state["exercise"] = False
            continue
        if state["optional"] or state["exercise"]:
            continue
        source = "\n".join(lines)
        if "remove-cell" in tags:
            continue
        study.figures += max(len(SHOWN.findall(source)), len(DRAWN.findall(source)))
        printed = SHOW_SOURCE.findall(source)
        own = GET_SOURCE.findall(source)
        if printed or own:
            study.code_lines += sum(_printed_lines(call) for call in printed)
            study.code_lines += sum(_page_function_lines(text, name) for name in own)
        elif not tags:
            study.code_lines += sum(1 for ln in lines if ln.strip())
    return study


def _replace(text: str, line: str) -> str:
    pattern = re.compile(rf"^{re.escape(LINE_PREFIX)}.*$", re.M)
    if not pattern.search(text):
        raise SystemExit(f"no line starting with {LINE_PREFIX} in the page's 本章导读")
    return pattern.sub(lambda _: line, text, count=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="+", type=Path)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="put the computed line into each page")
    mode.add_argument("--check", action="store_true", help="exit 1 when a page's line is stale")
    args = parser.parse_args()
    stale = 0
    for page in args.pages:
        study = measure(page)
        line = study.line()
        text = page.read_text(encoding="utf-8")
        if args.write:
            page.write_text(_replace(text, line), encoding="utf-8")
        elif args.check and line not in text.splitlines():
            stale += 1
            print(f"{page}: stale or missing {LINE_PREFIX} line; run scripts/study_time.py --write {page}")
        print(f"{page}: {line}")
        if study.unmarked:
            print(f"  exercises without ★: {study.unmarked}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
