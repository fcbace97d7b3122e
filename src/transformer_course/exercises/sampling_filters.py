"""The top-p (nucleus) filter exercise: ``fn(logits, p)`` keeps the smallest set of most
likely tokens whose probability reaches ``p`` and sets every other logit to ``-inf``,
as :func:`transformer_course.top_p_filter` does.

What is graded is the *kept set* (the finite logits), the fill value ``-inf`` (the page
counts the nucleus with ``torch.isfinite``, so a finite fill such as ``-1e4`` or
``torch.finfo.min`` is named, see :func:`_check_fill_value`) and the distribution
``softmax(out)``: the kept logits may be returned unchanged or shifted by one constant
per row (``log_softmax`` values), since softmax renormalises either way. The graded
inputs (``p = 1.0`` and :data:`TIE_CASE` apart) have no cumulative mass within ``1e-3``
of ``p`` and no tie at the nucleus's edge, so the order in which a sort puts tied tokens
never decides the result; ties inside the nucleus are graded. :data:`TIE_CASE` has
dyadic probabilities (exact in float32 and float64) and a token whose exclusive mass
equals ``p`` exactly: the package drops it (``before < p``), ``before <= p`` keeps it.
The classic shifted removal (``cum > p``, shifted right by one) is that same non-strict
rule; the exercise's text defines the smallest set (a token stays when the mass before
it is *below* p), so both are rejected with a hint that names ``<=`` for ``<``."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ..sampling import sample_next_token, top_p_filter
from ._protocol import calls_refused, checker, fail, name_of, run_learner
from ._report import as_tensor, check_float, check_shape, close, first_reproduced

# a logit at or below this counts as removed when the kept set is graded (a finite
# fill is named first, by _check_fill_value)
REMOVED = -1e9

# (hint, mistake): the kept sets the typical mistakes give, tried in this order
TOP_P_HINTS = [
    (
        "少留了跨过 p 的那个词元：你保留的是累计概率（含它自己）小于 p 的词元，它们的"
        "总概率还不到 p。核是“总概率达到 p 的最小前缀”，要一直留到跨过 p 的那个词元"
        "为止：判断一个词元留不留，看排在它前面的词元的累计概率（不含它自己），即 "
        "cum - probs < p。",
        "inclusive",
    ),
    (
        "多留了一个词元：跨过 p 的那个词元之后的下一个也留下了。用的是“排在前面的"
        "累计概率（不含自己）< p”吗？多半是把右移一位做了两次，或者用了 cum - probs "
        "之外还减了一次。",
        "one_extra",
    ),
    (
        "累加前没有按概率从大到小排序：按词表原来的顺序累加，留下的是编号靠前的词元，"
        "而不是最可能的词元。先按概率从大到小排序再累加："
        "torch.sort(..., descending=True)，在排好序的顺序里 cumsum。",
        "unsorted",
    ),
    (
        "累加用的是词表原来顺序的概率（probs.cumsum 之前没有排序），排序只用来把"
        "标记放回原位：先按概率从大到小排序再累加：sorted_probs, idx = "
        "probs.sort(dim=-1, descending=True)，在 sorted_probs 上 cumsum 得到标记，"
        "再用 idx 把标记放回原来的位置。",
        "unsorted_cumsum",
    ),
    (
        "排好序的标记放回原来的顺序时用了 gather(-1, idx)：idx[j] 是排第 j 的词元的"
        "编号，sorted_mask.gather(-1, idx) 是把标记又按 idx 重排了一次，不是放回。"
        "用 mask.scatter(-1, idx, sorted_mask)，或 sorted_mask.gather(-1, "
        "idx.argsort(dim=-1))。",
        "gather_not_scatter",
    ),
    (
        "把“累计概率 > p”右移一位时写了原地赋值 remove[..., 1:] = remove[..., :-1]："
        "等号两边是同一块内存，前面的值一路复制到后面，标记全乱了。要右移就给右边加 "
        ".clone()；更直接的是按定义判断保留：cum - probs < p。",
        "shift_in_place",
    ),
    (
        "把“累计概率 > p”的标记移位时移反了方向（remove[..., :-1] = remove[..., 1:]，"
        "左移）：这样连跨过 p 的那个词元和它前面的一个也去掉了。要右移一位："
        "remove[..., 1:] = remove[..., :-1].clone()；更直接的是按定义判断保留："
        "cum - probs < p。",
        "shift_left",
    ),
    (
        "排序、softmax、cumsum 都沿第 1 维做了：(N, V) 输入的第 1 维恰好是词表，"
        "(N, T, V) 输入的第 1 维却是位置 T，核就成了同一个词元在各位置之间的核。"
        "词表永远在最后一维：一律写 dim=-1（sort、softmax、cumsum、scatter 都是）。",
        "dim_1",
    ),
    (
        "排序方向反了：按概率从小到大累加，留下的是最不可能的词元。用 "
        "torch.sort(..., descending=True)。",
        "ascending",
    ),
    (
        "留不留的标记是在排好序的顺序里算的，却直接按位置用在了原来（未排序）的 "
        "logits 上：第 j 个标记说的是排第 j 的词元，不是编号 j 的词元。用 sort 返回的"
        "下标把标记放回原来的位置（mask.scatter(-1, idx, sorted_mask)），或者取出最后"
        "一个保留的 logit 作阈值，比较 logits < 阈值。",
        "mask_in_sorted_order",
    ),
    (
        "累加的是 logits，不是概率：logits 可正可负、和也不是 1，与 p 比较没有意义。"
        "先 probs = torch.softmax(sorted_logits, dim=-1)，再 probs.cumsum(dim=-1)。",
        "cumsum_logits",
    ),
    (
        "softmax 沿第 0 维（批）做了：softmax(logits, dim=0) 让同一个词元在各行之间"
        "归一化，每一行的概率之和不再是 1。词表在最后一维："
        "torch.softmax(logits, dim=-1)（一行一行单独送进来时看不出这个错）。",
        "softmax_first_dim",
    ),
    (
        "累加沿错了维：cumsum 要沿最后一维（词表，排好序的概率）做，"
        "probs.cumsum(dim=-1)；沿第 0 维累加的是各行同一名次的概率。",
        "cumsum_first_dim",
    ),
]

# learner test 38c: the whole batch sorted, normalised and summed as one distribution
FLAT_HINT = (
    "整批被当成了一个分布：sort、softmax、cumsum 作用在 logits.view(-1)（或 flatten）"
    "上，所有行的概率一起归一化、一起累加，核是整批共用的一个。每一行有自己的分布"
    "和自己的核：不要展平，直接在 (..., V) 上沿最后一维做，sort(logits, dim=-1, "
    "descending=True)、softmax(..., dim=-1)、cumsum(dim=-1)。"
)

BATCH_HINT = (
    "每一行单独送进来时保留的词元都对，整批一起送就错了：有一步把几行混在了一起。"
    "每一行有自己的核：排序、softmax、cumsum、比较都沿最后一维（dim=-1）逐行做，"
    "不要用 int(...)、.item()、不带 dim 的 sum 或整批的一个阈值，把各行的保留个数"
    "归成一个数。"
)

TOP_P_CRASHES = [
    (
        r"(scatter|gather|sort|cumsum|softmax)\w*\((?:[^()]*,\s*)?(dim\s*=\s*)?1\b",
        "沿第 1 维排序、累加或 scatter，只在 (N, V) 上碰巧对：logits 可以有更多前导维度"
        "（如 (N, T, V)），词表永远在最后一维，一律写 dim=-1。",
    ),
]


def _kept_by(logits: Tensor, p: float, mistake: str) -> Tensor:
    """The kept set (bool, like ``logits``) that ``mistake`` gives."""
    if mistake == "flat":  # one nucleus for the whole batch
        return _kept_by(logits.reshape(1, -1), p, "").reshape(logits.shape)
    if mistake in ("softmax_first_dim", "cumsum_first_dim"):
        return _kept_first_dim(logits, p, mistake)
    if mistake == "dim_1":  # every step along dim 1: right only where that is V
        return _kept_by(logits.transpose(1, -1), p, "").transpose(1, -1)
    descending = mistake != "ascending"
    sorted_logits, order = torch.sort(logits, dim=-1, descending=descending)
    if mistake in ("unsorted", "unsorted_cumsum"):  # the latter scatters back
        sorted_logits, order = logits, None if mistake == "unsorted" else order
    if mistake == "cumsum_logits":
        weights = sorted_logits
    else:
        weights = torch.softmax(sorted_logits, dim=-1)
    keep = _kept_sorted(weights, p, mistake)
    if order is None or mistake == "mask_in_sorted_order":
        return keep
    if mistake == "gather_not_scatter":
        return keep.gather(-1, order)
    return torch.zeros_like(keep).scatter(-1, order, keep)


def _kept_sorted(weights: Tensor, p: float, mistake: str) -> Tensor:
    """The marks, in sorted order, that ``mistake`` computes from the sorted
    ``weights`` (probabilities, or logits for ``cumsum_logits``)."""
    cum = weights.cumsum(dim=-1)
    before = cum - weights
    if mistake == "inclusive":
        keep = cum < p
        keep[..., 0] = True
        return keep
    if mistake == "non_strict":
        return before <= p
    if mistake in ("shift_in_place", "shift_left"):  # the classic shifted removal
        remove = cum > p
        if mistake == "shift_in_place":  # written in place: the marks smear right
            remove[..., 1:] = remove[..., :-1]
        else:  # shifted the wrong way
            remove[..., :-1] = remove[..., 1:].clone()
        remove[..., 0] = False
        return ~remove
    if mistake == "one_extra":
        return torch.cat(
            [torch.ones_like(before[..., :1], dtype=torch.bool), before[..., :-1] < p],
            -1,
        )
    return before < p


def _kept_first_dim(logits: Tensor, p: float, mistake: str) -> Tensor:
    """The kept set of the filter with its softmax (``softmax_first_dim``) or its
    cumsum (``cumsum_first_dim``) along dim 0."""
    softmax_dim = 0 if mistake == "softmax_first_dim" else -1
    cumsum_dim = 0 if mistake == "cumsum_first_dim" else -1
    if softmax_dim == 0:  # softmax first, then sort the probabilities
        sorted_probs, order = torch.sort(
            torch.softmax(logits, dim=0), dim=-1, descending=True
        )
    else:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
    keep = sorted_probs.cumsum(dim=cumsum_dim) - sorted_probs < p
    return torch.zeros_like(keep).scatter(-1, order, keep)


def _each_row_right(fn: Callable, logits: Tensor, p: float) -> bool:
    """Whether ``fn`` keeps the right set for every row of ``logits`` given alone
    (shape ``(1, …, 1, V)``): a wrong batch then mixes the rows."""
    rows = logits.reshape(-1, logits.size(-1))
    if rows.size(0) < 2:
        return False
    shape = (1,) * (logits.dim() - 1) + (logits.size(-1),)
    for row in rows:
        try:  # diagnosis only
            with calls_refused((top_p_filter, sample_next_token), ""):
                out = fn(row.reshape(shape).clone(), p)
        except Exception:
            return False
        want = torch.isfinite(top_p_filter(row.reshape(shape), p))
        if not (isinstance(out, Tensor) and torch.equal(out > REMOVED, want)):
            return False
    return True


TIE_CASE = "累计概率恰好等于 p：概率 0.5、0.25、0.125、0.0625、0.0625，p = 0.75"

NON_STRICT_HINT = (
    "多留了一个词元：排在第 3 的词元前面的累计概率已经恰好等于 p，前两个的总概率已"
    "达到 p，它不需要了（核是总概率达到 p 的最小的一组）。你用的是 <= 而不是 <"
    "（cum - probs <= p，或 cum > p 再右移一位，两者等价）；只在恰好相等时才有区别，"
    "按定义写 cum - probs < p。"
)


def _cases() -> list[tuple[str, Tensor, float]]:
    """(description, logits, p): the graded inputs, every one but :data:`TIE_CASE` with
    a margin of at least ``1e-3`` between ``p`` and every token's exclusive cumulative
    mass."""
    g = torch.Generator().manual_seed(20240527 + 41)
    rows = torch.randn(4, 10, generator=g) * 2.0
    # row 0: the most likely token alone has more than p; row 1: a flat row
    rows[0] = torch.tensor([6.0, 1.5, 1.0, 0.5, 0.2, 0.0, -0.5, -1.0, -2.0, -3.0])
    rows[1] = torch.linspace(0.9, 0.0, 10)
    ties = torch.tensor([[2.0, 0.5, 2.0, -1.0, 0.5, -3.0, 0.0, -2.0]])
    return [
        ("(N, V) = (4, 10)，p = 0.8", rows, 0.8),
        ("(N, V) = (4, 10)，p = 0.5", rows.flip(-1), 0.5),
        (
            "(N, T, V) = (2, 3, 7)，p = 0.9",
            torch.randn(2, 3, 7, generator=g) * 1.5,
            0.9,
        ),
        ("核内有并列的 logits，p = 0.85", ties, 0.85),
        (
            TIE_CASE,
            torch.tensor([[-3.0, 0.0, -2.0, -1.0, -3.0]], dtype=torch.float64)
            * math.log(2.0),
            0.75,
        ),
        ("(N, V) = (4, 10)，p = 1.0", rows, 1.0),
    ]


def _fmt(t: Tensor) -> str:
    return "[" + ", ".join(f"{v:.3g}" for v in t.tolist()) + "]"


def _row_hint(logits: Tensor, ref_kept: Tensor, kept: Tensor, p: float) -> str:
    """Where the kept sets first differ: the row, and its sorted probabilities."""
    bad = (kept != ref_kept).any(-1).nonzero()[0]
    row = tuple(int(i) for i in bad)
    where = str(row[0]) if len(row) == 1 else str(row)
    probs = torch.softmax(logits[row], -1)
    order = probs.argsort(descending=True)
    n_ref, n_got = int(ref_kept[row].sum()), int(kept[row].sum())
    got = kept[row].nonzero().flatten().tolist()
    return (
        f"第 {where} 行：按从大到小排好的概率是 {_fmt(probs[order])}，p = {p:g}，"
        f"应保留 {n_ref} 个词元（编号 {order[:n_ref].tolist()}），"
        f"你保留了 {n_got} 个（编号 {got}）。"
    )


@checker("top-p（核）过滤")
def check_top_p_filter(fn: Callable) -> str:
    """Grade ``fn(logits, p)`` on ``(..., V)`` logits: the same kept set and the same
    ``softmax`` as :func:`transformer_course.top_p_filter` (see the module docstring),
    written by hand (calling ``tc.top_p_filter`` or ``tc.sample_next_token`` fails),
    leaving the caller's ``logits`` as they were (the page filters the same logits
    twice)."""
    name = name_of(fn)
    refused = (
        f"{name} 调用了 tc.top_p_filter（或 tc.sample_next_token）：这道练习要自己写出"
        "排序、累加和截断。"
    )
    for i, (case, logits, p) in enumerate(_cases()):
        given = logits.clone()  # the learner's copy: an in-place edit shows in it
        with calls_refused((top_p_filter, sample_next_token), refused):
            out = run_learner(
                fn,
                given,
                p,
                what=name,
                case=case,
                first=i == 0,
                causes=TOP_P_CRASHES,
                copy_inputs=False,
            )
        out = as_tensor(out, name, case)
        check_shape(out, logits.shape, name, case, "：返回与 logits 同形状的 logits。")
        check_float(out, name)
        if bool((torch.isnan(out) | (out == math.inf)).any()):
            fail(
                f"{name} 的输出含 NaN 或 +inf（{case}）：是不是在 -inf 上又做了运算"
                "（如 -inf × 0、-inf - (-inf)），或者对全为 -inf 的一行做了 softmax？"
                "只用 masked_fill 把核外的位置设成 -inf，之后不再对它们做运算。"
            )
        ref = top_p_filter(logits, p)
        ref_kept = torch.isfinite(ref)
        _check_fill_value(name, case, out, ref_kept)
        kept = out > REMOVED
        if case == TIE_CASE and bool(
            torch.equal(kept, _kept_by(logits, p, "non_strict"))
        ):
            fail(
                f"{name} 保留的词元不对（{case}）。"
                + _row_hint(logits, torch.isfinite(top_p_filter(logits, p)), kept, p)
                + NON_STRICT_HINT
            )
        _check_kept_set(fn, case, (logits, p), out, kept, ref_kept)
        if not torch.equal(given, logits):  # -inf == -inf; the inputs hold no NaN
            fail(
                f"{name} 保留的词元对了，但原地改动了传进来的 logits（{case}）："
                "调用者的张量也被过滤了，本章后面的单元格把同一个 logits 再过滤一次，"
                "核就变了。用不带下划线的 logits.masked_fill(~keep, float('-inf'))"
                "（它返回新张量），或先 logits = logits.clone() 再原地改。"
            )
        if not close(torch.softmax(out.double(), -1), torch.softmax(ref.double(), -1)):
            fail(
                f"{name} 留下的词元对了（{case}），但它们的 logits 被改了："
                "softmax(输出) 与应有的分布不同。核内的 logits 要原样保留（差同一个"
                "常数也可以），只把核外的设成 -inf；温度之类的缩放不属于这个函数。"
            )
    return (
        "排序的、未排序的输出，(N, V) 与 (N, T, V)，核内并列，累计概率恰好等于 p，"
        "p = 1.0"
    )


def _check_fill_value(name: str, case: str, out: Tensor, ref_kept: Tensor) -> None:
    """Learner test 31c: the nucleus right but the removed logits set to one finite
    negative value (``-1e4``, ``torch.finfo(dtype).min``) instead of ``-inf``; 0 has
    its own hint in :func:`_check_kept_set`."""
    removed = out[~ref_kept]
    if removed.numel() == 0 or not bool(torch.isfinite(removed).all()):
        return
    fill = float(removed.max())
    if (
        fill >= 0
        or float(removed.min()) != fill
        or not bool((out[ref_kept] > fill).all())
    ):
        return
    fail(
        f"{name} 选对了核，但把核外的 logits 设成了有限的 {fill:g}（{case}），"
        "不是 -inf："
        "用 float('-inf')：后面的单元格用 isfinite 数保留的词元，有限的值会被当成"
        "留下的词元。写 logits.masked_fill(~keep, float('-inf'))。"
    )


def _check_kept_set(
    fn: Callable,
    case: str,
    logits_p: tuple[Tensor, float],
    out: Tensor,
    kept: Tensor,
    ref_kept: Tensor,
) -> None:
    if bool(torch.equal(kept, ref_kept)):
        return
    name, (logits, p) = name_of(fn), logits_p
    if not bool((out == -math.inf).any()) and bool(((out >= 0) & (out <= 1)).all()):
        sums = out.sum(-1)
        renormalised = bool(torch.allclose(sums, torch.ones_like(sums), atol=1e-4))
        fail(
            f"{name} 返回的像是过滤后的概率（核外为 0"
            + ("" if renormalised else "，而且没有重新归一化：每行的和小于 1")
            + f"），不是 logits（{case}）。这道练习返回 logits，核外的设成 -inf："
            "之后的 softmax 会给核外的词元概率 0，并自动把核内的重新归一化。"
            "若交给 softmax 的是概率，核外的 0 会变成 exp(0) 的权重。"
        )
    if torch.equal(kept, _kept_by(logits, p, "flat")):  # before the empty-row hint
        fail(
            f"{name} 保留的词元不对（{case}）。"
            + _row_hint(logits, ref_kept, kept, p)
            + FLAT_HINT
        )
    if not bool(kept.any(-1).all()):
        row = tuple(int(i) for i in (~kept.any(-1)).nonzero()[0])
        where = str(row[0]) if len(row) == 1 else str(row)
        top = float(torch.softmax(logits[row], -1).max())
        above = (
            f"这一行最可能的词元的概率 {top:.3f} 已经超过 p = {p:g}。"
            if top >= p
            else ""
        )
        fail(
            f"{name} 在第 {where} 行一个词元也没留下（{case}）：{above}跨过 p 的那个"
            "词元要保留，所以最可能的那个词元总会留下：判断时看排在它前面的累计概率"
            "（不含它自己）< p，第一个词元前面的累计概率是 0。"
        )
    if bool((out[~ref_kept] == 0).all()) and bool(
        torch.equal(out[ref_kept], logits[ref_kept])
    ):
        fail(
            f"{name} 把核外的 logits 设成了 0（{case}），不是 -inf：softmax 之后 "
            "exp(0) 仍有权重，核外的词元还会被抽到。用 logits.masked_fill(~keep, "
            "float('-inf'))。"
        )
    sorted_logits = torch.sort(logits, dim=-1, descending=True).values
    if torch.equal(kept, _kept_by(logits, p, "mask_in_sorted_order")) and close(
        out[kept], sorted_logits[kept]
    ):
        fail(
            f"{name} 返回的 logits 还是排好序的顺序（{case}）：核选对了，但第 j 个"
            "位置放的是排第 j 的词元，不是编号 j 的词元。要返回原来词表顺序的 "
            "logits：在原来的 logits 上把核外的位置设成 -inf。"
        )
    hint = first_reproduced(
        kept,
        TOP_P_HINTS,
        lambda mistake: _kept_by(logits, p, mistake),
        same=lambda a, b: bool(torch.equal(a, b)),
    )
    if hint is None and _each_row_right(fn, logits, p):
        hint = BATCH_HINT
    fail(
        f"{name} 保留的词元不对（{case}）。"
        + _row_hint(logits, ref_kept, kept, p)
        + (hint or "核是按概率从大到小排好后、总概率达到 p 的最小前缀。")
    )
