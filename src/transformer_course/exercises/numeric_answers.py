"""Checkers for exercises whose answer is a number (or a few numbers): the learner
types the value, or the expression that gives it, and a hidden cell grades it.

:func:`check_number` knows chapter 4's questions by name: the expected value is
computed here from the question's formula, and the typical wrong answers (each with
the hint that names it) are computed from the formulas of those mistakes, so the
page's source shows neither. A quantity the page measures (an accuracy of a trained
model) is passed in by keyword. :func:`check_answer` is the grader underneath, for a
page-local checker that computes its expected value from the page's own models.

A failure never shows the expected value: it names the matched mistake, says that
only digits are missing, that the answer is within 1% (an arithmetic slip), or gives
the question's general hint.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from .. import notebook
from ..sparse import sparsemax
from ._protocol import FAILED, PASSED, SKELETON, ExerciseError
from ._protocol import _record as _keep_result
from .predictions import Graded, compare_prediction

__all__ = ["check_answer", "check_number"]

_F64 = torch.float64


def _digits(x: float) -> int:
    """The significant digits ``x`` is written with (``3.40`` has 2: ``3.4``)."""
    return next(n for n in range(1, 18) if float(f"{x:.{n}g}") == x)


def check_answer(
    answer: object,
    expected: object,
    *,
    what: str,
    rel_tol: float = 1e-3,
    hint: str = "",
    mistakes: Sequence[tuple[object, str]] = (),
    exercise: str | None = None,
    name: str = "答案",
    solution: bool = False,
) -> None:
    """Grade ``answer`` (a number, a tuple of numbers or a tensor) against
    ``expected`` within ``rel_tol`` (relative; absolute 1e-6 near 0).

    ``answer=None`` prints ``尚未作答：what`` and returns (with ``solution=True`` it
    raises). A wrong answer raises :class:`ExerciseError` with, in this order: the
    hint of the first of ``mistakes`` (``[(wrong answer, why), ...]``) it matches
    within ``rel_tol``; "有效数字不够" when it is the expected value rounded to the
    digits it is written with; the hint of a mistake rounded that way; "很接近" when
    it is within 1% (or ten times ``rel_tol``); else ``hint``. A right answer prints
    ``✓ what`` (one check of an open ``nb.claims`` block) and, with ``exercise``,
    is kept for ``progress()`` under ``name``."""
    __tracebackhide__ = True
    _check_arguments(what, rel_tol, mistakes)
    record = functools.partial(_keep_result, exercise, what, name, solution)
    if answer is None:
        if solution:
            raise ExerciseError(f"{what}：参考解答没有作答（solution=True）。")
        print(f"尚未作答：{what}")
        record(SKELETON)
        return
    record(FAILED)  # until it passes
    refuse_wrong_answer(answer, expected, what, hint, mistakes, rel_tol)
    notebook.claim(True, what)  # in an nb.claims block: counted, not printed
    record(PASSED)


def refuse_wrong_answer(
    answer: object,
    expected: object,
    what: str,
    hint: str = "",
    mistakes: Sequence[tuple[object, str]] = (),
    rel_tol: float = 1e-3,
    near: str = "",
) -> None:
    """The grading of :func:`check_answer` without its verdict line: raise
    :class:`ExerciseError` for a wrong ``answer`` (not None), return for a right one.
    A ``@checker`` body grades a value it computed from the learner's code with it;
    ``near`` then replaces the "很接近" advice (written for a typed answer) with one
    about code."""
    __tracebackhide__ = True
    try:
        got = torch.as_tensor(answer, dtype=_F64)
    except (TypeError, ValueError, RuntimeError):
        raise ExerciseError(f"{what}：答案应是数或一组数，收到 {answer!r}") from None
    want = torch.as_tensor(expected, dtype=_F64)
    if _close(got, want, rel_tol):
        return
    if got.numel() > 8:
        shown: object = f"（形状 {tuple(got.shape)} 的张量）"
    else:
        shown = [round(x, 4) for x in got.flatten().tolist()] if got.dim() else answer
    if got.shape != want.shape:
        raise ExerciseError(
            f"{what}：答案的形状是 {tuple(got.shape)}，应该是 {tuple(want.shape)}"
        )
    why = _why_wrong(got, want, rel_tol, mistakes, near)
    raise ExerciseError(
        f"{what}：你的答案 {shown} 不对（相对容差 {rel_tol:g}）。" + (why or hint)
    )


def _check_arguments(what: object, rel_tol: object, mistakes: Sequence) -> None:
    """TypeError or ValueError for arguments of :func:`check_answer` it cannot use."""
    if not isinstance(what, str) or not what:
        raise TypeError(f"what must be a non-empty str, got {what!r}")
    if isinstance(rel_tol, bool) or not isinstance(rel_tol, int | float):
        raise TypeError(f"rel_tol must be a number, got {rel_tol!r}")
    if not 0 < rel_tol < 1:
        raise ValueError(f"rel_tol must be in (0, 1), got {rel_tol!r}")
    if any(not isinstance(why, str) for _, why in mistakes):
        raise TypeError(
            f"mistakes must be [(wrong answer, why: str), ...], got {mistakes!r}"
        )


def _close(got: torch.Tensor, b: object, rel_tol: float) -> bool:
    b = torch.as_tensor(b, dtype=_F64)
    return got.shape == b.shape and torch.allclose(got, b, rtol=rel_tol, atol=1e-6)


def _rounds_to(got: torch.Tensor, b: object, min_digits: int = 1) -> bool:
    """Each number of ``got`` is ``b``'s rounded to the digits it is written with."""
    b = torch.as_tensor(b, dtype=_F64)
    pairs = zip(got.flatten().tolist(), b.flatten().tolist(), strict=False)
    return got.shape == b.shape and all(
        min_digits <= _digits(x) <= 6 and float(f"{y:.{_digits(x)}g}") == x
        for x, y in pairs
    )


