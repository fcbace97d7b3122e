"""Multi-head attention: ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` as in
:class:`transformer_course.MultiHeadAttention`."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..attention import MultiHeadAttention
from ..masks import causal_mask
from ._protocol import (
    checker,
    construct,
    fail,
    name_of,
    randn,
    random_mask,
    run_module,
    seeded_generator,
)
from ._report import (
    apply_linear,
    as_tensor,
    check_finite,
    check_float,
    check_shape,
    close,
    diagnose,
    linear_attr,
    where_differs,
)


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
    q, k, v = apply_linear(W_q, Q), apply_linear(W_k, K), apply_linear(W_v, V)

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
    return apply_linear(W_o, out) if out_proj else out


def _mha_reference(
    layers: Sequence[nn.Linear],
    H: int,
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    mask: Tensor | None,
) -> Tensor:
    """The package's :class:`MultiHeadAttention` with the learner's weights."""
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
        return ref(Q, K, V, attn_mask=mask)


_MHA_NAMES = ("q_proj", "k_proj", "v_proj", "out_proj")


@checker("多头注意力", wants_class=True)
def check_multi_head_attention(cls: type) -> str:
    """Grade ``cls(d_model, num_heads)``: multi-head attention.

    The module has four ``nn.Linear(d_model, d_model)`` layers named as in
    :class:`~transformer_course.MultiHeadAttention`: ``q_proj, k_proj, v_proj,
    out_proj``
    (with or without bias); ``forward(Q, K, V, attn_mask=None)`` takes Q ``(N, L, E)``,
    K/V ``(N, S, E)`` and a bool mask ``(L, S)`` (``True`` = may attend) and returns
    ``(N, L, E)`` (or ``(output, weights)``). Compared with the package's
    :class:`~transformer_course.MultiHeadAttention` holding the same weights.
    """
    name = name_of(cls)
    g = seeded_generator(3)
    # (description, d_model, heads, Q, K, V, mask)
    x = randn(g, 3, 5, 12)
    cases = [
        ("d_model=12, 3 个头，自注意力 N=3, L=5，无掩码", 12, 3, x, x, x, None),
        (
            "d_model=12, 3 个头，交叉注意力 N=2, L=4, S=7，无掩码",
            12,
            3,
            randn(g, 2, 4, 12),
            randn(g, 2, 7, 12),
            randn(g, 2, 7, 12),
            None,
        ),
        (
            "d_model=8, 2 个头，自注意力 N=2, L=6，因果掩码 (6, 6)",
            8,
            2,
            *(3 * (randn(g, 2, 6, 8),)),
            causal_mask(6),
        ),
        (
            "d_model=12, 4 个头，交叉注意力 N=2, L=3, S=5，随机掩码 (3, 5)",
            12,
            4,
            randn(g, 2, 3, 12),
            randn(g, 2, 5, 12),
            randn(g, 2, 5, 12),
            random_mask(g, 3, 5),
        ),
    ]
    for i, (case, E, H, Q, K, V, mask) in enumerate(cases):
        what = f"{name}({E}, {H})"
        module = construct(cls, E, H, what=name)
        args = (Q, K, V) if mask is None else (Q, K, V, mask)
        with torch.no_grad():
            hint = ""
            if K.size(1) != Q.size(1):
                hint = (
                    "交叉注意力里 K、V 的长度 S 可以与 Q 的长度 L 不同：拆分 K、V "
                    "的多头时用它们自己的长度（K.size(1)），不要用 Q 的 L。"
                )
            out = run_module(
                module, *args, what=what, case=case, first=i == 0, hint=hint
            )
        if isinstance(out, tuple) and len(out) == 2:
            out = out[0]
        out = as_tensor(out, f"{what} 的输出", case)
        layers = [linear_attr(module, a, E, E, what) for a in _MHA_NAMES]
        with torch.no_grad():
            ref = _mha_reference(layers, H, Q, K, V, mask)
        if tuple(out.shape) == (Q.size(0), H, Q.size(1), E // H):
            fail(
                f"{what} 的输出形状是 {tuple(out.shape)}（{case}）：这是各个头的输出 "
                "(N, H, L, D)，还要合并多头 transpose(1, 2).reshape(N, L, E) 再经过 "
                "out_proj。"
            )
        check_shape(
            out,
            ref.shape,
            f"{what} 的输出",
            case,
            " 多头注意力的输出应与 Q 同形 (N, L, E)。",
        )
        check_float(out, f"{what} 的输出")
        nan_hint = "检查 softmax 之前的分数，是否某一行全被填成了 -inf？"
        if mask is not None and bool(mask.all(-1).any()):
            nan_hint = (
                "NaN 出现在有掩码的情形：掩码整行为 True 的 query 得到了 NaN，"
                "说明被填成 -inf 的恰是「可以看」的位置：掩码方向可能反了"
                "（True = 可以看）：应写 masked_fill(~attn_mask, -inf)。"
            )
        check_finite(out, f"{what} 的输出", case, nan_hint)
        if close(out, ref):
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
                "忘了最后的输出投影：合并多头后还要经过 out_proj。",
                functools.partial(
                    _mha_variant, layers, H, Q, K, V, mask, out_proj=False
                ),
            ),
            (
                "K 和 V 都用 Q 算了：应为 k_proj(K)、v_proj(V)"
                "（交叉注意力里三者不同）。",
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
                    "被屏蔽的位置仍有权重：掩码没有起作用"
                    "（attn_mask 参数被忽略了？）。",
                    functools.partial(_mha_variant, layers, H, Q, K, V, None),
                ),
            ]
        hint = diagnose(out, variants) or (
            "逐步对照：投影 → view(N, T, H, D).transpose(1, 2) → 缩放点积注意力"
            "（除以 √d_k，掩码，softmax(dim=-1)）"
            "→ transpose(1, 2).reshape(N, L, E) → out_proj。"
        )
        fail(
            f"{what} 的输出与参考实现（同样权重的 tc.MultiHeadAttention）不一致"
            f"（{case}；{where_differs(out, ref)}）。\n可能的原因：{hint}"
        )
    return "2 到 4 个头，自注意力与交叉注意力（S ≠ L），因果掩码与随机掩码，共 4 组"
