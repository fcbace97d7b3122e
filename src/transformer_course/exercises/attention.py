"""Scaled dot-product attention (``my_self_attention``) and the causal mask."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from torch import Tensor

from ..attention import scaled_dot_product_attention
from ..masks import causal_mask
from ._protocol import (
    checker,
    copies,
    fail,
    name_of,
    randn,
    random_mask,
    run_learner,
    seeded_generator,
)
from ._report import (
    as_tensor,
    bug_hunt_hints,
    check_float,
    check_shape,
    close,
    filled,
    first_reproduced,
    shape_letters,
    where_differs,
)


def _scores(Q: Tensor, K: Tensor, mask: Tensor | None, fill: float = -math.inf):
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
    return scores if mask is None else scores.masked_fill(~mask, fill)


def _online_without_rescale(
    Q: Tensor, K: Tensor, V: Tensor, mask: Tensor | None, block: int = 4
) -> Tensor:
    """Blockwise softmax that never rescales the earlier blocks' sums (ch04)."""
    scores = _scores(Q, K, mask)
    m = torch.full(scores.shape[:-1] + (1,), -math.inf, dtype=scores.dtype)
    total, acc = torch.zeros_like(m), 0.0
    for start in range(0, scores.size(-1), block):
        s = scores[..., start : start + block]
        m = torch.maximum(m, s.amax(-1, keepdim=True))
        p = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
        total = total + p.sum(-1, keepdim=True)
        acc = acc + p @ V[..., start : start + block, :]
    return acc / total


def _transposed_variant(scores: Tensor, V: Tensor, mistake: str) -> Tensor | None:
    """The (L, S) scores or weights transposed before use: only runs when L == S."""
    if scores.size(-1) != scores.size(-2):
        return None
    if mistake == "scores_transposed":
        return torch.softmax(scores.transpose(-2, -1), dim=-1) @ V
    return torch.softmax(scores, dim=-1).transpose(-2, -1) @ V  # weights_transposed


def _always_causal(Q: Tensor, s: int, mask: Tensor | None) -> Tensor:
    """A lower triangle added to whatever mask was passed (learner test 34a, 1.1)."""
    causal = torch.ones(Q.size(-2), s, dtype=torch.bool, device=Q.device).tril()
    return causal if mask is None else mask & causal


def _attention_variant(
    Q: Tensor, K: Tensor, V: Tensor, mask: Tensor | None, mistake: str
) -> Tensor | None:
    """What attention with one of :data:`ATTENTION_HINTS`' mistakes outputs."""
    if mistake.startswith("mask_") and mask is None:
        return None
    d, s = Q.size(-1), K.size(-2)
    raw = Q @ K.transpose(-2, -1)
    scale = {
        "no_scale": 1.0,
        "scale_d": d,
        "scale_len": math.sqrt(s),
        "scale_queries": math.sqrt(Q.size(-2)),
        "scale_batch": math.sqrt(K.size(0)),  # K.shape[0]: the batch size
        "scale_times": 1 / math.sqrt(d),  # multiplied by √d_k
        "scale_dv": math.sqrt(V.size(-1)),
    }
    scores = raw / scale.get(mistake, math.sqrt(d))
    if mistake == "mask_float_added":  # learner test 38c: mask.float() to SDPA
        return torch.softmax(scores + mask.to(scores.dtype), dim=-1) @ V
    mask = _always_causal(Q, s, mask) if mistake == "always_causal" else mask
    if mask is not None and mistake != "mask_ignored":
        fill = {"mask_zero": 0.0, "mask_inverted": -1e9}.get(mistake, -math.inf)
        scores = scores.masked_fill(mask if mistake == "mask_inverted" else ~mask, fill)
    if mistake in ("mask_after", "scale_after"):
        scores = (
            raw / math.sqrt(d) if mistake == "mask_after" else scores * math.sqrt(d)
        )
    if mistake == "online_no_rescale":
        return _online_without_rescale(Q, K, V, mask)
    if mistake in ("scores_transposed", "weights_transposed"):
        return _transposed_variant(scores, V, mistake)
    dim = -2 if mistake in ("softmax_queries", "softmax_queries_renormed") else -1
    weights = torch.softmax(scores, dim=dim)
    if mistake == "mask_after":
        weights = weights * mask
    if mistake == "scale_after":  # softmax of the raw scores, then divided by √d_k
        weights = weights / math.sqrt(d)
    if mistake == "softmax_queries_renormed":  # then each row rescaled to sum to 1
        weights = weights / weights.sum(-1, keepdim=True)
    return weights @ (K if mistake == "values_K" else V)


