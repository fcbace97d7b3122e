"""Merging blockwise attention (chapter 4, the bug hunt of exercise 4.4): the learner
fixes the one wrong line of an online softmax that keeps, for each query, the attention
output over the keys so far and the log-sum-exp of their scores, and merges each block's
own attention into them; graded against full-matrix attention at several block sizes,
each typical slip named."""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from ..attention import scaled_dot_product_attention
from ._protocol import (
    CallWatch,
    checker,
    ends_in,
    fail,
    name_of,
    run_learner,
    seeded_generator,
)
from ._report import bug_hunt_hints

__all__ = ["check_online_softmax"]

# how the log-sum-exp of the keys so far and of the new block are merged
_MERGE = {
    "logaddexp": torch.logaddexp,
    "max": torch.maximum,  # the page's bug (exercise 4.4)
    "add": torch.add,
}


def _merged_variant(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    block: int,
    merge: str = "logaddexp",
    weights_after_update: bool = False,
    swapped: bool = False,
    renormalised: bool = False,
    scaled: bool = True,
    drop_partial: bool = False,
    lse_start: float = -math.inf,
    lse_kept: bool = True,
    equal_weights: bool = False,
) -> Tensor:
    """The merging online softmax, possibly with one typical mistake: to name the
    learner's."""
    if equal_weights:  # each block's own attention, the blocks averaged alike
        parts = [
            torch.softmax(q @ k[..., i : i + block, :].mT / math.sqrt(q.size(-1)), -1)
            @ v[..., i : i + block, :]
            for i in range(0, k.size(-2), block)
        ]
        return sum(parts) / len(parts)
    lse = torch.full(q.shape[:-1] + (1,), lse_start)
    o = torch.zeros(q.shape[:-1] + (v.size(-1),))
    end = k.size(-2) - block + 1 if drop_partial else k.size(-2)
    for start in range(0, end, block):
        scale = math.sqrt(q.size(-1)) if scaled else 1
        s = q @ k[..., start : start + block, :].mT / scale
        lse_j = torch.logsumexp(s, -1, keepdim=True)
        o_j = torch.softmax(s, -1) @ v[..., start : start + block, :]
        lse_new = _MERGE[merge](lse, lse_j)
        w_old = torch.exp((lse_new if weights_after_update else lse) - lse_new)
        w_new = torch.exp(lse_j - lse_new)
        if swapped:
            w_old, w_new = w_new, w_old
        o = w_old * o + w_new * o_j
        o = o / (w_old + w_new) if renormalised else o
        lse = lse_new if lse_kept else lse_j
    return o


# each mistake: the keywords of ``_merged_variant`` that make it
_VARIANTS = {
    "max": dict(merge="max"),  # the page's bug (exercise 4.4)
    "renormalised_max": dict(merge="max", renormalised=True),
    "add": dict(merge="add"),
    "weights_after_update": dict(weights_after_update=True),
    "swapped": dict(swapped=True),
    "unscaled": dict(scaled=False),
    "partial_block_dropped": dict(drop_partial=True),
    "lse_starts_at_zero": dict(lse_start=0.0),
    "lse_not_kept": dict(lse_kept=False),
    "equal_weights": dict(equal_weights=True),
}

_LOGADDEXP = "lse_new = torch.logaddexp(lse, lse_j)"

