"""The label-smoothed training loss (chapter 2): the cross-entropy against the
smoothed target ``q = (1 - ε) e_y + ε/|V|``, written by hand and averaged over the real
(non-padding) labels. The right shift of the decoder input is chapter 1's exercise, not
repeated."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from ..training import label_smoothing_loss, smoothed_targets
from ._protocol import (
    calls_refused,
    checker,
    fail,
    name_of,
    run_learner,
    seeded_generator,
)
from ._report import as_tensor, check_float, close, first_reproduced

PAD = 0

# the one-line answers: label_smoothing= of F.cross_entropy (nn.CrossEntropyLoss
# passes it on) and the package's own implementation
_ANSWERS = (F.cross_entropy, label_smoothing_loss, smoothed_targets)
_WHEN = {F.cross_entropy: lambda args: bool(args.get("label_smoothing", 0.0) != 0)}
_REFUSED = (
    "本题要亲手写出平滑后的目标分布：不要用 label_smoothing= 参数"
    "（F.cross_entropy 或 nn.CrossEntropyLoss 的），也不要调用 "
    "tc.label_smoothing_loss / tc.smoothed_targets（那就是参考答案）。"
    "用 F.log_softmax 得到 log p，写出 q = (1 − ε)·e_y + ε/|V|"
    "（每个类别 ε/|V|，正确类别再加 1 − ε），再对非填充的标签求 −Σ q·log p 的平均。"
)

# (hint, mistake): the typical mistakes, in the order they are tried
_MISTAKES = [
    ("标签平滑没有用上：目标分布应为 q = (1 − ε)·e_y + ε/|V|。", "no_smoothing"),
    (
        "只留下了正确类别上的 (1 − ε)，漏了均匀的那一份：每个类别（含正确类别）"
        "还有 ε/|V|，损失里要加上 −(ε/|V|)·Σ_v log p_v。",
        "no_uniform",
    ),
    (
        "平滑的质量只分给了其余 |V| − 1 个类别：本章的定义是 q = (1 − ε)·e_y + ε/|V|，"
        "ε/|V| 也加在正确类别上（与 F.cross_entropy(label_smoothing=ε) 相同）。",
        "smooth_others",
    ),
    (
        "这是 The Annotated Transformer 的写法（正确类别以外每类 ε/(|V| − 2)，"
        "填充那一列置 0）：本页练习的定义不同，q = (1 − ε)·e_y + ε/|V| 把 ε 均匀分给"
        "全部 |V| 个类别（含正确类别和编号 0），与 F.cross_entropy(label_smoothing=ε) "
        "相同。",
        "annotated",
    ),
    (
        "对词表求的是平均（mean(-1)）：交叉熵 −Σ_v q_v·log p_v 要对词表求和，"
        "−(q * logp).sum(-1)；平均把每个词元的损失缩小了 |V| 倍。",
        "mean_over_vocab",
    ),
    (
        "填充位置也算进了损失：标签为 0（填充）的位置要跳过，"
        "例如 F.cross_entropy(..., ignore_index=0)，或只对 labels != 0 的位置求平均。",
        "pad_counted",
    ),
    (
        "交叉熵那一项只对真实词元求了平均，平滑那一项 ε·(−mean_v log p_v) 却对"
        "全部位置（含填充）求了平均：两项都只在 labels != 0 的位置上平均，"
        "或先逐词元合成 −Σ q·log p，再 per_token[labels != 0].mean()。",
        "smooth_pad_counted",
    ),
    (
        "填充位置的损失置 0 了，但平均时仍除以全部位置数：应只除以真实词元的个数。",
        "pad_in_denominator",
    ),
    ("返回的是损失之和：本题要所有真实词元上的平均（reduction='mean'）。", "sum"),
    (
        "总和除以了句子数 N：分母应是真实（非填充）标签的个数，"
        "per_token[labels != 0].mean()。",
        "sum_over_batch",
    ),
    (
        "先对每句求平均、再对各句求平均：短句的每个词元因此权重更大。"
        "应对整批所有非填充标签一起求一个平均（per_token[labels != 0].mean()）。",
        "mean_per_sentence",
    ),
    (
        "正确类别上的 q 恰好是 1 − ε，少了它那一份 ε/|V|（q 之和因此不是 1）："
        "scatter_ 是覆盖，应在 ε/|V| 之上再加 1 − ε（scatter_add_，"
        "或 q = (1 − ε)·one_hot + ε/|V|）。",
        "target_overwritten",
    ),
    (
        "算的是 KL 散度 KL(q‖p)（F.kl_div）：它比交叉熵 −Σ q·log p 少了 q 的熵 "
        "−Σ q·log q。两者的梯度相同，数值不同；本题要交叉熵 −(q * logp).sum(-1)。",
        "kl_div",
    ),
    (
        "softmax 沿错了维：logits 是 (N, n, |V|)，概率要在最后一维（词表）上归一化，"
        "F.log_softmax(logits, dim=-1)，不是 dim=1（位置维，长 n）。",
        "softmax_dim1",
    ),
    (
        "softmax 沿错了维：logits 是 (N, n, |V|)，dim=0 是批维（在 N 句之间归一化）；"
        "概率要在最后一维（词表）上归一化，F.log_softmax(logits, dim=-1)。",
        "softmax_dim0",
    ),
    (
        "把填充类别（编号 0）上的 q 置 0 了：本章的 q = (1 − ε)·e_y + ε/|V| 在每个"
        "类别上都有 ε/|V|（含编号 0），要跳过的是标签为 0 的位置，"
        "不是词表里的第 0 类。",
        "pad_class_zero",
    ),
    (
        "对 softmax 之后的概率又做了一次交叉熵：F.cross_entropy 的输入是 logits"
        "（它自己做 log_softmax），不要先 softmax。",
        "double_softmax",
    ),
    (
        "−Σ q·log p 里的 log p 用成了原始 logits：logits 不是对数概率，"
        "先做 logp = F.log_softmax(logits, dim=-1)，再算 −(q * logp).sum(-1)。",
        "raw_logits",
    ),
    (
        "−Σ q·log p 里的 log p 用成了概率 softmax(logits)：少了对数。"
        "用 logp = F.log_softmax(logits, dim=-1)（比 softmax 再 log 稳定），"
        "再算 −(q * logp).sum(-1)。",
        "softmax_as_logp",
    ),
]


# a loss below 0 that no mistake of _MISTAKES reproduces: q >= 0 and log p <= 0 make
# every term of -Σ q·log p nonnegative: the log p in the code is no log-probability
_NEGATIVE = (
    "损失是负数：q ≥ 0、log p ≤ 0，−Σ q·log p 的每一项都 ≥ 0，结果不可能小于 0。"
    "代码里当 log p 用的多半不是对数概率，而是概率 p 本身或它的变形（如 p.log1p()"
    "，即 log(1 + p) ≥ 0）：用 logp = F.log_softmax(logits, dim=-1)；也检查前面的负号。"
)


def _target(onehot: Tensor, eps: float, mistake: str) -> Tensor:
    """The smoothed target ``q``, or what one typical mistake makes of it."""
    V = onehot.size(-1)
    if mistake == "no_smoothing":
        return onehot
    if mistake == "no_uniform":  # the target's 1 - ε kept, the ε/|V| part dropped
        return onehot * (1 - eps)
    if mistake == "smooth_others":
        return onehot * (1 - eps) + (1 - onehot) * eps / (V - 1)
    if mistake == "target_overwritten":  # scatter_ where scatter_add_ is meant
        return onehot * (1 - eps) + (1 - onehot) * eps / V
    if mistake == "annotated":  # ε/(|V| − 2) off the target, none on class 0
        q = onehot * (1 - eps) + (1 - onehot) * eps / (V - 2)
        return q.index_fill(-1, torch.tensor([PAD]), 0.0)
    q = onehot * (1 - eps) + eps / V
    if mistake == "pad_class_zero":
        q = q.index_fill(-1, torch.tensor([PAD]), 0.0)
    return q


def _mean(per_token: Tensor, labels: Tensor, mistake: str) -> Tensor:
    """The mean over the real labels, or what one typical mistake averages."""
    keep = labels != PAD
    total = (per_token * keep).sum()
    return {
        "pad_counted": lambda: per_token.mean(),
        "pad_in_denominator": lambda: total / labels.numel(),
        "sum": lambda: total,
        "sum_over_batch": lambda: total / labels.size(0),
        "mean_per_sentence": lambda: ((per_token * keep).sum(1) / keep.sum(1)).mean(),
    }.get(mistake, lambda: per_token[keep].mean())()


def _loss(logits: Tensor, labels: Tensor, eps: float, mistake: str = "") -> Tensor:
    """Mean label-smoothed cross-entropy, or what one typical mistake computes."""
    if mistake == "double_softmax":
        logits = torch.softmax(logits, -1)
    dim = {"softmax_dim1": 1, "softmax_dim0": 0}.get(mistake, -1)
    logp = {
        "raw_logits": lambda: logits,
        "softmax_as_logp": lambda: torch.softmax(logits, -1),
    }.get(mistake, lambda: F.log_softmax(logits, dim))()
    if mistake == "smooth_pad_counted":  # only the NLL term skips the padding
        nll = -logp.gather(-1, labels[..., None]).squeeze(-1)[labels != PAD]
        return (1 - eps) * nll.mean() + eps * (-logp.mean(-1)).mean()
    q = _target(F.one_hot(labels, logp.size(-1)).to(logp.dtype), eps, mistake)
    over_vocab = torch.mean if mistake == "mean_over_vocab" else torch.sum
    per_token = -over_vocab(q * logp, -1)
    if mistake == "kl_div":
        per_token = per_token + torch.xlogy(q, q).sum(-1)
    return _mean(per_token, labels, mistake)


@checker("标签平滑的交叉熵")
def check_smoothed_loss(fn) -> str:
    """Grade ``fn(logits, labels, smoothing)``: ``logits (N, n, |V|)``, ``labels
    (N, n)`` (chapter 2's letters, as the messages) with padding id 0; returns the
    scalar mean over the labels ``!= 0`` of ``−Σ_v q_v log p_v`` with
    ``q = (1 - ε) e_y + ε/|V|``, written by hand: a call with ``label_smoothing=``
    (≠ 0) or to the package's ``label_smoothing_loss`` / ``smoothed_targets`` is
    refused."""
    name = name_of(fn)
    g = seeded_generator(53)
    # (description, N, T, V, ε, lengths): labels after lengths[i] are padding
    cases = [
        ("N=2, n=5, |V|=11, ε=0.1，没有填充", 2, 5, 11, 0.1, [5, 5]),
        ("N=3, n=6, |V|=13, ε=0，后两句末尾有填充", 3, 6, 13, 0.0, [6, 4, 2]),
        ("N=2, n=4, |V|=9, ε=0.2，第二句末尾有填充", 2, 4, 9, 0.2, [4, 3]),
    ]
    for i, (case, N, T, V, eps, lengths) in enumerate(cases):
        logits = (2 * torch.randn(N, T, V, generator=g)).requires_grad_()
        labels = torch.randint(1, V, (N, T), generator=g)
        for row, length in enumerate(lengths):
            labels[row, length:] = PAD
        what = f"{name}(logits, labels, {eps})"
        with calls_refused(_ANSWERS, f"{what}：{_REFUSED}", when=_WHEN):
            out = run_learner(
                fn, logits, labels, eps, what=what, case=case, first=i == 0
            )
        out = as_tensor(out, f"{what} 的返回值", case)
        if out.dim() != 0:
            fail(
                f"{what} 应返回一个数（0 维张量），得到形状 {tuple(out.shape)}"
                f"（{case}）：对所有真实标签的损失求平均，"
                "例如 F.cross_entropy 的默认 reduction='mean'。"
            )
        check_float(out, f"{what} 的返回值")
        if not out.requires_grad:
            fail(
                f"{what} 的返回值不能求梯度（{case}）：训练要对它 backward()。"
                "不要在 torch.no_grad() 里计算，也不要 .item() / .detach()。"
            )
        with torch.no_grad():
            ref = _loss(logits, labels, eps)
            if close(out, ref):
                continue
            hint = first_reproduced(
                out, _MISTAKES, functools.partial(_loss, logits, labels, eps)
            )
        if hint is None and float(out.detach()) < 0:
            hint = _NEGATIVE
        fail(
            f"{what} = {float(out.detach()):.6g}，应为 {float(ref):.6g}（{case}）。\n"
            "可能的原因："
            + (
                hint
                or "逐步对照：q = (1 − ε)·e_y + ε/|V|，对 labels != 0 的位置求 "
                "−Σ q·log_softmax(logits) 的平均。"
            )
        )
    return "ε = 0、0.1、0.2，有无填充，共 3 组"