ATTENTION_HINTS = [
    (
        "输出差了一个缩放：分数没有除以 √d_k（这里 d_k = {d}，应乘 1/√{d}）。",
        "no_scale",
    ),
    ("分数除以了 d_k = {d}，应除以 √d_k = {sqrt_d:.3g}。", "scale_d"),
    (
        "分数乘了 √d_k，应除以 √d_k：scores = Q @ K.transpose(-2, -1) / √d_k。",
        "scale_times",
    ),
    (
        "分数除以了 √d_v = √{dv}（V 的维数），应除以 √d_k = √{d}"
        "（d_k = Q.size(-1)，是 Q、K 的维数）。",
        "scale_dv",
    ),
    (
        "缩放用了键的个数 {S} = {s}（√{s}）：应除以向量维度的平方根 √d_k = √{d}"
        "（d_k = Q.size(-1)）。",
        "scale_len",
    ),
    (
        "缩放用了查询的个数 {L} = {l}（√{l}，Q.size(-2) 或 Q.shape[-2]）：应除以向量"
        "维度的平方根 √d_k = √{d}（d_k = Q.size(-1)，最后一维）。",
        "scale_queries",
    ),
    (
        "缩放用了 K.shape[0] = {n}（√{n}）：第一维是批大小 N，不是向量维度 d_k。"
        "应除以 √d_k = √{d}（d_k = Q.size(-1)，最后一维）。",
        "scale_batch",
    ),
    (
        "权重在 key 维度上之和不是 1：softmax 的 dim 可能写错了"
        "（应在最后一维 dim=-1，即 key 维度上归一化）。",
        "softmax_queries",
    ),
    ("用权重加权求和的应是 V，不是 K（weights @ V）。", "values_K"),
    (
        "被屏蔽的位置仍有权重：掩码方向可能反了（True = 可以看），"
        "应写 scores.masked_fill(~attn_mask, float('-inf'))。",
        "mask_inverted",
    ),
    (
        "被屏蔽的位置仍有权重：掩码没有起作用（attn_mask 参数被忽略了？）。",
        "mask_ignored",
    ),
    (
        "被屏蔽的位置仍有权重：0/1 的浮点掩码被当成了加性掩码，加到了分数上"
        "（可以看的加 1，未来的加 0，一个也没屏蔽）。F.scaled_dot_product_attention "
        "只把 bool 掩码当“True = 可以看”：直接传 bool 的 attn_mask，不要 .float()；"
        "或者自己 masked_fill(~attn_mask, -inf)（第 5 章的选读“0/1 浮点下三角矩阵"
        "怎样当掩码用？”专讲这个坑）。",
        "mask_float_added",
    ),
    (
        "被屏蔽的位置仍有权重：屏蔽时把分数填成了 0，应填 -inf"
        "（分数为 0 的位置经 softmax 后仍有权重）。",
        "mask_zero",
    ),
    (
        "softmax 之后才乘掩码：被屏蔽位置的权重虽为 0，每行之和却不再是 1。"
        "应在 softmax 之前把被屏蔽的分数填成 -inf。",
        "mask_after",
    ),
    (
        "分块计算时，最大值 m 变大后没有把之前的累加量乘上 exp(m_旧 − m_新) 重新缩放"
        "（分母 l 和分子 acc 都要缩放）。",
        "online_no_rescale",
    ),
    (
        "缩放放错了位置：应先把分数除以 √d_k 再做 softmax，"
        "而不是对 softmax 的结果除以 √d_k（那样每行权重之和不再是 1）。",
        "scale_after",
    ),
    (
        "softmax 沿查询维（dim=-2）做、再把每行除以行和：行和虽然是 1，"
        "权重却不是每个查询自己的 softmax。softmax 应沿键维 dim=-1 做。",
        "softmax_queries_renormed",
    ),
    (
        "把分数矩阵转置了再做 softmax：scores.transpose(-2, -1) 的第 i 行是第 i 个键"
        "对所有查询的分数，这等于沿查询维做 softmax。不要转置 scores，"
        "直接 torch.softmax(scores, dim=-1)（每行是一个查询对所有键的分数）。",
        "scores_transposed",
    ),
    (
        "乘 V 之前把权重转置了（weights.transpose(-2, -1) @ V）：权重 (…, {L}, {S}) 的"
        "第 i 行是查询 i 对各个键的权重，直接 weights @ V；{L} = {S} 时形状对得上，"
        "结果却是按键汇总的。",
        "weights_transposed",
    ),
    (
        "你的函数自己加了一个因果（下三角）掩码：没有传 attn_mask 时每个查询都应能看"
        "所有键。因果掩码由调用者传进来（attn_mask=tc.causal_mask(L)），"
        "函数里只屏蔽 attn_mask 为 False 的位置，不要写死 tril。",
        "always_causal",
    ),
]