def _why_wrong(
    got: torch.Tensor,
    want: torch.Tensor,
    rel_tol: float,
    mistakes: Sequence[tuple[object, str]],
    near_hint: str = "",
) -> str | None:
    """The hint for a wrong answer of the right shape, or None (the general hint)."""
    why = next((why for wrong, why in mistakes if _close(got, wrong, rel_tol)), None)
    if why is None and _rounds_to(got, want):
        why = (
            "差一点：你的答案是正确值舍入到这几位的结果，只是有效数字不够。"
            "按题目要求写足位数（或直接填算式）再试。"
        )
    if why is None:  # a listed wrong answer, rounded to the digits written
        why = next((why for wrong, why in mistakes if _rounds_to(got, wrong, 2)), None)
    near = max(10 * rel_tol, 0.01)  # "很接近": printed as a percentage, 2 digits
    if why is None and torch.allclose(got, want, rtol=near, atol=1e-6):
        why = f"很接近：与正确值相差不到 {near * 100:.2g}%，" + (
            near_hint
            or "推导多半对了，是算术或舍入出了错。直接填算式，让 Python 去算。"
        )
    return why


class _Grading(NamedTuple):
    """What a question computes: the expected value and how to grade against it."""

    expected: object
    mistakes: list[tuple[object, str]]
    hint: str
    rel_tol: float = 1e-3


# ---- the byte count of naive attention ------------------------------------------

_FLOAT32_BYTES = 4
_L_BYTES, _D_BYTES = 1024, 64


def _bytes_answer(square: int, thin: int, L: int = _L_BYTES, D: int = _D_BYTES):
    """(c, ratio) when ``square`` L×L matrices are weighed against ``thin`` L×D ones:
    the former are larger for L > c·D; at (L, D) they are ``ratio`` times the latter."""
    big, small = square * _FLOAT32_BYTES, thin * _FLOAT32_BYTES  # bytes per L², LD
    return small / big, big * L * L / (small * L * D)


def _bytes_hint(answer: object) -> str:
    """The threshold c and the ratio at L = 16D come from one ratio 8L²/(16LD): the
    ratio is always 16/c; a pair that breaks this was not computed from one count."""
    try:
        c, ratio = (float(a) for a in answer)  # type: ignore[union-attr]
        consistent = abs(c * ratio - _L_BYTES / _D_BYTES) < 0.01 * _L_BYTES / _D_BYTES
    except (TypeError, ValueError):
        consistent = True  # a wrong shape is named by check_answer
    if not consistent:
        return (
            "两个答案不是同一笔账算出来的：若 L > cD 时前者更大，"
            "L = 1024 = 16D 时的倍数就该是 16/c。用一套字节数把两问都算一遍。"
        )
    return "两个 L×L 矩阵各 4L² 字节；Q、K、V 与输出四个 L×D 矩阵各 4LD 字节。"


