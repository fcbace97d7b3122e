"""The training objective of the encoder-decoder model (chapter 2): feed the target
shifted right by one, predict the next token, average the label-smoothed cross-entropy
over the real (non-padding) tokens."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from ..models import Transformer, TransformerConfig
from ._protocol import checker, fail, name_of, run_learner, seeded_generator
from ._report import as_tensor, check_float, close, first_reproduced

PAD, BOS = 0, 1

# (hint, mistake): the typical mistakes, in the order they are tried
_MISTAKES = [
    (
        "没有右移：把整句 tgt 送进解码器、又拿 tgt 作标签，位置 t 预测 y_t 时看得见 "
        "y_t 本身。解码器输入是 tgt[:, :-1]，标签是 tgt[:, 1:]。",
        "no_shift",
    ),
    (
        "只截了输入、标签没有右移：解码器输入 tgt[:, :-1] 对应的标签是 tgt[:, 1:]"
        "（下一个词元），不是 tgt[:, :-1]。",
        "labels_unshifted",
    ),
    (
        "输入和标签的位移方向反了：解码器输入是 tgt[:, :-1]（以 ⟨bos⟩ 开头），"
        "标签是 tgt[:, 1:]。",
        "reversed",
    ),
    ("标签平滑没有用上：目标分布应为 q = (1 − ε)·e_y + ε/|V|。", "no_smoothing"),
    (
        "平滑的质量只分给了其余 |V| − 1 个类别：本章的定义是 q = (1 − ε)·e_y + ε/|V|，"
        "ε/|V| 也加在正确类别上（与 F.cross_entropy(label_smoothing=ε) 相同）。",
        "smooth_others",
    ),
    (
        "填充位置也算进了损失：标签为 0（填充）的位置要跳过，"
        "例如 F.cross_entropy(..., ignore_index=0)，或只对 labels != 0 的位置求平均。",
        "pad_counted",
    ),
    (
        "填充位置的损失置 0 了，但平均时仍除以全部位置数：应只除以真实词元的个数。",
        "pad_in_denominator",
    ),
    ("返回的是损失之和：本题要所有真实词元上的平均（reduction='mean'）。", "sum"),
    (
        "对 softmax 之后的概率又做了一次交叉熵：F.cross_entropy 的输入是 logits"
        "（它自己做 log_softmax），不要先 softmax。",
        "double_softmax",
    ),
]


def _loss(logits: Tensor, labels: Tensor, eps: float, mistake: str = "") -> Tensor:
    """Mean label-smoothed cross-entropy, or what one typical mistake computes."""
    V = logits.size(-1)
    if mistake == "double_softmax":
        logits = torch.softmax(logits, -1)
    logp = F.log_softmax(logits, -1)
    onehot = F.one_hot(labels, V).to(logp.dtype)
    if mistake == "no_smoothing":
        q = onehot
    elif mistake == "smooth_others":
        q = onehot * (1 - eps) + (1 - onehot) * eps / (V - 1)
    else:
        q = onehot * (1 - eps) + eps / V
    per_token = -(q * logp).sum(-1)
    keep = labels != PAD
    if mistake == "pad_counted":
        return per_token.mean()
    if mistake == "pad_in_denominator":
        return (per_token * keep).sum() / labels.numel()
    if mistake == "sum":
        return per_token[keep].sum()
    return per_token[keep].mean()


def _objective_variant(
    model: Transformer, src: Tensor, tgt: Tensor, eps: float, mistake: str
) -> Tensor:
    if mistake == "no_shift":
        dec_in, labels = tgt, tgt
    elif mistake == "labels_unshifted":
        dec_in, labels = tgt[:, :-1], tgt[:, :-1]
    elif mistake == "reversed":
        dec_in, labels = tgt[:, 1:], tgt[:, :-1]
    else:
        dec_in, labels = tgt[:, :-1], tgt[:, 1:]
    return _loss(model(src, dec_in), labels, eps, mistake)


def _batch(g: torch.Generator, N: int, m: int, T: int, V: int, lengths: list[int]):
    """``src (N, m)`` and ``tgt (N, T)``: ⟨bos⟩ then tokens in 2..V-1, then padding
    up to ``T`` after ``lengths[i]`` tokens (⟨bos⟩ included)."""
    src = torch.randint(2, V, (N, m), generator=g)
    tgt = torch.randint(2, V, (N, T), generator=g)
    tgt[:, 0] = BOS
    for i, length in enumerate(lengths):
        tgt[i, length:] = PAD
    return src, tgt


@checker("右移一位的训练目标（含标签平滑）")
def check_shifted_loss(fn) -> str:
    """Grade ``fn(model, src, tgt, smoothing)``: ``model`` a
    :class:`~transformer_course.Transformer`, ``src (N, m)``, ``tgt (N, T)`` starting
    with ⟨bos⟩ (id 1), padded with id 0 at the end; returns the scalar mean over the
    real label tokens of the cross-entropy against ``(1 - ε) e_y + ε/|V|``, the decoder
    fed ``tgt[:, :-1]`` and predicting ``tgt[:, 1:]``."""
    name = name_of(fn)
    g = seeded_generator(53)
    # (description, N, m, T, V, ε, lengths)
    cases = [
        ("N=2, T=6, |V|=11, ε=0.1，没有填充", 2, 5, 6, 11, 0.1, [6, 6]),
        ("N=3, T=7, |V|=13, ε=0，后两句末尾有填充", 3, 4, 7, 13, 0.0, [7, 5, 3]),
        ("N=2, T=5, |V|=9, ε=0.2，第二句末尾有填充", 2, 6, 5, 9, 0.2, [5, 4]),
    ]
    for i, (case, N, m, T, V, eps, lengths) in enumerate(cases):
        cfg = TransformerConfig(
            src_vocab_size=V, tgt_vocab_size=V, d_model=16, num_heads=2,
            num_encoder_layers=1, num_decoder_layers=1, d_ff=32, dropout=0.0,
            context_length=16, final_norm=False, pad_id=PAD,
        )  # fmt: skip
        model = Transformer(cfg).eval()
        src, tgt = _batch(g, N, m, T, V, lengths)
        what = f"{name}(model, src, tgt, {eps})"
        out = run_learner(fn, model, src, tgt, eps, what=what, case=case, first=i == 0)
        out = as_tensor(out, f"{what} 的返回值", case)
        if out.dim() != 0:
            fail(
                f"{what} 应返回一个数（0 维张量），得到形状 {tuple(out.shape)}"
                f"（{case}）：对所有真实词元的损失求平均，"
                "例如 F.cross_entropy 的默认 reduction='mean'。"
            )
        check_float(out, f"{what} 的返回值")
        if not out.requires_grad:
            fail(
                f"{what} 的返回值不能求梯度（{case}）：训练要对它 backward()。"
                "不要在 torch.no_grad() 里计算，也不要 .item() / .detach()。"
            )
        with torch.no_grad():
            ref = _objective_variant(model, src, tgt, eps, "")
            if close(out, ref):
                continue
            hint = first_reproduced(
                out,
                _MISTAKES,
                functools.partial(_objective_variant, model, src, tgt, eps),
            )
        fail(
            f"{what} = {float(out.detach()):.6g}，应为 {float(ref):.6g}（{case}）。\n"
            "可能的原因："
            + (
                hint
                or "逐步对照：logits = model(src, tgt[:, :-1])，labels = tgt[:, 1:]，"
                "q = (1 − ε)·e_y + ε/|V|，对 labels != 0 的位置求 −Σ q·log_softmax "
                "的平均。"
            )
        )
    return "ε = 0、0.1、0.2，有无填充，共 3 组"