# crashes: (pattern in "Type: message\nline", hint), before the general causes; the
# hints' {L}, {D}, {H} are filled with the exercise's letters (``filled``)
ATTENTION_CRASHES = [
    (
        r"\bK\.T\b|\.t\(\)|transpose\(1, ?2\)",
        "输入可以是 3 维 (N, {L}, {D}) 或 4 维 (N, {H}, {L}, {D})："
        "转置 K 用 K.transpose(-2, -1)（或 K.mT），"
        "不要写死维度编号（K.T、K.transpose(1, 2) 只适合特定维数）。",
    ),
]


# crashes told apart by the case's sizes, where the learner's line may be unknown (code
# run by exec): (pattern over the sizes {H}, {L}, {S}, hint in the exercise's letters)
ATTENTION_SIZE_CRASHES = [
    (
        r"tensor a \({H}\) must match the size of tensor b \({S}\) at non-singleton "
        r"dimension 1",
        "4 维输入 (N, {H}, {L}, {D}) 在头的那一维上对不上：K.transpose(1, 2) 在 4 维时"
        "交换的是头和位置，不是最后两维。转置 K 用 K.transpose(-2, -1)（或 K.mT），"
        "3 维、4 维都对。",
    ),
    (
        r"batch2 tensor to be: \[\d+, {L}\] but got: \[\d+, {S}\]",
        "权重 @ V 时，权重的最后一维应是键的个数 {S}：你的权重是 (…, {S}, {L})，"
        "被转置了（如 softmax(scores.transpose(-2, -1), …)）。分数 Q Kᵀ 本来就是 "
        "(…, {L}, {S})：不要转置，softmax 沿键的维度 dim=-1 做。",
    ),
]


def _size_causes(Q: Tensor, K: Tensor, letters: dict[str, str]) -> list:
    """:data:`ATTENTION_SIZE_CRASHES` for this case's sizes; a pattern is left out
    where two sizes it tells apart are equal."""
    H = Q.size(1) if Q.dim() == 4 else None
    L, S, D = Q.size(-2), K.size(-2), Q.size(-1)
    (heads, heads_hint), (weights, weights_hint) = ATTENTION_SIZE_CRASHES
    causes = []
    if H is not None and H != S:
        causes.append((heads.format(H=H, S=S), heads_hint.format(**letters)))
    if L != S and L != D:  # Q @ K without a transpose reads "[N, D] but got [N, S]"
        causes.append((weights.format(L=L, S=S), weights_hint.format(**letters)))
    return causes