def _attention_bytes(answer: object) -> _Grading:
    c, ratio = _bytes_answer(2, 4)  # scores and weights; Q, K, V and the output
    return _Grading(
        (c, ratio),
        [
            (
                _bytes_answer(1, 4),
                "只算了分数矩阵：softmax 之后的权重矩阵也是 L×L，也要存。",
            ),
            (
                _bytes_answer(2, 3),
                "漏了输出：Q、K、V 与输出是四个 L×D 矩阵，共 16LD 字节。",
            ),
            (
                (c, 1 / ratio),
                "倍数倒过来了：问的是两个 L×L 矩阵是 Q、K、V 与输出的几倍。",
            ),
            (
                (ratio, c),
                "顺序反了：先写分界点（L 超过 D 的几倍），再写 L = 1024 时的倍数。",
            ),
            (
                (c, _L_BYTES / _D_BYTES),
                "分界点对了，倍数却取了 L/D：倍数是两边字节数之比，"
                "把两边的字节数都代进去再相除，不只是 L 与 D 的比。",
            ),
            (
                _bytes_answer(2, 2),
                "两边按一样多的矩阵算了：分数与权重是两个 L×L 矩阵，"
                "Q、K、V 与输出是四个 L×D 矩阵，个数不同。",
            ),
        ],
        _bytes_hint(answer),
    )


# ---- the reference values of uniform attention (predictions) ----------------------

_L_UNIFORM = 32


def _uniform_distance_mistakes() -> list[tuple[object, str]]:
    L = _L_UNIFORM
    return [
        (
            L / 3,
            "这是大 L 的近似 L/3（求和换成了积分）：要 L = 32 的精确值，"
            "对 i、j = 0..L−1 的 |i − j| 求和，再除以 L² 对。",
        ),
        (
            (L + 1) / 3,
            "只对 j ≠ i 的 L(L − 1) 对求了平均：查询也看自己（距离 0，"
            "均匀注意力给它 1/L 的权重），分母是 L² 对。",
        ),
        (
            (L - 1) / 4,
            "这是因果均匀（查询 i 只看 0..i）的 (L − 1)/4：这里是双向均匀，"
            "每个查询均匀地看全部 L 个键，前后都有。",
        ),
        (
            L / 2,
            "L/2 大约是一端的查询到各键的平均距离（第 0 个查询是 (L − 1)/2）；"
            "中间的查询离各键更近，对所有查询平均要小。",
        ),
        (
            (L - 1) / 2,
            "(L − 1)/2 是第 0 个查询到各键的平均距离；中间的查询离各键更近，"
            "要对所有 L 个查询平均。",
        ),
        (
            (L - 1) / 3,
            "(L − 1)/3 也是近似：把 ∑|i − j| 完整算出来，再除以 L² 对，"
            "不要约掉 (L + 1)/L。",
        ),
        (
            ((L - 1) ** 2 - 1) / (3 * (L - 1)),
            "公式对了，代入的 L 错了：i、j 取 0..31，一共 L = 32 个位置，不是 31。",
        ),
        (
            (L + 1) / 2,
            "这是因果均匀的有效键数 (L + 1)/2：这里问的是双向均匀的平均注意距离。",
        ),
        (float(L), "这是双向均匀的有效键数 L：这里问的是平均注意距离。"),
    ]