_MISTAKES = [
    (
        "合并后的 lse 取了两者的最大值：lse 是目前见过的所有分数的 ln Σ e^s，"
        "两部分的键合在一起，Σ e^s 要相加：ln(e^lse + e^lse_j)，即 "
        f"{_LOGADDEXP}。取最大值时，两部分的权重 exp(lse − lse_new) 与 "
        "exp(lse_j − lse_new) 加起来大于 1。",
        "max",
    ),
    (
        "o 除以了两部分的权重之和，这一次合并的 o 对了；但 lse 仍是两者的最大值，"
        "不是 ln Σ e^s，下一块合并时前面各块的权重就算小了。要改的是 lse 本身："
        f"{_LOGADDEXP}，两个权重之和就正好是 1，不用再除。",
        "renormalised_max",
    ),
    (
        "合并写成了 lse + lse_j：对数相加是两个和相乘。两部分的键合在一起，"
        f"Σ e^s 要相加：{_LOGADDEXP}。第一块时 lse = −∞，lse_new 也是 −∞，"
        "−∞ − (−∞) 得 nan。",
        "add",
    ),
    (
        "前面各块的 o 的权重成了 1：它应是 exp(lse − lse_new)，用合并之前的 lse。"
        "要么是漏乘了这个因子，要么是先更新了 lse 再算它（更新之后它恒为 1）。"
        "先算两个权重、合并 o，再 lse = lse_new。",
        "weights_after_update",
    ),
    (
        "两部分的权重互换了：前面各块的 o 乘 exp(lse − lse_new)，"
        "这一块的 o_j 乘 exp(lse_j − lse_new)。",
        "swapped",
    ),
    ("分数没有除以 √D：s = q kᵀ / √D，与整矩阵注意力一样。", "unscaled"),
    (
        "最后一个不满的块被丢掉了：键的个数不是块大小的倍数时，最后一块较短，"
        "循环要写 range(0, S, block)。",
        "partial_block_dropped",
    ),
    (  # learner test 63, 4.4
        "lse 的初值是 0，应是 −∞：还没有见过任何键时 Σ e^s = 0，ln 0 = −∞。"
        "从 0 开始，等于多了一个分数为 0、值为零向量的假键，它分走了一份权重，"
        "输出被整体拉向 0。",
        "lse_starts_at_zero",
    ),
    (  # learner test 64
        "lse 没有累积：合并之后写成了 lse = lse_j，只记住了最后一块。lse 是目前"
        "见过的所有键的 ln Σ e^s，合并之后要 lse = lse_new。",
        "lse_not_kept",
    ),
    (  # learner test 64
        "把各块的输出等权平均了：各块的 Σ e^s 不同，权重要按它们在总和里的份额，"
        "即 exp(lse − lse_new) 与 exp(lse_j − lse_new)。",
        "equal_weights",
    ),
]

# the bug hunt prints the buggy function: its bug unchanged (or hidden by dividing by
# the weights' sum) is told by its symptom, not fixed
_BUG_HUNT = {
    "4.4": {
        "max": (
            "结果与有 bug 的版本完全相同：那一行还没改。值全为 1 时输出大于 1，"
            "说明合并时两部分的权重加起来大于 1：按 lse 的含义，这两个权重各应是多少？"
        ),
        "renormalised_max": (
            "o 除以了两部分的权重之和：这一次合并对了，但有 bug 的那一行还在，"
            "lse 仍不是目前所有分数的 ln Σ e^s，下一块合并时前面各块的权重就错了。"
            "要改的是算 lse_new 的那一行本身。"
        ),
    }
}


def _general_hint(wrong: list[tuple]) -> str:
    """The hint when no listed mistake reproduces the answer, from how the wrong
    cases failed: ``(block, single block, not finite, sharp scores, > 1, < 1)`` (the
    last two on values all 1)."""
    if all(sharp for *_, sharp, _, _ in wrong) and any(nan for _, _, nan, *_ in wrong):
        return (
            "只有分数上百的那一组不对（输出有 nan 或 inf）：某处直接对分数或 lse "
            "取了 exp，溢出了（float32 只到 e^88 左右），例如把 ln(e^lse + e^lse_j) "
            "写成 torch.log(torch.exp(lse) + torch.exp(lse_j))。合并用 "
            f"{_LOGADDEXP}（它先减去两者中较大的一个再取 exp），"
            "权重写成 exp(lse − lse_new)：先相减，再取 exp。"
        )
    if any(nan for _, _, nan, *_ in wrong):
        return (
            "输出里有 nan 或 inf：看第一块时（lse = −∞）合并那一行和两个权重算出"
            "什么。torch.logaddexp(−∞, x) = x，exp(−∞) = 0，而 −∞ − (−∞) 是 nan。"
        )
    if any(above for *_, above, _ in wrong):
        return (
            "值全为 1 时输出大于 1：合并时两部分的权重加起来大于 1。两个权重应是"
            "两部分各自的 Σ e^s 在合并后的总和里所占的份额，加起来正好是 1。"
        )
    if any(below for *_, below in wrong):
        return (
            "值全为 1 时输出小于 1：合并时两部分的权重加起来小于 1。两个权重应是"
            "两部分各自的 Σ e^s 在合并后的总和里所占的份额，加起来正好是 1。"
        )
    if any(single for _, single, *_ in wrong):
        return (
            "只有一块时就不对：检查分数的缩放（除以 √D）和这一块自己的注意力输出 "
            "o_j = softmax(s) @ V_j。"
        )
    return (
        "只有一块时对、分块后错：问题在合并上。前面各块与这一块的权重各应是多少，"
        "合并后的 lse 又应是多少？"
    )


