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

Every checker ``check_xxx(candidate, *, solution=False)`` compares the candidate with
the package's own implementation (or with a reference computed from the candidate's own
weights) on several random inputs: several shapes, batch > 1, masks, odd lengths. The
inputs come from a local ``torch.Generator`` and the global RNG state of the notebook is
restored afterwards, so a check is deterministic and changes nothing around it. Then:

* right: prints one line starting with ``✓`` and returns ``True``;
* wrong: raises :class:`ExerciseError` (an ``AssertionError``) whose message says in
  Chinese what is wrong, with the shapes/values involved, and the likely mistake,
  diagnosed from the symptom (missing scale, softmax on the wrong axis, inverted mask,
  ...);
* still a skeleton (returns ``None`` or raises ``NotImplementedError``; for a class:
  construction raises it, or ``forward`` returns ``None``): prints
  ``尚未实现：…（写好后重新运行本单元格）`` and returns ``False`` without raising, so a
  notebook runs through with the skeletons in place. With ``solution=True`` a skeleton
  raises instead.

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


def _checker(title: str) -> Callable:
    """Turn ``body(candidate) -> detail`` into a checker with the common protocol."""

    def decorate(body: Callable[[object], str]) -> Callable[..., bool]:
        @functools.wraps(body)
        def check(candidate: object, *, solution: bool = False) -> bool:
            __tracebackhide__ = True  # IPython and pytest hide this frame
            name = _name(candidate)
            if not callable(candidate):
                raise ExerciseError(
                    f"{title}：要检查的应是一个函数或类，得到的是 "
                    f"{type(candidate).__name__}（{candidate!r:.60}）。"
                    "把函数/类本身传进来，不要先调用它。"
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
                return False
            print(f"✓ {title}：{name} 通过（{detail}）")
            return True

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


def _shape(x: object) -> str:
    if isinstance(x, Tensor):
        return str(tuple(x.shape))
    return type(x).__name__


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
    _fail(f"{what} 应返回 torch.Tensor{where}，得到的是 {kind}：{hint}。")
    return out  # unreachable


def _check_shape(
    t: Tensor, expected: Sequence[int], what: str, case: str = "", hint: str = ""
) -> None:
    __tracebackhide__ = True
    expected = tuple(expected)
    if tuple(t.shape) != expected:
        where = f"（{case}）" if case else ""
        _fail(
            f"{what} 的形状不对{where}：应为 {expected}，得到 {tuple(t.shape)}。"
            + (hint or "")
        )


def _check_float(t: Tensor, what: str) -> None:
    __tracebackhide__ = True
    if not t.is_floating_point():
        _fail(
            f"{what} 应是浮点张量，得到 dtype {t.dtype}：计算中是否用了整数张量"
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


def _check_nan(t: Tensor, what: str, case: str, hint: str = "") -> None:
    __tracebackhide__ = True
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        _fail(f"{what} 含 NaN 或 inf（{case}：{bad} 个元素）。" + hint)


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


@_checker("缩放点积注意力")
def check_self_attention(fn: Callable) -> str:
    """Grade ``fn(Q, K, V, mask=None)``: scaled dot-product attention.

    Q ``(..., L, D)``, K and V ``(..., S, D)`` (3-D and 4-D inputs); ``mask`` is bool,
    broadcastable to ``(..., L, S)``, ``True`` = may attend. ``fn`` returns the output
    ``(..., L, D)`` or ``(output, weights)`` with weights ``(..., L, S)``. Compared with
    :func:`transformer_course.scaled_dot_product_attention`.
    """
    __tracebackhide__ = True
    g = _generator(1)
    # (description, Q, K, V, mask)
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
    for i, (case, Q, K, V, mask) in enumerate(cases):
        args = (Q, K, V) if mask is None else (Q, K, V, mask)
        hint = ""
        if Q.dim() == 4:
            hint = (
                "4 维输入 (N, H, L, D) 也要能算：转置 K 用 K.transpose(-2, -1)，"
                "不要写死维度编号（K.transpose(1, 2)、K.T 只适合特定维数）。"
            )
        out = _run(fn, *args, what=_name(fn), case=case, first=i == 0, hint=hint)
        weights = None
        if isinstance(out, tuple):
            if len(out) != 2:
                _fail(
                    f"{_name(fn)} 返回了 {len(out)} 个值的元组：应返回输出，或 "
                    "(输出, 权重) 两个值。"
                )
            out, weights = out
        ref_out, ref_w = scaled_dot_product_attention(Q, K, V, mask)
        out = _as_tensor(out, f"{_name(fn)} 的输出", case)
        if weights is not None:
            weights = _as_tensor(weights, f"{_name(fn)} 返回的权重", case)
            if tuple(out.shape) == tuple(ref_w.shape) != tuple(ref_out.shape) and tuple(
                weights.shape
            ) == tuple(ref_out.shape):
                _fail(
                    f"{_name(fn)} 返回值的顺序反了（{case}）：应为 (输出, 权重)，"
                    f"输出 {tuple(ref_out.shape)}、权重 {tuple(ref_w.shape)}。"
                )
        if tuple(out.shape) == tuple(ref_w.shape) != tuple(ref_out.shape):
            _fail(
                f"{_name(fn)} 的输出形状是 {tuple(out.shape)}，这是权重 (…, L, S) "
                f"的形状（{case}）：别忘了用权重对 V 加权求和（weights @ V），"
                f"输出应为 {tuple(ref_out.shape)}。"
            )
        _check_shape(
            out,
            ref_out.shape,
            f"{_name(fn)} 的输出",
            case,
            " Q 是 (…, L, D)、K/V 是 (…, S, D)，输出应为 (…, L, D)。",
        )
        _check_float(out, f"{_name(fn)} 的输出")
        if weights is not None:
            _check_attention_weights(fn, weights, ref_w, mask, case)
        if not bool(torch.isfinite(out).all()):
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
        if _close(out, ref_out):
            if weights is not None and not _close(weights, ref_w):
                _fail(
                    f"{_name(fn)} 的输出正确，返回的权重却与参考不一致（{case}；"
                    f"{_where_differs(weights, ref_w)}）：返回的应是乘 V 的那个权重。"
                )
            continue
        d = Q.size(-1)
        variants = [
            (
                f"输出差了一个缩放：分数没有除以 √d_k（这里 d_k = {d}，应乘 1/√{d}）。",
                functools.partial(_attention_variant, Q, K, V, mask, scale="none"),
            ),
            (
                f"分数除以了 d_k = {d}，应除以 √d_k = {math.sqrt(d):.3g}。",
                functools.partial(_attention_variant, Q, K, V, mask, scale="d"),
            ),
            (
                "权重在 key 维度上之和不是 1：softmax 的 dim 可能写错了"
                "（应在最后一维 dim=-1，即 key 维度上归一化）。",
                functools.partial(_attention_variant, Q, K, V, mask, dim=-2),
            ),
            (
                "用权重加权求和的应是 V，不是 K（weights @ V）。",
                functools.partial(_attention_variant, Q, K, V, mask, value="K"),
            ),
        ]
        if mask is not None:
            variants += [
                (
                    "被屏蔽的位置仍有权重：掩码方向可能反了（True = 可以看），"
                    "应写 scores.masked_fill(~mask, float('-inf'))。",
                    functools.partial(
                        _attention_variant, Q, K, V, mask, masking="inverted"
                    ),
                ),
                (
                    "被屏蔽的位置仍有权重：掩码没有起作用（mask 参数被忽略了？）。",
                    functools.partial(_attention_variant, Q, K, V, None),
                ),
                (
                    "被屏蔽的位置仍有权重：屏蔽时把分数填成了 0，应填 -inf"
                    "（分数为 0 的位置经 softmax 后仍有权重）。",
                    functools.partial(
                        _attention_variant, Q, K, V, mask, masking="zero"
                    ),
                ),
                (
                    "softmax 之后才乘掩码：被屏蔽位置的权重虽为 0，每行之和却不再是 1。"
                    "应在 softmax 之前把被屏蔽的分数填成 -inf。",
                    functools.partial(
                        _attention_variant, Q, K, V, mask, masking="after"
                    ),
                ),
            ]
        hint = _diagnose(out, variants)
        if hint is None:
            hint = (
                "逐步对照：scores = Q @ K.transpose(-2, -1) / √d_k → "
                "masked_fill(~mask, -inf) → softmax(dim=-1) → weights @ V。"
            )
        _fail(
            f"{_name(fn)} 的输出与参考实现不一致（{case}；"
            f"{_where_differs(out, ref_out)}）。\n可能的原因：{hint}"
        )
    return "3 维和 4 维输入、批量 > 1、L ≠ S、因果掩码与随机掩码，共 5 组"


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
            _fail(
                f"被屏蔽的位置仍有权重（{case}）：例如位置 {idx} 的掩码为 False，"
                f"权重却是 {weights[idx].item():.3g}。"
                "掩码方向可能反了（True = 可以看），"
                "或者屏蔽没有在 softmax 之前把分数填成 -inf。"
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
        return ref(Q, K, V, attn_mask=mask)[0]


_MHA_NAMES = ("W_q", "W_k", "W_v", "W_o")


@_checker("多头注意力")
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
            out = _forward(module, *args, what=what, case=case, first=i == 0)
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
        _check_nan(
            out,
            f"{what} 的输出",
            case,
            "若只在有掩码时出现：掩码方向可能反了（True = 可以看）。",
        )
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


@_checker("层归一化")
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
        hint = _diagnose(
            out,
            [(h, functools.partial(_pe_variant, max_len, d, m)) for h, m in variants],
            1e-4,
            1e-4,
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
