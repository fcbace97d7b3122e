"""Reading a trained model's attention weights (chapter 4, exercise 4.3): the weight
each head puts on the next position, the direct evidence of what a model without a
causal mask reads. The page passes its two trained models and their batch."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..notebook import record_attention
from ._protocol import checker, fail, name_of, run_learner
from .numeric_answers import refuse_wrong_answer

__all__ = ["check_weight_on_next"]


def _first_layer_weights(model: nn.Module, x: Tensor) -> Tensor:
    """The first layer's attention weights ``(N, H, L, L)`` on ``x``."""
    with torch.no_grad(), record_attention(model) as maps:
        model(x)
    return maps[model.layers[0].self_attn]


def _check_context(*, masked: object, unmasked: object, x: object) -> None:
    """TypeError / ValueError for models and a batch the checker cannot use."""
    for what, model in (("masked", masked), ("unmasked", unmasked)):
        if not isinstance(model, nn.Module) or not hasattr(model, "layers"):
            raise TypeError(
                f"{what} must be a model with .layers (the page's trained "
                f"TinyTransformer), got {type(model).__name__}"
            )
    if not isinstance(x, Tensor) or x.dim() != 2 or x.dtype != torch.long:
        raise TypeError(
            f"x must be a LongTensor (N, L) of token ids, got {type(x).__name__}"
            f"{tuple(x.shape) if isinstance(x, Tensor) else ''}"
        )
    if x.size(1) < 2:
        raise ValueError(
            f"x must have at least 2 positions, got shape {tuple(x.shape)}"
        )


