"""Checkers for chapter 2 (the formulas as code): the key-padding mask built from the
sentence lengths of a right-padded batch."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from ._protocol import checker, fail, name_of, run_learner
from ._report import as_tensor, check_shape, first_reproduced, shape_letters


def _lengths_mask(lengths: Tensor, S: int, mistake: str = "") -> Tensor:
    """``(N, 1, 1, S)``: ``True`` on the first ``lengths[b]`` positions of row ``b``
    (or what ``mistake`` gives instead)."""
    pos = torch.arange(S)
    real = {
        "": pos < lengths[:, None],
        "inverted": pos >= lengths[:, None],
        "one_more": pos <= lengths[:, None],
        "one_less": pos < lengths[:, None] - 1,
        "left": pos >= S - lengths[:, None],  # the last ℓ positions: left padding
        "left_inverted": pos < S - lengths[:, None],
    }[mistake]
    return real[:, None, None, :]


PADDING_MASK_HINTS = [
    (
        "True 与 False 反了：本课程约定 True = 可以看（真实词元），"
        "填充位置才是 False（用 <，不是 >=）。",
        "inverted",
    ),
    (
        "每句多放行了一个填充位置：位置编号从 0 开始，长 ℓ 的句子占位置 "
        "0..ℓ−1，条件是 pos < ℓ，不是 pos <= ℓ。",
        "one_more",
    ),
    (
        "每句少了最后一个真实词元：长 ℓ 的句子占位置 0..ℓ−1，条件是 pos < ℓ。",
        "one_less",
    ),
    (
        "True 放在了每句的最后 ℓ 个位置：那是填充在左边（左填充）时的掩码。"
        "这里的批是右填充，句子在前、填充在后：长 ℓ 的句子占位置 0..ℓ−1，"
        "条件是 pos < ℓ。",
        "left",
    ),
    (
        "True 放在了每句前面的 {S}−ℓ 个位置：那是填充在左边（左填充）时的填充位置，"
        "而且 True/False 反了。这里的批是右填充（句子在前、填充在后），"
        "True = 真实词元：长 ℓ 的句子占位置 0..ℓ−1，条件是 pos < ℓ。",
        "left_inverted",
    ),
]

_CASES = (((3, 5), 5), ((1, 4, 2), 6), ((2,), 2), ((4, 4), 7))


@checker("填充掩码")
def check_padding_mask(fn: Callable, exercise: str | None = None) -> str:
    """Grade ``fn(lengths, S)``: ``lengths`` an int64 tensor ``(N,)`` of sentence
    lengths, right-padded to ``S``; returns a bool key-padding mask ``(N, 1, 1, S)``,
    ``True`` = real token (may be attended to), as
    :func:`transformer_course.padding_mask` gives from the token ids. The messages
    of a chapter-2 ``exercise`` call the key length m, as that page does."""
    name = name_of(fn)
    # the letters of the score shape (N, H, L, S); S_ names the key length S
    H, L, S_ = (shape_letters(exercise)[k] for k in "HLS")
    for i, (lens, S) in enumerate(_CASES):
        lengths = torch.tensor(lens)
        case = f"lengths = {list(lens)}，{S_} = {S}"
        out = run_learner(fn, lengths.clone(), S, what=name, case=case, first=i == 0)
        out = as_tensor(out, name, case)
        ref = _lengths_mask(lengths, S)
        if tuple(out.shape) == (len(lens), S):
            fail(
                f"{name} 的形状是 {tuple(out.shape)}（{case}）：要能与 "
                f"(N, {H}, {L}, {S_}) 的分数广播，应为 (N, 1, 1, {S_}) = "
                f"{tuple(ref.shape)}，在末尾加 [:, None, None, :]。"
            )
        if tuple(out.shape) == (len(lens), 1, S, 1):
            fail(
                f"{name} 的形状是 {tuple(out.shape)}（{case}）：句子的位置放在了"
                f"查询那一维（{L}）：这屏蔽的是填充位置发出的查询，"
                "其余查询照样看得见填充的键。"
                f"填充掩码沿键那一维（{S_}）：应为 (N, 1, 1, {S_})，"
                "即 [:, None, None, :]。"
            )
        check_shape(out, ref.shape, name, case)
        if out.dtype != torch.bool:
            why = (
                "0/1 的浮点张量会被当作加到分数上的加性掩码。"
                if out.is_floating_point()
                else "非布尔的掩码，masked_fill 和 scaled_dot_product_attention 都会"
                "报错（它们只收 torch.bool）。比较运算直接给出布尔值，"
                "不要再 .long() 或 .int()。"
            )
            fail(
                f"{name} 应返回 torch.bool 张量（{case}），得到 dtype {out.dtype}："
                + why
            )
        if bool((out == ref).all()):
            continue
        hint = first_reproduced(
            out, PADDING_MASK_HINTS, functools.partial(_lengths_mask, lengths, S), S=S_
        )
        b, j = (int(k) for k in (out != ref).nonzero()[0][[0, 3]])
        fail(
            f"{name} 不对（{case}）：第 {b} 句的位置 {j} 应为 {bool(ref[b, 0, 0, j])}，"
            f"得到 {bool(out[b, 0, 0, j])}。"
            + (hint or "长 ℓ 的句子，位置 0..ℓ−1 为 True，其余为 False。")
        )
    return "4 组长度，含整句无填充和单句的批"
