"""Causal linear attention written as an RNN (chapter 2, ex-7): a state
``S_i = S_{i-1} + φ(k_i) v_iᵀ`` and a normaliser ``u_i = u_{i-1} + φ(k_i)``, read as
``o_i = φ(q_i)ᵀ S_i / φ(q_i)ᵀ u_i`` with ``φ = elu + 1``."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from ..efficient_attention import linear_attention, linear_attention_recurrent
from ._protocol import (
    calls_refused,
    checker,
    fail,
    name_of,
    randn,
    run_learner,
    seeded_generator,
)
from ._report import (
    as_tensor,
    check_float,
    check_shape,
    close,
    first_reproduced,
    where_differs,
)

# (hint, mistake): the typical mistakes, in the order they are tried
_MISTAKES = [
    (
        "特征映射 φ 没有用上：应先算 φ(q) = elu(q) + 1、φ(k) = elu(k) + 1，"
        "再更新状态和读出（φ 保证分母为正）。",
        "no_phi",
    ),
    (
        "φ 用成了 relu（或 relu 加一个防止除以 0 的小常数 ε）：本题的 φ 是 "
        "elu(x) + 1（F.elu(x) + 1），处处严格为正，分母不会是 0，也就不需要 ε。",
        "relu",
    ),
    (
        "φ 用成了 relu(x) + 1：本题的 φ 是 elu(x) + 1（F.elu(x) + 1）。两者在 x > 0 "
        "时相同；x < 0 时 elu(x) + 1 = exp(x) 平滑地趋于 0，relu(x) + 1 却恒为 1。",
        "relu_plus_one",
    ),
    ("φ 用成了 elu(x)，少了 + 1：φ(x) = F.elu(x) + 1。", "elu"),
    ("φ 用成了 exp：本题的 φ 是 elu(x) + 1。", "exp"),
    ("φ 也作用在了 v 上：φ 只作用于 q 和 k，状态里累加的是 φ(k_i) v_iᵀ。", "phi_v"),
    (
        "漏了分母：o_i 还要除以 φ(q_i)ᵀ u_i，其中 u_i = φ(k_1) + … + φ(k_i)"
        "（它让权重之和为 1）。",
        "no_den",
    ),
    (
        "分母用了已见位置的个数 i + 1（求平均）：分母应是 φ(q_i)ᵀ u_i，"
        "u_i = φ(k_1) + … + φ(k_i) 与状态一起累加，读出时用当前查询 φ(q_i) 点乘它。",
        "count_den",
    ),
    (
        "分母用了 φ(k_i)ᵀ u_i：分子和分母都用当前查询读出，分母是 φ(q_i)ᵀ u_i。",
        "den_with_k",
    ),
    (
        "输出不是因果的：位置 i 的状态只应累加 j ≤ i 的 φ(k_j) v_jᵀ，"
        "看起来用了整段序列的和。",
        "noncausal",
    ),
    (
        "先读后更新（用了上一步的状态 S_{{i-1}}）：位置 i 读出时状态还只含 j < i 的项；"
        "应先把 φ(k_i) v_iᵀ 加进状态、φ(k_i) 加进 u，再读出 o_i。",
        "read_first",
    ),
    (
        "读出时用了 φ(k_i) 而不是 φ(q_i)：状态用键和值更新，用查询读出。",
        "read_with_k",
    ),
]


# the exercise is to write the recurrence: calling the package's answer is refused
_REFERENCE_CALLED = (
    "不要直接调用 linear_attention / linear_attention_recurrent（那就是参考答案）："
    "按递推逐个位置更新 S 与 u（S_i = S_{i-1} + φ(k_i) v_iᵀ，u_i = u_{i-1} + φ(k_i)，"
    "o_i = φ(q_i)ᵀ S_i / φ(q_i)ᵀ u_i）。"
)


_HINT_OF = {mistake: hint for hint, mistake in _MISTAKES}
_RELU_EPS = tuple(10.0**-e for e in range(1, 10))  # φ = relu + ε: the ε learners add


def _rnn_variant(
    q: Tensor, k: Tensor, v: Tensor, mistake: str, relu_eps: float = 1e-6
) -> Tensor:
    """What a recurrent linear attention with one typical mistake outputs; ``relu``
    means ``φ = relu + relu_eps``."""
    phi = {
        "no_phi": lambda x: x,
        # the default ε is vanishing: pure relu where it is defined, and its ε -> 0
        # limit in a row whose φ(q_i)ᵀ φ(k_j) are all 0 (0/0 for pure relu)
        "relu": lambda x: F.relu(x) + relu_eps,
        "relu_plus_one": lambda x: F.relu(x) + 1,
        "elu": F.elu,
        "exp": torch.exp,
    }.get(mistake, lambda x: F.elu(x) + 1)
    pq, pk = phi(q), phi(k)
    if mistake == "read_with_k":
        pq = pk
    if mistake == "phi_v":
        v = F.elu(v) + 1
    kv = pk[:, :, None] * v[:, None, :]  # (n, d_k, d_v)
    if mistake == "noncausal":
        state = kv.sum(0).expand_as(kv)
        u = pk.sum(0).expand_as(pk)
    else:
        state, u = kv.cumsum(0), pk.cumsum(0)
        if mistake == "read_first":  # state of j < i: nothing at i = 0
            state, u = state - kv, u - pk
    num = torch.einsum("nd,nde->ne", pq, state)
    if mistake == "no_den":
        return num
    if mistake == "den_with_k":  # normaliser φ(k_i)ᵀ u_i
        return num / (pk * u).sum(-1, keepdim=True)
    if mistake == "count_den":  # the mean over the i + 1 positions seen so far
        return num / torch.arange(1, len(num) + 1, dtype=num.dtype)[:, None]
    # read_first: position 0 reads an empty state; a guarded 0 / (0 + eps) gives 0
    return torch.nan_to_num(num / (pq * u).sum(-1, keepdim=True), nan=0.0)


@checker("因果线性注意力的 RNN 形式")
def check_rnn_linear_attention(fn) -> str:
    """Grade ``fn(q, k, v)``: ``q, k (n, d_k)``, ``v (n, d_v)`` -> ``(n, d_v)``, the
    causal linear attention with ``φ = elu + 1`` and no ``eps``; compared with
    ``tc.linear_attention(q, k, v, causal=True, eps=0.0)``. Calling that function or
    ``tc.linear_attention_recurrent`` (the answer) is refused."""
    name = name_of(fn)
    g = seeded_generator(71)
    cases = [
        ("n=6, d_k=4, d_v=3", 6, 4, 3, 1.0),
        ("n=1, d_k=3, d_v=2（只有一个位置）", 1, 3, 2, 1.0),
        ("n=9, d_k=5, d_v=7，分量较大", 9, 5, 7, 2.0),
    ]
    for i, (case, n, d_k, d_v, scale) in enumerate(cases):
        q = randn(g, n, d_k, scale=scale)
        k = randn(g, n, d_k, scale=scale)
        v = randn(g, n, d_v)
        what = f"{name}(q, k, v)"
        answer = (linear_attention, linear_attention_recurrent)
        with torch.no_grad(), calls_refused(answer, f"{what}：{_REFERENCE_CALLED}"):
            out = run_learner(fn, q, k, v, what=what, case=case, first=i == 0)
        out = as_tensor(out, f"{what} 的输出", case)
        check_shape(
            out, (n, d_v), f"{what} 的输出", case,
            " 每个位置输出一个 d_v 维向量：φ(q_i)ᵀ S_i 是 (d_k,) 乘 (d_k, d_v)。",
        )  # fmt: skip
        check_float(out, f"{what} 的输出")
        with torch.no_grad():
            ref = linear_attention(q, k, v, causal=True, eps=0.0)
        if close(out, ref):
            continue
        finite = torch.isfinite(out)
        if not bool(finite.all()):
            rows = sorted({int(r) for r in (~finite).nonzero()[:, 0]})
            if rows == [0] and n > 1:
                later = _rnn_variant(q, k, v, "read_first")[1:]
                if close(out[1:], later):
                    fail(
                        f"{what} 在第 0 个位置得到 NaN（{case}）：这是先读后更新——"
                        "读出时状态和 u 还是 0，0/0 = NaN。"
                        "应先把 φ(k_i) v_iᵀ 加进状态、φ(k_i) 加进 u，再读出 o_i。"
                    )
            fail(
                f"{what} 的输出含 NaN 或 inf（{case}，位置 {rows}）：分母 φ(q_i)ᵀ u_i "
                "为 0 或负数了吗？φ = elu + 1 处处为正，分母才不会是 0。"
            )
        with torch.no_grad():
            hint = first_reproduced(
                out, _MISTAKES, functools.partial(_rnn_variant, q, k, v)
            )
            # relu plus a larger ε against 0/0: the output depends on ε (relu's
            # φ(q)ᵀφ(k) can be tiny), so the usual constants are tried
            if hint is None and any(
                close(out, _rnn_variant(q, k, v, "relu", eps)) for eps in _RELU_EPS
            ):
                hint = _HINT_OF["relu"]
            # read before the update, with a state started at a tiny value instead of
            # 0: position 0 reads whatever that start gives, every later one is off by 1
            if hint is None and n > 1:
                later = _rnn_variant(q, k, v, "read_first")[1:]
                if close(out[1:], later):
                    hint = _HINT_OF["read_first"].format()
        fail(
            f"{what} 与 tc.linear_attention(q, k, v, causal=True, eps=0.0) 不一致"
            f"（{case}；{where_differs(out, ref)}）。\n可能的原因："
            + (
                hint
                or "逐步对照：S_i = S_{i-1} + φ(k_i) v_iᵀ，u_i = u_{i-1} + φ(k_i)，"
                "o_i = φ(q_i)ᵀ S_i / φ(q_i)ᵀ u_i，φ = elu + 1。"
            )
        )
    return "长度 1、6、9，d_k ≠ d_v，共 3 组"
