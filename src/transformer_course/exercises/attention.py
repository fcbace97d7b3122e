"""Scaled dot-product attention (``my_self_attention``) and the causal mask."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from torch import Tensor

from ..attention import scaled_dot_product_attention
from ..masks import causal_mask
from ._protocol import (
    checker,
    fail,
    name_of,
    randn,
    random_mask,
    run_learner,
    seeded_generator,
)
from ._report import (
    as_tensor,
    check_float,
    check_shape,
    close,
    diagnose,
    where_differs,
)


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


def _attention_cases(
    g: torch.Generator,
) -> list[tuple[str, Tensor, Tensor, Tensor, Tensor | None]]:
    """The self-attention checks: ``(description, Q, K, V, mask)``."""
    cases = [
        (
            "3 维输入 N=2, L=5, S=7, D=8，无掩码",
            randn(g, 2, 5, 8),
            randn(g, 2, 7, 8),
            randn(g, 2, 7, 8),
            None,
        ),
        (
            "4 维输入 N=2, H=3, L=4, S=5, D=6，无掩码",
            randn(g, 2, 3, 4, 6),
            randn(g, 2, 3, 5, 6),
            randn(g, 2, 3, 5, 6),
            None,
        ),
        ("自注意力 N=3, L=S=5，因果掩码 (5, 5)", None, None, None, causal_mask(5)),
        (
            "N=2, L=3, S=7，随机掩码 (2, 3, 7)",
            randn(g, 2, 3, 8),
            randn(g, 2, 7, 8),
            randn(g, 2, 7, 8),
            random_mask(g, 2, 3, 7),
        ),
        (
            "4 维输入，掩码 (2, 1, 4, 5) 在头维上广播",
            randn(g, 2, 3, 4, 6),
            randn(g, 2, 3, 5, 6),
            randn(g, 2, 3, 5, 6),
            random_mask(g, 2, 1, 4, 5),
        ),
    ]
    x = randn(g, 3, 5, 8)
    cases[2] = (cases[2][0], x, x, x, cases[2][4])
    return cases


_FOUR_D_HINT = (
    "4 维输入 (N, H, L, D) 也要能算：转置 K 用 K.transpose(-2, -1)，"
    "不要写死维度编号（K.transpose(1, 2)、K.T 只适合特定维数）。"
)


@checker("缩放点积注意力")
def check_self_attention(fn: Callable) -> str:
    """Grade ``fn(Q, K, V, attn_mask=None)``: scaled dot-product attention.

    Q ``(..., L, D)``, K and V ``(..., S, D)`` (3-D and 4-D inputs); ``mask`` is bool,
    broadcastable to ``(..., L, S)``, ``True`` = may attend. ``fn`` returns the output
    ``(..., L, D)`` or ``(output, weights)`` with weights ``(..., L, S)``. Compared with
    :func:`transformer_course.scaled_dot_product_attention`.
    """
    name = name_of(fn)
    for i, (case, Q, K, V, mask) in enumerate(_attention_cases(seeded_generator(1))):
        args = (Q, K, V) if mask is None else (Q, K, V, mask)
        hint = _FOUR_D_HINT if Q.dim() == 4 else ""
        out = run_learner(fn, *args, what=name, case=case, first=i == 0, hint=hint)
        ref_out, ref_w = scaled_dot_product_attention(Q, K, V, mask)
        out, weights = _attention_outputs(fn, out, ref_out, ref_w, case)
        _check_attention_output_shape(fn, out, ref_out, ref_w, case)
        if weights is not None:
            _check_attention_weights(fn, weights, ref_w, mask, case)
        _check_attention_finite(fn, out, mask, case)
        if not close(out, ref_out):
            fail(
                f"{name} 的输出与参考实现不一致（{case}；"
                f"{where_differs(out, ref_out)}）。\n可能的原因："
                f"{_attention_hint(out, Q, K, V, mask)}"
            )
        if weights is not None and not close(weights, ref_w):
            fail(
                f"{name} 的输出正确，返回的权重却与参考不一致（{case}；"
                f"{where_differs(weights, ref_w)}）：返回的应是乘 V 的那个权重。"
            )
    return "3 维和 4 维输入、批量 > 1、L ≠ S、因果掩码与随机掩码，共 5 组"


def _attention_outputs(
    fn: Callable, out: object, ref_out: Tensor, ref_w: Tensor, case: str
) -> tuple[Tensor, Tensor | None]:
    """``fn``'s result as ``(output, weights or None)``; a swapped pair is a mistake."""
    name = name_of(fn)
    weights = None
    if isinstance(out, tuple):
        if len(out) != 2:
            fail(
                f"{name} 返回了 {len(out)} 个值的元组：应返回输出，或 "
                "(输出, 权重) 两个值。"
            )
        out, weights = out
    out = as_tensor(out, f"{name} 的输出", case)
    if weights is None:
        return out, None
    weights = as_tensor(weights, f"{name} 返回的权重", case)
    if tuple(out.shape) == tuple(ref_w.shape) != tuple(ref_out.shape) and tuple(
        weights.shape
    ) == tuple(ref_out.shape):
        fail(
            f"{name} 返回值的顺序反了（{case}）：应为 (输出, 权重)，"
            f"输出 {tuple(ref_out.shape)}、权重 {tuple(ref_w.shape)}。"
        )
    return out, weights


