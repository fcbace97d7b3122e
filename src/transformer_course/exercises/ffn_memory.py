"""Writing one more memory into a hand-built key-value FFN (chapter 4, exercise
4.20): ``W₁`` gains the row ``[k_new, −τ]``, ``W₂`` the column ``v_new / (1 − τ)``.
The page passes its memory FFN, the memories it stores and the new pair; the checker
grades on them and again on an FFN and a threshold of its own, so that an answer
reading the page's variables instead of its parameters is caught."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor

from ..feedforward import FeedForward
from ._protocol import checker, fail, name_of, run_learner, seeded_generator
from .numeric_answers import refuse_wrong_answer

__all__ = ["check_add_memory"]

_TAU_OTHER = 0.55  # not the page's τ, nor a round 0.5
_N_OTHER = 6  # the memories of the checker's own FFN, fewer than the page's

# the page's variables (memory_ffn, mem_keys, n_mem, …) read in place of the
# parameters: right on the page's FFN, not on the checker's own
_PAGE_VARIABLES = (
    "函数里用的是页面上的变量（如 memory_ffn、mem_keys、mem_vals、n_mem），"
    "而不是参数：大小和权重都要从参数 ffn 读（ffn.w1.weight、ffn.w2.weight、"
    "ffn.w1.out_features）。"
)
# learner test: the page's n_mem for d_ff crashes there
_OTHER_CRASHES = [
    (r"", f"在页面的 FFN 上能运行，换一个 FFN 就出错：多半是{_PAGE_VARIABLES}")
]


def _grown_recall(ffn: FeedForward, k: Tensor, v: Tensor, t: float, queries: Tensor):
    """What ``ffn`` with the row ``[k, −t]`` and the column ``v / (1 − t)`` appended
    gives for ``queries``."""
    w1 = torch.cat([ffn.w1.weight, torch.cat([k, torch.full((1, 1), -t)], 1)])
    w2 = torch.cat([ffn.w2.weight, v.T / (1 - t)], 1)
    return torch.relu(queries @ w1.T) @ w2.T


def _check_context(*, ffn, keys, values, k_new, v_new, tau) -> None:
    """TypeError / ValueError for a page context the checker cannot grade with."""
    if not isinstance(ffn, FeedForward) or ffn.w1.bias is not None:
        raise TypeError(f"ffn must be a tc.FeedForward without bias, got {ffn!r:.80}")
    E, n = ffn.w1.in_features, ffn.w1.out_features
    shapes = {
        "keys": (keys, (n, E - 1)),
        "values": (values, (n, E)),
        "k_new": (k_new, (1, E - 1)),
        "v_new": (v_new, (1, E)),
    }
    for what, (t, shape) in shapes.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{what} must be a tensor, got {type(t).__name__}")
        if tuple(t.shape) != shape:
            raise ValueError(f"{what} must have shape {shape}, got {tuple(t.shape)}")
    if isinstance(tau, bool) or not isinstance(tau, int | float) or not 0 < tau < 1:
        raise ValueError(f"tau must be a number in (0, 1), got {tau!r}")


def _other_memory(fn, page_ffn: FeedForward, name: str) -> None:
    """Grade ``fn`` on another FFN (6 orthogonal memories) and another τ: it must use
    its parameters, not the page's variables."""
    E = page_ffn.w1.in_features
    g, t = seeded_generator(105), _TAU_OTHER
    keys = torch.linalg.qr(torch.randn(E - 1, 8, generator=g, dtype=torch.float64))[0]
    keys = keys.T.float()
    k2, keys = keys[:1], keys[1 : _N_OTHER + 1]
    v2 = torch.randn(1, E, generator=g)
    other = FeedForward(E, _N_OTHER, "relu", bias=False)
    with torch.no_grad():
        other.w1.weight.copy_(torch.cat([keys, torch.full((_N_OTHER, 1), -t)], 1))
        other.w2.weight.copy_(torch.randn(E, _N_OTHER, generator=g))
    c = (1 + t) / 2  # halfway 与 k2 的余弦，高于 t：新神经元只半开，输出随 τ 变
    halfway = F.normalize(c / (1 - c**2) ** 0.5 * k2 + keys[:1], dim=-1)
    queries = torch.cat([k2, keys, halfway])
    queries = torch.cat([queries, torch.ones(len(queries), 1)], 1)
    grown = run_learner(
        fn,
        copy.deepcopy(other),
        k2,
        v2,
        t,
        what=name,
        case=f"另一个 FFN，{_N_OTHER} 条记忆，τ = {t}",
        causes=_OTHER_CRASHES,
    )
    with torch.no_grad():
        got = grown(queries)
        want = _grown_recall(other, k2, v2, t, queries)
        named = [  # (用页面的变量时的输出, 提示)
            (
                _grown_recall(page_ffn, k2, v2, t, queries),
                f"取回的还是页面上的记忆：{_PAGE_VARIABLES}",
            ),
        ]
    if torch.allclose(got, want, rtol=1e-4, atol=1e-5):
        return
    if torch.allclose(got[:-1], want[:-1], rtol=1e-4, atol=1e-5):  # 只错在 halfway
        named.append(
            (
                got,
                "键本身与旧键都取回得对，只有与新键余弦在 τ 之上的查询"
                "不对：新神经元打开的阈值不对，函数没有用参数 tau（写死了"
                "一个数，或用了全局的 tau）。W₁ 新行的 −τ 和 W₂ 新列的 "
                "1 − τ 都要用参数 tau。",
            )
        )
    hint = next(
        (
            why
            for wrong, why in named
            if torch.allclose(got, wrong, rtol=1e-4, atol=1e-5)
        ),
        "取回的值不对：函数只能用它的参数 ffn、k_new、v_new、tau，新的一行接在 "
        "ffn.w1 后面，新的一列接在 ffn.w2 后面。",
    )
    fail(f"练习 4.20：换一个 FFN（{_N_OTHER} 条记忆、τ = {t}）再检查时，{hint}")


