"""Where dropout goes in the Post-LN encoder layer (chapter 2, the paper's section
5.4): on each sublayer's output, before the residual sum, ``LayerNorm(x +
Dropout(F(x)))``. In evaluation mode dropout is the identity, so only a run in training
mode, with the same random stream for the learner's function and the layer's own
forward, tells the placements apart."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from ..blocks import TransformerBlock
from ._protocol import (
    SEED,
    checker,
    fail,
    name_of,
    randn,
    run_learner,
    seeded_generator,
)
from ._report import as_tensor, check_shape, close, first_reproduced, where_differs

_SHARED_MASK = (
    "两个子层用了同一个 dropout 掩码（只调用一次 layer.drop，结果用了两次）：每个"
    "子层的输出各调用一次 layer.drop，各自随机丢，两个掩码互相独立。"
)

# (hint, mistake): the typical placements of ``layer.drop``, in the order they are tried
_DROPOUT_MISTAKES = [
    ("没有用 layer.drop：每个子层的输出先经过 layer.drop，再加残差。", "none"),
    ("dropout 放在了 LayerNorm 之后：应为 norm(x + drop(F(x)))。", "after_norm"),
    (
        "dropout 作用在残差相加之后的和上：只丢子层的输出，norm(x + drop(F(x)))。",
        "on_sum",
    ),
    (
        "只有自注意力子层用了 dropout：前馈子层的输出也要经过 layer.drop。",
        "attention_only",
    ),
    (
        "只有前馈子层用了 dropout：自注意力子层的输出也要经过 layer.drop。",
        "ffn_only",
    ),
    (
        "dropout 作用在了子层的输入上（drop(X) 送进自注意力、drop(A) 送进前馈）："
        "应丢的是子层的输出，norm(x + drop(F(x)))，子层读的是没丢过的 x。",
        "on_input",
    ),
    (_SHARED_MASK, "shared_mask"),
    (_SHARED_MASK, "shared_mask_first"),
]


class _Layer(TransformerBlock):
    """The checker's layer: calling it whole is refused, the exercise is to use its
    sublayers."""

    def forward(self, *args, **kwargs) -> Tensor:
        fail(
            "不要直接调用 layer(X)（那就是参考答案）：用它的子模块 layer.self_attn、"
            "layer.norm1、layer.ffn、layer.norm2 和 layer.drop 写出两个子层。"
        )


def _dropout_variant(
    layer: _Layer, X: Tensor, mask: Tensor | None, mistake: str
) -> Tensor:
    """What the encoder layer outputs with ``layer.drop`` in one wrong place (the
    caller seeds the random stream first)."""

    def keep(t: Tensor) -> Tensor:  # no dropout on this sublayer
        return t

    drop_attn = layer.drop if mistake == "attention_only" else keep
    drop_ffn = layer.drop if mistake == "ffn_only" else keep
    if mistake in ("none", "attention_only", "ffn_only"):
        A = layer.norm1(X + drop_attn(layer.self_attn(X, X, X, attn_mask=mask)))
        return layer.norm2(A + drop_ffn(layer.ffn(A)))
    if mistake == "after_norm":
        A = layer.drop(layer.norm1(X + layer.self_attn(X, X, X, attn_mask=mask)))
        return layer.drop(layer.norm2(A + layer.ffn(A)))
    if mistake == "on_input":
        Xd = layer.drop(X)
        A = layer.norm1(X + layer.self_attn(Xd, Xd, Xd, attn_mask=mask))
        return layer.norm2(A + layer.ffn(layer.drop(A)))
    if mistake in ("shared_mask", "shared_mask_first"):
        # one mask (times 1/(1-p)) for both, drawn before or after the attention's own
        # dropout has used the random stream
        first = mistake == "shared_mask_first"
        early = layer.drop(torch.ones_like(X)) if first else None
        attended = layer.self_attn(X, X, X, attn_mask=mask)
        scale = layer.drop(torch.ones_like(attended)) if early is None else early
        A = layer.norm1(X + attended * scale)
        return layer.norm2(A + layer.ffn(A) * scale)
    if mistake == "on_sum":
        A = layer.norm1(layer.drop(X + layer.self_attn(X, X, X, attn_mask=mask)))
        return layer.norm2(layer.drop(A + layer.ffn(A)))
    raise ValueError(f"unknown dropout mistake {mistake!r}")


@checker("编码器层的 dropout 位置（训练模式）")
def check_encoder_dropout(fn) -> str:
    """Grade ``fn(layer, X, attn_mask=None)`` in training mode (dropout 0.5): with the
    same random stream, its output must equal the layer's own forward element by
    element, i.e. ``layer.drop`` wraps each sublayer's output before the residual
    sum. ``layer`` is a Post-LN :class:`~transformer_course.TransformerBlock`."""
    name = name_of(fn)
    g = seeded_generator(31)
    torch.manual_seed(SEED + 31)  # the layer's initial weights
    layer = _Layer(16, 4, 32, dropout=0.5, norm_first=False).train()
    X = randn(g, 2, 6, 16)
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[1, ..., 4:] = False  # the second sequence ends in two padding positions
    case = "训练模式，dropout=0.5，d_model=16，4 个头，第二句末尾两个填充位置"
    what = f"{name}(layer, X, attn_mask)"

    def same_stream(f):
        torch.manual_seed(SEED + 32)  # every run draws the same dropout masks
        with torch.no_grad():
            return f()

    dropped: list[Tensor] = []  # what the learner's code hands to layer.drop
    hook = layer.drop.register_forward_hook(
        lambda module, args, result: dropped.append(args[0].detach().clone())
    )
    try:
        out = same_stream(
            lambda: run_learner(fn, layer, X, mask, what=what, case=case, first=True)
        )
    finally:
        hook.remove()
    out = as_tensor(out, f"{what} 的输出", case)
    check_shape(out, tuple(X.shape), f"{what} 的输出", case)
    ref = same_stream(lambda: TransformerBlock.forward(layer, X, attn_mask=mask))
    if close(out, ref):
        return "训练模式下与 layer(X) 逐元素相同"
    hint = first_reproduced(
        out,
        _DROPOUT_MISTAKES,
        lambda mistake: same_stream(
            functools.partial(_dropout_variant, layer, X, mask, mistake)
        ),
    )
    if hint is None and any(torch.equal(t, X) for t in dropped):
        # X itself went through layer.drop, however often: a sublayer's input dropped
        hint = next(h for h, m in _DROPOUT_MISTAKES if m == "on_input")
    if hint is None and len(dropped) > 2:
        hint = (
            f"layer.drop 调用了 {len(dropped)} 次：每个子层的输出各丢一次，一共两次，"
            "norm(x + drop(F(x)))；同一个张量不要丢两遍。"
        )
    fail(
        f"{what} 在训练模式下与 layer(X) 不同（{case}；{where_differs(out, ref)}）。\n"
        "可能的原因："
        + (
            hint
            or "检查 layer.drop 的位置和次数：每个子层的输出各一次，在加残差之前，"
            "norm(x + drop(F(x)))。若评估模式的检查也没通过，先改好公式。"
        )
    )
