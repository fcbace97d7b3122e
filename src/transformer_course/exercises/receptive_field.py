"""The receptive field of stacked sliding-window attention (chapter 4, exercise
4.16): the learner composes the window mask with itself by boolean matrix products
(reachability) rather than typing the closed formula ``min(ℓ n_w + 1, L)``."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from ..masks import causal_mask
from ._protocol import CallWatch, checker, ends_in, fail, name_of, run_learner
from .numeric_answers import refuse_wrong_answer

__all__ = ["check_receptive_field"]

# (L, n_w, layers): path counts thresholded only at the end wrap around (or become
# inf) into wrong answers: in uint8, int8 or float16 on (12, 2, 9) and (38, 3, 12), in
# int64 on (40, 3, 40), in float32 on (64, 2, 130) (learner test 65)
_CASES = [
    (40, 3, 1),
    (40, 3, 5),
    (40, 3, 15),
    (10, 4, 3),
    (12, 1, 20),
    (12, 2, 9),
    (38, 3, 12),
    (40, 3, 40),
    (64, 2, 130),
]


# products of two matrices; a broadcast boolean product (M[:, :, None] & R).any(1)
# shows itself by its (L, L, L) intermediate instead
_PRODUCTS = {
    torch.matmul,
    torch.Tensor.matmul,
    torch.Tensor.__matmul__,
    torch.Tensor.__rmatmul__,
    torch.mm,
    torch.Tensor.mm,
    torch.bmm,
    torch.einsum,
    torch.tensordot,
    torch.linalg.matrix_power,
    torch.matrix_power,
    torch.Tensor.matrix_power,
    torch.linalg.multi_dot,
    torch.mv,
    torch.Tensor.mv,
    torch.inner,
    torch.Tensor.inner,
}

# a reduction over one dim of an (L, L) operand, leaving an (L,) vector, is the second
# half of a broadcast vector–matrix product (e[:, None] & band).any(0); learner test 66
_REDUCTIONS = {
    torch.any,
    torch.Tensor.any,
    torch.all,
    torch.Tensor.all,
    torch.sum,
    torch.Tensor.sum,
    torch.amax,
    torch.Tensor.amax,
    torch.max,
    torch.Tensor.max,
    torch.count_nonzero,
    torch.Tensor.count_nonzero,
}

# the mask handed to numpy: its products there are out of torch's sight, so trusted
_TO_NUMPY = {torch.Tensor.numpy, torch.Tensor.__array__}


def _multiplies_masks(L: int, func, args: tuple, out: object) -> bool:
    """Whether a torch call multiplies by an (L, L) mask: a product with an (L, L)
    operand, an (L, L, L) broadcast of one, a reduction of an (L, L) operand to an
    (L,) vector (a broadcast vector–matrix product), or the mask passed to numpy.
    Building the mask alone is not enough: a closed formula after it makes none."""
    operands = [t for a in args for t in (a if isinstance(a, (list, tuple)) else [a])]
    square = any(ends_in(t, (L, L)) for t in operands)
    if isinstance(out, tuple) and out:  # torch.max(x, dim): (values, indices)
        out = out[0]
    reduced = func in _REDUCTIONS and isinstance(out, Tensor) and out.shape == (L,)
    by_mask = func in _PRODUCTS or func in _TO_NUMPY or reduced
    return (square and by_mask) or ends_in(out, (L, L, L))


# dtypes in which a product's path counts can overflow on these cases
_NARROW = (
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
)


def _overflowed(func, args: tuple, out: object) -> bool:
    """Whether a product in a narrow dtype overflowed: the same product in float64
    leaves the integer dtype's range (a count wrapped around), or is finite where the
    float16, bfloat16 or float32 one became inf."""
    if func not in _PRODUCTS or not isinstance(out, Tensor) or out.dtype not in _NARROW:
        return False
    wide = func(*[_in_float64(a) for a in args])
    if out.is_floating_point():
        return bool((~out.isfinite() & wide.isfinite()).any())
    info = torch.iinfo(out.dtype)
    return bool(((wide > info.max) | (wide < info.min)).any())


def _in_float64(a: object) -> object:
    if isinstance(a, (list, tuple)):
        return type(a)(_in_float64(t) for t in a)
    return a.to(torch.float64) if isinstance(a, Tensor) else a


def _overflow(dtype: torch.dtype) -> str:
    """``dtype`` and what happens in it to a path count too large for it."""
    if dtype.is_floating_point:
        return (
            f"{dtype}，它最大只能存 {torch.finfo(dtype).max:g}，更大的条数变成 inf，"
            "inf 再乘 0 得 nan：nan > 0 是 False，nan != 0 却是 True，两种写法都数错"
        )
    info = torch.iinfo(dtype)
    return (
        f"{dtype}，它只能存 {info.min}～{info.max}，更大的条数会回绕"
        f"（按 2^{info.bits} 取模），可能变成 0{' 或负数' if info.min < 0 else ''}，"
        "这样的位置就数漏了"
    )


_OVERFLOW_FIX = (
    "不取 > 0 时 band @ reach 的元素是路径的条数，层数一多就超出这个范围。"
    "每乘一次就取 > 0，元素最多是 L，用哪种 dtype 都不会溢出。"
)


# learner test 66: a float count grown into inf, then nan, handed to int()
_CRASHES = [
    (
        r"cannot convert float (NaN|infinity) to integer",
        "路径条数溢出了：浮点的条数超过 dtype 的最大值就成了 inf，inf 再乘 0 得 nan，"
        "int() 转不了它。" + _OVERFLOW_FIX,
    ),
]


def _path_counts(L: int, n_w: int, layers: int) -> float:
    """The last row's sum without ``> 0``: the paths from the inputs to the last
    position."""
    band = causal_mask(L, window=n_w + 1).to(torch.float64)
    return torch.linalg.matrix_power(band, layers)[-1].sum().item()


def _mistakes() -> list[tuple[list, str]]:
    c = _CASES
    return [
        (
            [_path_counts(*case) for case in c],
            "每层之后没有取 > 0：band @ reach 的元素是路径的条数，不是能否到达，"
            "数出来的是路径总数。每乘一次就做 (band @ reach) > 0，只数到得了的位置。",
        ),
        (
            [1] * len(c),
            "答案都是 1：数的是第 0 行（第 0 个位置只看得到它自己），或最后一列"
            "（只有最后一个位置用到最后一个输入）。band 被转置（band.T）时，"
            "reach[-1] 数的正是最后一列：掩码的行是查询、列是键，不要转置。"
            "要数最后一个位置那一行 reach[-1]。从单位矩阵出发、却用了逐元素的 "
            "band * reach 时，reach 一直是单位矩阵，答案也都是 1：要用矩阵乘 @。",
        ),
        (
            [min((layers - 1) * n_w + 1, L) for L, n_w, layers in c],
            "少算了一层：从单位矩阵出发时要乘 layers 次；从 band 出发时它已经是一层，"
            "只再乘 layers − 1 次。",
        ),
        (
            [min((layers + 1) * n_w + 1, L) for L, n_w, layers in c],
            "多算了一层：从 band 出发时已经是一层，再乘 layers 次就是 layers + 1 层；"
            "从单位矩阵出发。",
        ),
        (
            [layers * n_w + 1 for L, n_w, layers in c],
            "超过了序列长度：感受野最多是全部 L 个位置。",
        ),
        (
            [min(layers * n_w, L) for L, n_w, layers in c],
            "少了 1：每个位置也看它自己。",
        ),
        (
            [min(layers * (n_w - 1) + 1, L) for L, n_w, layers in c],
            "窗口小了 1：自己和前 n_w 个位置是 tc.causal_mask(L, window=n_w + 1)。",
        ),
        (  # learner test 64
            [min(layers * (n_w + 1) + 1, L) for L, n_w, layers in c],
            "窗口大了 1：自己和前 n_w 个位置共 n_w + 1 个，是 "
            "tc.causal_mask(L, window=n_w + 1)，不是 window=n_w + 2。",
        ),
        (
            [min(n_w + 1, L) for L, n_w, layers in c],
            "只算了一层：掩码的布尔乘积要做 layers 次，而且是矩阵乘 band @ reach。"
            "用逐元素的 band * reach 时，循环做多少次结果都只是一层（最多是 band"
            "本身）。",
        ),
        (
            [
                sum(min(layers * n_w + 1, i + 1) for i in range(L))
                for L, n_w, layers in c
            ],
            "数的是整个 reach 里 True 的个数（所有位置的感受野之和）：只数最后一个"
            "位置那一行 reach[-1]。",
        ),
    ]


@checker("滑动窗口的感受野")
def check_receptive_field(fn) -> str:
    """Grade ``fn(L, n_w, layers)``: how many inputs the last position depends on
    after ``layers`` causal sliding-window layers (itself and the ``n_w`` positions
    before), computed with matrix products of the ``(L, L)`` window mask."""
    name = name_of(fn)
    answers, products, narrow = [], False, []

    def overflowed(func, args: tuple, out: object) -> bool:
        if _overflowed(func, args, out):
            narrow.append(out.dtype)
            return True
        return False

    for i, case in enumerate(_CASES):
        with (
            CallWatch(functools.partial(_multiplies_masks, case[0])) as watch,
            CallWatch(overflowed),
        ):
            answers.append(
                run_learner(
                    fn,
                    *case,
                    what=name,
                    case=f"(L, n_w, layers) = {case}",
                    first=i == 0,
                    causes=_CRASHES,
                )
            )
        products = products or watch.seen
    expected = [min(layers * n_w + 1, L) for L, n_w, layers in _CASES]
    if answers == expected and not products:  # 值对了，却没有做乘积
        fail(
            "练习 4.16：你的函数没有做 (L, L) 掩码矩阵的乘积（@、matmul、einsum、"
            "tensordot、matrix_power、mv 或广播的布尔乘积）。答案虽对，但这道题要用"
            "掩码的乘积核对可达性，不是套公式 min(ℓ n_w + 1, L)，也不是逐行搜索："
            "从单位矩阵出发，每过一层做一次 (band @ reach) > 0。"
        )
    refuse_wrong_answer(
        answers,
        expected,
        what="练习 4.16：堆叠后的感受野",
        hint=f"路径条数溢出了：你的矩阵乘积用的是 {_overflow(narrow[0])}。"
        + _OVERFLOW_FIX
        if narrow
        else "从单位矩阵出发，每过一层做一次 (band @ reach) > 0，"
        "最后数最后一行有几个 True。",
        mistakes=_mistakes(),
    )
    if narrow:  # right by luck: no count wrapped onto 0 here
        fail(
            "练习 4.16：答案都对，但路径条数在你的矩阵乘积里溢出了"
            f"（{_overflow(narrow[0])}）：这几组碰巧没有数错，"
            "换一组 (L, n_w, layers) 就可能数错。" + _OVERFLOW_FIX
        )
    return f"{len(_CASES)} 组 (L, n_w, layers)，用掩码的乘积算出 min(ℓ n_w + 1, L)"
