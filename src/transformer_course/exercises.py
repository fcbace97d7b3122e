"""Checkers for the book's build exercises: they grade the learner's own code, offline,
with hints in Chinese.

The build-exercise pattern of every chapter:

1. a **skeleton** cell under the learner's name (``my_self_attention``,
   ``MyMultiHeadAttention``) whose body is ``pass`` (or raises ``NotImplementedError``);
2. a **checker** cell right after it:
   ``tc.exercises.check_self_attention(my_self_attention)``;
3. the **solution** in a closed dropdown under *another* name (``solution_...``,
   ``Solution...``), graded by the same checker with ``solution=True``. "Run All" never
   overwrites the learner's code, and CI grades the solution.

In code::

    def my_self_attention(Q, K, V, mask=None):
        # 在这里写你的代码：返回 (输出, 权重) 或只返回输出
        pass

    tc.exercises.check_self_attention(my_self_attention)  # skeleton: 尚未实现…

    # (in the closed solution dropdown)
    def solution_self_attention(Q, K, V, mask=None):
        ...

    tc.exercises.check_self_attention(solution_self_attention, solution=True)

Every checker ``check_xxx(candidate, *, solution=False)`` compares the candidate with
the package's own implementation (or with a reference computed from the candidate's own
weights) on several random inputs: several shapes, batch > 1, masks, odd lengths. The
inputs come from a local ``torch.Generator`` and the global RNG state of the notebook is
restored afterwards, so a check is deterministic and changes nothing around it. Then:

* right: prints one line starting with ``✓``;
* wrong: raises :class:`ExerciseError` (an ``AssertionError``) whose message says in
  Chinese what is wrong, with the shapes/values involved, and the likely mistake,
  diagnosed from the symptom (missing scale, softmax on the wrong axis, inverted mask,
  ...);
* still a skeleton (returns ``None`` or raises ``NotImplementedError``; for a class:
  construction raises it, or ``forward`` returns ``None``): prints
  ``尚未实现：…（写好后重新运行本单元格）`` without raising, so a notebook runs through
  with the skeletons in place. With ``solution=True`` a skeleton raises instead.

A checker returns ``None``, so a checker call as the last line of a cell echoes
nothing under its one line.

Contracts (boolean masks: ``True`` = may attend):

* :func:`check_self_attention` ``fn(Q, K, V, mask=None)`` -> output or
  ``(output, weights)``
* :func:`check_causal_mask` ``fn(L)`` -> bool ``(L, L)``
* :func:`check_multi_head_attention` ``cls(d_model, num_heads)``, ``nn.Linear``
  ``W_q, W_k, W_v, W_o``; ``forward(Q, K, V, mask=None)`` -> ``(N, L, E)``
* :func:`check_layer_norm` ``cls(d_model, eps=1e-5)``, ``weight``/``bias`` (or
  ``gamma``/``beta``)
* :func:`check_sinusoidal_encoding` ``fn(max_len, d_model)`` -> ``(max_len, d_model)``
* :func:`check_rope` ``fn(x)``, x ``(N, H, L, D)`` -> rotated x (pairs ``(2i, 2i+1)``)
* :func:`check_feed_forward` ``cls(d_model, d_ff)``: ``linear1``, GELU, ``linear2``
* :func:`check_swiglu` ``cls(d_model, d_ff)``: ``w2(silu(w1 x) * w3 x)``, no biases
* :func:`check_transformer_block` ``cls(d_model, num_heads)``: Pre-LN causal GPT block
* :func:`check_gpt` ``cls(vocab_size, context_length, d_model, num_heads, num_layers)``
* :func:`check_train_step` ``fn(model, optimizer, x, y)`` -> loss as a float
* :func:`check_lm_batch` ``fn(data, batch_size, context_length, generator)`` ->
  ``(x, y)``
* :func:`check_generate` ``fn(model, idx, max_new_tokens, context_length, top_k=None,
  generator=None)``
* :func:`check_kv_cache` ``cls()``; ``update(k, v)`` -> ``(K_all, V_all)``, ``len``
"""

from __future__ import annotations

import functools
import linecache
import math
import os
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import scaled_dot_product_attention
from .masks import causal_mask
from .norms import layer_norm_reference
from .positional import sinusoidal_table

__all__ = [
    "ExerciseError",
    "check_self_attention",
    "check_causal_mask",
    "check_multi_head_attention",
    "check_layer_norm",
    "check_sinusoidal_encoding",
    "check_rope",
    "check_feed_forward",
    "check_swiglu",
    "check_transformer_block",
    "check_gpt",
    "check_train_step",
    "check_lm_batch",
    "check_generate",
    "check_kv_cache",
]

# Every check seeds its own generator from this; the learner's RNG state is untouched.
_SEED = 20240527
_RTOL, _ATOL = 1e-4, 1e-5


class ExerciseError(AssertionError):
    """The candidate does not meet the exercise's contract; the message says in Chinese
    what is wrong and what the likely mistake is."""


class _Skeleton(Exception):
    """Internal: the candidate is still a skeleton (None / NotImplementedError)."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(what)
        self.what, self.reason = what, reason


# ---------------------------------------------------------------------------
# infrastructure
# ---------------------------------------------------------------------------


@contextmanager
def _isolated_rng() -> Iterator[None]:
    """Run with the global CPU RNG seeded, and restore the learner's state afterwards
    (module constructors draw their initial weights from it)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_SEED)
        yield


