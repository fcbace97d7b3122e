"""The code the book prints reads like its formula: every package function or class that a page shows with
``tc.show_source(...)`` has at most 30 code lines (docstring, comments and blank lines aside) and no ``raise``
(validation lives in one-line helper calls)."""

from __future__ import annotations

import ast
import inspect
import io
import re
import textwrap
import tokenize
from pathlib import Path

import pytest

import transformer_course as tc

BOOK = Path(__file__).resolve().parents[1] / "book"
MAX_CODE_LINES = 30
_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```", re.M | re.S)


def _cells(page: Path) -> list[ast.Module]:
    """The code cells of a MyST page that parse as Python (cell options and IPython magics dropped)."""
    trees = []
    for body in _CELL.findall(page.read_text(encoding="utf-8")):
        if body.startswith("---\n"):  # a YAML header of cell options
            body = body.split("\n---\n", 1)[-1]
        body = "\n".join(line for line in body.splitlines() if not line.lstrip().startswith(("%", "!", ":")))
        try:
            trees.append(ast.parse(body))
        except SyntaxError:
            continue
    return trees


def _printed() -> list[tuple[str, str, object]]:
    """(page, expression, object) for every ``show_source(expr)`` whose expression names package code."""
    found = []
    for page in sorted(BOOK.glob("*.md")):
        trees = _cells(page)
        namespace: dict[str, object] = {}
        for tree in trees:  # the page's imports from the package, run in a scratch namespace
            for node in ast.walk(tree):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                    if module and module.split(".")[0] == "transformer_course":
                        try:
                            exec(compile(ast.Module([node], []), page.name, "exec"), namespace)  # noqa: S102
                        except ImportError:  # a module the page names no longer exists: nbval reports it
                            continue
        for tree in trees:
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == (
                    "show_source"
                ):
                    expr = ast.unparse(node.args[0])
                    root = expr.split(".")[0]
                    if root not in namespace:  # a function the page defines itself is not package code
                        continue
                    try:
                        obj = eval(expr, dict(namespace))  # noqa: S307
                    except AttributeError:  # a renamed object: the page fails under nbval
                        obj = None
                    found.append((page.name, expr, obj))
    return found


def code_lines(obj: object) -> tuple[int, int]:
    """(code lines, raise statements) of ``obj``'s source: docstrings, comments and blank lines are not code."""
    source = textwrap.dedent(inspect.getsource(obj))
    tree = ast.parse(source)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Module) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    lines = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip:
            lines.update(range(token.start[0], token.end[0] + 1))
    raises = sum(isinstance(node, ast.Raise) for node in ast.walk(tree))
    return len(lines - docstrings), raises


PRINTED = _printed()


def test_the_book_prints_package_code():
    assert len(PRINTED) >= 20, PRINTED


@pytest.mark.parametrize("page,expr,obj", PRINTED, ids=[f"{p}:{e}" for p, e, _ in PRINTED])
def test_printed_code_is_short_and_has_no_raise(page, expr, obj):
    if obj is None:
        pytest.skip(f"{expr} does not exist in the package (the page is out of date; nbval fails on it)")
    lines, raises = code_lines(obj)
    assert lines <= MAX_CODE_LINES, f"{expr} (printed in {page}) has {lines} code lines, more than {MAX_CODE_LINES}"
    assert raises == 0, f"{expr} (printed in {page}) raises in its body: move the check into a helper"


def test_code_lines_counts_code_only():
    def f(x):
        """A docstring
        of two lines."""
        # a comment

        y = (x
             + 1)  # fmt: skip
        if y < 0:
            raise ValueError("negative")
        return y

    assert code_lines(f) == (6, 1)
    assert code_lines(tc.MiniGPT.hidden_states)[1] == 0