def _causal_distance_mistakes() -> list[tuple[object, str]]:
    L = _L_UNIFORM
    return [
        (
            L / 4,
            "这是大 L 的近似 L/4：要 L = 32 的精确值。查询 i 均匀地看 0..i，"
            "平均距离是 i/2，再对 i = 0..L−1 平均。",
        ),
        (
            (L + 1) / 4,
            "距离从 0 数起：查询 i 也看自己（距离 0），它到 0..i 的平均距离是 i/2，"
            "不是 (i + 1)/2。",
        ),
        (
            (L - 1) / 3,
            "这是对所有 (i, j ≤ i) 对等权平均：后面的查询看的键多，占的对也多。"
            "平均注意距离先对每个查询按它的权重平均（权重和为 1），再对 L 个查询平均。",
        ),
        (
            (L - 1) / 2,
            "(L − 1)/2 是最后一个查询的平均距离：前面的查询看的键少、距离也小，"
            "要对所有 L 个查询平均。",
        ),
        (
            (L - 2) / 4,
            "公式对了，代入的 L 错了：i 取 0..31，一共 L = 32 个位置，不是 31。",
        ),
        (
            (L**2 - 1) / (3 * L),
            "这是双向均匀的平均距离：因果均匀的查询 i 只看 0..i，不看后面。",
        ),
        ((L + 1) / 2, "这是因果均匀的有效键数：这里问的是平均注意距离。"),
    ]


def _causal_keys_mistakes() -> list[tuple[object, str]]:
    L = _L_UNIFORM
    return [
        (
            L / 2,
            "这是大 L 的近似 L/2：要 L = 32 的精确值。查询 i 均匀地看 i + 1 个键，"
            "有效键数是 i + 1，再对 i = 0..L−1 平均。",
        ),
        (
            (L - 1) / 2,
            "查询 i 看 0..i 共 i + 1 个键，不是 i 个：它也看自己。",
        ),
        (
            math.exp(math.lgamma(L + 1) / L),
            "先把熵对查询平均、再取了 e 的幂：有效键数是每个查询各自的 e^熵"
            "（查询 i 的是 i + 1）再对查询平均。",
        ),
        (
            (2 * L + 1) / 3,
            "按 (i, j) 对加权平均了：有效键数对 L 个查询等权平均，查询 i 的是 i + 1。",
        ),
        (
            float(L),
            "这是双向均匀的有效键数（也是最后一个查询的键数）：因果均匀的查询 i "
            "只看 i + 1 个键，要对所有查询平均。",
        ),
        (
            (L - 1) / 4,
            "这是因果均匀的平均注意距离：这里问的是有效键数。",
        ),
    ]


# ---- the temperature QK-Norm needs ------------------------------------------------

_S_KEYS, _TARGET_WEIGHT = 100, 0.9


def _temperature(keys: int = _S_KEYS, odds_of: float = _TARGET_WEIGHT, spread=2):
    """g with e^{spread·g}/(e^{spread·g} + keys − 1) = odds_of."""
    return math.log(odds_of / (1 - odds_of) * (keys - 1)) / spread


def _qk_norm_temperature() -> _Grading:
    S, odds = _S_KEYS, _TARGET_WEIGHT / (1 - _TARGET_WEIGHT)
    same_base = "softmax 里是 e 的幂，解 e^{2g} 要用自然对数 math.log。"
    return _Grading(
        _temperature(),
        [
            (
                _temperature(spread=1),
                "大了一倍：最大权重在 s₁ = 1、其余 s_j = −1 时取到，分数相差 2g，"
                "解出 e^{2g} 之后还要除以 2。",
            ),
            (_temperature(S + 1), "其余的键只有 S − 1 = 99 个，不是 S 个。"),
            (
                _temperature(S + 1, spread=1),
                "两处：分数相差 2g，要除以 2；其余的键是 S − 1 = 99 个。",
            ),
            (
                0.5 * math.log(odds * (S - 1) + 1),
                "多加了 1：e^{2g} = 9(S − 1) = 891，不是 892。",
            ),
            (
                0.5 * math.log((S - 1) / odds),
                "不等式解反了：e^{2g}/(e^{2g}+S−1) ≥ 0.9 给出 e^{2g} ≥ 9(S−1)。",
            ),
            (
                _temperature(odds_of=0.5),
                "漏了因子 9：e^{2g} = S − 1 只让最大权重达到 0.5；"
                "要达到 0.9，e^{2g} = 0.9/(1 − 0.9)·(S − 1) = 9(S − 1)。",
            ),
            (0.5 * math.log10(odds * (S - 1)), "用了以 10 为底的对数：" + same_base),
            (0.5 * math.log2(odds * (S - 1)), "用了以 2 为底的对数：" + same_base),
        ],
        "令 e^{2g}/(e^{2g}+S−1) = 0.9，解出 g。",
        rel_tol=1e-4,
    )