def _generator(offset: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(_SEED + offset)


def _randn(g: torch.Generator, *shape: int, scale: float = 1.0) -> Tensor:
    return torch.randn(*shape, generator=g) * scale


def _name(candidate: object) -> str:
    return getattr(candidate, "__name__", None) or type(candidate).__name__


def _checker(title: str, wants_class: bool = False) -> Callable:
    """Turn ``body(candidate) -> detail`` into a checker with the common protocol."""

    def decorate(body: Callable[[object], str]) -> Callable[..., bool]:
        @functools.wraps(body)
        def check(candidate: object, *, solution: bool = False) -> None:
            __tracebackhide__ = True  # IPython and pytest hide this frame
            name = _name(candidate)
            if not callable(candidate):
                raise ExerciseError(
                    f"{title}：要检查的应是一个函数或类，得到的是 "
                    f"{type(candidate).__name__}（{candidate!r:.60}）。"
                    "把函数/类本身传进来，不要先调用它。"
                )
            if wants_class and not isinstance(candidate, type):
                raise ExerciseError(
                    f"{title}：要检查的是类本身（如 MyMultiHeadAttention），得到的是"
                    f"一个 {type(candidate).__name__} 实例：去掉类名后面的括号和参数，"
                    "检查器会自己用不同的参数构造它。"
                )
            try:
                with _isolated_rng():
                    detail = body(candidate)
            except _Skeleton as skel:
                if solution:
                    raise ExerciseError(
                        f"{title}：{skel.what} {skel.reason}——参考解答不能是骨架"
                        "（solution=True）。"
                    ) from None
                print(f"尚未实现：{skel.what} {skel.reason}（写好后重新运行本单元格）")
                return
            except ExerciseError:
                raise
            except Exception as err:  # an unexpected value made the checker trip
                raise ExerciseError(
                    f"{title}：检查 {name} 时出错（{type(err).__name__}: {err}）。"
                    "多半是返回值的类型或形状出乎意料：对照练习说明检查返回值。"
                ) from err
            print(f"✓ {title}：{name} 通过（{detail}）")

        return check

    return decorate


def _fail(message: str) -> None:
    __tracebackhide__ = True
    raise ExerciseError(message)


def _user_line(err: BaseException) -> str:
    """``文件:行号 源代码`` of the innermost frame outside torch and this package."""
    skip = (os.path.dirname(torch.__file__), os.path.dirname(__file__))
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        if frame.filename.startswith(skip):
            continue
        line = (frame.line or linecache.getline(frame.filename, frame.lineno)).strip()
        where = os.path.basename(frame.filename)
        return f"\n出错的位置：{where} 第 {frame.lineno} 行：{line}"
    return ""


def _crash_hint(err: BaseException) -> str:
    text = str(err)
    if isinstance(err, TypeError) and "argument" in text:
        return "检查参数：函数（或 __init__、forward）的签名要与练习说明的一致。"
    shape_words = ("size", "shape", "dimension", "mat1", "broadcast")
    if any(word in text for word in shape_words):
        return "多半是形状对不上：在出错的行前打印各个张量的 .shape 看看。"
    if "expected scalar type" in text or "dtype" in text.lower():
        return "多半是 dtype 不一致（例如 float 和 long、float32 和 float64 混用）。"
    return ""


def _run(
    fn: Callable,
    *args,
    what: str,
    case: str = "",
    first: bool = False,
    hint: str = "",
    **kwargs,
):
    """Call the learner's ``fn``; a crash becomes an :class:`ExerciseError` naming the
    inputs; ``NotImplementedError`` (or ``None`` from a ``first`` call) a skeleton."""
    __tracebackhide__ = True
    # the learner's code may change its inputs in place: it gets copies
    args = tuple(a.clone() if isinstance(a, Tensor) else a for a in args)
    try:
        out = fn(*args, **kwargs)
    except NotImplementedError:
        raise _Skeleton(what, "抛出了 NotImplementedError") from None
    except (ExerciseError, _Skeleton):
        raise
    except Exception as err:  # the learner's bug: say where and on what
        where = f"（{case}）" if case else ""
        extra = hint or _crash_hint(err)
        raise ExerciseError(
            f"{what} 运行出错{where}：{type(err).__name__}: {err}"
            f"{_user_line(err)}" + (f"\n提示：{extra}" if extra else "")
        ) from None
    if out is None:
        if first:
            raise _Skeleton(what, "返回了 None——还没写完，或者忘了 return")
        where = f"（{case}）" if case else ""
        _fail(f"{what} 返回了 None{where}：这种情况下也要返回结果，是不是漏了 return？")
    return out


def _construct(cls: type, *args, what: str, **kwargs) -> nn.Module:
    """Build the learner's module; a skeleton ``__init__`` is fine (forward decides)."""
    __tracebackhide__ = True
    obj = _run(
        cls, *args, what=f"{what}{_fmt_args(args, kwargs)}", first=True, **kwargs
    )
    if not isinstance(obj, nn.Module):
        _fail(
            f"{what} 应继承 nn.Module（class {what}(nn.Module): ...），"
            f"得到的对象类型是 {type(obj).__name__}。"
        )
    return obj


def _fmt_args(args: tuple, kwargs: dict) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return "(" + ", ".join(parts) + ")"


def _forward(
    module: nn.Module,
    *args,
    what: str,
    case: str = "",
    first: bool = False,
    hint: str = "",
):
    """Call ``module(*args)``; an ``__init__`` without ``super().__init__()`` still
    reveals a skeleton ``forward`` (it is called directly then)."""
    __tracebackhide__ = True
    if "_parameters" not in module.__dict__:  # nn.Module.__init__ never ran
        out = _run(
            type(module).forward,
            module,
            *args,
            what=f"{what}.forward",
            case=case,
            first=first,
            hint=hint,
        )
        _fail(
            f"{what}.__init__ 里没有调用 super().__init__()：nn.Module 的子类必须先"
            "调用它，才能注册参数和子模块。"
        )
        return out
    return _run(
        module, *args, what=f"{what}.forward", case=case, first=first, hint=hint
    )


def _first(out: object) -> Tensor:
    """The package's modules return a tensor or a tuple led by one (across versions)."""
    return out[0] if isinstance(out, tuple) else out


def _as_tensor(out: object, what: str, case: str = "") -> Tensor:
    """``out`` must be a tensor; lists, numpy arrays and numbers get a hint."""
    __tracebackhide__ = True
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
    _fail(f"{_sp(what)}应是 torch.Tensor{where}，得到的是 {kind}：{hint}。")
    return out  # unreachable


def _sp(what: str) -> str:
    """``what`` followed by a space unless it ends in a Chinese character."""
    return what if what and ord(what[-1]) > 0x2E80 else what + " "


def _of(what: str) -> str:
    """``what`` + "的", e.g. ``"fn 的输出"`` -> ``"fn 的输出的"``."""
    return f"{_sp(what)}的"


def _check_shape(
    t: Tensor, expected: Sequence[int], what: str, case: str = "", hint: str = ""
) -> None:
    __tracebackhide__ = True
    expected = tuple(expected)
    if tuple(t.shape) != expected:
        where = f"（{case}）" if case else ""
        _fail(
            f"{_of(what)}形状不对{where}：应为 {expected}，得到 {tuple(t.shape)}。"
            + (hint or "")
        )


def _check_float(t: Tensor, what: str) -> None:
    __tracebackhide__ = True
    if not t.is_floating_point():
        _fail(
            f"{_sp(what)}应是浮点张量，得到 dtype {t.dtype}：计算中是否用了整数张量"
            "（如 torch.arange 默认是 int64）？"
        )


def _close(a: Tensor, b: Tensor, rtol: float = _RTOL, atol: float = _ATOL) -> bool:
    if a.shape != b.shape:
        return False
    return bool(
        torch.allclose(
            a.detach().double(), b.detach().double(), rtol, atol, equal_nan=False
        )
    )


def _max_err(a: Tensor, b: Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max())


def _where_differs(got: Tensor, ref: Tensor) -> str:
    """The first index where ``got`` and ``ref`` differ, with both values."""
    diff = ~torch.isclose(got.detach().double(), ref.detach().double(), _RTOL, _ATOL)
    idx = tuple(int(i) for i in diff.nonzero()[0])
    return (
        f"最大误差 {_max_err(got, ref):.3g}；例如位置 {idx}：应为 "
        f"{ref[idx].item():.6g}，得到 {got[idx].item():.6g}"
    )


def _diagnose(
    got: Tensor,
    variants: Sequence[tuple[str, Callable[[], Tensor]]],
    rtol: float = _RTOL,
    atol: float = _ATOL,
) -> str | None:
    """The hint of the first typical mistake whose result ``got`` reproduces."""
    for hint, compute in variants:
        try:
            with torch.no_grad():
                ref = compute()
        except Exception:  # a variant that cannot run here cannot be the mistake
            continue
        if _close(got, ref, rtol, atol):
            return hint
    return None


def _diagnose_mistakes(
    got: Tensor,
    mistakes: Sequence[tuple[str, str]],
    variant: Callable[[str], Tensor],
    rtol: float = _RTOL,
    atol: float = _ATOL,
) -> str | None:
    """:func:`_diagnose` over a table of ``(hint, mistake)``: ``variant(mistake)``
    computes the result of that mistake."""
    variants = [(hint, functools.partial(variant, m)) for hint, m in mistakes]
    return _diagnose(got, variants, rtol, atol)


def _check_nan(t: Tensor, what: str, case: str, hint: str = "") -> None:
    __tracebackhide__ = True
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        _fail(f"{_sp(what)}含 NaN 或 inf（{case}：{bad} 个元素）。" + hint)


# ---------------------------------------------------------------------------
# 1. scaled dot-product attention
# ---------------------------------------------------------------------------


def _attention_variant(
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    mask: Tensor | None,
    *,
    scale: str = "sqrt",
    dim: int = -1,
    masking: str = "ok",
    transpose_scores: bool = False,
    value: str = "V",
) -> Tensor:
    """Attention with one typical mistake (for diagnosis)."""
    if transpose_scores:
        scores = (K @ Q.transpose(-2, -1)).transpose(-2, -1)
    else:
        scores = Q @ K.transpose(-2, -1)
    d = Q.size(-1)
    scores = {"sqrt": scores / math.sqrt(d), "none": scores, "d": scores / d}[scale]
    if mask is not None:
        if masking == "ok":
            scores = scores.masked_fill(~mask, -math.inf)
        elif masking == "inverted":
            scores = scores.masked_fill(mask, -math.inf)
        elif masking == "zero":
            scores = scores.masked_fill(~mask, 0.0)
        elif masking == "big":
            scores = scores.masked_fill(~mask, -1e9)
    weights = torch.softmax(scores, dim=dim)
    if mask is not None and masking == "after":
        weights = weights * mask
    return weights @ (V if value == "V" else K)


def _random_mask(g: torch.Generator, *shape: int) -> Tensor:
    """A bool mask with at least one True and one False in every row."""
    mask = torch.rand(*shape, generator=g) < 0.6
    mask[..., 0] = True
    mask[..., -1] = False
    return mask


def _attention_cases(
    g: torch.Generator,
) -> list[tuple[str, Tensor, Tensor, Tensor, Tensor | None]]:
    """The self-attention checks: ``(description, Q, K, V, mask)``."""
    cases = [
        (
            "3 维输入 N=2, L=5, S=7, D=8，无掩码",
            _randn(g, 2, 5, 8),
            _randn(g, 2, 7, 8),
            _randn(g, 2, 7, 8),
            None,
        ),
        (
            "4 维输入 N=2, H=3, L=4, S=5, D=6，无掩码",
            _randn(g, 2, 3, 4, 6),
            _randn(g, 2, 3, 5, 6),
            _randn(g, 2, 3, 5, 6),
            None,
        ),
        ("自注意力 N=3, L=S=5，因果掩码 (5, 5)", None, None, None, causal_mask(5)),
        (
            "N=2, L=3, S=7，随机掩码 (2, 3, 7)",
            _randn(g, 2, 3, 8),
            _randn(g, 2, 7, 8),
            _randn(g, 2, 7, 8),
            _random_mask(g, 2, 3, 7),
        ),
        (
            "4 维输入，掩码 (2, 1, 4, 5) 在头维上广播",
            _randn(g, 2, 3, 4, 6),
            _randn(g, 2, 3, 5, 6),
            _randn(g, 2, 3, 5, 6),
            _random_mask(g, 2, 1, 4, 5),
        ),
    ]
    x = _randn(g, 3, 5, 8)
    cases[2] = (cases[2][0], x, x, x, cases[2][4])
    return cases


_FOUR_D_HINT = (
    "4 维输入 (N, H, L, D) 也要能算：转置 K 用 K.transpose(-2, -1)，"
    "不要写死维度编号（K.transpose(1, 2)、K.T 只适合特定维数）。"
)


@_checker("缩放点积注意力")
def check_self_attention(fn: Callable) -> str:
    """Grade ``fn(Q, K, V, mask=None)``: scaled dot-product attention.

    Q ``(..., L, D)``, K and V ``(..., S, D)`` (3-D and 4-D inputs); ``mask`` is bool,
    broadcastable to ``(..., L, S)``, ``True`` = may attend. ``fn`` returns the output
    ``(..., L, D)`` or ``(output, weights)`` with weights ``(..., L, S)``. Compared with
    :func:`transformer_course.scaled_dot_product_attention`.
    """
    __tracebackhide__ = True
    name = _name(fn)
    for i, (case, Q, K, V, mask) in enumerate(_attention_cases(_generator(1))):
        args = (Q, K, V) if mask is None else (Q, K, V, mask)
        hint = _FOUR_D_HINT if Q.dim() == 4 else ""
        out = _run(fn, *args, what=name, case=case, first=i == 0, hint=hint)
        ref_out, ref_w = scaled_dot_product_attention(Q, K, V, mask)
        out, weights = _attention_outputs(fn, out, ref_out, ref_w, case)
        _check_attention_output_shape(fn, out, ref_out, ref_w, case)
        if weights is not None:
            _check_attention_weights(fn, weights, ref_w, mask, case)
        _check_attention_finite(fn, out, mask, case)
        if not _close(out, ref_out):
            _fail(
                f"{name} 的输出与参考实现不一致（{case}；"
                f"{_where_differs(out, ref_out)}）。\n可能的原因："
                f"{_attention_hint(out, Q, K, V, mask)}"
            )
        if weights is not None and not _close(weights, ref_w):
            _fail(
                f"{name} 的输出正确，返回的权重却与参考不一致（{case}；"
                f"{_where_differs(weights, ref_w)}）：返回的应是乘 V 的那个权重。"
            )
    return "3 维和 4 维输入、批量 > 1、L ≠ S、因果掩码与随机掩码，共 5 组"


def _attention_outputs(
    fn: Callable, out: object, ref_out: Tensor, ref_w: Tensor, case: str
) -> tuple[Tensor, Tensor | None]:
    """``fn``'s result as ``(output, weights or None)``; a swapped pair is a mistake."""
    __tracebackhide__ = True
    name = _name(fn)
    weights = None
    if isinstance(out, tuple):
        if len(out) != 2:
            _fail(
                f"{name} 返回了 {len(out)} 个值的元组：应返回输出，或 "
                "(输出, 权重) 两个值。"
            )
        out, weights = out
    out = _as_tensor(out, f"{name} 的输出", case)
    if weights is None:
        return out, None
    weights = _as_tensor(weights, f"{name} 返回的权重", case)
    if tuple(out.shape) == tuple(ref_w.shape) != tuple(ref_out.shape) and tuple(
        weights.shape
    ) == tuple(ref_out.shape):
        _fail(
            f"{name} 返回值的顺序反了（{case}）：应为 (输出, 权重)，"
            f"输出 {tuple(ref_out.shape)}、权重 {tuple(ref_w.shape)}。"
        )
    return out, weights


def _check_attention_output_shape(
    fn: Callable, out: Tensor, ref_out: Tensor, ref_w: Tensor, case: str
) -> None:
    """The output is ``(…, L, D)`` floats; ``(…, L, S)`` means ``weights @ V`` is
    missing."""
    __tracebackhide__ = True
    name = _name(fn)
    if tuple(out.shape) == tuple(ref_w.shape) != tuple(ref_out.shape):
        _fail(
            f"{name} 的输出形状是 {tuple(out.shape)}，这是权重 (…, L, S) "
            f"的形状（{case}）：别忘了用权重对 V 加权求和（weights @ V），"
            f"输出应为 {tuple(ref_out.shape)}。"
        )
    _check_shape(
        out,
        ref_out.shape,
        f"{name} 的输出",
        case,
        " Q 是 (…, L, D)、K/V 是 (…, S, D)，输出应为 (…, L, D)。",
    )
    _check_float(out, f"{name} 的输出")


def _check_attention_finite(
    fn: Callable, out: Tensor, mask: Tensor | None, case: str
) -> None:
    """NaN in the output; NaN in rows that may see everything means an inverted
    mask."""
    __tracebackhide__ = True
    if bool(torch.isfinite(out).all()):
        return
    if mask is not None and bool(mask.all(-1).any()):
        _fail(
            f"{_name(fn)} 的输出含 NaN（{case}）：NaN 出现在掩码整行为 True"
            "（全都可以看）的 query 上，说明填成 -inf 的恰是「可以看」的位置："
            "掩码方向可能反了（True = 可以看）：应写 masked_fill(~mask, -inf)。"
        )
    _fail(
        f"{_name(fn)} 的输出含 NaN 或 inf（{case}）：检查 softmax 之前的"
        "分数，是否某一行全被填成了 -inf？"
    )


def _attention_hint(
    out: Tensor, Q: Tensor, K: Tensor, V: Tensor, mask: Tensor | None
) -> str:
    """The typical mistake whose result ``out`` reproduces, or the recipe."""
    variant = functools.partial(_attention_variant, Q, K, V, mask)
    d = Q.size(-1)
    variants = [
        (
            f"输出差了一个缩放：分数没有除以 √d_k（这里 d_k = {d}，应乘 1/√{d}）。",
            functools.partial(variant, scale="none"),
        ),
        (
            f"分数除以了 d_k = {d}，应除以 √d_k = {math.sqrt(d):.3g}。",
            functools.partial(variant, scale="d"),
        ),
        (
            "权重在 key 维度上之和不是 1：softmax 的 dim 可能写错了"
            "（应在最后一维 dim=-1，即 key 维度上归一化）。",
            functools.partial(variant, dim=-2),
        ),
        (
            "用权重加权求和的应是 V，不是 K（weights @ V）。",
            functools.partial(variant, value="K"),
        ),
    ]
    if mask is not None:
        variants += [
            (
                "被屏蔽的位置仍有权重：掩码方向可能反了（True = 可以看），"
                "应写 scores.masked_fill(~mask, float('-inf'))。",
                functools.partial(variant, masking="inverted"),
            ),
            (
                "被屏蔽的位置仍有权重：掩码没有起作用（mask 参数被忽略了？）。",
                functools.partial(_attention_variant, Q, K, V, None),
            ),
            (
                "被屏蔽的位置仍有权重：屏蔽时把分数填成了 0，应填 -inf"
                "（分数为 0 的位置经 softmax 后仍有权重）。",
                functools.partial(variant, masking="zero"),
            ),
            (
                "softmax 之后才乘掩码：被屏蔽位置的权重虽为 0，每行之和却不再是 1。"
                "应在 softmax 之前把被屏蔽的分数填成 -inf。",
                functools.partial(variant, masking="after"),
            ),
        ]
    return _diagnose(out, variants) or (
        "逐步对照：scores = Q @ K.transpose(-2, -1) / √d_k → "
        "masked_fill(~mask, -inf) → softmax(dim=-1) → weights @ V。"
    )


def _check_attention_weights(
    fn: Callable, weights: Tensor, ref_w: Tensor, mask: Tensor | None, case: str
) -> None:
    __tracebackhide__ = True
    name = _name(fn)
    _check_shape(
        weights,
        ref_w.shape,
        f"{name} 返回的权重",
        case,
        " 权重应为 (…, L, S)：每个 query 对每个 key 一个权重。",
    )
    _check_float(weights, f"{name} 返回的权重")
    if not bool(torch.isfinite(weights).all()):
        return  # the output check explains NaN
    if mask is not None:
        leaked = (weights.detach().abs() > 1e-6) & ~mask
        if bool(leaked.any()):
            idx = tuple(int(i) for i in leaked.nonzero()[0])
            # rows with something masked: an inverted mask gives weight only there
            allowed = (mask & ~mask.all(-1, keepdim=True)).expand_as(weights)
            if bool((weights.detach()[allowed].abs() < 1e-6).all()):
                why = (
                    "掩码方向可能反了（True = 可以看）：应写 masked_fill(~mask, -inf)。"
                )
            else:
                why = (
                    "屏蔽没有生效：应在 softmax 之前把掩码为 False 的分数填成 -inf"
                    "（填 0 不行，0 分经 softmax 后仍有权重）。"
                )
            _fail(
                f"被屏蔽的位置仍有权重（{case}）：例如位置 {idx} 的掩码为 False，"
                f"权重却是 {weights[idx].item():.3g}。{why}"
            )
    sums = weights.detach().double().sum(-1)
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
        cols = weights.detach().double().sum(-2)
        hint = (
            "softmax 的 dim 可能写错了（应为 dim=-1）"
            if torch.allclose(cols, torch.ones_like(cols), atol=1e-4)
            else "检查 softmax 的 dim（应为 -1）"
        )
        _fail(
            f"权重在 key 维度上之和不是 1（{case}）：每个 query 的权重之和应为 1，"
            f"得到例如 {sums.flatten()[0].item():.4g}。{hint}。"
        )


# ---------------------------------------------------------------------------
# 2. causal mask
# ---------------------------------------------------------------------------


@_checker("因果掩码")
def check_causal_mask(fn: Callable) -> str:
    """Grade ``fn(L)``: a bool ``(L, L)`` mask, ``True`` on and below the diagonal
    (query ``i`` may see keys ``0..i``). Compared with
    :func:`transformer_course.causal_mask`."""
    __tracebackhide__ = True
    name = _name(fn)
    for i, L in enumerate((5, 1, 2, 8)):
        case = f"L = {L}"
        out = _as_tensor(_run(fn, L, what=name, case=case, first=i == 0), name, case)
        _check_shape(out, (L, L), name, case)
        ref = causal_mask(L)
        if out.dtype != torch.bool:
            same = out.shape == ref.shape and bool(((out != 0) == ref).all())
            _fail(
                f"{name}({L}) 应返回 torch.bool 张量，得到 dtype {out.dtype}"
                + ("（值本身是对的）" if same else "")
                + "：0/1 的浮点掩码会被当作加到分数上的加性掩码。用 "
                "torch.ones(L, L, dtype=torch.bool).tril()，或在最后加 .bool()。"
            )
        if bool((out == ref).all()):
            continue
        variants = [
            (
                ~ref,
                "得到的是「不能看」的掩码（True = 未来位置）：本课程约定 "
                "True = 可以看，对角线及以下为 True（.tril()，不是 .triu(1)）。",
            ),
            (
                ref.T,
                "掩码方向反了：True 应在对角线及其下方（query i 只能看 "
                "key 0..i），你的在上方（.triu() 应为 .tril()）。",
            ),
            (
                ref.tril(-1),
                "对角线上应为 True：每个位置可以看它自己"
                "（tril 的 diagonal 应为 0，不是 -1）。",
            ),
            (torch.ones_like(ref), "全部为 True：没有屏蔽未来的位置。"),
            (
                torch.ones_like(ref).tril(1),
                "对角线上方多了一条 True：位置 i 看到了 i + 1"
                "（tril 的 diagonal 应为 0）。",
            ),
        ]
        hint = next((h for v, h in variants if bool((out == v).all())), None)
        bad = tuple(int(j) for j in (out != ref).nonzero()[0])
        _fail(
            f"{name}({L}) 不对：位置 {bad} 应为 {bool(ref[bad])}，"
            f"得到 {bool(out[bad])}。" + (hint or "应为对角线及其下方为 True。")
        )
    return "L = 1, 2, 5, 8"


# ---------------------------------------------------------------------------
# 3. multi-head attention
# ---------------------------------------------------------------------------


def _linear(
    module: nn.Module,
    attr: str,
    in_f: int,
    out_f: int,
    what: str,
    bias: bool | None = None,
) -> nn.Linear:
    """The learner's ``module.attr``, which must be ``nn.Linear(in_f, out_f)``."""
    __tracebackhide__ = True
    layer = getattr(module, attr, None)
    if layer is None:
        _fail(
            f"{what} 缺少属性 {attr}：按约定它应是 nn.Linear({in_f}, {out_f})，"
            f"在 __init__ 里写 self.{attr} = nn.Linear({in_f}, {out_f}"
            + ("" if bias is None or bias else ", bias=False")
            + ")。"
        )
    if not isinstance(layer, nn.Linear):
        _fail(f"{what}.{attr} 应是 nn.Linear，得到 {type(layer).__name__}。")
    if (layer.in_features, layer.out_features) != (in_f, out_f):
        _fail(
            f"{what}.{attr} 应是 nn.Linear({in_f}, {out_f})，得到 "
            f"nn.Linear({layer.in_features}, {layer.out_features})。"
        )
    if bias is False and layer.bias is not None:
        _fail(f"{what}.{attr} 不应带偏置：nn.Linear({in_f}, {out_f}, bias=False)。")
    return layer


def _lin(layer: nn.Linear, x: Tensor) -> Tensor:
    return F.linear(x, layer.weight, layer.bias)


def _mha_variant(
    layers: Sequence[nn.Linear],
    H: int,
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    mask: Tensor | None,
    *,
    split: str = "ok",
    merge: str = "ok",
    scale: str = "head",
    dim: int = -1,
    masking: str = "ok",
    out_proj: bool = True,
    source: str = "ok",
) -> Tensor:
    """Multi-head attention from the learner's own four layers, with one typical
    mistake (for diagnosis)."""
    W_q, W_k, W_v, W_o = layers
    N, L, E = Q.shape
    D = E // H
    if source == "q":
        K = V = Q
    q, k, v = _lin(W_q, Q), _lin(W_k, K), _lin(W_v, V)

    def heads(x: Tensor) -> Tensor:
        if split == "view":  # (N, T, E) -> (N, H, T, D) without the transpose
            return x.reshape(N, H, x.size(1), D)
        return x.view(N, x.size(1), H, D).transpose(1, 2)

    q, k, v = heads(q), heads(k), heads(v)
    scores = q @ k.transpose(-2, -1)
    scores = {
        "head": scores / math.sqrt(D),
        "model": scores / math.sqrt(E),
        "none": scores,
    }[scale]
    if mask is not None:
        fill = ~mask if masking == "ok" else mask
        scores = scores.masked_fill(fill, -math.inf)
    out = torch.softmax(scores, dim=dim) @ v  # (N, H, L, D)
    if merge == "view":  # (N, H, L, D) -> (N, L, E) without the transpose
        out = out.reshape(N, L, E)
    else:
        out = out.transpose(1, 2).reshape(N, L, E)
    return _lin(W_o, out) if out_proj else out


def _mha_reference(
    layers: Sequence[nn.Linear],
    H: int,
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    mask: Tensor | None,
) -> Tensor:
    """The package's :class:`MultiHeadAttention` with the learner's weights."""
    from .attention import MultiHeadAttention

    E = Q.size(-1)
    ref = MultiHeadAttention(E, H)
    with torch.no_grad():
        for mine, theirs in zip(
            layers, (ref.q_proj, ref.k_proj, ref.v_proj, ref.out_proj), strict=True
        ):
            theirs.weight.copy_(mine.weight)
            if mine.bias is None:
                theirs.bias.zero_()
            else:
                theirs.bias.copy_(mine.bias)
        return _first(ref(Q, K, V, attn_mask=mask))


_MHA_NAMES = ("W_q", "W_k", "W_v", "W_o")


@_checker("多头注意力", wants_class=True)
def check_multi_head_attention(cls: type) -> str:
    """Grade ``cls(d_model, num_heads)``: multi-head attention.

    The module has four ``nn.Linear(d_model, d_model)`` layers ``W_q, W_k, W_v, W_o``
    (with or without bias); ``forward(Q, K, V, mask=None)`` takes Q ``(N, L, E)``,
    K/V ``(N, S, E)`` and a bool mask ``(L, S)`` (``True`` = may attend) and returns
    ``(N, L, E)`` (or ``(output, weights)``). Compared with the package's
    :class:`~transformer_course.MultiHeadAttention` holding the same weights.
    """
    __tracebackhide__ = True
    name = _name(cls)
    g = _generator(3)
    # (description, d_model, heads, Q, K, V, mask)
    x = _randn(g, 3, 5, 12)
    cases = [
        ("d_model=12, 3 个头，自注意力 N=3, L=5，无掩码", 12, 3, x, x, x, None),
        (
            "d_model=12, 3 个头，交叉注意力 N=2, L=4, S=7，无掩码",
            12,
            3,
            _randn(g, 2, 4, 12),
            _randn(g, 2, 7, 12),
            _randn(g, 2, 7, 12),
            None,
        ),
        (
            "d_model=8, 2 个头，自注意力 N=2, L=6，因果掩码 (6, 6)",
            8,
            2,
            *(3 * (_randn(g, 2, 6, 8),)),
            causal_mask(6),
        ),
        (
            "d_model=12, 4 个头，交叉注意力 N=2, L=3, S=5，随机掩码 (3, 5)",
            12,
            4,
            _randn(g, 2, 3, 12),
            _randn(g, 2, 5, 12),
            _randn(g, 2, 5, 12),
            _random_mask(g, 3, 5),
        ),
    ]
    for i, (case, E, H, Q, K, V, mask) in enumerate(cases):
        what = f"{name}({E}, {H})"
        module = _construct(cls, E, H, what=name)
        args = (Q, K, V) if mask is None else (Q, K, V, mask)
        with torch.no_grad():
            hint = ""
            if K.size(1) != Q.size(1):
                hint = (
                    "交叉注意力里 K、V 的长度 S 可以与 Q 的长度 L 不同：拆分 K、V "
                    "的多头时用它们自己的长度（K.size(1)），不要用 Q 的 L。"
                )
            out = _forward(module, *args, what=what, case=case, first=i == 0, hint=hint)
        if isinstance(out, tuple) and len(out) == 2:
            out = out[0]
        out = _as_tensor(out, f"{what} 的输出", case)
        layers = [_linear(module, a, E, E, what) for a in _MHA_NAMES]
        with torch.no_grad():
            ref = _mha_reference(layers, H, Q, K, V, mask)
        if tuple(out.shape) == (Q.size(0), H, Q.size(1), E // H):
            _fail(
                f"{what} 的输出形状是 {tuple(out.shape)}（{case}）：这是各个头的输出 "
                "(N, H, L, D)，还要合并多头 transpose(1, 2).reshape(N, L, E) 再经过 "
                "W_o。"
            )
        _check_shape(
            out,
            ref.shape,
            f"{what} 的输出",
            case,
            " 多头注意力的输出应与 Q 同形 (N, L, E)。",
        )
        _check_float(out, f"{what} 的输出")
        nan_hint = "检查 softmax 之前的分数，是否某一行全被填成了 -inf？"
        if mask is not None and bool(mask.all(-1).any()):
            nan_hint = (
                "NaN 出现在有掩码的情形：掩码整行为 True 的 query 得到了 NaN，"
                "说明被填成 -inf 的恰是「可以看」的位置：掩码方向可能反了"
                "（True = 可以看）：应写 masked_fill(~mask, -inf)。"
            )
        _check_nan(out, f"{what} 的输出", case, nan_hint)
        if _close(out, ref):
            continue
        D = E // H
        variants = [
            (
                "合并多头时没有先转置：(N, H, L, D) 要先 transpose(1, 2) 变成 "
                "(N, L, H, D)，再 reshape 成 (N, L, E)。",
                functools.partial(_mha_variant, layers, H, Q, K, V, mask, merge="view"),
            ),
            (
                "拆分多头时直接 view 成了 (N, H, L, D)：应先 view 成 (N, L, H, D)，"
                "再 transpose(1, 2)。",
                functools.partial(_mha_variant, layers, H, Q, K, V, mask, split="view"),
            ),
            (
                "拆分和合并多头时都少了转置：应 view(N, L, H, D).transpose(1, 2)，"
                "合并时反过来。",
                functools.partial(
                    _mha_variant, layers, H, Q, K, V, mask, split="view", merge="view"
                ),
            ),
            (
                f"没有拆分多头：应把 (N, T, E) 拆成 {H} 个头 (N, {H}, T, {D})，"
                "每个头各自做注意力（缩放 √d_k 也按每个头的维度）。",
                functools.partial(_mha_variant, layers, 1, Q, K, V, mask),
            ),
            (
                f"输出差了一个缩放：分数没有除以 √d_k（每个头 d_k = {D}）。",
                functools.partial(_mha_variant, layers, H, Q, K, V, mask, scale="none"),
            ),
            (
                f"缩放用了 √d_model = √{E}，应除以每个头的维度 √d_k = √{D}。",
                functools.partial(
                    _mha_variant, layers, H, Q, K, V, mask, scale="model"
                ),
            ),
            (
                "权重在 key 维度上之和不是 1：softmax 的 dim 可能写错了"
                "（应为 dim=-1）。",
                functools.partial(_mha_variant, layers, H, Q, K, V, mask, dim=-2),
            ),
            (
                "忘了最后的输出投影：合并多头后还要经过 W_o。",
                functools.partial(
                    _mha_variant, layers, H, Q, K, V, mask, out_proj=False
                ),
            ),
            (
                "K 和 V 都用 Q 算了：应为 W_k(K)、W_v(V)（交叉注意力里三者不同）。",
                functools.partial(_mha_variant, layers, H, Q, K, V, mask, source="q"),
            ),
        ]
        if mask is not None:
            variants += [
                (
                    "被屏蔽的位置仍有权重：掩码方向可能反了（True = 可以看）。",
                    functools.partial(
                        _mha_variant, layers, H, Q, K, V, mask, masking="inverted"
                    ),
                ),
                (
                    "被屏蔽的位置仍有权重：掩码没有起作用（mask 参数被忽略了？）。",
                    functools.partial(_mha_variant, layers, H, Q, K, V, None),
                ),
            ]
        hint = _diagnose(out, variants) or (
            "逐步对照：投影 → view(N, T, H, D).transpose(1, 2) → 缩放点积注意力"
            "（除以 √d_k，掩码，softmax(dim=-1)）"
            "→ transpose(1, 2).reshape(N, L, E) → W_o。"
        )
        _fail(
            f"{what} 的输出与参考实现（同样权重的 tc.MultiHeadAttention）不一致"
            f"（{case}；{_where_differs(out, ref)}）。\n可能的原因：{hint}"
        )
    return "2 到 4 个头，自注意力与交叉注意力（S ≠ L），因果掩码与随机掩码，共 4 组"


# ---------------------------------------------------------------------------
# 4. layer norm
# ---------------------------------------------------------------------------


def _norm_params(module: nn.Module, what: str) -> tuple[Tensor, Tensor]:
    """``(weight, bias)`` of the learner's norm, also named ``gamma``/``beta``."""
    __tracebackhide__ = True
    pairs = (("weight", "bias"), ("gamma", "beta"))
    for w_name, b_name in pairs:
        w, b = getattr(module, w_name, None), getattr(module, b_name, None)
        if w is None and b is None:
            continue
        for n, p in ((w_name, w), (b_name, b)):
            if p is None:
                _fail(f"{what} 缺少参数 {n}：weight/bias（或 gamma/beta）要成对定义。")
            if not isinstance(p, nn.Parameter):
                _fail(
                    f"{what}.{n} 应是 nn.Parameter（得到 {type(p).__name__}）："
                    "普通张量不会出现在 parameters() 里，优化器就不会训练它。"
                )
        return w, b
    _fail(
        f"{what} 缺少可学习参数：应有 self.weight = nn.Parameter(torch.ones(d_model))"
        " 和 self.bias = nn.Parameter(torch.zeros(d_model))（也可叫 gamma/beta）。"
    )
    raise AssertionError  # unreachable


def _ln_variant(x: Tensor, w: Tensor, b: Tensor, eps: float, mistake: str) -> Tensor:
    dims = {"dim0": 0, "dim1": 1, "all": tuple(range(1, x.dim()))}.get(mistake, -1)
    mean = x.mean(dim=dims, keepdim=True)
    var = x.var(dim=dims, keepdim=True, unbiased=mistake == "unbiased")
    if mistake == "no_center":
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w + b
    if mistake == "std_eps":
        y = (x - mean) / (var.sqrt() + eps)
    elif mistake == "no_sqrt":
        y = (x - mean) / (var + eps)
    else:
        y = (x - mean) / torch.sqrt(var + (0.0 if mistake == "no_eps" else eps))
    if mistake == "no_affine":
        return y
    if mistake == "swapped":
        return y * b + w
    return y * w + b


@_checker("层归一化", wants_class=True)
def check_layer_norm(cls: type) -> str:
    """Grade ``cls(d_model, eps=1e-5)``: layer normalisation.

    Learnable ``weight`` (init 1) and ``bias`` (init 0), also accepted as
    ``gamma``/``beta``; ``forward(x)`` normalises the last dimension with the biased
    variance: ``(x - mean) / sqrt(var + eps) * weight + bias``. Compared with
    :func:`transformer_course.layer_norm_reference`.
    """
    __tracebackhide__ = True
    name = _name(cls)
    g = _generator(4)
    small = _randn(g, 3, 6, scale=3e-3)
    small[1] = 0.5  # a constant row: zero variance
    # (description, d_model, eps or None for the default, x)
    cases = [
        ("d_model=6, x (2, 5, 6)", 6, None, _randn(g, 2, 5, 6, scale=3.0) + 2.0),
        ("d_model=6, 方差很小或为 0 的行 x (3, 6)", 6, None, small),
        ("d_model=8, 4 维 x (2, 3, 4, 8)", 8, None, _randn(g, 2, 3, 4, 8) - 1.0),
        ("d_model=6, eps=0.01, x (3, 6) 方差很小", 6, 0.01, small * 10),
        ("d_model=5（奇数）, x (4, 5)", 5, None, _randn(g, 4, 5, scale=2.0)),
    ]
    for i, (case, E, eps, x) in enumerate(cases):
        kwargs = {} if eps is None else {"eps": eps}
        module = _construct(cls, E, what=name, **kwargs)
        what = f"{name}{_fmt_args((E,), kwargs)}"
        with torch.no_grad():
            out = _forward(module, x, what=what, case=case, first=i == 0)
        w, b = _norm_params(module, what)
        for p, n, init in ((w, "weight（γ）", 1.0), (b, "bias（β）", 0.0)):
            _check_shape(p, (E,), f"{what} 的 {n}", "", " 每个特征一个参数。")
            if i == 0 and not bool((p == init).all()):
                _fail(
                    f"{what} 的 {n} 初始值应全为 {init:g}"
                    "（初始时 LayerNorm 只做标准化）"
                    f"，得到例如 {p.flatten()[0].item():.4g}。"
                )
        with torch.no_grad():  # random γ, β: both must be used, and used right
            w.copy_(_randn(g, E, scale=0.5) + 1.0)
            b.copy_(_randn(g, E))
            out = _forward(module, x, what=what, case=case)
        out = _as_tensor(out, f"{what} 的输出", case)
        _check_shape(
            out,
            x.shape,
            f"{what} 的输出",
            case,
            " LayerNorm 不改变形状：求均值和方差时要 keepdim=True。",
        )
        _check_float(out, f"{what} 的输出")
        e = 1e-5 if eps is None else eps
        _check_nan(
            out,
            f"{what} 的输出",
            case,
            "方差为 0 的行除以了 0：忘了在根号里加 eps（sqrt(var + eps)）。",
        )
        ref = layer_norm_reference(x, w.detach(), b.detach(), e)
        if _close(out, ref, 1e-4, 1e-4):
            continue
        variants = [
            (
                "方差用了无偏估计（除以 n − 1）：torch.var / x.std 默认 unbiased=True，"
                "LayerNorm 要有偏方差，写 x.var(-1, keepdim=True, unbiased=False)。",
                "unbiased",
            ),
            (
                "eps 应加在根号里面：(x − mean) / sqrt(var + eps)，"
                "不是 / (std + eps)。",
                "std_eps",
            ),
            ("忘了开根号：应除以 sqrt(var + eps)，不是 (var + eps)。", "no_sqrt"),
            ("忘了 eps：应为 sqrt(var + eps)。", "no_eps"),
            (
                "归一化的维度不对：应在最后一维上求均值和方差（dim=-1, keepdim=True），"
                "不是第 0 维。",
                "dim0",
            ),
            (
                "归一化的维度不对：应在最后一维上求均值和方差（dim=-1, keepdim=True），"
                "不是第 1 维。",
                "dim1",
            ),
            (
                "归一化的维度不对：只在最后一维（特征维）上求均值和方差，"
                "不要把其它维也算进去。",
                "all",
            ),
            (
                "没有减去均值：这是 RMSNorm 的做法；LayerNorm 要 (x − mean)。",
                "no_center",
            ),
            ("没有用上 γ 和 β：标准化之后要 * weight + bias。", "no_affine"),
            ("weight 和 bias 用反了：应为 x̂ * weight + bias。", "swapped"),
        ]
        variants_run = [
            (h, functools.partial(_ln_variant, x, w.detach(), b.detach(), e, m))
            for h, m in variants
        ]
        if eps is not None:
            variants_run.append(
                (
                    "没有使用构造函数传入的 eps："
                    "把它存成 self.eps，forward 里用 self.eps。",
                    functools.partial(layer_norm_reference, x, w.detach(), b.detach()),
                )
            )
        hint = _diagnose(out, variants_run, 1e-4, 1e-4) or (
            "对照公式：mean、有偏方差都在最后一维上算（keepdim=True），"
            "y = (x − mean) / sqrt(var + eps) * weight + bias。"
        )
        _fail(
            f"{what} 的输出与参考不一致（{case}；{_where_differs(out, ref)}）。"
            f"\n可能的原因：{hint}"
        )
    return "2 到 4 维输入、奇数 d_model、方差为 0 的行、自定义 eps、随机 γ/β，共 5 组"


# ---------------------------------------------------------------------------
# 5. sinusoidal positional encoding
# ---------------------------------------------------------------------------


def _pe_variant(max_len: int, d: int, mistake: str) -> Tensor:
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    if mistake == "pos1":
        pos = pos + 1
    i = torch.arange(0, d, 2, dtype=torch.float64)  # 2i
    if mistake == "exp_i":
        freq = 10000.0 ** (-(i / 2) / d)
    elif mistake == "multiply":
        freq = 10000.0 ** (i / d)
    elif mistake == "per_column":  # every column its own index j
        freq = None
    else:
        freq = 10000.0 ** (-i / d)
    pe = torch.zeros(max_len, d, dtype=torch.float64)
    if freq is None:
        j = torch.arange(d, dtype=torch.float64)
        angles = pos * 10000.0 ** (-j / d)
        pe[:, 0::2], pe[:, 1::2] = angles[:, 0::2].sin(), angles[:, 1::2].cos()
        return pe
    angles = pos * freq
    if mistake == "halves":
        return torch.cat([angles.sin(), angles.cos()], dim=1)
    sin, cos = angles.sin(), angles.cos()
    if mistake == "swapped":
        sin, cos = cos, sin
    pe[:, 0::2], pe[:, 1::2] = sin, cos
    return pe


@_checker("正弦位置编码")
def check_sinusoidal_encoding(fn: Callable) -> str:
    """Grade ``fn(max_len, d_model)``: the sinusoidal table ``(max_len, d_model)`` with
    ``PE[p, 2i] = sin(p / 10000^(2i/d))`` and ``PE[p, 2i+1] = cos(p / 10000^(2i/d))``.
    Compared with :func:`transformer_course.sinusoidal_table`."""
    __tracebackhide__ = True
    name = _name(fn)
    for i, (max_len, d) in enumerate(((7, 8), (1, 2), (50, 16), (11, 6))):
        case = f"max_len={max_len}, d_model={d}"
        out = _as_tensor(
            _run(fn, max_len, d, what=name, case=case, first=i == 0), name, case
        )
        if tuple(out.shape) == (d, max_len) and d != max_len:
            _fail(
                f"{name}({max_len}, {d}) 的形状是 {tuple(out.shape)}：行和列反了，"
                f"应为 (max_len, d_model) = {(max_len, d)}，每行是一个位置。"
            )
        _check_shape(
            out, (max_len, d), f"{name}({max_len}, {d})", "", " 行是位置，列是维度。"
        )
        _check_float(out, f"{name}({max_len}, {d})")
        ref = sinusoidal_table(max_len, d, dtype=torch.float64)
        if _close(out, ref, 1e-4, 1e-4):
            continue
        variants = [
            (
                "sin 和 cos 的列放反了：偶数列（0, 2, 4, …）是 sin，奇数列是 cos。",
                "swapped",
            ),
            (
                "前一半列放 sin、后一半放 cos 是另一种排法；"
                "本课程（和原论文）交错排列："
                "PE[:, 0::2] = sin，PE[:, 1::2] = cos。",
                "halves",
            ),
            (
                "位置应从 0 开始：第 0 行应为 [0, 1, 0, 1, …]"
                "（torch.arange(max_len)）。",
                "pos1",
            ),
            (
                "频率的指数写错了：应为 10000^(2i/d_model)，i 是列对的编号；"
                "写成 torch.arange(0, d_model, 2) / d_model 即是 2i/d_model。",
                "exp_i",
            ),
            (
                "位置应除以 10000^(2i/d_model)"
                "（或乘以 10000^(−2i/d_model)），你乘了它。",
                "multiply",
            ),
            (
                "每一列用了自己的列号 j 算频率：同一对 (2i, 2i+1) 应共享一个频率 "
                "10000^(−2i/d_model)。",
                "per_column",
            ),
        ]
        hint = _diagnose_mistakes(
            out, variants, functools.partial(_pe_variant, max_len, d), 1e-4, 1e-4
        )
        _fail(
            f"{name}({max_len}, {d}) 与参考不一致（{_where_differs(out, ref)}）。"
            + (
                f"\n可能的原因：{hint}"
                if hint
                else "\n对照公式：PE[p, 2i] = sin(p / 10000^(2i/d))，"
                "PE[p, 2i+1] = cos(p / 10000^(2i/d))。"
            )
        )
    return "max_len × d_model = 7×8, 1×2, 50×16, 11×6"


# ---------------------------------------------------------------------------
# 6. rotary position embedding
# ---------------------------------------------------------------------------


def _rope_variant(x: Tensor, mistake: str) -> Tensor:
    """RoPE (interleaved pairs, positions along dim -2) with one typical mistake."""
    D = x.size(-1)
    two_i = torch.arange(0, D, 2, dtype=torch.float64)
    freq = 10000.0 ** (-(two_i / 2 if mistake == "exp_i" else two_i) / D)
    if mistake == "pos_heads":  # the angle of head h instead of position l
        pos = torch.arange(x.size(1), dtype=torch.float64)[:, None, None]
    else:
        pos = torch.arange(x.size(-2), dtype=torch.float64)[:, None]
    if mistake == "pos1":
        pos = pos + 1
    angles = pos * freq
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    if mistake == "reversed":
        sin = -sin
    if mistake == "halves":
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    r1, r2 = x1 * cos - x2 * sin, x1 * sin + x2 * cos
    if mistake == "cat":
        return torch.cat([r1, r2], dim=-1)
    return torch.stack([r1, r2], dim=-1).flatten(-2)


@_checker("旋转位置编码 RoPE")
def check_rope(fn: Callable) -> str:
    """Grade ``fn(x)``: rotary position embedding of ``x (N, H, L, D)``, D even.

    Feature pair ``(2i, 2i+1)`` of the vector at position ``m`` (``m = 0..L-1``, along
    dim -2) is rotated by the angle ``m · 10000^(-2i/D)``:
    ``(x₁, x₂) -> (x₁ cos − x₂ sin, x₁ sin + x₂ cos)``. Returns a tensor of the shape of
    ``x``. Compared with :class:`transformer_course.RotaryEmbedding` (its default,
    interleaved pairs).
    """
    __tracebackhide__ = True
    from .positional import RotaryEmbedding

    name = _name(fn)
    g = _generator(6)
    shapes = ((2, 3, 5, 8), (1, 2, 7, 4), (2, 1, 1, 6), (3, 2, 9, 2))
    for i, shape in enumerate(shapes):
        case = f"x {shape}"
        x = _randn(g, *shape)
        out = _as_tensor(
            _run(fn, x.clone(), what=name, case=case, first=i == 0), name, case
        )
        _check_shape(out, shape, f"{name} 的输出", case, " RoPE 只旋转，不改变形状。")
        _check_float(out, f"{name} 的输出")
        ref = RotaryEmbedding(shape[-1])(x)
        if _close(out, ref):
            continue
        variants = [
            (
                "配对方式不对：本约定是相邻两维 (2i, 2i+1) 一对（交错，x[..., 0::2] 与 "
                "x[..., 1::2]），你用的是前后两半 (i, i + D/2)。",
                "halves",
            ),
            (
                "旋转后要按 (2i, 2i+1) 交错放回"
                "（torch.stack([…], dim=-1).flatten(-2)），"
                "不是前后拼接（torch.cat）。",
                "cat",
            ),
            (
                "旋转方向反了：x₁' = x₁·cos − x₂·sin，x₂' = x₁·sin + x₂·cos。",
                "reversed",
            ),
            ("位置应从 0 开始：第 0 个位置不旋转（torch.arange(L)）。", "pos1"),
            (
                "频率写错了：θ_i = 10000^(−2i/D)，i 是维度对的编号"
                "（torch.arange(0, D, 2) / D 即是 2i/D）。",
                "exp_i",
            ),
            (
                f"位置应沿倒数第二维 L 数（x 的形状是 (N, H, L, D) = {shape}），"
                "你用的是头的编号。",
                "pos_heads",
            ),
        ]
        hint = _diagnose_mistakes(out, variants, functools.partial(_rope_variant, x))
        if hint is None:
            norms = out.detach().double().norm(dim=-1)
            if not torch.allclose(norms, x.double().norm(dim=-1), rtol=1e-4):
                hint = (
                    "旋转不改变向量的长度，你的输出却改变了它：检查每一对用的是"
                    "同一个角度的 cos 和 sin，且 cos² + sin² = 1。"
                )
            else:
                hint = (
                    "对照公式：第 m 个位置、第 i 对 (x[2i], x[2i+1]) 旋转角度 "
                    "m · 10000^(−2i/D)。"
                )
        _fail(
            f"{name} 的输出与参考（tc.RotaryEmbedding）不一致（{case}；"
            f"{_where_differs(out, ref)}）。\n可能的原因：{hint}"
        )
    return "4 种形状 (N, H, L, D)，含 L = 1 与 D = 2"


# ---------------------------------------------------------------------------
# 7. feed-forward networks
# ---------------------------------------------------------------------------


def _copy_linear(src: nn.Linear, dst: nn.Linear) -> None:
    """Copy ``src`` into ``dst``; a missing bias becomes zeros."""
    with torch.no_grad():
        dst.weight.copy_(src.weight)
        if dst.bias is not None:
            if src.bias is None:
                dst.bias.zero_()
            else:
                dst.bias.copy_(src.bias)


def _ffn_variant(l1: nn.Linear, l2: nn.Linear, x: Tensor, mistake: str) -> Tensor:
    acts = {
        "relu": F.relu,
        "tanh": functools.partial(F.gelu, approximate="tanh"),
        "none": lambda t: t,
        "silu": F.silu,
        "sigmoid": torch.sigmoid,
    }
    act = acts.get(mistake, F.gelu)
    out = _lin(l2, act(_lin(l1, x)))
    if mistake == "twice":
        return F.gelu(out)
    if mistake == "residual":
        return x + out
    return out


def _ffn_cases(g: torch.Generator) -> list[tuple[str, int, int, Tensor]]:
    return [
        ("d_model=8, d_ff=32, x (2, 5, 8)", 8, 32, _randn(g, 2, 5, 8)),
        ("d_model=6, d_ff=10, x (3, 6)", 6, 10, _randn(g, 3, 6, scale=2.0)),
        ("d_model=4, d_ff=12, x (2, 3, 1, 4)", 4, 12, _randn(g, 2, 3, 1, 4)),
    ]


def _ffn_runs(
    cls: type, seed: int
) -> Iterator[tuple[str, int, int, Tensor, str, nn.Module, object]]:
    """Build the learner's FFN for each of :func:`_ffn_cases` and run it on ``x``:
    ``(case, d_model, d_ff, x, what, module, out)``, ``what`` like ``MyFFN(8, 32)``."""
    __tracebackhide__ = True
    name = _name(cls)
    for i, (case, E, d_ff, x) in enumerate(_ffn_cases(_generator(seed))):
        what = f"{name}({E}, {d_ff})"
        module = _construct(cls, E, d_ff, what=name)
        with torch.no_grad():
            out = _forward(module, x, what=what, case=case, first=i == 0)
        yield case, E, d_ff, x, what, module, out


def _check_ffn_output(
    out: object,
    x: Tensor,
    ref_mod: nn.Module,
    mistakes: Sequence[tuple[str, str]],
    variant: Callable[[str], Tensor],
    formula: str,
    what: str,
    case: str,
) -> None:
    """``out`` must equal ``ref_mod(x)``; otherwise the hint of the typical mistake
    that it reproduces (``variant(mistake)`` computes one), or the ``formula``."""
    __tracebackhide__ = True
    out = _as_tensor(out, f"{what} 的输出", case)
    _check_shape(
        out, x.shape, f"{what} 的输出", case, " FFN 逐位置作用，输出与输入同形。"
    )
    _check_float(out, f"{what} 的输出")
    with torch.no_grad():
        ref = ref_mod(x)
    if _close(out, ref):
        return
    hint = _diagnose_mistakes(out, mistakes, variant) or f"对照公式：{formula}。"
    _fail(
        f"{what} 的输出与参考不一致（{case}；{_where_differs(out, ref)}）。"
        f"\n可能的原因：{hint}"
    )


_FFN_HINTS = [
    ("激活函数用了 ReLU；本练习用 GELU（F.gelu 或 nn.GELU()）。", "relu"),
    (
        "用了 GELU 的 tanh 近似（approximate='tanh'）；本练习用精确的 GELU"
        "（F.gelu 的默认）。",
        "tanh",
    ),
    ("两层之间缺少激活函数：两个线性层叠在一起仍是一个线性变换。", "none"),
    ("激活只在两层之间：linear2 之后不要再过 GELU。", "twice"),
    ("FFN 本身不含残差：x + … 由 Transformer 块去加。", "residual"),
    ("激活函数用了 SiLU；本练习用 GELU。", "silu"),
    ("激活函数用了 sigmoid；本练习用 GELU。", "sigmoid"),
]


@_checker("前馈网络 FFN", wants_class=True)
def check_feed_forward(cls: type) -> str:
    """Grade ``cls(d_model, d_ff)``: the position-wise FFN ``linear2(gelu(linear1 x))``.

    ``linear1 = nn.Linear(d_model, d_ff)``, ``linear2 = nn.Linear(d_ff, d_model)``
    (with or without bias), the exact GELU (``F.gelu`` / ``nn.GELU()``) between them, no
    dropout; ``forward(x)`` works on any leading dimensions. Compared with
    :class:`transformer_course.FeedForward` (``activation="gelu"``) holding the same
    weights.
    """
    __tracebackhide__ = True
    from .feedforward import FeedForward

    for case, E, d_ff, x, what, module, out in _ffn_runs(cls, seed=7):
        l1 = _linear(module, "linear1", E, d_ff, what)
        l2 = _linear(module, "linear2", d_ff, E, what)
        ref_mod = FeedForward(E, d_ff, activation="gelu")
        _copy_linear(l1, ref_mod.w1)
        _copy_linear(l2, ref_mod.w2)
        variant = functools.partial(_ffn_variant, l1, l2, x)
        formula = "linear2(gelu(linear1(x)))"
        _check_ffn_output(out, x, ref_mod, _FFN_HINTS, variant, formula, what, case)
    return "2 到 4 维输入，3 组 (d_model, d_ff)"


def _swiglu_variant(
    w1: nn.Linear, w2: nn.Linear, w3: nn.Linear, x: Tensor, mistake: str
) -> Tensor:
    a, b = _lin(w1, x), _lin(w3, x)
    hidden = {
        "swapped": lambda: F.silu(b) * a,
        "gelu": lambda: F.gelu(a) * b,
        "sigmoid": lambda: torch.sigmoid(a) * b,
        "relu": lambda: F.relu(a) * b,
        "no_gate": lambda: F.silu(a),
        "sum": lambda: F.silu(a) + b,
        "after": lambda: F.silu(a * b),
        "both": lambda: F.silu(a) * F.silu(b),
    }[mistake]()
    return _lin(w2, hidden)


_SWIGLU_HINTS = [
    (
        "silu 应作用在 w1 x 上，w3 x 是不过激活的另一支：w2(silu(w1 x) * w3 x)。",
        "swapped",
    ),
    (
        "SwiGLU 的激活是 SiLU（F.silu，即 x·sigmoid(x)），不是 GELU（那是 GEGLU）。",
        "gelu",
    ),
    (
        "用了 sigmoid（那是 GLU）：SwiGLU 用 SiLU(x) = x·sigmoid(x)，即 F.silu。",
        "sigmoid",
    ),
    ("激活函数用了 ReLU；SwiGLU 用 SiLU（F.silu）。", "relu"),
    ("缺了门控：silu(w1 x) 还要逐元素乘以 w3 x。", "no_gate"),
    ("门控是逐元素相乘，不是相加：silu(w1 x) * w3 x。", "sum"),
    (
        "silu 只作用在 w1 x 上，之后再乘 w3 x：silu(w1 x) * w3 x，"
        "不是 silu(w1 x * w3 x)。",
        "after",
    ),
    ("w3 x 那一支不过激活：silu(w1 x) * w3 x。", "both"),
]


@_checker("SwiGLU 前馈网络", wants_class=True)
def check_swiglu(cls: type) -> str:
    """Grade ``cls(d_model, d_ff)``: the SwiGLU FFN ``w2(silu(w1 x) * w3 x)``.

    Three bias-free layers: ``w1 = nn.Linear(d_model, d_ff, bias=False)``, ``w3`` the
    same, ``w2 = nn.Linear(d_ff, d_model, bias=False)``. Compared with
    :class:`transformer_course.FeedForward` (``activation="swiglu"``, ``bias=False``)
    holding the same weights.
    """
    __tracebackhide__ = True
    from .feedforward import FeedForward

    for case, E, d_ff, x, what, module, out in _ffn_runs(cls, seed=8):
        w1 = _linear(module, "w1", E, d_ff, what, bias=False)
        w3 = _linear(module, "w3", E, d_ff, what, bias=False)
        w2 = _linear(module, "w2", d_ff, E, what, bias=False)
        ref_mod = FeedForward(E, d_ff, activation="swiglu", bias=False)
        for src, dst in ((w1, ref_mod.w1), (w2, ref_mod.w2), (w3, ref_mod.w3)):
            _copy_linear(src, dst)
        variant = functools.partial(_swiglu_variant, w1, w2, w3, x)
        formula = "w2(silu(w1(x)) * w3(x))"
        _check_ffn_output(out, x, ref_mod, _SWIGLU_HINTS, variant, formula, what, case)
    return "2 到 4 维输入，3 组 (d_model, d_ff)"


# ---------------------------------------------------------------------------
# 8. the GPT block and the GPT model: the learner's names -> the package's
# ---------------------------------------------------------------------------


def _block_name_map(block: nn.Module) -> list[tuple[str, nn.Module]]:
    """(the learner's attribute path, the package module it corresponds to) for one
    Pre-LN block. The one place that knows the package's attribute names."""
    attn, ffn = block.self_attn, block.ffn
    return [
        ("ln1", block.norm1),
        ("attn.W_q", attn.q_proj),
        ("attn.W_k", attn.k_proj),
        ("attn.W_v", attn.v_proj),
        ("attn.W_o", attn.out_proj),
        ("ln2", block.norm2),
        ("ffn.linear1", ffn.w1),
        ("ffn.linear2", ffn.w2),
    ]


def _gpt_name_map(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The same for :class:`~transformer_course.MiniGPT` (learned positions)."""
    pos = getattr(model, "pos_emb", None) or getattr(model, "pos", None)
    pairs = [
        ("tok_emb", model.tok_emb),
        ("pos_emb", getattr(pos, "embedding", pos)),
        ("ln_f", model.norm_f),
        ("lm_head", model.lm_head),
    ]
    for i, block in enumerate(model.blocks):
        pairs += [(f"blocks.{i}.{path}", m) for path, m in _block_name_map(block)]
    return pairs


def _resolve(obj: nn.Module, path: str, what: str) -> nn.Module:
    __tracebackhide__ = True
    current: object = obj
    done = what
    for part in path.split("."):
        if part.isdigit():
            try:
                current = current[int(part)]
            except (TypeError, IndexError):
                _fail(f"{done} 应是 nn.ModuleList，且至少有 {int(part) + 1} 个元素。")
            done += f"[{part}]"
            continue
        nxt = getattr(current, part, None)
        if nxt is None:
            _fail(
                f"{done} 缺少属性 {part}：按约定要有 {what}.{path}（名字要一致，"
                "检查器按名字把你的权重复制到参考实现里）。"
            )
        current, done = nxt, f"{done}.{part}"
    return current


def _param(module: nn.Module, names: Sequence[str]) -> Tensor | None:
    for n in names:
        p = getattr(module, n, None)
        if isinstance(p, Tensor):
            return p
    return None


def _copy_weights(
    candidate: nn.Module,
    pairs: Sequence[tuple[str, nn.Module]],
    what: str,
    randomize_norms: torch.Generator | None = None,
) -> None:
    """Copy the candidate's weights into the package modules of ``pairs``.

    With ``randomize_norms`` the candidate's norm weights/biases are first set to random
    values (initially all 1/0, they would not tell ``ln1`` from ``ln2``)."""
    __tracebackhide__ = True
    for path, dst in pairs:
        src = _resolve(candidate, path, what)
        w = _param(src, ("weight", "gamma"))
        b = _param(src, ("bias", "beta"))
        if w is None:
            _fail(
                f"{what}.{path} 没有权重（weight）：它应是 {type(dst).__name__}"
                "（nn.Linear / nn.LayerNorm / nn.Embedding）。"
            )
        if tuple(w.shape) != tuple(dst.weight.shape):
            _fail(
                f"{what}.{path}.weight 的形状应为 {tuple(dst.weight.shape)}，"
                f"得到 {tuple(w.shape)}。"
            )
        norm = w.dim() == 1
        with torch.no_grad():
            if randomize_norms is not None and norm:
                w.copy_(1.0 + 0.3 * _randn(randomize_norms, *w.shape))
                if b is not None:
                    b.copy_(0.2 * _randn(randomize_norms, *b.shape))
            dst.weight.copy_(w)
            dst_b = getattr(dst, "bias", None)
            if dst_b is None:
                if b is not None and bool(b.detach().ne(0).any()):
                    _fail(f"{what}.{path} 不应带偏置（nn.Linear(…, bias=False)）。")
            elif b is None:
                dst_b.zero_()
            else:
                if tuple(b.shape) != tuple(dst_b.shape):
                    _fail(
                        f"{what}.{path}.bias 的形状应为 {tuple(dst_b.shape)}，"
                        f"得到 {tuple(b.shape)}。"
                    )
                dst_b.copy_(b)


def _attend(block: nn.Module, h: Tensor, causal: bool = True) -> Tensor:
    return _first(block.self_attn(h, is_causal=causal))


def _block_variant(block: nn.Module, x: Tensor, mistake: str) -> Tensor:
    """The package block's pieces, wired with one typical mistake."""
    attn = functools.partial(_attend, block, causal=mistake != "no_causal")
    ln1, ln2, ffn = block.norm1, block.norm2, block.ffn
    if mistake in _RESIDUAL_MISTAKES:
        return _residual_variant(x, attn, ln1, ln2, ffn, mistake)
    # the norm mistakes: the right wiring, with the wrong norm (or none)
    if mistake == "ln1_twice":
        ln2 = ln1
    elif mistake == "no_ln2":
        ln2 = nn.Identity()
    elif mistake == "no_ln":
        ln1 = ln2 = nn.Identity()
    x = x + attn(ln1(x))
    return x + ffn(ln2(x))


_RESIDUAL_MISTAKES = (
    "post_ln",
    "no_res_attn",
    "no_res_ffn",
    "no_res",
    "res_from_norm",
    "parallel",
)


def _residual_variant(
    x: Tensor,
    attn: Callable[[Tensor], Tensor],
    ln1: nn.Module,
    ln2: nn.Module,
    ffn: nn.Module,
    mistake: str,
) -> Tensor:
    """The block with one of the :data:`_RESIDUAL_MISTAKES`."""
    if mistake == "post_ln":
        x = ln1(x + attn(x))
        return ln2(x + ffn(x))
    if mistake == "no_res_attn":
        x = attn(ln1(x))
        return x + ffn(ln2(x))
    if mistake == "no_res_ffn":
        return ffn(ln2(x + attn(ln1(x))))
    if mistake == "no_res":
        return ffn(ln2(attn(ln1(x))))
    if mistake == "res_from_norm":
        h = ln1(x)
        x = h + attn(h)
        h = ln2(x)
        return h + ffn(h)
    return x + attn(ln1(x)) + ffn(ln2(x))  # "parallel"


_BLOCK_HINTS = [
    ("少了注意力子层的残差连接：x = x + attn(ln1(x))。", "no_res_attn"),
    ("少了 FFN 子层的残差连接：x = x + ffn(ln2(x))。", "no_res_ffn"),
    (
        "两个子层都少了残差连接：x = x + attn(ln1(x))，然后 x = x + ffn(ln2(x))。",
        "no_res",
    ),
    (
        "这是 Post-LN（先加残差再归一化：ln(x + attn(x))）；本练习要 Pre-LN："
        "x + attn(ln1(x))。",
        "post_ln",
    ),
    (
        "注意力没有因果掩码：GPT 块里位置 i 只能看 0..i（mask = causal_mask(L)）。",
        "no_causal",
    ),
    (
        "残差要加在归一化之前的 x 上：x + attn(ln1(x))，不是 ln1(x) + attn(ln1(x))。",
        "res_from_norm",
    ),
    (
        "两个子层是串行的：FFN 的输入是加过注意力残差之后的 x，"
        "不是原来的 x（x + attn(…) + ffn(…) 是并行块）。",
        "parallel",
    ),
    ("第二个子层应该用 ln2，你用了两次 ln1。", "ln1_twice"),
    ("FFN 之前忘了 ln2：x + ffn(ln2(x))。", "no_ln2"),
    ("没有用 ln1 和 ln2：Pre-LN 先归一化再进子层，x + attn(ln1(x))。", "no_ln"),
]


def _causality_hint(
    run: Callable[[Tensor], Tensor], x: Tensor, t: int, noise: Tensor
) -> str | None:
    """Change the inputs from position ``t`` on; earlier outputs must not move."""
    with torch.no_grad():
        before = run(x)
        x2 = x.clone()
        x2[:, t:] = noise
        after = run(x2)
    if (
        isinstance(before, Tensor)
        and isinstance(after, Tensor)
        and not _close(before[:, :t], after[:, :t])
    ):
        return (
            f"改动第 {t} 个位置及以后的输入，前 {t} 个位置的输出也变了："
            "缺少因果掩码（或方向反了），位置 i 只能看 0..i。"
        )
    return None


@_checker("Transformer 块（Pre-LN，GPT）", wants_class=True)
def check_transformer_block(cls: type) -> str:
    """Grade ``cls(d_model, num_heads)``: a Pre-LN GPT block, d_ff = 4·d_model, no
    dropout.

    Attributes: ``ln1`` and ``ln2`` (``nn.LayerNorm(d_model)``), ``attn`` (the
    multi-head attention of :func:`check_multi_head_attention`: ``W_q, W_k, W_v, W_o``),
    ``ffn`` (the FFN of :func:`check_feed_forward`: ``linear1``, GELU, ``linear2``).
    ``forward(x)`` with x ``(N, L, E)``, causal: ``x = x + attn(ln1(x))`` then
    ``x = x + ffn(ln2(x))``. Compared with :class:`transformer_course.TransformerBlock`
    (``.gpt``) holding the same weights (the norms get random γ/β first).
    """
    __tracebackhide__ = True
    from .blocks import TransformerBlock

    name = _name(cls)
    g = _generator(9)
    cases = [
        ("d_model=16, 4 个头, x (2, 7, 16)", 16, 4, _randn(g, 2, 7, 16)),
        ("d_model=12, 3 个头, x (3, 5, 12)", 12, 3, _randn(g, 3, 5, 12, scale=2.0)),
        ("d_model=8, 2 个头, x (1, 1, 8)", 8, 2, _randn(g, 1, 1, 8)),
    ]
    for i, (case, E, H, x) in enumerate(cases):
        what = f"{name}({E}, {H})"
        module = _construct(cls, E, H, what=name)
        with torch.no_grad():
            _forward(module, x, what=what, case=case, first=i == 0)
        ref_mod = TransformerBlock.gpt(E, H, 4 * E)
        ref_mod.eval()
        _copy_weights(module, _block_name_map(ref_mod), what, randomize_norms=g)
        module.eval()  # no dropout in the contract; eval() in case there is some
        with torch.no_grad():
            out = _forward(module, x, what=what, case=case)
            ref = ref_mod(x)
        out = _as_tensor(out, f"{what} 的输出", case)
        _check_shape(out, x.shape, f"{what} 的输出", case, " 块的输出与输入同形。")
        _check_float(out, f"{what} 的输出")
        _check_nan(
            out,
            f"{what} 的输出",
            case,
            "因果掩码的方向可能反了（True = 可以看）：最后一行全被屏蔽时会得到 NaN。",
        )
        if _close(out, ref):
            continue
        hint = _diagnose_mistakes(
            out, _BLOCK_HINTS, functools.partial(_block_variant, ref_mod, x)
        )
        if hint is None and x.size(1) > 2:
            hint = _causality_hint(
                functools.partial(_forward, module, what=what, case=case),
                x,
                2,
                _randn(g, x.size(0), x.size(1) - 2, E),
            )
        hint = hint or (
            "逐项对照：ln1/ln2 是 nn.LayerNorm(d_model)，注意力带因果掩码，"
            "FFN 的 d_ff = 4·d_model、激活是精确 GELU；x = x + attn(ln1(x))，"
            "x = x + ffn(ln2(x))。先分别用 check_multi_head_attention、"
            "check_feed_forward 检查子模块。"
        )
        _fail(
            f"{what} 的输出与参考（同样权重的 tc.TransformerBlock.gpt）不一致"
            f"（{case}；{_where_differs(out, ref)}）。\n可能的原因：{hint}"
        )
    return "3 组 (d_model, 头数, 形状)，含 L = 1，因果性与 Pre-LN 连线"


def _gpt_reference(V: int, C: int, E: int, H: int, n_layers: int) -> nn.Module:
    from .models import GPTConfig, MiniGPT

    cfg = GPTConfig(
        vocab_size=V,
        context_length=C,
        d_model=E,
        num_heads=H,
        num_layers=n_layers,
        d_ff=4 * E,
        dropout=0.0,
        positional="learned",
        norm="layernorm",
        norm_first=True,
        activation="gelu",
        tie_weights=False,
        bias=True,
    )
    return MiniGPT(cfg).eval()


def _gpt_variant(ref: nn.Module, idx: Tensor, mistake: str) -> Tensor:
    """The package model's pieces, wired with one typical mistake."""
    pairs = dict(_gpt_name_map(ref))
    L = idx.size(1)
    tok = ref.tok_emb(idx)
    pos = pairs["pos_emb"].weight
    if mistake == "no_pos":
        x = tok
    elif mistake == "pos_by_id":  # only where every id < context_length
        x = tok + pos[idx]
    else:
        x = tok + pos[:L]
    h = x
    for block in ref.blocks:
        if mistake == "no_causal":
            h = _block_variant(block, h, "no_causal")
        else:
            h = block(x if mistake == "same_input" else h)
    if mistake != "no_ln_f":
        h = ref.norm_f(h)
    logits = ref.lm_head(h)
    return torch.softmax(logits, -1) if mistake == "softmax" else logits


_GPT_HINTS = [
    ("忘了加位置嵌入：x = tok_emb(idx) + pos_emb(torch.arange(L))。", "no_pos"),
    (
        "位置嵌入应按位置 0..L-1 查表（pos_emb(torch.arange(L))），不是按 token id。",
        "pos_by_id",
    ),
    ("lm_head 之前忘了最后的 ln_f。", "no_ln_f"),
    (
        "forward 应返回 logits（未经 softmax）：交叉熵和采样都从 logits 出发。",
        "softmax",
    ),
    (
        "每个块的输入应是上一个块的输出：for block in self.blocks: x = block(x)。",
        "same_input",
    ),
    ("注意力没有因果掩码：位置 i 只能看 0..i。", "no_causal"),
]


@_checker("GPT 模型", wants_class=True)
def check_gpt(cls: type) -> str:
    """Grade ``cls(vocab_size, context_length, d_model, num_heads, num_layers)``.

    Attributes: ``tok_emb`` (``nn.Embedding(vocab_size, d_model)``), ``pos_emb``
    (learned, ``nn.Embedding(context_length, d_model)``), ``blocks``
    (``nn.ModuleList`` of blocks of the :func:`check_transformer_block` contract),
    ``ln_f`` (``nn.LayerNorm``), ``lm_head`` (``nn.Linear(d_model, vocab_size,
    bias=False)``; tying it to ``tok_emb`` is fine). ``forward(idx)`` with idx
    ``(N, L)``,
    ``L <= context_length``, returns logits ``(N, L, vocab_size)`` (a tuple
    ``(logits, loss)`` is accepted too). Graded by copying the weights into
    :class:`transformer_course.MiniGPT` (learned positions, GELU, Pre-LN).
    """
    __tracebackhide__ = True
    name = _name(cls)
    g = _generator(10)
    # (vocab, context, d_model, heads, layers, idx shapes)
    configs = [(23, 8, 16, 2, 2, ((2, 8), (3, 5))), (11, 6, 12, 3, 1, ((1, 1), (2, 6)))]
    first = True
    for V, C, E, H, n_layers, shapes in configs:
        args = (V, C, E, H, n_layers)
        what = f"{name}{_fmt_args(args, {})}"
        module = _construct(cls, *args, what=name)
        probe = torch.randint(V, shapes[0], generator=g)
        with torch.no_grad():
            _forward(
                module,
                probe,
                what=what,
                case=f"idx {shapes[0]}",
                first=first,
                hint=_embedding_hint,
            )
        first = False
        ref = _gpt_reference(*args)
        _copy_weights(module, _gpt_name_map(ref), what, randomize_norms=g)
        module.eval()
        for shape in shapes:
            case = f"vocab={V}, context={C}, idx {shape}"
            idx = torch.randint(V, shape, generator=g)
            with torch.no_grad():
                out = _forward(module, idx, what=what, case=case, hint=_embedding_hint)
                expected = _first(ref(idx))
            if isinstance(out, tuple) and len(out) == 2:
                out = out[0]
            out = _as_tensor(out, f"{what} 的输出", case)
            N, L = shape
            if tuple(out.shape) == (N, V) and L > 1:
                _fail(
                    f"{what} 只返回了最后一个位置的 logits {tuple(out.shape)}（{case}）"
                    f"：forward 应返回每个位置的 (N, L, V) = {(N, L, V)}。"
                )
            if tuple(out.shape) == (N * L, V) and N > 1:
                _fail(
                    f"{what} 的输出被展平成了 {tuple(out.shape)}（{case}）：forward "
                    f"应返回 (N, L, V) = {(N, L, V)}，展平留给算损失的地方。"
                )
            _check_shape(out, (N, L, V), f"{what} 的输出", case)
            _check_float(out, f"{what} 的输出")
            _check_nan(out, f"{what} 的输出", case)
            if _close(out, expected):
                continue
            hint = _diagnose_mistakes(
                out, _GPT_HINTS, functools.partial(_gpt_variant, ref, idx)
            )
            if hint is None:
                hint = _gpt_block_hint(module, ref, idx, what)
            _fail(
                f"{what} 的 logits 与参考（同样权重的 tc.MiniGPT）不一致（{case}；"
                f"{_where_differs(out, expected)}）。\n可能的原因：{hint}"
            )
    return "2 组配置、1 到 2 层、L = 1 到 context_length、批量 1 到 3"


_embedding_hint = (
    "nn.Embedding 的下标越界时：token 嵌入用 idx 查表，位置嵌入用 "
    "torch.arange(L) 查表；检查 vocab_size 和 context_length 有没有用反。"
)


def _gpt_block_hint(module: nn.Module, ref: nn.Module, idx: Tensor, what: str) -> str:
    """Locate the first block whose output differs, given the reference's input."""
    pairs = dict(_gpt_name_map(ref))
    with torch.no_grad():
        h = ref.tok_emb(idx) + pairs["pos_emb"].weight[: idx.size(1)]
        for i, block in enumerate(ref.blocks):
            mine = module.blocks[i]
            try:
                got = mine(h)
            except Exception:
                return (
                    f"{what}.blocks[{i}] 单独运行时出错："
                    "先用 check_transformer_block 检查块。"
                )
            expected = block(h)
            if not (isinstance(got, Tensor) and _close(got, expected)):
                return (
                    f"{what}.blocks[{i}] 的输出与参考块不一致：先用 "
                    "check_transformer_block 检查你的块类。"
                )
            h = expected
    return (
        "各个块都对，问题在嵌入或最后几步：x = tok_emb(idx) + pos_emb(arange(L))，"
        "逐个过 blocks，再 ln_f，最后 lm_head。"
    )


# ---------------------------------------------------------------------------
# 9. one training step
# ---------------------------------------------------------------------------


class _TinyLM(nn.Module):
    """A small model for the training-step check: ``idx (N, T) -> logits (N, T, V)``."""

    def __init__(self, vocab_size: int = 13, d: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab_size, d)
        self.head = nn.Linear(d, vocab_size)

    def forward(self, idx: Tensor) -> Tensor:
        return self.head(torch.tanh(self.emb(idx)))


class _RecordingSGD(torch.optim.SGD):
    """SGD that writes down when ``zero_grad`` and ``step`` are called."""

    def __init__(self, params, lr: float, events: list[str]) -> None:
        super().__init__(params, lr=lr)
        self.events = events

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.events.append("zero_grad")
        super().zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):  # noqa: ANN001 - torch's signature
        self.events.append("step")
        return super().step(closure)


def _params_close(a: nn.Module, b: nn.Module) -> bool:
    return all(
        _close(p, q, 1e-5, 1e-6)
        for p, q in zip(a.parameters(), b.parameters(), strict=True)
    )


def _lm_loss(model: nn.Module, x: Tensor, y: Tensor, reduction: str = "mean") -> Tensor:
    logits = model(x)
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction=reduction)


def _order_hint(events: list[str]) -> str | None:
    """The ordering mistake in one call's events, if any."""
    if "backward" not in events:
        return "没有调用 loss.backward()：没有梯度，参数不会更新。"
    if "step" not in events:
        return "没有调用 optimizer.step()：梯度算出来了，参数却没有更新。"
    first_backward, last_step = (
        events.index("backward"),
        len(events) - 1 - events[::-1].index("step"),
    )
    if events.index("step") < first_backward:
        return (
            "optimizer.step() 在 loss.backward() 之前：这一步用的是上一次的梯度，"
            "顺序应为 zero_grad → backward → step。"
        )
    if "zero_grad" in events[first_backward:last_step]:
        return (
            "optimizer.zero_grad() 放在了 backward 和 step 之间：梯度刚算出来就被清掉"
            "了。顺序应为 zero_grad → backward → step。"
        )
    return None


@_checker("一步训练")
def check_train_step(fn: Callable) -> str:
    """Grade ``fn(model, optimizer, x, y)``: one optimisation step of a language model.

    ``model(x)`` returns logits ``(N, T, V)`` for ids ``x (N, T)``; the loss is the mean
    cross-entropy over all ``N·T`` positions against ``y (N, T)``; then ``zero_grad``,
    ``backward``, ``step``. ``fn`` returns the loss (before the update) as a Python
    ``float`` (``loss.item()``). Checked over two steps with plain SGD against the same
    step done by the checker on a copy of the model.
    """
    __tracebackhide__ = True
    import copy

    name = _name(fn)
    g = _generator(11)
    V, N, T = 13, 3, 5
    model = _TinyLM(V)
    reference = copy.deepcopy(model)
    events: list[str] = []
    optimizer = _RecordingSGD(model.parameters(), lr=0.5, events=events)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(
            lambda _p: (
                events.append("backward") if events[-1:] != ["backward"] else None
            )
        )
    for step in range(2):
        case = f"第 {step + 1} 步，x 和 y 形状 ({N}, {T})，V = {V}"
        x = torch.randint(V, (N, T), generator=g)
        y = torch.randint(V, (N, T), generator=g)
        events.clear()
        before = copy.deepcopy(model)
        loss = _run(
            fn,
            model,
            optimizer,
            x,
            y,
            what=name,
            case=case,
            first=step == 0,
            hint=_train_crash_hint,
        )
        ref_opt.zero_grad()
        ref_loss = _lm_loss(reference, x, y)
        ref_loss.backward()
        ref_opt.step()
        if isinstance(loss, Tensor):
            _fail(
                f"{name} 应返回 Python float（loss.item()），得到张量 "
                f"{tuple(loss.shape)}：返回张量会把整张计算图留在内存里。"
            )
        if not isinstance(loss, float):
            _fail(f"{name} 应返回损失（float），得到 {type(loss).__name__}。")
        if not math.isclose(loss, ref_loss.item(), rel_tol=1e-5, abs_tol=1e-6):
            with torch.no_grad():
                variants = {
                    "应对所有位置取平均（F.cross_entropy 默认的 reduction='mean'），"
                    "你返回的是求和。": _lm_loss(before, x, y, "sum").item(),
                    "返回的应是这一步更新之前的损失，不是更新后重新算的。": _lm_loss(
                        model, x, y
                    ).item(),
                    "x 和 y 已经错开一位了（y[t] 就是 x[t] 的下一个词元），"
                    "不要再移位：直接对展平的 logits 和 y 算交叉熵。": F.cross_entropy(
                        before(x)[:, :-1].flatten(0, 1), y[:, 1:].flatten()
                    ).item(),
                }
            hint = next(
                (
                    h
                    for h, v in variants.items()
                    if math.isclose(loss, v, rel_tol=1e-5, abs_tol=1e-6)
                ),
                "损失应为 F.cross_entropy(logits.view(-1, V), y.view(-1))。",
            )
            _fail(
                f"{name} 返回的损失不对（{case}）：应为 {ref_loss.item():.6f}，"
                f"得到 {loss:.6f}。{hint}"
            )
        if _params_close(model, reference):
            continue
        hint = _order_hint(events)
        if hint is None and step == 1 and "zero_grad" not in events:
            hint = (
                "第二步的参数不对：梯度在两步之间累积了——忘了 optimizer.zero_grad()"
                "（每步在 backward 之前清零梯度）。"
            )
        if hint is None and _params_close(model, before):
            hint = "调用之后参数没有变化：检查 backward 和 optimizer.step()。"
        _fail(
            f"{name} 之后的参数与参考不一致（{case}）。"
            + (hint or "顺序应为 zero_grad → 前向 → 损失 → backward → step。")
        )
    return "连续两步 SGD：损失的值、参数更新、梯度清零"


_train_crash_hint = (
    "F.cross_entropy 要求类别在第 1 维：把 logits 展平成 (N*T, V)、y 展平成 (N*T,)，"
    "即 F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))。"
)


# ---------------------------------------------------------------------------
# 10. language-model batches
# ---------------------------------------------------------------------------


@_checker("语言模型批次")
def check_lm_batch(fn: Callable) -> str:
    """Grade ``fn(data, batch_size, context_length, generator)`` -> ``(x, y)``.

    ``data`` is a 1-D int64 tensor of token ids. The ``batch_size`` window starts are
    drawn by ``torch.randint(len(data) - context_length, (batch_size,),
    generator=generator)``; ``x[b] = data[i : i+T]``, ``y[b] = data[i+1 : i+T+1]``, both
    int64 ``(batch_size, context_length)``. Compared with
    :func:`transformer_course.lm_batch` using a generator with the same seed.
    """
    __tracebackhide__ = True
    from .data import lm_batch

    name = _name(fn)
    g = _generator(12)
    # (len(data), batch_size, context_length)
    cases = [(40, 4, 8), (10, 3, 9), (25, 5, 1), (30, 2, 7)]
    for i, (n, B, T) in enumerate(cases):
        case = f"len(data)={n}, batch_size={B}, context_length={T}"
        data = torch.randperm(200, generator=g)[:n]  # distinct ids: positions traceable
        seed = 100 + i
        out = _run(
            fn,
            data.clone(),
            B,
            T,
            _generator(seed),
            what=name,
            case=case,
            first=i == 0,
            hint=_batch_crash_hint,
        )
        x, y = _lm_batch_outputs(name, out, B, T, case)
        ref_x, ref_y = lm_batch(data, B, T, generator=_generator(seed))
        if torch.equal(x, ref_x) and torch.equal(y, ref_y):
            continue
        again = _run(fn, data.clone(), B, T, _generator(seed), what=name, case=case)
        if not (isinstance(again, tuple) and torch.equal(again[0], x)):
            _fail(
                f"{name} 用同一个种子的 generator 调用两次，结果却不同（{case}）："
                "没有把 generator 传给 torch.randint（generator=generator）。"
            )
        starts = _window_starts(name, x, data, T, case)
        _check_targets(name, x, y, data, starts, case)
        ref_starts = _window_starts(name, ref_x, data, T, case)
        _fail(
            f"{name} 抽到的起点 {starts} 与约定的抽样 {ref_starts} 不一致（{case}）："
            + _randint_hint(starts, n, T, seed)
        )
    return "4 组 (len(data), batch_size, context_length)，含只有一个可选起点的情形"


def _lm_batch_outputs(
    name: str, out: object, B: int, T: int, case: str
) -> tuple[Tensor, Tensor]:
    """``out`` must be ``(x, y)``: two int64 tensors
    ``(batch_size, context_length)``."""
    __tracebackhide__ = True
    if not (isinstance(out, tuple) and len(out) == 2):
        _fail(
            f"{name} 应返回两个张量 (x, y)，得到 {type(out).__name__}"
            + (f"（{len(out)} 个元素）" if isinstance(out, (tuple, list)) else "")
            + "。"
        )
    x, y = (
        _as_tensor(t, f"{name} 返回的 {n_}", case)
        for t, n_ in zip(out, "xy", strict=True)
    )
    for t, n_ in ((x, "x"), (y, "y")):
        _check_shape(
            t,
            (B, T),
            f"{name} 返回的 {n_}",
            case,
            " 应为 (batch_size, context_length)。",
        )
        if t.dtype != torch.int64:
            _fail(
                f"{name} 返回的 {n_} 应是 torch.long（int64），得到 {t.dtype}："
                "nn.Embedding 和 F.cross_entropy 都要整数 id。"
            )
    return x, y


def _window_starts(name: str, x: Tensor, data: Tensor, T: int, case: str) -> list[int]:
    """Where each row of ``x`` starts in ``data``; each row must be a window of it."""
    __tracebackhide__ = True
    pos = {int(v): j for j, v in enumerate(data)}
    starts = []
    for b in range(x.size(0)):
        j = pos.get(int(x[b, 0]), -1)
        if j < 0 or j + T > len(data) or not torch.equal(x[b], data[j : j + T]):
            _fail(
                f"{name} 返回的 x[{b}] 不是 data 里连续的一段（{case}）："
                "每一行应为 data[i : i + context_length]。"
            )
        starts.append(j)
    return starts


def _check_targets(
    name: str, x: Tensor, y: Tensor, data: Tensor, starts: list[int], case: str
) -> None:
    """Each row of ``y`` is the window of ``x``'s row moved on by one:
    ``data[i+1 : i+1+T]``."""
    __tracebackhide__ = True
    n, T = len(data), y.size(1)
    for b, j in enumerate(starts):
        if torch.equal(y[b], x[b]):
            _fail(
                f"{name} 返回的 y 与 x 相同（{case}）：y 应比 x 错后一位，"
                "y = data[i + 1 : i + 1 + context_length]。"
            )
        if torch.equal(y[b], data[j + 1 : j + 1 + T]):
            continue
        shifted = [k for k in range(n - T + 1) if torch.equal(y[b], data[k : k + T])]
        if shifted and shifted[0] != j + 1:
            _fail(
                f"{name} 返回的 y[{b}] 从 data[{shifted[0]}] 开始，x[{b}] 从 "
                f"data[{j}] 开始（{case}）：y 应正好错后一位，与 x 用同一个"
                "起点 i（y = data[i+1 : i+1+T]），不要为 y 另抽随机数。"
            )
        _fail(
            f"{name} 返回的 y[{b}] 不对（{case}）：应为 data[{j + 1} : {j + 1 + T}]。"
        )


def _randint_hint(starts: list[int], n: int, T: int, seed: int) -> str:
    """Why the drawn ``starts`` differ from the contract's: an off-by-one bound?"""
    for delta, word in ((1, "多"), (-1, "少")):
        high = n - T + delta
        if high > 0:
            alt = torch.randint(high, (len(starts),), generator=_generator(seed))
            if alt.tolist() == starts:
                return (
                    f"torch.randint 的上界应为 len(data) - context_length = {n - T}，"
                    f"你的{word}了 1。"
                )
    return (
        "应写 torch.randint(len(data) - context_length, (batch_size,), "
        "generator=generator)，在其它随机调用之前只抽这一次。"
    )


_batch_crash_hint = (
    "下标越界时：起点 i 最大只能是 len(data) - context_length - 1，"
    "这样 y 的最后一个 data[i + context_length] 仍在范围内。"
)


# ---------------------------------------------------------------------------
# 11. generation
# ---------------------------------------------------------------------------


class _ToyLM(nn.Module):
    """A small random GPT that returns logits ``(N, L, V)`` and refuses inputs longer
    than its context; it records what it was given."""

    def __init__(self, vocab_size: int, context_length: int) -> None:
        super().__init__()
        from .models import GPTConfig, MiniGPT

        cfg = GPTConfig(
            vocab_size=vocab_size,
            context_length=context_length,
            d_model=16,
            num_heads=2,
            num_layers=1,
            dropout=0.0,
        )
        self.gpt = MiniGPT(cfg).eval()
        # logits of std ~1: no near-ties for argmax, yet sampling is far from greedy
        with torch.no_grad():
            self.gpt.lm_head.weight.normal_(0.0, 0.12)
        self.context_length = context_length
        self.calls: list[Tensor] = []

    def logits(self, idx: Tensor) -> Tensor:
        with torch.no_grad():
            return _first(self.gpt(idx))

    def forward(self, idx: Tensor) -> Tensor:
        __tracebackhide__ = True
        if not isinstance(idx, Tensor) or idx.dim() != 2 or idx.is_floating_point():
            _fail(
                f"传给 model 的应是整数 id 张量 (N, L)，得到 "
                f"{tuple(idx.shape) if isinstance(idx, Tensor) else type(idx).__name__}"
                + (f" {idx.dtype}" if isinstance(idx, Tensor) else "")
                + "。"
            )
        if idx.size(1) > self.context_length:
            _fail(
                "模型一次最多看 context_length = "
                f"{self.context_length} 个词元，却收到了 "
                f"{idx.size(1)} 个：每一步先裁剪 idx_cond = idx[:, -context_length:]"
                "，再送进模型。"
            )
        self.calls.append(idx.detach().clone())
        return self.logits(idx)


def _generate_reference(
    model: _ToyLM,
    idx: Tensor,
    steps: int,
    C: int,
    top_k: int | None,
    seed: int | None,
    mistake: str = "",
) -> Tensor:
    """The contract's generation loop (or one typical mistake in it); ``seed`` seeds a
    fresh generator (``None``: greedy)."""
    generator = None if seed is None else _generator(seed)
    for _ in range(steps):
        ctx = {"first": idx[:, :C], "short": idx[:, -(C - 1) :] if C > 1 else idx}.get(
            mistake, idx[:, -C:]
        )
        all_logits = model.logits(ctx)
        logits = all_logits[:, 0] if mistake == "pos0" else all_logits[:, -1]
        if generator is None or mistake == "greedy":
            nxt = logits.argmax(-1, keepdim=True)
        else:
            k = {"k_minus_1": -1, "k_plus_1": 1}.get(mistake, 0)
            if top_k is not None and mistake != "no_top_k":
                kk = max(1, min(top_k + k, logits.size(-1)))
                vals, inds = torch.topk(logits, kk)
                if mistake == "gather":
                    choice = torch.multinomial(
                        torch.softmax(vals, -1), 1, generator=generator
                    )
                    nxt = inds.gather(-1, choice)
                    idx = torch.cat([idx, nxt], dim=1)
                    continue
                logits = logits.masked_fill(logits < vals[:, -1:], -math.inf)
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
        idx = torch.cat([idx, nxt], dim=1)
    return idx


_GENERATE_HINTS = [
    ("取了第一个位置的 logits：应取最后一个位置 logits[:, -1, :]。", "pos0"),
    (
        "裁剪保留的是最前面的 context_length 个词元：应保留最后的 "
        "idx[:, -context_length:]。",
        "first",
    ),
    (
        "裁剪多了一个：应保留最后 context_length 个词元（idx[:, -context_length:]）。",
        "short",
    ),
    ("给了 generator 时应按概率抽样（torch.multinomial），不是取 argmax。", "greedy"),
    (
        "top-k 只保留了 k − 1 个词元：阈值应是第 k 大的值 v[:, [-1]]，"
        "把小于它的（logits < 阈值）设为 -inf。",
        "k_minus_1",
    ),
    (
        "top-k 多保留了一个（k + 1 个）：阈值应是第 k 大的值，torch.topk(logits, k)。",
        "k_plus_1",
    ),
    ("top_k 没有起作用：应只保留最大的 top_k 个 logits，其余设为 -inf。", "no_top_k"),
]


@_checker("自回归生成")
def check_generate(fn: Callable) -> str:
    """Grade ``fn(model, idx, max_new_tokens, context_length, top_k=None,
    generator=None)`` -> ``(N, L + max_new_tokens)``.

    ``model(idx)`` returns logits ``(N, L, V)`` and accepts at most ``context_length``
    tokens. Each step: crop to the last ``context_length`` tokens, take the last
    position's logits; ``generator is None``: greedy argmax; otherwise keep the
    ``top_k`` largest logits (if given; the rest -inf), softmax, and
    ``torch.multinomial(probs, 1, generator=generator)`` (sampling among
    ``torch.topk``'s values and mapping back is accepted too); append. Compared with
    that loop run on the same model with a generator of the same seed.
    """
    __tracebackhide__ = True
    name = _name(fn)
    g = _generator(13)
    V, C = 17, 5
    # (description, idx shape, new tokens, top_k, sample)
    cases = [
        (
            "贪心，idx (3, 3)，生成 6 个（超过 context_length = 5）",
            (3, 3),
            6,
            None,
            False,
        ),
        (
            "贪心，idx (1, 7) 比 context_length = 5 长，生成 3 个",
            (1, 7),
            3,
            None,
            False,
        ),
        ("top_k = 3 抽样，idx (3, 2)，生成 8 个", (3, 2), 8, 3, True),
        ("不限 top_k 抽样，idx (1, 1)，生成 6 个", (1, 1), 6, None, True),
    ]
    model = _ToyLM(V, C)
    for i, (case, shape, steps, top_k, sample) in enumerate(cases):
        idx = torch.randint(V, shape, generator=g)
        seed = 200 + i if sample else None
        # _run hands the learner a copy of idx
        run = functools.partial(_run, fn, model, idx, steps, C, what=name, case=case)
        model.calls.clear()
        out = run(
            first=i == 0, hint=_generate_crash_hint, **_generate_kwargs(top_k, seed)
        )
        out = _generated_tokens(name, out, idx, steps, case)
        gen = functools.partial(_generate_reference, model, idx, steps, C, top_k, seed)
        if torch.equal(out, gen()) or (
            top_k is not None and torch.equal(out, gen("gather"))
        ):
            continue
        if sample:
            model.calls.clear()
            again = run(**_generate_kwargs(top_k, seed))
            if not (isinstance(again, Tensor) and torch.equal(again, out)):
                _fail(
                    f"{name} 用同一个种子的 generator 运行两次，结果却不同（{case}）："
                    "没有把 generator 传给 torch.multinomial（generator=generator）。"
                )
        hint = _generate_hint(out, gen, sample)
        expected = gen()
        bad = tuple((out != expected).nonzero()[0].tolist())
        _fail(
            f"{name} 生成的词元与参考不一致（{case}）：位置 {bad} 应为 "
            f"{int(expected[bad])}，得到 {int(out[bad])}。{hint}"
        )
    return "贪心与抽样（top-k、带种子的 generator），prompt 长于上下文，批量 1 到 3"


def _generate_kwargs(top_k: int | None, seed: int | None) -> dict:
    """The optional arguments of one generation call: ``top_k`` and a fresh
    ``generator`` seeded with ``seed`` (``None``: greedy)."""
    kwargs = {}
    if top_k is not None:
        kwargs["top_k"] = top_k
    if seed is not None:
        kwargs["generator"] = _generator(seed)
    return kwargs


def _generated_tokens(
    name: str, out: object, idx: Tensor, steps: int, case: str
) -> Tensor:
    """``out`` must be int64 ``(N, L + steps)`` and start with the prompt ``idx``."""
    __tracebackhide__ = True
    out = _as_tensor(out, f"{name} 的输出", case)
    N, L = idx.shape
    if tuple(out.shape) == (N, steps):
        _fail(
            f"{name} 只返回了新生成的词元 {tuple(out.shape)}（{case}）："
            f"应返回 prompt 加新词元，形状 (N, L + max_new_tokens) = "
            f"{(N, L + steps)}。"
        )
    _check_shape(
        out,
        (N, L + steps),
        f"{name} 的输出",
        case,
        " 每一步在 dim=1 上拼接一个新词元：torch.cat([idx, next_id], dim=1)。",
    )
    if out.dtype != torch.int64:
        _fail(
            f"{name} 的输出应是 torch.long（int64）的词元 id，得到 {out.dtype}："
            "argmax 和 torch.multinomial 的结果本来就是 long，不要转成浮点。"
        )
    if not torch.equal(out[:, :L], idx):
        _fail(f"{name} 的输出前 {L} 列应原样是输入 idx（{case}）。")
    return out


def _generate_hint(out: Tensor, gen: Callable[[str], Tensor], sample: bool) -> str:
    """The typical mistake that ``out`` reproduces (``gen(mistake)`` generates with
    it), or the recipe."""
    hint = next((h for h, m in _GENERATE_HINTS if torch.equal(out, gen(m))), None)
    if hint is None and not sample:
        hint = (
            "generator 为 None 时应贪心地取 argmax（logits[:, -1, :].argmax"
            "(dim=-1, keepdim=True)），不要抽样。"
        )
    if hint:
        return f"\n可能的原因：{hint}"
    return "\n对照：裁剪 → 取最后位置 logits → top-k → softmax → multinomial。"


_generate_crash_hint = (
    "model(idx) 直接返回 logits (N, L, V)，不是 (logits, loss) 元组；"
    "torch.multinomial 需要非负的概率（先 softmax）。"
)


# ---------------------------------------------------------------------------
# 12. KV cache
# ---------------------------------------------------------------------------


def _call_len(cache: object, what: str, first: bool = False) -> int:
    __tracebackhide__ = True
    n = _run(type(cache).__len__, cache, what=f"{what}.__len__", first=first)
    if not isinstance(n, int) or isinstance(n, bool):
        _fail(
            f"len({what}) 应返回 int，得到 {type(n).__name__}：用 Python 整数"
            "（如 self.k.size(2)，或累加的计数）。"
        )
    return n


@_checker("KV 缓存", wants_class=True)
def check_kv_cache(cls: type) -> str:
    """Grade ``cls()``: a KV cache.

    ``update(k, v)`` takes the new keys and values ``(N, H, T, D)`` (``T`` new
    positions) and returns ``(K_all, V_all)``: everything cached so far, old positions
    first, concatenated along dim -2 (``torch.cat([old, new], dim=-2)``);
    ``len(cache)`` is the number of cached positions (0 when empty). Two caches do not
    share state.
    """
    __tracebackhide__ = True
    name = _name(cls)
    g = _generator(14)
    # (N, H, D, chunk lengths)
    configs = [(2, 3, 4, (1, 1, 3, 2)), (1, 2, 6, (2, 2, 1))]
    first = True
    for N, H, D, chunks in configs:
        cache = _run(cls, what=f"{name}()", first=first)
        other = _run(cls, what=f"{name}()")
        if not hasattr(cache, "update"):
            _fail(f"{name} 缺少方法 update(k, v)。")
        keys: list[Tensor] = []
        values: list[Tensor] = []
        for step, T in enumerate(chunks):
            k, v = _randn(g, N, H, T, D), _randn(g, N, H, T, D)
            keys.append(k)
            values.append(v)
            case = f"(N, H, D) = {(N, H, D)}，第 {step + 1} 次 update，新增 {T} 个位置"
            out = _run(
                cache.update,
                k.clone(),
                v.clone(),
                what=f"{name}.update",
                case=case,
                first=first,
                hint=_cache_crash_hint,
            )
            if first:
                _call_len(cache, name, first=True)
            first = False
            K_all, V_all = _cache_outputs(name, out, case)
            total = sum(chunks[: step + 1])
            for got, n in ((K_all, "K_all"), (V_all, "V_all")):
                _check_cache_shape(name, got, n, (N, H, T, D), total, step + 1, case)
            _check_cache_contents(name, K_all, V_all, keys, values, case)
            _check_cache_len(name, cache, total, step + 1, case)
        if _call_len(other, name) != 0:
            _fail(
                f"另一个新建的 {name}() 的 len 不是 0：两个缓存共享了数据。把 "
                "self.k = None 之类写在 __init__ 里，不要用类属性（class 级别的列表）。"
            )
    return "两种 (N, H, D)，每次新增 1 到 3 个位置，len 与两个缓存互不影响"


def _cache_outputs(name: str, out: object, case: str) -> tuple[Tensor, Tensor]:
    """``update``'s result must be two tensors ``(K_all, V_all)``."""
    __tracebackhide__ = True
    if not (isinstance(out, tuple) and len(out) == 2):
        _fail(
            f"{name}.update 应返回 (K_all, V_all) 两个张量，得到 {type(out).__name__}。"
        )
    K_all, V_all = (
        _as_tensor(t, f"{name}.update 返回的 {n}", case)
        for t, n in zip(out, ("K_all", "V_all"), strict=True)
    )
    return K_all, V_all


def _check_cache_shape(
    name: str,
    got: Tensor,
    what: str,
    chunk: tuple[int, int, int, int],
    total: int,
    updates: int,
    case: str,
) -> None:
    """After ``updates`` calls, ``got`` holds all ``total`` positions:
    ``(N, H, total, D)``."""
    __tracebackhide__ = True
    N, H, _, D = chunk
    expected = (N, H, total, D)
    if tuple(got.shape) != expected:
        hint = _cache_shape_hint(tuple(got.shape), chunk, expected, updates)
        _fail(
            f"{name}.update 返回的 {what} 形状不对（{case}）：应为 "
            f"{expected}，得到 {tuple(got.shape)}。{hint}"
        )


def _check_cache_contents(
    name: str,
    K_all: Tensor,
    V_all: Tensor,
    keys: list[Tensor],
    values: list[Tensor],
    case: str,
) -> None:
    """``(K_all, V_all)`` must be all keys and values so far, oldest first."""
    __tracebackhide__ = True
    exp_k, exp_v = torch.cat(keys, dim=-2), torch.cat(values, dim=-2)
    if torch.equal(K_all, exp_k) and torch.equal(V_all, exp_v):
        return
    if torch.equal(K_all, exp_v) and torch.equal(V_all, exp_k):
        _fail(f"{name}.update 返回的 K 和 V 顺序反了（{case}）：应为 (K_all, V_all)。")
    if len(keys) > 1 and torch.equal(K_all, torch.cat(keys[::-1], dim=-2)):
        _fail(
            f"{name}.update 拼接的顺序反了（{case}）：旧的位置在前、新的在后，"
            "torch.cat([self.k, k], dim=-2)。"
        )
    _fail(
        f"{name}.update 返回的 K_all/V_all 与逐次拼接的结果不一致（{case}）："
        "应为到目前为止所有 k（v）沿 dim=-2 拼接。"
    )


def _check_cache_len(
    name: str, cache: object, total: int, updates: int, case: str
) -> None:
    """``len(cache)`` is the number of cached positions, not of ``update`` calls."""
    __tracebackhide__ = True
    n_len = _call_len(cache, name)
    if n_len != total:
        extra = (
            "：len 应是缓存的位置数（每次新增 T 个的总和），不是 update 的调用次数。"
            if n_len == updates
            else "：len 应是缓存的位置数（dim=-2 的长度）。"
        )
        _fail(f"len({name}) 应为 {total}，得到 {n_len}（{case}）{extra}")


_cache_crash_hint = (
    "torch.cat 报形状不匹配时，多半是拼接的维度不对：应沿时间维 dim=-2"
    "（(N, H, T, D) 的 T）拼接，torch.cat([self.k, k], dim=-2)。"
)


def _cache_shape_hint(got: tuple, chunk: tuple, expected: tuple, updates: int) -> str:
    if got == chunk:
        return "只返回了这一步的 k/v：应返回缓存里全部的（旧的在前，新的在后）。"
    N, H, T_all, D = expected
    for dim, shape in ((0, (N * updates, H)), (1, (N, H * updates))):
        if got[:2] == shape and updates > 1:
            return (
                f"拼接的维度不对：你沿 dim={dim} 拼接了；应沿时间维 dim=-2"
                "（(N, H, T, D) 的 T）拼接。"
            )
    if got[:2] == (N, H) and got[-1] != D:
        return (
            "拼接的维度不对：你沿最后一维拼接了；应沿时间维 dim=-2"
            "（(N, H, T, D) 的 T）拼接。"
        )
    return "应沿时间维 dim=-2 拼接：torch.cat([self.k, k], dim=-2)。"