def _attention_cases(
    g: torch.Generator,
) -> list[tuple[str, Tensor, Tensor, Tensor, Tensor | None]]:
    """The self-attention checks: ``(description, Q, K, V, mask)``; the
    description's ``{L}``, ``{S}``, ``{D}``, ``{H}`` are the exercise's letters
    (:func:`shape_letters`)."""
    cases = [
        (
            "3 维输入 N=2, {L}=5, {S}=7, {D}=8，无掩码",
            randn(g, 2, 5, 8),
            randn(g, 2, 7, 8),
            randn(g, 2, 7, 8),
            None,
        ),
        (
            "4 维输入 N=2, {H}=3, {L}=4, {S}=5, {D}=6，无掩码",
            randn(g, 2, 3, 4, 6),
            randn(g, 2, 3, 5, 6),
            randn(g, 2, 3, 5, 6),
            None,
        ),
        ("自注意力 N=3, {L}={S}=5，因果掩码 (5, 5)", None, None, None, causal_mask(5)),
        (
            "N=2, {L}=3, {S}=7，随机掩码 (2, 3, 7)",
            randn(g, 2, 3, 8),
            randn(g, 2, 7, 8),
            randn(g, 2, 7, 8),
            random_mask(g, 2, 3, 7),
        ),
        (
            "4 维输入，掩码 (2, 1, 4, 5) 在头维上广播",
            randn(g, 2, 3, 4, 6),
            randn(g, 2, 3, 5, 6),
            randn(g, 2, 3, 5, 6),
            random_mask(g, 2, 1, 4, 5),
        ),
    ]
    leading = random_mask(g, 2, 3, 10)
    leading[0, 0, :4] = leading[1, :, :4] = False  # a whole first block of 4 keys
    leading[..., 6] = True
    cases.append(
        (
            "N=2, {L}=3, {S}=10，有的行前 4 个键全被屏蔽"
            "（按 4 个一块时第一块整块被屏蔽）",
            randn(g, 2, 3, 8),
            randn(g, 2, 10, 8),
            randn(g, 2, 10, 8),
            leading,
        )
    )
    cases.append(
        (
            "N=2, {L}=4, {S}=6，d_k = 8 而 d_v = 5（V 的维数与 Q、K 不同）",
            randn(g, 2, 4, 8),
            randn(g, 2, 6, 8),
            randn(g, 2, 6, 5),
            random_mask(g, 2, 4, 6),
        )
    )
    x = randn(g, 3, 5, 8)
    cases[2] = (cases[2][0], x, x, x, cases[2][4])
    return cases


# exercises whose text asks for ``(输出, 权重)`` (ch01 1.1); elsewhere the output
# alone is fine
_RETURNS_WEIGHTS = frozenset({"1.1"})

_SOFTMAX_DIM = "softmax 的 dim 可能写错了（应为 dim=-1）。"

# the find-the-bug exercises on this checker: the page's bug (softmax over the
# queries; the scale by the number of keys) gets the symptom and where to look
_BUG_HUNT = {
    "1.7": {
        "softmax_queries": (
            "每一列（同一个键上、各个查询的权重）之和是 1，每一行却不是：看 softmax "
            "沿的是哪一维。权重 (…, L, S) 里，哪一维的和应该是 1？"
        )
    },
    "2.1": {
        "scale_len": (
            "输出和题目给的 buggy_attention 完全一样：还没有改到 bug。症状与题目里"
            "的相同：键的个数 {S} 一变，结果就与参考不同（这里 {S} = {s}）。"
            "看看 softmax 之前，分数除以的是什么量。"
        )
    },
}


@checker("缩放点积注意力")
def check_self_attention(fn: Callable, exercise: str | None = None) -> str:
    """Grade ``fn(Q, K, V, attn_mask=None)``: scaled dot-product attention.

    Q ``(..., L, D)``, K and V ``(..., S, D)`` (3-D and 4-D inputs); ``mask`` is bool,
    broadcastable to ``(..., L, S)``, ``True`` = may attend. ``fn`` returns the output
    ``(..., L, D)`` or ``(output, weights)`` with weights ``(..., L, S)``; the exercises
    in ``_RETURNS_WEIGHTS`` state the pair, so there the output alone is a mistake.
    Compared with :func:`transformer_course.scaled_dot_product_attention`. The
    messages of a chapter-2 ``exercise`` use that page's letters n, m, d_k, h.
    """
    name = name_of(fn)
    letters = shape_letters(exercise)
    causes = filled(ATTENTION_CRASHES, letters)
    hints = bug_hunt_hints(ATTENTION_HINTS, exercise, _BUG_HUNT)
    dim_hint = _BUG_HUNT.get(str(exercise), {}).get("softmax_queries", _SOFTMAX_DIM)
    for i, (case, Q, K, V, mask) in enumerate(_attention_cases(seeded_generator(1))):
        case = case.format(**letters)
        args = (Q, K, V) if mask is None else (Q, K, V, mask)
        given = copies(args)
        out = run_learner(
            fn,
            *given,
            what=name,
            case=case,
            first=i == 0,
            causes=causes + _size_causes(Q, K, letters),
            copy_inputs=False,
        )
        _check_inputs_unchanged(fn, args, given, case)
        ref_out, ref_w = scaled_dot_product_attention(Q, K, V, mask)
        if exercise in _RETURNS_WEIGHTS and not isinstance(out, (tuple, list)):
            fail(
                f"练习 {exercise} 要求 {name} 返回 (输出, 权重) 两个值，它只返回了一个"
                f"（{type(out).__name__}）：把 softmax 得到的权重 (…, L, S) 也返回，"
                "最后一行写成 return 输出, 权重。"
            )
        out, weights = _attention_outputs(fn, out, ref_out, ref_w, case)
        _check_attention_output_shape(fn, out, ref_out, ref_w, case, letters)
        if weights is not None:
            _check_attention_weights(
                fn, weights, ref_w, (Q, K), mask, case, letters, dim_hint
            )
        _check_attention_finite(fn, out, mask, case)
        if not close(out, ref_out):
            fail(
                f"{name} 的输出与参考实现不一致（{case}；"
                f"{where_differs(out, ref_out)}）。\n可能的原因："
                f"{_attention_hint(out, Q, K, V, mask, letters, hints)}"
            )
        if weights is not None and not close(weights, ref_w):
            fail(
                f"{name} 的输出正确，返回的权重却与参考不一致（{case}；"
                f"{where_differs(weights, ref_w)}）：返回的应是乘 V 的那个权重。"
            )
    return (
        f"3 维和 4 维输入、批量 > 1、{letters['L']} ≠ {letters['S']}、d_v ≠ d_k、"
        "因果掩码、随机掩码、整块被屏蔽的键，共 7 组"
    )


