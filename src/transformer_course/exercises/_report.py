"""Chinese messages shared by the topic modules: type, shape, dtype and NaN checks of a
learner's output, where two tensors differ, and which typical mistake an output
reproduces."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._protocol import ATOL, RTOL, fail

# The letters messages use for query length, key length, head dimension and heads:
# PyTorch's everywhere, the paper's in chapter 2, whose page keeps the paper's notation.
TORCH_LETTERS = {"L": "L", "S": "S", "D": "D", "H": "H", "E": "E"}
PAPER_LETTERS = {"L": "n", "S": "m", "D": "d_k", "H": "h", "E": "d_model"}


def shape_letters(exercise: str | None) -> dict[str, str]:
    """The shape letters for the messages of ``exercise`` (``"2.4"``: the paper's n,
    m, d_k, h, d_model; any other number or None: L, S, D, H, E); fill a template's
    ``{L}``, ``{S}``, ``{D}``, ``{H}``, ``{E}`` with them."""
    if exercise is not None and str(exercise).startswith("2."):
        return PAPER_LETTERS
    return TORCH_LETTERS


def filled(causes: Sequence[tuple[str, str]], letters: dict[str, str]) -> list:
    """A ``*_CRASHES`` table ``[(pattern, hint), ...]`` with the hints' ``{L}``,
    ``{S}``, ``{D}``, ``{H}``, ``{E}`` filled with ``letters``."""
    return [(pattern, hint.format(**letters)) for pattern, hint in causes]


def as_tensor(out: object, what: str, case: str = "") -> Tensor:
    """``out`` must be a tensor; lists, numpy arrays and numbers get a hint."""
    if isinstance(out, Tensor):
        return out
    where = f"（{case}）" if case else ""
    kind = type(out).__name__
    if isinstance(out, (list, tuple)):
        hint = "用 torch 的运算直接得到张量（或 torch.stack / torch.tensor 把它合起来）"
    elif type(out).__module__.startswith("numpy"):
        hint = "全程用 torch 计算，不要转成 numpy（或 torch.from_numpy 转回来）"
    elif isinstance(out, (int, float, bool)):
        hint = "得到的是一个数：是不是只算了一个元素，或者提前调用了 .item()？"
    else:
        hint = "检查 return 语句"
    end = "" if hint.endswith("？") else "。"
    fail(f"{spaced(what)}应是 torch.Tensor{where}，得到的是 {kind}：{hint}{end}")
    return out  # unreachable


def spaced(what: str) -> str:
    """``what`` followed by a space unless it ends in a Chinese character."""
    return what if what and ord(what[-1]) > 0x2E80 else what + " "


def of(what: str) -> str:
    """``what`` + "的", e.g. ``"fn 的输出"`` -> ``"fn 的输出的"``."""
    return f"{spaced(what)}的"


def check_shape(
    t: Tensor, expected: Sequence[int], what: str, case: str = "", hint: str = ""
) -> None:
    expected = tuple(expected)
    if tuple(t.shape) != expected:
        where = f"（{case}）" if case else ""
        fail(
            f"{of(what)}形状不对{where}：应为 {expected}，得到 {tuple(t.shape)}。"
            + (hint or "")
        )


def check_float(t: Tensor, what: str) -> None:
    if not t.is_floating_point():
        fail(
            f"{spaced(what)}应是浮点张量，得到 dtype {t.dtype}：计算中是否用了整数张量"
            "（如 torch.arange 默认是 int64）？"
        )


def close(a: Tensor, b: Tensor, rtol: float = RTOL, atol: float = ATOL) -> bool:
    if a.shape != b.shape:
        return False
    return bool(
        torch.allclose(
            a.detach().double(), b.detach().double(), rtol, atol, equal_nan=False
        )
    )


def max_err(a: Tensor, b: Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max())


def where_differs(got: Tensor, ref: Tensor) -> str:
    """The first index where ``got`` and ``ref`` differ, with both values."""
    diff = ~torch.isclose(got.detach().double(), ref.detach().double(), RTOL, ATOL)
    idx = tuple(int(i) for i in diff.nonzero()[0])
    return (
        f"最大误差 {max_err(got, ref):.3g}；例如位置 {idx}：应为 "
        f"{ref[idx].item():.6g}，得到 {got[idx].item():.6g}"
    )


def first_reproduced(
    got: Tensor,
    table: Sequence[tuple[str, str]],
    variant: Callable[[str], Tensor | None],
    rtol: float = RTOL,
    atol: float = ATOL,
    same: Callable[[Tensor, Tensor], bool] | None = None,
    **fmt: object,
) -> str | None:
    """The hint of the first typical mistake that ``got`` reproduces: ``table`` is
    ``[(hint template, mistake), ...]``, ``variant(mistake)`` computes what that mistake
    outputs (``None`` or an exception: not possible here), ``fmt`` fills the hint's
    ``{placeholders}``. Reproduces means :func:`close` within ``rtol``/``atol``, or
    ``same(got, variant)`` where given. The one way a checker says "this is mistake
    X"."""
    for template, mistake in table:
        try:
            with torch.no_grad():
                ref = variant(mistake)
        except Exception:  # a variant that cannot run here cannot be the mistake
            continue
        if ref is None:
            continue
        if same(got, ref) if same is not None else close(got, ref, rtol, atol):
            return template.format(**fmt)
    return None


