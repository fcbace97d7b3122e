"""The online softmax's correction (chapter 4, the bug hunt of exercise 4.4): the
learner fixes the one wrong line of a blockwise softmax attention; graded against
full-matrix attention at several block sizes, each typical slip named."""

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


def _online_variant(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    block: int,
    scaled: bool = True,
    fix_ell: bool = True,
    fix_o: bool = True,
    keep_c: bool = True,
    p_by_block_max: bool = False,
    carry_ell: bool = True,
    divide: bool = True,
    running_max: bool = True,
    drop_partial: bool = False,
) -> Tensor:
    """Online softmax, possibly with one typical mistake: to name the learner's."""
    c = torch.full(q.shape[:-1] + (1,), -math.inf)
    ell, o = torch.zeros_like(c), torch.zeros(q.shape[:-1] + (v.size(-1),))
    end = k.size(-2) - block + 1 if drop_partial else k.size(-2)
    for start in range(0, end, block):
        scale = math.sqrt(q.size(-1)) if scaled else 1
        s = q @ k[..., start : start + block, :].mT / scale
        block_max = s.amax(-1, keepdim=True)
        c_new = torch.maximum(c, block_max) if running_max else block_max
        fix = torch.exp(c - c_new)
        p = torch.exp(s - (s.amax(-1, keepdim=True) if p_by_block_max else c_new))
        kept = ell * (fix if fix_ell else 1) if carry_ell else 0
        ell = kept + p.sum(-1, keepdim=True)
        o = o * (fix if fix_o else 1) + p @ v[..., start : start + block, :]
        c = c_new if keep_c else c
    return o / ell if divide else o


# each mistake: the keywords of ``_online_variant`` that make it
_VARIANTS = {
    "no_division": dict(divide=False),
    "unscaled": dict(scaled=False),
    "neither_rescaled": dict(fix_ell=False, fix_o=False),
    "ell_not_carried": dict(carry_ell=False),
    "c_not_updated": dict(keep_c=False),
    "block_max": dict(p_by_block_max=True),
    "ell_not_rescaled": dict(fix_ell=False),  # the page's bug (exercise 4.4)
    "block_max_only": dict(running_max=False),
    "partial_block_dropped": dict(drop_partial=True),
}

_ONLINE_MISTAKES = [
    ("最后要除以 ℓ：o 只是分子（按 exp 加权的和），return o / ell。", "no_division"),
    ("分数没有除以 √D：s = q kᵀ / √D，与整矩阵注意力一样。", "unscaled"),
    (
        "ℓ 和 o 都没有乘校正因子：最大值变大时，旧块的项是按旧的最大值算的，"
        "两者都要先乘 fix = exp(c − c_new)，再加上新块的项。",
        "neither_rescaled",
    ),
    (
        "ℓ 没有跨块累加：ell = p.sum(...) 每块重新开始，只剩最后一块的和。"
        "o 是对的；ℓ 也要带上旧块：ell = ell * fix + p.sum(-1, keepdim=True)。",
        "ell_not_carried",
    ),
    (
        "c 没有更新：每块末尾要 c = c_new。c 一直是 −∞ 时，每块的 fix = exp(−∞) = 0，"
        "把前面各块累加的 ℓ 和 o 清零，结果只剩最后一块的注意力。",
        "c_not_updated",
    ),
    (
        "新块的 p 减的是这一块自己的最大值：p = exp(s − c_new)，要减到目前为止的最大值 "
        "c_new。ℓ 和 o 里的每一项都要相对同一个最大值，fix 才能把旧的项换算过来。",
        "block_max",
    ),
    (
        "分母 ℓ 没有乘校正因子：旧块在 ℓ 里的项还按旧的最大值计，"
        "应为 ell = ell * fix + p.sum(-1, keepdim=True)。",
        "ell_not_rescaled",
    ),
    (
        "c_new 只取了这一块的最大值：要取 max(c, 这一块的最大值)。否则 fix = "
        "exp(c − c_new) 可能大于 1，分数大时溢出成 inf，o / ℓ 得 nan。",
        "block_max_only",
    ),
    (
        "最后一个不满的块被丢掉了：键的个数不是块大小的倍数时，最后一块较短，"
        "循环要写 range(0, S, block)。",
        "partial_block_dropped",
    ),
]