def _check_inputs_unchanged(fn: Callable, args: tuple, given: tuple, case: str) -> None:
    """The learner's code must not change Q, K, V or the mask in place."""
    names = ("Q", "K", "V", "attn_mask")[: len(args)]
    changed = [
        n for n, a, b in zip(names, args, given, strict=True) if not torch.equal(a, b)
    ]
    if changed:
        fail(
            f"{name_of(fn)} 原地修改了输入 {'、'.join(changed)}（{case}）：例如 "
            "Q.div_(...)、Q /= ...、K.masked_fill_(...) 这类带下划线或 /= 的运算"
            "改的是调用者的张量。自注意力里 Q、K、V 是同一个张量 x，改了 Q 也就改了 "
            "K 和 V，调用者手里的 x 也变了。用不改输入的写法：Q / math.sqrt(d_k)、"
            "scores.masked_fill(...)。"
        )


def _attention_outputs(
    fn: Callable, out: object, ref_out: Tensor, ref_w: Tensor, case: str
) -> tuple[Tensor, Tensor | None]:
    """``fn``'s result as ``(output, weights or None)``; a swapped pair is a mistake."""
    name = name_of(fn)
    weights = None
    if isinstance(out, (tuple, list)):
        if len(out) != 2:
            fail(f"{name} 返回了 {len(out)} 个值：应返回输出，或 (输出, 权重) 两个值。")
        out, weights = out
    out = as_tensor(out, f"{name} 的输出", case)
    if weights is None:
        return out, None
    weights = as_tensor(weights, f"{name} 返回的权重", case)
    if tuple(out.shape) == tuple(ref_w.shape) != tuple(ref_out.shape) and tuple(
        weights.shape
    ) == tuple(ref_out.shape):
        fail(
            f"{name} 返回值的顺序反了（{case}）：应为 (输出, 权重)，"
            f"输出 {tuple(ref_out.shape)}、权重 {tuple(ref_w.shape)}。"
        )
    return out, weights


def _check_attention_output_shape(
    fn: Callable,
    out: Tensor,
    ref_out: Tensor,
    ref_w: Tensor,
    case: str,
    letters: dict[str, str],
) -> None:
    """The output is ``(…, L, D)`` floats; ``(…, L, S)`` means ``weights @ V`` is
    missing."""
    name = name_of(fn)
    L, S = letters["L"], letters["S"]
    if tuple(out.shape) == tuple(ref_w.shape) != tuple(ref_out.shape):
        fail(
            f"{name} 的输出形状是 {tuple(out.shape)}，这是权重 (…, {L}, {S}) "
            f"的形状（{case}）：别忘了用权重对 V 加权求和（weights @ V），"
            f"输出应为 {tuple(ref_out.shape)}。"
        )
    check_shape(
        out,
        ref_out.shape,
        f"{name} 的输出",
        case,
        f" Q、K 是 (…, {L}, d_k)、(…, {S}, d_k)，V 是 (…, {S}, d_v)，"
        f"输出应为 (…, {L}, d_v)（d_v = V.size(-1)）。",
    )
    check_float(out, f"{name} 的输出")