# ---- the slopes of binary sparsemax and softmax at t = 0 ---------------------------


def _first_output_at_zero(f: Callable) -> tuple[float, float]:
    """f((t, 0))_1 at t = 0 and its slope d/dt there (autograd)."""
    t = torch.zeros((), dtype=_F64, requires_grad=True)
    p = f(torch.stack([t, torch.zeros((), dtype=_F64)]))[0]
    (slope,) = torch.autograd.grad(p, t)
    return p.item(), slope.item()


def _sparsemax_slopes() -> _Grading:
    _, sp = _first_output_at_zero(sparsemax)
    p0, sm = _first_output_at_zero(functools.partial(torch.softmax, dim=-1))
    return _Grading(
        (sp, sm),
        [
            ((sm, sp), "顺序反了：先写 sparsemax 的斜率，再写 softmax 的。"),
            (
                (2 * sp, sm),
                "sparsemax 的斜率大了一倍：p₁ = (t + 1)/2，对 t 求导是 1/2。",
            ),
            (
                (sp, p0),
                "softmax 的第二个数是 σ(0) 本身，不是斜率：σ′(0) = σ(0)(1 − σ(0))。",
            ),
            (
                (0.0, sm),
                "sparsemax 在 t = 0 附近不是平的：|t| < 1 时两个元素都在支撑里，"
                "p₁ 随 t 线性变化；解出 τ，写出 p₁(t) 再求导。",
            ),
            (
                (2 * sp, 2 * sm),
                "两个斜率都大了一倍：p = (p₁, p₂) 里 z₂ = 0 固定，"
                "只有 z₁ = t 在变；只对 p₁ 求导。",
            ),
        ],
        "|t| < 1 时 sparsemax 给出 p₁ = (t + 1)/2；softmax 给出 σ(t)，σ′ = σ(1 − σ)。",
    )


# ---- retrieved lags from an accuracy ------------------------------------------------

_LAGS, _SYMBOLS = 4, 8


def _lags_from(acc: float, guess: float = 1 / _SYMBOLS) -> float:
    """k from acc = (k + (LAGS − k)·guess)/LAGS."""
    return (_LAGS * acc - _LAGS * guess) / (1 - guess)


def _retrieved_lags(acc_2: float, acc_1: float) -> _Grading:
    n, right = _LAGS, _lags_from(acc_2)
    return _Grading(
        right,
        [
            (n * acc_2, "漏了瞎猜的部分：没取回的 4 − k 个距离也各有 1/8 的机会猜对。"),
            (_lags_from(acc_2, 1 / 4), "瞎猜猜对的概率是 1/8（8 个符号），不是 1/4。"),
            (n * acc_2 - n / _SYMBOLS, "少乘了 8/7：4·acc = 7k/8 + 1/2。"),
            (
                (n * acc_2 - n / _SYMBOLS) * (1 - 1 / _SYMBOLS),
                "乘反了：4·acc = 7k/8 + 1/2，解出 k 要乘 8/7。",
            ),
            (_lags_from(acc_1), "这是 H = 1 的结果，题目问的是 H = 2。"),
            (
                acc_2,
                "这是准确率本身：要由 acc = (k + (4 − k)/8)/4 解出 k"
                "（取回的距离数，0 到 4）。",
            ),
            (
                n * acc_1,
                "这是 H = 1 的 4·acc，而且漏了瞎猜的部分：题目问 H = 2，"
                "没取回的距离也各有 1/8 的机会猜对。",
            ),
        ],
        "由 acc = (k + (4 − k)/8)/4 解出 k，acc 用 4.3.2 节输出里 H = 2 的准确率。",
        rel_tol=0.01,
    )


# ---- the RoPE base whose second pair has period 7 -----------------------------------

_HEAD_DIM, _PAIR, _WINDOW = 16, 1, 8


def _base_for_period(period: float, pair: int = _PAIR, dim: int = _HEAD_DIM) -> float:
    """b with 2π / θ_pair = period, θ_i = b^{−2i/dim}."""
    return (period / (2 * math.pi)) ** (dim / (2 * pair))