@checker("放给下一个位置的权重", validate=_check_context)
def check_weight_on_next(
    fn, *, masked: nn.Module, unmasked: nn.Module, x: Tensor
) -> str:
    """Grade ``fn(model, x) -> (H,)``: each head's weight from query ``i`` on key
    ``i + 1`` in ``model``'s first layer, averaged over the samples and
    ``i = 0 … L − 2``; on the page's model with the causal mask (``masked``) and the
    one without (``unmasked``), both trained on the batch ``x``."""
    name = name_of(fn)
    models = (masked, unmasked)
    answers = [
        run_learner(fn, model, x, what=name, case=case, first=i == 0)
        for i, (model, case) in enumerate(
            zip(models, ("有掩码的模型", "无掩码的模型"), strict=True)
        )
    ]
    weights = [_first_layer_weights(model, x) for model in models]
    expected = [
        w.diagonal(offset=1, dim1=-2, dim2=-1).mean(dim=(0, 2)) for w in weights
    ]
    H = expected[0].numel()
    for a in answers:
        if not isinstance(a, Tensor):
            fail(
                "练习 4.3：my_weight_on_next 应返回 torch.Tensor，"
                f"收到 {type(a).__name__}：直接返回张量，"
                "不要转成列表或 numpy。"
            )
        if tuple(a.shape) != (H,):
            fail(
                f"练习 4.3：my_weight_on_next 应返回形状 ({H},) 的张量，每个头一个数；"
                f"收到形状 {tuple(a.shape)}：对样本维和查询位置 i "
                "都要求平均，只留下头的维度。"
            )
    N, L = x.shape
    diag = [w.diagonal(offset=-1, dim1=-2, dim2=-1) for w in weights]
    nxt = [w.diagonal(offset=1, dim1=-2, dim2=-1) for w in weights]  # (N, H, L − 1)
    refuse_wrong_answer(
        torch.stack([a.detach() for a in answers]),
        torch.stack(expected),
        what=f"练习 4.3：每个头放给下一个位置的权重（前 {H} 个数是有掩码的模型，"
        f"后 {H} 个是无掩码的）",
        near="思路多半对了，但算的不是这批数据：函数要用传入的 model 和 x，"
        "不要自己另造一批序列，也不要只取其中一部分样本或位置。",
        hint="在每个 (L, L) 的权重矩阵里，查询 i 放给键 i+1 的权重排在哪一条对角线上？"
        "把它取出来（torch.diagonal 可以选对角线和两个维度），"
        "再对样本和查询位置求平均，只留下头的维度。",
        mistakes=[
            (
                torch.stack([d.mean(dim=(0, 2)) for d in diag]),
                "这是键 i−1（前一个位置）上的权重：diagonal 的 offset 应为 +1。"
                "若你用的已是 offset=1，就是权重矩阵被转置了（如 .mT、.T 或 dim1、"
                "dim2 对调）：行是查询、列是键，不要转置。",
            ),
            (
                torch.stack(
                    [w.diagonal(dim1=-2, dim2=-1).mean(dim=(0, 2)) for w in weights]
                ),
                "这是查询 i 放给自己（键 i）的权重：diagonal 的 offset 应为 +1。",
            ),
            (
                torch.stack(
                    [w.triu(1).sum(-1)[..., :-1].mean(dim=(0, 2)) for w in weights]
                ),
                "这是查询 i 放给所有后面的键 j > i 的权重之和：只要键 i + 1 那一个，"
                "diagonal(offset=1)。",
            ),
            (
                torch.stack(
                    [
                        w[0].diagonal(offset=1, dim1=-2, dim2=-1).mean(-1)
                        for w in weights
                    ]
                ),
                "只用了第一个样本：对全部 N 个样本和查询位置 i 求平均，"
                "mean(dim=(0, 2))。",
            ),
            (
                torch.stack(
                    [
                        w.diagonal(offset=1, dim1=-2, dim2=-1)[..., 0].mean(0)
                        for w in weights
                    ]
                ),
                "只用了查询 0（第一个位置放给键 1 的权重）：要对查询位置 i = 0 … L−2 "
                "全部求平均，mean(dim=(0, 2))。",
            ),
            (
                torch.stack([w.mean(dim=(0, 2, 3)) for w in weights]),
                "每个数都是 1/L：这是整个权重矩阵的平均（softmax 之后每行的和是 1，"
                "L 个键平均下来就是 1/L）。你把所有键上的权重都平均了进去，"
                "要的只是键 i + 1 上的那一个。",
            ),
            (
                torch.stack([w.sum(-1).mean(dim=(0, 2)) for w in weights]),
                "每个数都是 1：你把查询 i 在全部键上的权重加了起来（softmax 之后"
                "每行的和就是 1）。要的只是键 i + 1 上的那一个。",
            ),
            (
                torch.stack([w.diagonal(2, -2, -1).mean(dim=(0, 2)) for w in weights]),
                "这是键 i + 2 上的权重（隔了一个位置）：下一个位置是键 i + 1。",
            ),
            (
                torch.stack([d[..., 1:].mean(dim=(0, 2)) for d in nxt]),
                "少了查询 0：键 i + 1 对 i = 0 … L−2 都存在，平均要从 i = 0 算起。",
            ),
            (
                torch.stack([d.amax(dim=(0, 2)) for d in nxt]),
                "取的是最大值：要对样本和查询位置求平均。",
            ),
            (
                torch.stack([e * N for e in expected]),
                "对样本求了和：应当求平均。",
            ),
            (
                torch.stack([e * (L - 1) for e in expected]),
                "对查询位置 i 求了和：应当求平均。",
            ),
            (
                torch.stack([e * N * (L - 1) for e in expected]),
                "对样本和查询位置求的都是和：应当求平均。",
            ),
            (
                torch.stack([e * (L - 1) / L for e in expected]),
                "除以了 L：键 i + 1 只对 i = 0..L−2 存在，一共 L − 1 个查询；"
                "对 diagonal(offset=1) 的结果用 .mean，它已经只有 L − 1 项。",
            ),
            (
                torch.stack([e.mean().expand_as(e) for e in expected]),
                "各头的数都一样：你对头也求了平均。每个头单独一个数，"
                "只对样本维和查询位置求平均，mean(dim=(0, 2))。",
            ),
        ],
    )
    return f"有、无掩码的两个模型，{H} 个头"