INVERTED_MASK_NAN = (
    "NaN 出现在掩码整行为 True（全都可以看）的 query 上，说明填成 -inf 的恰是"
    "「可以看」的位置：掩码方向可能反了（True = 可以看）："
    "应写 masked_fill(~attn_mask, -inf)。"
)


def nan_from_inverted_mask(out: Tensor, mask: Tensor | None) -> bool:
    """Whether the non-finite rows of ``out`` ``(…, L, D)`` are all queries whose
    bool ``mask`` row is all True (may see every key): the -inf went where the mask
    says "may attend"."""
    if mask is None:
        return False
    bad = ~torch.isfinite(out).all(-1)  # (…, L)
    try:
        full = torch.broadcast_to(mask.all(-1), bad.shape)
    except RuntimeError:  # a mask that does not broadcast: no diagnosis
        return False
    return bool(bad.any()) and bool(full[bad].all())


def _check_attention_finite(
    fn: Callable, out: Tensor, mask: Tensor | None, case: str
) -> None:
    """NaN in the output; NaN in rows that may see everything means an inverted
    mask."""
    if bool(torch.isfinite(out).all()):
        return
    if nan_from_inverted_mask(out, mask):
        fail(f"{name_of(fn)} 的输出含 NaN（{case}）：{INVERTED_MASK_NAN}")
    fail(
        f"{name_of(fn)} 的输出含 NaN 或 inf（{case}）：检查 softmax 之前的"
        "分数，是否某一行全被填成了 -inf？"
    )


def _attention_hint(
    out: Tensor,
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    mask: Tensor | None,
    letters: dict[str, str],
    hints: list[tuple[str, str]],
) -> str:
    """The typical mistake of ``hints`` (:data:`ATTENTION_HINTS` as the exercise
    shows them) whose result ``out`` reproduces, or the recipe."""
    d = Q.size(-1)
    variant = functools.partial(_attention_variant, Q, K, V, mask)
    hint = first_reproduced(
        out,
        hints,
        variant,
        d=d,
        sqrt_d=math.sqrt(d),
        s=K.size(-2),
        l=Q.size(-2),
        n=K.size(0),
        dv=V.size(-1),
        **letters,
    )
    return hint or (
        "逐步对照：scores = Q @ K.transpose(-2, -1) / √d_k → "
        "masked_fill(~attn_mask, -inf) → softmax(dim=-1) → weights @ V。"
    )


def _finite_fill(
    weights: Tensor, Q: Tensor, K: Tensor, mask: Tensor, idx: tuple
) -> float | None:
    """The finite fill value whose softmax reproduces ``weights`` (estimated from the
    leaked weight at ``idx`` and a visible key of its row), or None."""
    scores = _scores(Q, K, None).double().expand(weights.shape)
    row = idx[:-1]
    visible = mask.expand(weights.shape)[row].nonzero()
    if len(visible) == 0 or float(weights[row][visible[0, 0]]) <= 0:
        return None
    j = int(visible[0, 0])
    ratio = float(weights[idx]) / float(weights[row][j])
    fill = math.log(ratio) + float(scores[row][j])
    filled = torch.softmax(scores.masked_fill(~mask, fill), dim=-1)
    return fill if close(weights.double(), filled) else None