def _check_attention_output_shape(
    fn: Callable, out: Tensor, ref_out: Tensor, ref_w: Tensor, case: str
) -> None:
    """The output is ``(…, L, D)`` floats; ``(…, L, S)`` means ``weights @ V`` is
    missing."""
    name = name_of(fn)
    if tuple(out.shape) == tuple(ref_w.shape) != tuple(ref_out.shape):
        fail(
            f"{name} 的输出形状是 {tuple(out.shape)}，这是权重 (…, L, S) "
            f"的形状（{case}）：别忘了用权重对 V 加权求和（weights @ V），"
            f"输出应为 {tuple(ref_out.shape)}。"
        )
    check_shape(
        out,
        ref_out.shape,
        f"{name} 的输出",
        case,
        " Q 是 (…, L, D)、K/V 是 (…, S, D)，输出应为 (…, L, D)。",
    )
    check_float(out, f"{name} 的输出")


def _check_attention_finite(
    fn: Callable, out: Tensor, mask: Tensor | None, case: str
) -> None:
    """NaN in the output; NaN in rows that may see everything means an inverted
    mask."""
    if bool(torch.isfinite(out).all()):
        return
    if mask is not None and bool(mask.all(-1).any()):
        fail(
            f"{name_of(fn)} 的输出含 NaN（{case}）：NaN 出现在掩码整行为 True"
            "（全都可以看）的 query 上，说明填成 -inf 的恰是「可以看」的位置："
            "掩码方向可能反了（True = 可以看）：应写 masked_fill(~attn_mask, -inf)。"
        )
    fail(
        f"{name_of(fn)} 的输出含 NaN 或 inf（{case}）：检查 softmax 之前的"
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
                "应写 scores.masked_fill(~attn_mask, float('-inf'))。",
                functools.partial(variant, masking="inverted"),
            ),
            (
                "被屏蔽的位置仍有权重：掩码没有起作用（attn_mask 参数被忽略了？）。",
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
    return diagnose(out, variants) or (
        "逐步对照：scores = Q @ K.transpose(-2, -1) / √d_k → "
        "masked_fill(~attn_mask, -inf) → softmax(dim=-1) → weights @ V。"
    )


def _check_attention_weights(
    fn: Callable, weights: Tensor, ref_w: Tensor, mask: Tensor | None, case: str
) -> None:
    name = name_of(fn)
    check_shape(
        weights,
        ref_w.shape,
        f"{name} 返回的权重",
        case,
        " 权重应为 (…, L, S)：每个 query 对每个 key 一个权重。",
    )
    check_float(weights, f"{name} 返回的权重")
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
                    "掩码方向可能反了（True = 可以看）："
                    "应写 masked_fill(~attn_mask, -inf)。"
                )
            else:
                why = (
                    "屏蔽没有生效：应在 softmax 之前把掩码为 False 的分数填成 -inf"
                    "（填 0 不行，0 分经 softmax 后仍有权重）。"
                )
            fail(
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
        fail(
            f"权重在 key 维度上之和不是 1（{case}）：每个 query 的权重之和应为 1，"
            f"得到例如 {sums.flatten()[0].item():.4g}。{hint}。"
        )


# causal mask


@checker("因果掩码")
def check_causal_mask(fn: Callable) -> str:
    """Grade ``fn(L)``: a bool ``(L, L)`` mask, ``True`` on and below the diagonal
    (query ``i`` may see keys ``0..i``). Compared with
    :func:`transformer_course.causal_mask`."""
    name = name_of(fn)
    for i, L in enumerate((5, 1, 2, 8)):
        case = f"L = {L}"
        out = as_tensor(
            run_learner(fn, L, what=name, case=case, first=i == 0), name, case
        )
        check_shape(out, (L, L), name, case)
        ref = causal_mask(L)
        if out.dtype != torch.bool:
            same = out.shape == ref.shape and bool(((out != 0) == ref).all())
            fail(
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
        fail(
            f"{name}({L}) 不对：位置 {bad} 应为 {bool(ref[bad])}，"
            f"得到 {bool(out[bad])}。" + (hint or "应为对角线及其下方为 True。")
        )
    return "L = 1, 2, 5, 8"