# the bug hunt prints the buggy function: its bug unchanged is told as such, not fixed
_BUG_HUNT = {"4.4": {"ell_not_rescaled": "结果与有 bug 的版本完全相同：那一行还没改。"}}


def _general_hint(wrong: list[tuple]) -> str:
    """The hint when no listed mistake reproduces the answer, from how the wrong
    cases failed: ``(block, single block, all 0, not finite, > 1)``."""
    if any(nan for _, single, *_, nan, _ in wrong if single) and not any(
        nan for _, single, *_, nan, _ in wrong if not single
    ):
        return (
            "只有一块时输出是 nan 或 inf：校正放在了加法之后，例如 "
            "ell = (ell + Σp) * fix，新块的项也被乘了 fix（校正了两次）。"
            "第一块时旧的最大值是 −∞，fix = 0，被这样校正的 ℓ（或 o）清零，"
            "o / ℓ 得 inf 或 nan。"
            "每块先给旧的 ℓ、o 乘 fix，再加上新块的项。"
        )
    if any(nan for *_, nan, _ in wrong):
        return (
            "输出里有 nan 或 inf：校正因子倒过来了。应为 fix = exp(c − c_new)"
            "（旧的最大值减新的，≤ 1）；第一块时 c = −∞，"
            "exp(c_new − c) = ∞，0·∞ 得 nan。"
        )
    if any(above for *_, above in wrong):
        return (
            "值全为 1 时输出大于 1：分子 o 里旧块的项没有按新的最大值缩小，"
            "而分母 ℓ 缩小了。o 和 ℓ 每块都要先乘 fix，再加上新块的项。"
        )
    if any(zero for *_, zero, _, _ in wrong):
        return (
            "输出全是 0：o 被校正了两次"
            "（例如 o = (o * fix + p @ V) * fix）。第一块时旧的最大值是 −∞，"
            "fix = exp(−∞) = 0，把刚加上的 p @ V 也清零了。"
            "每块只给旧的 o 乘一次 fix，再加上新块的 p @ V。"
        )
    if any(single for _, single, *_ in wrong):
        return "只有一块时就不对：对照 4.1.4 节检查分数的缩放与最后的 o / ℓ。"
    return (
        "只有一块时对、分块后错：问题在跨块的校正上。对照 4.1.4 节的"
        "递推，逐个累加量看它是否按新的最大值重新计过。"
    )


def _all_scores(shape: tuple[int, int], func, args: tuple, out: object) -> bool:
    """Whether a torch call made the (L, S) score matrix: all keys at once, which the
    blockwise computation never needs when the block is shorter."""
    return ends_in(out, shape)


@checker("在线 softmax 的校正")
def check_online_softmax(fn, exercise: str | None = None) -> str:
    """Grade ``fn(q, k, v, block=4)``, the online softmax of section 4.1.4 with its
    denominator rescaled: full-matrix attention ``(…, L, D_v)`` for every block size
    (with a batch dimension; smaller blocks update the maximum later more often), and
    values all 1 (any weighted mean is 1). A float64 answer is fine."""
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
    wrong = []  # (块大小, 单块, 全 0, 非有限, 值全 1 时输出 > 1)
    for i, ((qc, kc, vc, b), got) in enumerate(zip(cases, answers, strict=True)):
        want = scaled_dot_product_attention(qc, kc, vc)[0]
        if not isinstance(got, Tensor) or got.shape != want.shape:
            fail(
                f"练习 4.4：输出应是形状 {tuple(want.shape)} 的张量，"
                f"收到 {getattr(got, 'shape', type(got))}"
            )
        answers[i] = got = got.to(want.dtype)  # float64 也可以：在同一精度里比较
        if not torch.allclose(got, want, atol=1e-5, rtol=1e-4):
            wrong.append(
                (
                    b,
                    b >= kc.size(-2),
                    not got.any(),
                    not bool(got.isfinite().all()),
                    i == len(cases) - 2 and bool((got > 1 + 1e-5).any()),
                )
            )
    if wrong:
        hints = bug_hunt_hints(_ONLINE_MISTAKES, exercise, _BUG_HUNT)
        named = next(
            (
                why
                for why, mistake in hints
                if all(
                    torch.allclose(
                        got,
                        _online_variant(qc, kc, vc, b, **_VARIANTS[mistake]),
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