def _leak_hint(
    weights: Tensor,
    qk: tuple[Tensor, Tensor],
    mask: Tensor,
    idx: tuple,
    letters: dict[str, str],
) -> str:
    """Why masked keys still get weight: the mask transposed, the weights returned
    from before the masking, a finite fill too small, or the mask not applied."""
    Q, K = qk
    scores = _scores(Q, K, None).double()
    if mask.size(-1) == mask.size(-2) and close(
        weights.double(),
        torch.softmax(scores.masked_fill(~mask.mT, float("-inf")), dim=-1),
    ):
        return (
            "掩码用转置了（像是 attn_mask.mT 或 attn_mask.transpose(-2, -1)）："
            f"attn_mask[i, j] 说 query i 能否看 key j，形状 ({letters['L']}, "
            f"{letters['S']}) 与 scores 对齐，"
            "直接 scores.masked_fill(~attn_mask, float('-inf'))，不要转置。"
        )
    if close(weights.double(), torch.softmax(scores, dim=-1)):
        return (
            "返回的权重是没有屏蔽的 softmax：要么掩码根本没用上，要么只用在了"
            "输出上、返回的却是另算的未屏蔽权重。先屏蔽再 softmax，并返回与 V "
            "相乘的那个权重：softmax(scores.masked_fill(~attn_mask, -inf), dim=-1)。"
        )
    if close(weights.double(), torch.softmax(scores + mask.double(), dim=-1)):
        return (
            "把布尔掩码转成 0/1 的浮点数加到了分数上（scores + attn_mask.float()）："
            "可以看的位置加 1、要屏蔽的位置加 0，什么也没有屏蔽。加性掩码要用 0 和 "
            "-inf（可以看处 0、屏蔽处 -inf）；布尔掩码直接 "
            "scores.masked_fill(~attn_mask, float('-inf'))。"
        )
    fill = _finite_fill(weights, Q, K, mask, idx)
    if fill is not None and abs(fill) > 0.5:
        return (
            f"被屏蔽的分数像是填成了有限值（约 {fill:.3g}）：有限的数不够小，"
            "经 softmax 后仍留下权重，尤其当其他分数也不大时。应填 -inf："
            "scores.masked_fill(~attn_mask, float('-inf'))。"
        )
    return (
        "屏蔽没有生效：应在 softmax 之前把掩码为 False 的分数填成 -inf"
        "（填 0 不行，0 分经 softmax 后仍有权重）。"
    )


def _check_attention_weights(
    fn: Callable,
    weights: Tensor,
    ref_w: Tensor,
    qk: tuple[Tensor, Tensor],
    mask: Tensor | None,
    case: str,
    letters: dict[str, str],
    dim_hint: str,
) -> None:
    """The returned weights: shape, masked keys without weight, rows summing to 1
    (``dim_hint``: what columns that sum to 1 mean, as the exercise says it)."""
    Q, K = qk
    name = name_of(fn)
    check_shape(
        weights,
        ref_w.shape,
        f"{name} 返回的权重",
        case,
        f" 权重应为 (…, {letters['L']}, {letters['S']})："
        "每个 query 对每个 key 一个权重。",
    )
    check_float(weights, f"{name} 返回的权重")
    if not bool(torch.isfinite(weights).all()):
        return  # the output check explains NaN
    if mask is not None:
        leaked = (weights.detach().abs() > 1e-6) & ~mask
        if bool(leaked.any()):
            idx = tuple(int(i) for i in leaked.nonzero()[0])
            # rows with something masked: an inverted mask gives weight only there
            allowed = (mask & ~mask.all(-1, keepdim=True)).expand_as(weights)
            if bool((weights.detach()[allowed].abs() < 1e-6).all()):
                why = (
                    "掩码方向可能反了（True = 可以看）："
                    "应写 masked_fill(~attn_mask, -inf)。"
                )
            else:
                why = _leak_hint(weights.detach(), qk, mask, idx, letters)
            fail(
                f"被屏蔽的位置仍有权重（{case}）：例如位置 {idx} 的掩码为 False，"
                f"权重却是 {weights[idx].item():.3g}。{why}"
            )
    sums = weights.detach().double().sum(-1)
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
        cols = weights.detach().double().sum(-2)
        scaled = sums * math.sqrt(Q.size(-1))
        if torch.allclose(cols, torch.ones_like(cols), atol=1e-4):
            hint = dim_hint
        elif torch.allclose(scaled, torch.ones_like(scaled), atol=1e-4):
            hint = (
                "每行之和恰好是 1/√d_k：权重在 softmax 之后又除以了 √d_k。缩放属于"
                "分数：先 scores = Q @ K.transpose(-2, -1) / √d_k，再 softmax，"
                "softmax 之后不再缩放。"
            )
        elif mask is not None and close(
            weights, torch.softmax(_scores(Q, K, None), dim=-1) * mask
        ):
            hint = (
                "softmax 之后才把被屏蔽的权重置 0（乘掩码或 masked_fill(…, 0)）："
                "被屏蔽的权重虽为 0，剩下的却没有重新归一化。应在 softmax 之前"
                "把被屏蔽的分数填成 -inf："
                "scores.masked_fill(~attn_mask, float('-inf'))。"
            )
        elif mask is None and any(
            close(weights, s) for s in (_scores(Q, K, None), Q @ K.transpose(-2, -1))
        ):
            hint = "返回的权重是 softmax 之前的分数：应返回 softmax 之后、乘 V 的权重。"
        else:
            hint = "返回的应是 softmax(dim=-1) 之后、乘 V 的那个权重。"
        fail(
            f"权重在 key 维度上之和不是 1（{case}）：每个 query 的权重之和应为 1，"
            f"得到例如 {sums.flatten()[0].item():.4g}。{hint}"
        )


