"""An encoder layer written from its equations (chapter 2):
``A = LayerNorm(X + MultiHead(X, X, X))``, ``out = LayerNorm(A + FFN(A))``, with the
sublayers of a Post-LN :class:`transformer_course.TransformerBlock` (``self_attn``,
``norm1``, ``ffn``, ``norm2``)."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from ..blocks import TransformerBlock
from ._protocol import checker, fail, name_of, randn, run_learner, seeded_generator
from ._report import (
    as_tensor,
    check_finite,
    check_float,
    check_shape,
    close,
    first_reproduced,
    where_differs,
)

# (hint, mistake): the typical mistakes, in the order they are tried
_MISTAKES = [
    (
        "写成了前归一化（Pre-LN，X + F(LayerNorm(X))）：本题是原始论文的后归一化，"
        "先残差相加，再 LayerNorm：LayerNorm(X + F(X))。",
        "pre_ln",
    ),
    (
        "自注意力子层少了残差：应为 norm1(X + self_attn(X, X, X))，不是 "
        "norm1(self_attn(X, X, X))。",
        "no_residual_attn",
    ),
    (
        "前馈子层少了残差：应为 norm2(A + ffn(A))，不是 norm2(ffn(A))。",
        "no_residual_ffn",
    ),
    (
        "残差加在了归一化之后（X + LayerNorm(F(X))）：后归一化是先相加，"
        "再对和做 LayerNorm。",
        "norm_branch",
    ),
    ("两个归一化用反了：自注意力之后是 norm1，前馈网络之后是 norm2。", "swapped_norms"),
    ("两个子层都用了 norm1：前馈子层之后是 norm2，norm2(A + ffn(A))。", "norm1_twice"),
    (
        "前馈网络的输入用了层输入 X：第二个子层的输入是第一个子层的输出 A，"
        "即 norm2(A + ffn(A))。",
        "ffn_on_x",
    ),
    (
        "前馈子层的残差加的是层输入 X：norm2(X + ffn(A)) 跳过了第一个子层。"
        "残差应加第二个子层自己的输入 A：norm2(A + ffn(A))。",
        "ffn_residual_x",
    ),
    (
        "掩码没有传给自注意力：应写 self_attn(X, X, X, attn_mask=attn_mask)。",
        "mask_ignored",
    ),
    (
        "编码器用了因果掩码：编码器不是因果的，每个源位置都可以看整句源句（双向），"
        "只屏蔽填充：self_attn(X, X, X, attn_mask=attn_mask)，不要 is_causal=True "
        "或 causal_mask（因果掩码只属于解码器的自注意力）。",
        "causal",
    ),
    (
        "掩码取反了：attn_mask 里 True = 可以看，直接把它传给 self_attn，不要写 "
        "~attn_mask。",
        "mask_inverted",
    ),
]


class _Layer(TransformerBlock):
    """The checker's layer: calling it whole is refused, the exercise is to use its
    sublayers."""

    def forward(self, *args, **kwargs) -> Tensor:
        fail(
            "不要直接调用 layer(X)（那就是参考答案）：用它的子模块 layer.self_attn、"
            "layer.norm1、layer.ffn、layer.norm2 按公式写出两个子层。"
        )


def _reference(layer: _Layer, X: Tensor, mask: Tensor | None) -> Tensor:
    return TransformerBlock.forward(layer, X, attn_mask=mask)


def _encoder_variant(
    layer: _Layer, X: Tensor, mask: Tensor | None, mistake: str
) -> Tensor:
    """What an encoder layer with one typical mistake outputs."""
    attn, ffn = layer.self_attn, layer.ffn
    n1, n2 = layer.norm1, layer.norm2
    if mistake == "swapped_norms":
        n1, n2 = n2, n1
    if mistake == "norm1_twice":
        n2 = n1
    if mistake == "mask_ignored":
        mask = None
    elif mistake == "mask_inverted":
        if mask is None:
            raise ValueError("no mask to invert")  # this case cannot show the mistake
        mask = ~mask

    def sa(x: Tensor) -> Tensor:
        return attn(x, x, x, attn_mask=mask, is_causal=mistake == "causal")

    if mistake == "pre_ln":
        A = X + sa(n1(X))
        return A + ffn(n2(A))
    if mistake == "norm_branch":
        A = X + n1(sa(X))
        return A + n2(ffn(A))
    A = n1(sa(X)) if mistake == "no_residual_attn" else n1(X + sa(X))
    if mistake == "no_residual_ffn":
        return n2(ffn(A))
    ffn_in = X if mistake == "ffn_on_x" else A
    residual = X if mistake == "ffn_residual_x" else A
    return n2(residual + ffn(ffn_in))


def _random_layer(g: torch.Generator, E: int, H: int, d_ff: int) -> _Layer:
    """A Post-LN encoder layer whose norms have distinct, non-trivial γ and β (so that
    swapping them, or leaving one out, changes the output)."""
    layer = _Layer(E, H, d_ff, dropout=0.0, norm_first=False).eval()
    with torch.no_grad():
        for norm in (layer.norm1, layer.norm2):
            norm.weight.copy_(1.0 + 0.5 * randn(g, E))
            norm.bias.copy_(0.5 * randn(g, E))
    return layer


@checker("编码器层（后归一化）")
def check_encoder_layer(fn) -> str:
    """Grade ``fn(layer, X, attn_mask=None)``: the Post-LN encoder layer computed from
    the sublayers of ``layer`` (a :class:`~transformer_course.TransformerBlock` with
    ``norm_first=False``); ``X (N, m, d_model)``, ``attn_mask`` a bool key-padding mask
    ``(N, 1, 1, m)`` (True = may attend) or None. Compared with the layer's own
    forward."""
    name = name_of(fn)
    g = seeded_generator(41)
    pad = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    pad[1, ..., 4:] = False  # the second sequence ends in two padding positions
    # (description, d_model, heads, d_ff, X, mask)
    cases = [
        ("d_model=16, 4 个头, d_ff=32, N=2, m=5，无掩码", 16, 4, 32,
         randn(g, 2, 5, 16), None),
        ("d_model=8, 2 个头, d_ff=24, N=2, m=6，第二句末尾两个填充位置", 8, 2, 24,
         randn(g, 2, 6, 8), pad),
    ]  # fmt: skip
    for i, (case, E, H, d_ff, X, mask) in enumerate(cases):
        layer = _random_layer(g, E, H, d_ff)
        what = f"{name}(layer, X" + (", attn_mask)" if mask is not None else ")")
        args = (layer, X) if mask is None else (layer, X, mask)
        with torch.no_grad():
            out = run_learner(fn, *args, what=what, case=case, first=i == 0)
        out = as_tensor(out, f"{what} 的输出", case)
        check_shape(
            out, tuple(X.shape), f"{what} 的输出", case,
            " 编码器层不改变形状：输出与 X 同形 (N, m, d_model)。",
        )  # fmt: skip
        check_float(out, f"{what} 的输出")
        check_finite(out, f"{what} 的输出", case)
        with torch.no_grad():
            ref = _reference(layer, X, mask)
            if close(out, ref):
                continue
            hint = first_reproduced(
                out, _MISTAKES, functools.partial(_encoder_variant, layer, X, mask)
            )
        fail(
            f"{what} 与编码器层的公式不一致（{case}；{where_differs(out, ref)}）。\n"
            "可能的原因："
            + (
                hint
                or "逐行对照公式：A = norm1(X + self_attn(X, X, X, attn_mask=...))，"
                "输出 = norm2(A + ffn(A))。"
            )
        )
    return (
        "评估模式（dropout 不起作用），无掩码与填充掩码 2 组；dropout 放的位置"
        "这里不检查，由下一行 check_encoder_dropout 在训练模式下检查"
    )
