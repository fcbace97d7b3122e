"""Helpers for the book's notebooks: one seed knob, the package's own source, one-line
claims, the attention weights of a whole model.

Chapters import it as ``from transformer_course import notebook as nb``;
``setup_chapter`` and ``show_source`` are also ``tc.setup_chapter``/``tc.show_source``.

* :func:`course_seed` derives every random seed of a chapter from one base seed, read
  from the environment variable ``COURSE_SEED`` (default 0), so that ``make claims`` can
  re-run the whole book with other seeds.
* :func:`setup_chapter` is the first line of every chapter: seeds, one CPU thread, the
  figure style.
* :func:`show_source` displays the tested source of a package object as a highlighted
  code block, in the HTML book (myst-nb renders the Markdown output) and in Jupyter
  alike.
* :func:`claim` and :func:`claim_close` verify a claim and print a one-line summary, so
  that a reader sees the verdict rather than a wall of assertions; inside a
  :func:`claims` block they are silent and the block prints one line for all of them.
* :func:`record_attention` collects the detached attention weights of every
  :class:`~transformer_course.MultiHeadAttention` of a model during a forward pass.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor, nn

from ._validate import check_int
from .utils import set_seed

__all__ = [
    "SEED_ENV",
    "course_seed",
    "setup_chapter",
    "SourceCode",
    "show_source",
    "claim",
    "claim_close",
    "claims",
    "report_claims",
    "record_attention",
]

SEED_ENV = "COURSE_SEED"
# Seeds of different base values never coincide while offsets stay below this stride.
_SEED_STRIDE = 10_000


def course_seed(offset: int = 0) -> int:
    """The seed for one random choice of a chapter: ``COURSE_SEED * 10000 + offset``.

    ``offset`` (0 to 9999) tells the random choices of one page apart; the base seed
    comes from the environment variable ``COURSE_SEED`` (a non-negative integer, 0 when
    unset).
    """
    check_int("offset", offset, 0)
    if offset >= _SEED_STRIDE:
        raise ValueError(f"offset must be < {_SEED_STRIDE}, got {offset}")
    raw = os.environ.get(SEED_ENV, "0").strip() or "0"
    try:
        base = int(raw)
    except ValueError:
        raise ValueError(
            f"{SEED_ENV} must be a non-negative integer, got {raw!r}"
        ) from None
    if base < 0:
        raise ValueError(f"{SEED_ENV} must be a non-negative integer, got {raw!r}")
    return base * _SEED_STRIDE + offset


def setup_chapter(threads: int = 1) -> int:
    """Prepare a chapter's kernel and return its base seed (``course_seed(0)``).

    Seeds Python, NumPy and PyTorch, limits PyTorch to ``threads`` CPU threads (the
    book's models are tiny; one thread is fastest and steadiest on a shared machine),
    prints tensors compactly and switches figures to the book's style (vector graphics,
    readable fonts).
    """
    check_int("threads", threads, 1)
    seed = course_seed()
    set_seed(seed)
    torch.set_num_threads(threads)
    torch.set_printoptions(precision=4, sci_mode=False)
    from . import viz  # matplotlib only when a chapter asks for it

    viz.use_book_style()
    return seed


class SourceCode:
    """The source of one package object; displays as a highlighted code block with its
    location."""

    def __init__(self, qualname: str, path: str, first_line: int, code: str) -> None:
        self.qualname = qualname
        self.path = path
        self.first_line = first_line
        self.code = code

    @property
    def last_line(self) -> int:
        return self.first_line + self.code.count("\n") - 1

    def _repr_markdown_(self) -> str:
        where = f"`{self.path}` 第 {self.first_line}–{self.last_line} 行"
        return f"{where}：`{self.qualname}`\n\n````python\n{self.code.rstrip()}\n````\n"

    def __repr__(self) -> str:
        return (
            f"# {self.path}:{self.first_line}-{self.last_line} ({self.qualname})\n"
            f"{self.code.rstrip()}"
        )


def show_source(obj: object) -> SourceCode:
    """Return the source of a ``transformer_course`` function, class or method for
    display.

    The code is read from the installed package with :func:`inspect.getsourcelines`, so
    the book shows exactly the code that the unit tests cover, never a copy.
    """
    target = inspect.unwrap(obj.fget if isinstance(obj, property) else obj)
    if not (
        inspect.isfunction(target)
        or inspect.isclass(target)
        or inspect.ismethod(target)
    ):
        raise TypeError(
            f"show_source expects a function, class, method or property, got {obj!r}"
        )
    module = inspect.getmodule(target)
    package = __name__.rpartition(".")[0]
    if module is None or not module.__name__.startswith(package + "."):
        raise ValueError(
            f"show_source shows {package} code only, got {obj!r} "
            f"from {getattr(module, '__name__', None)}"
        )
    lines, first_line = inspect.getsourcelines(target)
    root = Path(inspect.getfile(__import__(package))).parent.parent
    path = (
        Path(inspect.getfile(target)).resolve().relative_to(root.resolve()).as_posix()
    )
    return SourceCode(
        target.__qualname__,
        path,
        first_line,
        inspect.cleandoc("\n" + "".join(lines)) + "\n",
    )


# Counters of the open `claims` blocks (innermost last): claims inside one are silent.
_OPEN_BLOCKS: list[list[int]] = []
# Checks run by finished quiet blocks that the next reported block has not counted yet.
_UNREPORTED = [0]


def _passed(line: str) -> None:
    if _OPEN_BLOCKS:
        _OPEN_BLOCKS[-1][0] += 1
    else:
        print(line)


@contextlib.contextmanager
def claims(summary: str, *, quiet: bool = False) -> Iterator[None]:
    """Run a section's checks quietly and print one line for all of them.

    Inside the block :func:`claim` and :func:`claim_close` print nothing; the first
    failure raises at once with its own message. When the block ends, one line
    ``✓ summary（n 项检查）`` is printed. A block in which no check ran raises
    ``AssertionError``: it would claim what nothing verified.

    With ``quiet=True`` the block prints nothing; its checks are counted in the line
    of the next block that prints, so a section whose checks sit in several cells
    shows a single line.
    """
    if not isinstance(summary, str) or not summary:
        raise TypeError(f"summary must be a non-empty str, got {summary!r}")
    if not isinstance(quiet, bool):
        raise TypeError(f"quiet must be a bool, got {quiet!r}")
    counter = [0]
    _OPEN_BLOCKS.append(counter)
    try:
        yield
    finally:
        _OPEN_BLOCKS.pop()
    if counter[0] == 0:
        raise AssertionError(f"claim failed: {summary}: no check ran in this block")
    if quiet and not _OPEN_BLOCKS:
        _UNREPORTED[0] += counter[0]
        return
    total = counter[0] + (0 if _OPEN_BLOCKS else _UNREPORTED[0])
    if not _OPEN_BLOCKS:
        _UNREPORTED[0] = 0
    _passed(f"✓ {summary}（{total} 项检查）")


def report_claims(summary: str) -> None:
    """Print one line ``✓ summary（n 项检查）`` for the checks of the quiet blocks that
    no printed line has counted yet, without running a check of its own: a page whose
    sections check quietly reports them all at one place of its choosing (chapter 4, in
    the box that explains how its conclusions are checked).

    Raises ``AssertionError`` when there is nothing to report (the line would claim what
    nothing verified) and ``RuntimeError`` inside a ``claims`` block.
    """
    if not isinstance(summary, str) or not summary:
        raise TypeError(f"summary must be a non-empty str, got {summary!r}")
    if _OPEN_BLOCKS:
        raise RuntimeError(f"report_claims({summary!r}) inside a claims block")
    if _UNREPORTED[0] == 0:
        raise AssertionError(f"claim failed: {summary}: no unreported check to report")
    total, _UNREPORTED[0] = _UNREPORTED[0], 0
    _passed(f"✓ {summary}（{total} 项检查）")


def claim(condition: object, what: str) -> None:
    """Assert ``condition`` and print ``✓ what``; raise ``AssertionError(what)`` when it
    is false."""
    if not isinstance(what, str) or not what:
        raise TypeError(f"what must be a non-empty str, got {what!r}")
    if isinstance(condition, torch.Tensor):
        if condition.numel() != 1:
            raise ValueError(
                "condition must be a single truth value, got a tensor of shape "
                f"{tuple(condition.shape)}"
            )
        condition = condition.item()
    if not condition:
        raise AssertionError(f"claim failed: {what}")
    _passed(f"✓ {what}")


def claim_close(
    actual: object,
    expected: object,
    what: str,
    *,
    atol: float | None = None,
    rtol: float | None = None,
) -> None:
    """``torch.testing.assert_close(actual, expected)`` with a one-line verdict and the
    max error.

    Numbers, NumPy arrays and tensors are accepted; dtypes may differ (the comparison is
    in the wider dtype). ``atol`` and ``rtol`` are given together or not at all, as in
    ``assert_close``.
    """
    if not isinstance(what, str) or not what:
        raise TypeError(f"what must be a non-empty str, got {what!r}")
    if (atol is None) != (rtol is None):
        raise ValueError(
            f"give atol and rtol together or neither, got atol={atol}, rtol={rtol}"
        )
    a, e = torch.as_tensor(actual), torch.as_tensor(expected)
    if a.shape != e.shape:
        raise AssertionError(
            f"claim failed: {what}: shapes {tuple(a.shape)} and {tuple(e.shape)} differ"
        )
    dtype = torch.promote_types(a.dtype, e.dtype)
    a, e = a.detach().cpu().to(dtype), e.detach().cpu().to(dtype)
    try:
        torch.testing.assert_close(a, e, atol=atol, rtol=rtol)
    except AssertionError as err:
        raise AssertionError(f"claim failed: {what}\n{err}") from None
    error = (a.double() - e.double()).abs().max().item() if a.numel() else 0.0
    _passed(f"✓ {what}（最大误差 {error:.1e}）")


@contextlib.contextmanager
def record_attention(*models: nn.Module) -> Iterator[dict[nn.Module, Tensor]]:
    """Collect the attention weights of every :class:`MultiHeadAttention` in
    ``models`` (a model itself included) while the block runs.

    Yields a dict filled during the forward passes inside the block: attention module
    -> its latest weights ``(N, H, L, S)``, detached (no autograd graph is kept), e.g.
    ``maps[model.blocks[0].self_attn]``. Each module runs its explicit path
    (``need_weights=True``) for the duration, whose output equals the fused one up to
    float rounding; the module's callers still get the output alone. Nothing is
    stored on the modules, and the hooks are removed when the block ends.
    """
    from .attention import MultiHeadAttention

    modules = []
    for model in models:
        if not isinstance(model, nn.Module):
            raise TypeError(f"models must be nn.Modules, got {type(model).__name__}")
        found = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
        if not found:
            raise ValueError(f"{type(model).__name__} has no MultiHeadAttention")
        modules += [m for m in found if m not in modules]
    if not modules:
        raise TypeError("record_attention needs at least one model")
    maps: dict[nn.Module, Tensor] = {}
    asked: dict[nn.Module, bool] = {}

    def ask(module, args, kwargs):
        asked[module] = kwargs.get("need_weights", False)
        return args, {**kwargs, "need_weights": True}

    def keep(module, args, kwargs, output):
        out, weights = output
        maps[module] = weights.detach()
        return output if asked.pop(module) else out

    handles = []
    try:
        for m in modules:
            handles.append(m.register_forward_pre_hook(ask, with_kwargs=True))
            handles.append(m.register_forward_hook(keep, with_kwargs=True))
        yield maps
    finally:
        for handle in handles:
            handle.remove()