def _all_scores(shape: tuple[int, int], func, args: tuple, out: object) -> bool:
    """Whether a torch call made the (L, S) score matrix: all keys at once, which the
    blockwise computation never needs when the block is shorter."""
    return ends_in(out, shape)


@checker("在线 softmax 的合并")
def check_online_softmax(fn, exercise: str | None = None) -> str:
    """Grade ``fn(q, k, v, block=4)``, blockwise softmax attention whose blocks are
    merged correctly (exercise 4.4 merges each block's own attention by log-sum-exp;
    the recurrence of section 4.1.4 passes too): full-matrix attention ``(…, L, D_v)``
    for every block size (with a batch dimension; smaller blocks merge more often),
    values all 1 (any weighted mean is 1) and scores in the hundreds (a naive exp
    overflows). A float64 answer is fine."""
    name = name_of(fn)
    g = seeded_generator(191)
    q, k, v = (torch.randn(2, 5, 8, generator=g) for _ in range(3))
    ones = (torch.randn(4, 8, generator=g), torch.randn(12, 8, generator=g))
    sharp = (40 * torch.randn(3, 8, generator=g), torch.randn(16, 8, generator=g))
    cases = [(q, k, v, b) for b in (1, 2, 5, 8)] + [
        (*ones, torch.ones(12, 1), 4),
        (*sharp, torch.randn(16, 8, generator=g), 4),  # 分数大：上百
    ]
    answers, full = [], False
    for i, (qc, kc, vc, b) in enumerate(cases):
        scores = functools.partial(_all_scores, (qc.size(-2), kc.size(-2)))
        with CallWatch(scores) as watch:
            answers.append(
                run_learner(
                    fn, qc, kc, vc, block=b, what=name, case=f"块大小 {b}", first=i == 0
                )
            )
        full = full or (watch.seen and b < kc.size(-2))
    wrong = []  # (块大小, 单块, 非有限, 分数大的一组, 值全 1 时输出 > 1, < 1)
    for i, ((qc, kc, vc, b), got) in enumerate(zip(cases, answers, strict=True)):
        want = scaled_dot_product_attention(qc, kc, vc)[0]
        if not isinstance(got, Tensor) or got.shape != want.shape:
            fail(
                f"练习 4.4：输出应是形状 {tuple(want.shape)} 的张量，"
                f"收到 {getattr(got, 'shape', type(got))}"
            )
        answers[i] = got = got.to(want.dtype)  # float64 也可以：在同一精度里比较
        if not torch.allclose(got, want, atol=1e-5, rtol=1e-4):
            ones_case = i == len(cases) - 2
            wrong.append(
                (
                    b,
                    b >= kc.size(-2),
                    not bool(got.isfinite().all()),
                    i == len(cases) - 1,
                    ones_case and bool((got > 1 + 1e-5).any()),
                    ones_case and bool((got < 1 - 1e-5).any()),
                )
            )
    if wrong:
        hints = bug_hunt_hints(_MISTAKES, exercise, _BUG_HUNT)
        named = next(
            (
                why
                for why, mistake in hints
                if all(
                    torch.allclose(
                        got,
                        _merged_variant(qc, kc, vc, b, **_VARIANTS[mistake]),
                        atol=1e-5,
                        rtol=1e-4,
                        equal_nan=True,
                    )
                    for (qc, kc, vc, b), got in zip(cases, answers, strict=True)
                )
            ),
            None,
        )
        sizes = sorted({b for b, *_ in wrong})
        fail(
            f"练习 4.4：块大小 {sizes} 时与整矩阵注意力不一致。"
            + (named or _general_hint(wrong))
        )
    if full:
        fail(
            "练习 4.4：结果对了，但函数一次算出了全部键的 (L, S) 分数矩阵：这是整矩阵"
            "注意力，不是分块的在线 softmax。只改有 bug 的那一行，保留按块的循环。"
        )
    return f"块大小 {sorted({b for *_, b in cases})}，与整矩阵注意力一致"