def _rope_base_period() -> _Grading:
    farthest = _WINDOW - 1  # the largest relative distance in the window
    return _Grading(
        _base_for_period(farthest),
        [
            (
                _base_for_period(_WINDOW),
                "这是周期等于 8 的 b：长度 8 的窗口是位置 0～7，"
                "相对距离最远是 7，不是 8。",
            ),
            (
                _base_for_period(farthest, dim=2 * _HEAD_DIM),
                "指数用错了：θ_i = b^{−2i/D}，i = 1、D = 16 时是 b^{−1/8}。",
            ),
            (
                float(farthest) ** (_HEAD_DIM / 2),
                "漏了 2π：转一整圈的角度是 2π，周期是 2π/θ₁。",
            ),
            (
                _base_for_period(farthest, pair=2),
                "指数 4 来自 θ = b^{−1/4}：要么用了 D = 8（这里头维度 D = 16），"
                "要么取了第三对 i = 2（第二对是 i = 1）。θ₁ = b^{−2·1/16} = b^{−1/8}。",
            ),
            (
                1 / _base_for_period(farthest),
                "解反了：周期随 b 增大而变长，b = (7/2π)^8。",
            ),
            (  # learner test 63
                (farthest / math.pi) ** (_HEAD_DIM / 2),
                "用了 π 而不是 2π：π/θ₁ 是转半圈的距离；转满一整圈是 2π/θ₁ = 7。",
            ),
            (
                _base_for_period(farthest, dim=2),
                "这是 b^{1/8}：令 2π·b^{1/8} = 7 之后还要把两边取 8 次方，"
                "解出 b 本身。",
            ),
        ],
        "第二对 i = 1：θ₁ = b^{−2/16}，周期 2π/θ₁ = 2π·b^{1/8}；令它等于 7 解出 b。",
    )


# ---- weight decay on rows that get no gradient --------------------------------------

_ETA, _LAMBDA, _STEPS = 0.01, 0.1, 200


def _weight_decay_factor() -> _Grading:
    shrink = 1 - _ETA * _LAMBDA
    return _Grading(
        shrink**_STEPS,
        [
            (
                1 - _STEPS * _ETA * _LAMBDA,
                "不是线性的：每一步乘一次 (1 − ηλ)，200 步是 200 次方；"
                "1 − 200ηλ 只在总的缩小量很小时才近似成立。",
            ),
            (
                math.exp(-_STEPS * _ETA * _LAMBDA),
                "这是连续时间的近似 exp(−200ηλ)：每一步乘的是 "
                "(1 − ηλ)，200 步是 (1 − ηλ)²⁰⁰，差在第 4 位。",
            ),
            (shrink ** (_STEPS + 1), "多乘了一步：200 步是 200 次方，不是 201 次方。"),
            (shrink ** (_STEPS - 1), "少乘了一步：200 步是 200 次方，不是 199 次方。"),
            ((1 - _LAMBDA) ** _STEPS, "每步缩小的是 ηλ = 0.001，不是 λ。"),
            ((1 - _ETA) ** _STEPS, "每步缩小的是 ηλ = 0.001，不是 η。"),
            (shrink**5, "步数是 fit 训练的 200 步。"),
            (
                1.0,
                "weight_decay > 0 时，即使梯度为 0，AdamW 每一步也把参数乘以 1 − ηλ。",
            ),
        ],
        "梯度为 0 时 AdamW 的一步只剩 θ ← θ − ηλθ；答案至少写 5 位有效数字。",
        rel_tol=3e-5,
    )


class _Question(NamedTuple):
    title: str
    name: str  # the page's variable for the answer
    grading: Callable[..., _Grading]  # (answer?, measured...) -> _Grading


QUESTIONS: dict[str, _Question] = {
    "attention_bytes": _Question(
        "分界点与 L = 1024 时的倍数", "my_bytes_answer", _attention_bytes
    ),
    "qk_norm_temperature": _Question("温度 g 的下界", "my_g_min", _qk_norm_temperature),
    "sparsemax_slopes": _Question("t = 0 处的两个斜率", "my_slopes", _sparsemax_slopes),
    "retrieved_lags": _Question("H = 2 取回的距离数", "my_k_h2", _retrieved_lags),
    "rope_base_period": _Question(
        "第二对周期为 7 的 rope_base", "my_base", _rope_base_period
    ),
    "weight_decay_factor": _Question(
        "200 步之后的倍数", "my_decay", _weight_decay_factor
    ),
}