# causal mask


def _causal_variant(L: int, mistake: str) -> Tensor:
    """What a causal mask with one of :data:`CAUSAL_MASK_HINTS`' mistakes is."""
    ones = torch.ones(L, L, dtype=torch.bool)
    return {
        "inverted": ~ones.tril(),
        "upper": ones.triu(),
        "no_diagonal": ones.tril(-1),
        "all_true": ones,
        "one_ahead": ones.tril(1),
    }[mistake]


CAUSAL_MASK_HINTS = [
    (
        "得到的是「不能看」的掩码（True = 未来位置）：本课程约定 "
        "True = 可以看，对角线及以下为 True（.tril()，不是 .triu(1)）。",
        "inverted",
    ),
    (
        "掩码方向反了：True 应在对角线及其下方（query i 只能看 "
        "key 0..i），你的在上方（.triu() 应为 .tril()）。",
        "upper",
    ),
    (
        "对角线上应为 True：每个位置可以看它自己（tril 的 diagonal 应为 0，不是 -1）。",
        "no_diagonal",
    ),
    ("全部为 True：没有屏蔽未来的位置。", "all_true"),
    (
        "对角线上方多了一条 True：位置 i 看到了 i + 1（tril 的 diagonal 应为 0）。",
        "one_ahead",
    ),
]


def is_additive_mask(out: Tensor, ref: Tensor) -> bool:
    """Whether the float ``out`` is the additive form of the bool mask ``ref``: 0 where
    ``ref`` allows, a large negative number (−inf) where it blocks."""
    return (
        out.is_floating_point()
        and out.shape == ref.shape
        and bool((out[ref] == 0).all())
        and bool((out[~ref] < -1e4).all())
    )


ADDITIVE_MASK_NOTE = (
    "：这是加性掩码（可以看的位置 0、屏蔽的位置 −inf），位置本身是对的；"
    "本课程的掩码是布尔的，True = 可以看，注意力内部才把 False 换成 −inf。"
)


@checker("因果掩码")
def check_causal_mask(fn: Callable) -> str:
    """Grade ``fn(L)``: a bool ``(L, L)`` mask, ``True`` on and below the diagonal
    (query ``i`` may see keys ``0..i``). Compared with
    :func:`transformer_course.causal_mask`."""
    name = name_of(fn)
    for i, L in enumerate((5, 1, 2, 8)):
        case = f"L = {L}"
        out = as_tensor(
            run_learner(fn, L, what=name, case=case, first=i == 0), name, case
        )
        check_shape(out, (L, L), name, case)
        ref = causal_mask(L)
        if out.dtype != torch.bool:
            if is_additive_mask(out, ref):
                fail(
                    f"{name}({L}) 应返回 torch.bool 张量，得到 dtype {out.dtype}"
                    + ADDITIVE_MASK_NOTE
                    + "用 torch.ones(L, L, dtype=torch.bool).tril()。"
                )
            same = out.shape == ref.shape and bool(((out != 0) == ref).all())
            fail(
                f"{name}({L}) 应返回 torch.bool 张量，得到 dtype {out.dtype}"
                + ("（值本身是对的）" if same else "")
                + (
                    "：0/1 的浮点掩码会被当作加到分数上的加性掩码。"
                    if out.is_floating_point()
                    else "：整数的 0/1 不是布尔掩码，tc 的注意力会拒绝它，"
                    "~mask 也成了按位取反（~1 = -2）。"
                )
                + "用 torch.ones(L, L, dtype=torch.bool).tril()，或在最后加 .bool()。"
            )
        if bool((out == ref).all()):
            continue
        hint = first_reproduced(
            out.bool(), CAUSAL_MASK_HINTS, functools.partial(_causal_variant, L)
        )
        bad = tuple(int(j) for j in (out != ref).nonzero()[0])
        fail(
            f"{name}({L}) 不对：位置 {bad} 应为 {bool(ref[bad])}，"
            f"得到 {bool(out[bad])}。" + (hint or "应为对角线及其下方为 True。")
        )
    return "L = 1, 2, 5, 8"