def bug_hunt_hints(
    table: Sequence[tuple[str, str]],
    exercise: str | None,
    bugs: dict[str, dict[str, str]],
) -> list[tuple[str, str]]:
    """``table`` (``[(hint, mistake), ...]``) as ``exercise`` shows it: a find-the-bug
    exercise in ``bugs`` (``{number: {mistake: hint}}``) gets, for the bug its page
    prints (and the bug left in under a disguise), a hint that names the symptom and
    where to look instead of the fix."""
    softer = bugs.get(str(exercise), {})
    return [(softer.get(mistake, text), mistake) for text, mistake in table]


def same_code(fn: object, page_name: str) -> bool:
    """Whether ``fn`` is, instruction for instruction, the function the page defines
    as ``page_name`` next to it (the page's buggy code copied unchanged; comments,
    blank lines, the function's name and decorators aside)."""
    fn = inspect.unwrap(fn) if callable(fn) else fn
    page = getattr(fn, "__globals__", {}).get(page_name)
    page = inspect.unwrap(page) if callable(page) else page
    codes = [getattr(f, "__code__", None) for f in (fn, page)]
    if None in codes:
        return False
    a, b = codes
    fields = ("co_code", "co_consts", "co_names", "co_varnames")
    return all(getattr(a, f) == getattr(b, f) for f in fields)


def check_finite(t: Tensor, what: str, case: str, hint: str = "") -> None:
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        fail(f"{spaced(what)}含 NaN 或 inf（{case}：{bad} 个元素）。" + hint)


def linear_attr(
    module: nn.Module,
    attr: str,
    in_f: int,
    out_f: int,
    what: str,
    bias: bool | None = None,
) -> nn.Linear:
    """The learner's ``module.attr``, which must be ``nn.Linear(in_f, out_f)``."""
    layer = getattr(module, attr, None)
    if layer is None:
        fail(
            f"{what} 缺少属性 {attr}：按约定它应是 nn.Linear({in_f}, {out_f})，"
            f"在 __init__ 里写 self.{attr} = nn.Linear({in_f}, {out_f}"
            + ("" if bias is None or bias else ", bias=False")
            + ")。"
        )
    if not isinstance(layer, nn.Linear):
        fail(f"{what}.{attr} 应是 nn.Linear，得到 {type(layer).__name__}。")
    if (layer.in_features, layer.out_features) != (in_f, out_f):
        fail(
            f"{what}.{attr} 应是 nn.Linear({in_f}, {out_f})，得到 "
            f"nn.Linear({layer.in_features}, {layer.out_features})。"
        )
    if bias is False and layer.bias is not None:
        fail(f"{what}.{attr} 不应带偏置：nn.Linear({in_f}, {out_f}, bias=False)。")
    if bias is True and layer.bias is None:
        fail(
            f"{what}.{attr} 应带偏置：nn.Linear({in_f}, {out_f})（默认 bias=True），"
            "不要写 bias=False：书里的 tc 模块带偏置，后面的单元格要复制它。"
        )
    return layer


def check_no_dropout(module: nn.Module, what: str) -> None:
    """The exercises have no dropout: a learner's ``nn.Dropout(p > 0)`` makes the
    output random and differ from the page's ``tc`` model."""
    for path, sub in module.named_modules():
        if isinstance(sub, nn.Dropout) and sub.p > 0:
            fail(
                f"{what}.{path} 是 nn.Dropout(p={sub.p:g})：练习里不加 dropout"
                "（去掉它，或 p=0），否则每次输出都不同，也与后面单元格里的 tc 模型"
                "对不上。"
            )


def apply_linear(layer: nn.Linear, x: Tensor) -> Tensor:
    return F.linear(x, layer.weight, layer.bias)