class _Prediction(NamedTuple):
    title: str
    name: str  # the page's variable for the prediction
    measured: str  # the keyword of the page's measurement
    mistakes: Callable[[], list[tuple[object, str]]]


# predictions: compared with the page's measurement and shown, as compare_prediction
PREDICTIONS: dict[str, _Prediction] = {
    "uniform_distance": _Prediction(
        "双向均匀的平均注意距离（L = 32）",
        "my_prediction_distance",
        "measured_distance",
        _uniform_distance_mistakes,
    ),
    "causal_distance": _Prediction(
        "因果均匀的平均注意距离（L = 32）",
        "my_causal_distance",
        "measured_distance",
        _causal_distance_mistakes,
    ),
    "causal_keys": _Prediction(
        "因果均匀的有效键数（L = 32）",
        "my_causal_keys",
        "measured_keys",
        _causal_keys_mistakes,
    ),
}
_PREDICTION_TOL = 5e-4


def _measured_names(grading: Callable) -> list[str]:
    return [p for p in inspect.signature(grading).parameters if p != "answer"]


def check_number(
    question: str,
    answer: object,
    *,
    exercise: str | None = None,
    solution: bool = False,
    **measured: float,
) -> Graded | None:
    """Grade the learner's ``answer`` to ``question`` (a key of :data:`QUESTIONS`, e.g.
    ``"qk_norm_temperature"``) with :func:`check_answer`; the expected value and the
    typical mistakes are computed here. ``measured``: the quantities the page measured
    that the question needs (``retrieved_lags``: ``acc_2`` and ``acc_1``, the
    accuracies of the H = 2 and H = 1 models). ``exercise`` (``"4.11"``) names the
    exercise in the messages and keeps the outcome for ``progress()``.

    A prediction (a key of :data:`PREDICTIONS`: ``"uniform_distance"`` and
    ``"causal_distance"`` with the page's ``measured_distance``, ``"causal_keys"``
    with its ``measured_keys``) is never an error: it is printed next to the
    measurement by :func:`compare_prediction`, whose result is returned. An exercise
    with several predictions counts in ``progress()`` with the worst of them."""
    __tracebackhide__ = True
    if question in PREDICTIONS:
        title, name, measure, mistakes = PREDICTIONS[question]
        _expect_measured(question, [measure], measured)
        what = f"练习 {exercise}：{title}" if exercise else title
        actual = float(measured[measure])
        graded = compare_prediction(
            answer, actual, rel_tol=_PREDICTION_TOL, what=what, mistakes=mistakes()
        )
        if answer is None:
            status = SKELETON
        elif graded and abs(float(answer) - actual) <= _PREDICTION_TOL * abs(actual):
            status = PASSED
        else:
            status = FAILED
        _keep_result(exercise, title, name, solution, status)
        return graded
    if question not in QUESTIONS:
        known = sorted([*QUESTIONS, *PREDICTIONS])
        raise ValueError(f"unknown question {question!r}; known: {known}")
    title, name, grading = QUESTIONS[question]
    _expect_measured(question, _measured_names(grading), measured)
    if "answer" in inspect.signature(grading).parameters:
        measured = {"answer": answer, **measured}
    expected, mistakes, hint, rel_tol = grading(**measured)
    check_answer(
        answer,
        expected,
        what=f"练习 {exercise}：{title}" if exercise else title,
        rel_tol=rel_tol,
        hint=hint,
        mistakes=mistakes,
        exercise=exercise,
        name=name,
        solution=solution,
    )
    return None


def _expect_measured(question: str, names: list[str], measured: dict) -> None:
    """ValueError naming a measured quantity missing or not expected, TypeError naming
    one that is not a number (a one-element tensor counts as its number)."""
    missing = [n for n in names if n not in measured]
    if missing:
        raise ValueError(f"question {question!r} needs the measured {missing}")
    extra = [n for n in measured if n not in names]
    if extra:
        raise ValueError(f"question {question!r} takes no measured {extra}")
    for n in names:
        value = measured[n]
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = measured[n] = value.item()
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"measured {n} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"measured {n} must be finite, got {value!r}")