def _page_hint(grown: object, n_mem: int, old_ok: bool) -> str:
    """The hint when the page's memories are not all recalled."""
    biases = [getattr(getattr(grown, w, None), "bias", None) for w in ("w1", "w2")]
    activation = getattr(grown, "activation", "relu")
    width = getattr(getattr(grown, "w1", None), "out_features", n_mem + 1)
    if activation != "relu":
        return (
            f"新的 FFN 的激活函数是 {activation}：要和 memory_ffn 一样用 'relu'。"
            "ReLU 在阈值以下正好是 0，新神经元在旧键上才不出声；GELU 等在 0 附近"
            "不为零，每条记忆都会偏。"
        )
    if width == n_mem:
        return (
            f"新的 FFN 有 {width} 个神经元，与原来的 {n_mem} 个一样多：要新加一个"
            "神经元（d_ff + 1），把新的一行、一列接在最后，旧的原样保留。"
        )
    if any(b is not None and b.abs().max() > 0 for b in biases):
        return (
            "新的 FFN 带了偏置：要 tc.FeedForward(E, d_ff + 1, 'relu', bias=False)。"
            "偏置 −τ 已经写在 W₁ 的最后一列里（输入的最后一维恒为 1），"
            "再加一个偏置，每条记忆都会偏。"
        )
    if old_ok:
        return (
            f"旧的 {n_mem} 条取回得对，新的一条不对：W₁ 新加的一行是 [k_new, −τ]，"
            "W₂ 新加的一列是 v_new / (1 − τ)。"
        )
    return (
        "旧记忆取回的值变了：新神经元在旧键上必须保持为零（W₁ 新行的最后一维是"
        "偏置 −τ），旧的行和列要原样保留，新的接在最后。"
    )


# learner test 63: v_new (1, E) put under W₂ as a row
_ADD_MEMORY_CRASHES = [
    (
        r"Sizes of tensors must match except in dimension",
        "拼接的形状对不上。W₁ 的权重是 (d_ff, E)，新行 [k_new, −τ] 的形状是 (1, E)，"
        "沿 dim=0 接在下面；W₂ 的权重是 (E, d_ff)，记忆 v_i 是它的列，新列 "
        "v_new.T / (1 − τ) 的形状是 (E, 1)，沿 dim=1 接在右边。",
    ),
]


@checker("再写一条记忆", validate=_check_context)
def check_add_memory(
    fn,
    *,
    ffn: FeedForward,
    keys: Tensor,
    values: Tensor,
    k_new: Tensor,
    v_new: Tensor,
    tau: float,
) -> str:
    """Grade ``fn(ffn, k_new, v_new, tau)``: a new ``FeedForward`` (no bias, ReLU, one
    more hidden unit) that recalls ``v_new`` for ``k_new`` and still ``values`` for
    ``keys`` (inputs end with a constant 1, whose ``W₁`` column is the bias ``−τ``),
    without changing ``ffn``; then once more on an FFN and a τ of the checker's own."""
    name = name_of(fn)
    given = copy.deepcopy(ffn)  # 改了副本，页面的 ffn 也不受影响
    grown = run_learner(
        fn,
        given,
        k_new,
        v_new,
        tau,
        what=name,
        first=True,
        copy_inputs=False,
        causes=_ADD_MEMORY_CRASHES,
    )
    before, after = ffn.state_dict(), given.state_dict()
    if before.keys() != after.keys() or not all(
        torch.equal(before[n], after[n]) for n in before
    ):
        fail("练习 4.20：不要改动传入的 ffn（它的 w1、w2 都要原样保留）")
    n_mem = keys.size(0)
    queries = torch.cat([torch.cat([k_new, keys]), torch.ones(n_mem + 1, 1)], 1)
    with torch.no_grad():
        recalled = grown(queries)  # 第 0 行是新键，其余是旧键
    old_ok = torch.allclose(recalled[1:], values, rtol=1e-4, atol=1e-6)
    if old_ok and torch.allclose(recalled[:1], v_new, rtol=1e-4, atol=1e-6):
        _other_memory(fn, ffn, name)
    refuse_wrong_answer(
        recalled,
        torch.cat([v_new, values]),
        what="练习 4.20：再写一条记忆",
        rel_tol=1e-4,
        hint=_page_hint(grown, n_mem, old_ok),
        mistakes=[
            (
                torch.cat([(1 - tau) * v_new, values]),
                "新记忆取回的值小了 (1 − τ) 倍：W₂ 的新列要除以 1 − τ。",
            )
        ],
    )
    return f"新记忆与旧的 {n_mem} 条都取回得对；换一个 FFN、τ = {_TAU_OTHER} 也对"
