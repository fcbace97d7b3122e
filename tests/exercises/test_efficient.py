"""Efficient attention (chapter 4): grouped-query attention, sparsemax, KV-cache bytes and
the prefix-LM mask.

Correct implementations in different styles pass with one "✓" line, skeletons are
"尚未实现", and hand-written mutants are rejected with a hint that names the mistake."""

import collections
import math

import pytest
import torch
import torch.nn.functional as F

import transformer_course as tc
from transformer_course import exercises as ex

from .support import (
    assert_every_hint_reached,
    assert_passes,
    assert_rejects,
    assert_skeleton,
    rejection,
)

# grouped-query attention
# ---------------------------------------------------------------------------


def gqa_five_dims(q, k, v, mask):
    N, H, L, D = q.shape
    Hkv = k.size(1)
    qg = q.view(N, Hkv, H // Hkv, L, D)
    w = torch.softmax(qg @ k.unsqueeze(2).mT / math.sqrt(D), dim=-1)
    return (w @ v.unsqueeze(2)).reshape(N, H, L, D)


def gqa_merged_rows(q, k, v, mask):
    N, H, L, D = q.shape
    Hkv = k.size(1)
    qg = q.reshape(N, Hkv, (H // Hkv) * L, D)  # G·L query rows per key-value head
    s = (qg @ k.transpose(-2, -1) * D**-0.5).view(N, Hkv, H // Hkv, L, -1)
    s = s.masked_fill(~mask, -math.inf).flatten(2, 3)  # (L, S) broadcast over (G, L)
    return (torch.softmax(s, dim=-1) @ v).view(N, H, L, D)


def gqa_mask_tiled(q, k, v, mask):  # the mask repeated G times along the rows: right
    N, H, L, D = q.shape
    G = H // k.size(1)
    s = q.reshape(N, k.size(1), G * L, D) @ k.mT / math.sqrt(D)
    s = s.masked_fill(~mask.repeat(G, 1), -math.inf)
    return (s.softmax(-1) @ v).view(N, H, L, D)


def gqa_mask_interleaved(q, k, v, mask):  # repeat_interleave where repeat was meant
    N, H, L, D = q.shape
    G = H // k.size(1)
    s = q.reshape(N, k.size(1), G * L, D) @ k.mT / math.sqrt(D)
    s = s.masked_fill(~mask.repeat_interleave(G, 0), -math.inf)
    return (s.softmax(-1) @ v).view(N, H, L, D)


def gqa_own_tril(q, k, v, mask):  # learner test 36b: the passed mask ignored, tril() instead
    N, H, L, D = q.shape
    Hkv, S = k.shape[1:3]
    m = torch.ones(L, S, dtype=torch.bool).tril()
    s = (q.view(N, Hkv, H // Hkv * L, D) @ k.mT / math.sqrt(D)).view(N, Hkv, H // Hkv, L, S)
    s = s.masked_fill(~m, -math.inf).flatten(2, 3)
    return (s.softmax(-1) @ v).reshape(N, H, L, D)


def gqa_mask_first_group(q, k, v, mask):  # learner test 36b: the mask on the first L rows only
    N, H, L, D = q.shape
    Hkv, S = k.shape[1:3]
    rows = torch.ones(H // Hkv * L, S, dtype=torch.bool)
    rows[:L] = mask
    s = (q.reshape(N, Hkv, H // Hkv * L, D) @ k.mT / math.sqrt(D)).masked_fill(~rows, -math.inf)
    return (s.softmax(-1) @ v).reshape(N, H, L, D)


def gqa_mask_multiplied(q, k, v, mask):
    N, H, L, D = q.shape
    G = H // k.size(1)
    s = (q.reshape(N, k.size(1), G * L, D) @ k.mT / math.sqrt(D)).view(N, -1, G, L, k.size(2))
    return ((s * mask).flatten(2, 3).softmax(-1) @ v).view(N, H, L, D)


def gqa_mask_as_is(q, k, v, mask):  # the (L, S) mask on the (N, H_kv, G·L, S) scores
    N, H, L, D = q.shape
    s = q.reshape(N, k.size(1), H // k.size(1) * L, D) @ k.mT / math.sqrt(D)
    return (s.masked_fill(~mask, -math.inf).softmax(-1) @ v).view(N, H, L, D)


def gqa_einsum(q, k, v, mask):
    N, H, L, D = q.shape
    Hkv = k.size(1)
    qg = q.unflatten(1, (Hkv, H // Hkv))
    s = torch.einsum("nhgld,nhsd->nhgls", qg, k) / math.sqrt(D)
    s = s.masked_fill(~mask, -math.inf)
    return torch.einsum("nhgls,nhsd->nhgld", s.softmax(-1), v).flatten(1, 2)


def gqa_einsum_unsqueezed(q, k, v, mask):  # right: a size-1 group dim, broadcast, no copy
    N, H, L, D = q.shape
    Hkv = k.size(1)
    qg = q.unflatten(1, (Hkv, H // Hkv))
    s = torch.einsum("nhgld,nhgsd->nhgls", qg, k[:, :, None]) / math.sqrt(D)
    s = s.masked_fill(~mask, -math.inf)
    return torch.einsum("nhgls,nhgsd->nhgld", s.softmax(-1), v[:, :, None]).flatten(1, 2)


def gqa_einsum_expanded(only_v):  # learner test 64: einsum copies expanded k, v internally
    def fn(q, k, v, mask):
        N, H, L, D = q.shape
        Hkv, S = k.size(1), k.size(2)
        G = H // Hkv
        qg = q.view(N, Hkv, G, L, D)
        vv = v[:, :, None].expand(N, Hkv, G, S, D)
        if only_v:
            s = torch.einsum("nhgld,nhsd->nhgls", qg, k)
        else:
            s = torch.einsum("nhgld,nhgsd->nhgls", qg, k[:, :, None].expand(N, Hkv, G, S, D))
        s = (s / math.sqrt(D)).masked_fill(~mask, -math.inf)
        return torch.einsum("nhgls,nhgsd->nhgld", s.softmax(-1), vv).reshape(N, H, L, D)

    return fn


def gqa_repeat_interleave(q, k, v, mask):
    G = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    return torch.softmax(q @ k.mT / math.sqrt(q.size(-1)), -1) @ v


def gqa_expand_reshape(q, k, v, mask):  # copies through expand + reshape
    N, H, L, D = q.shape
    Hkv, S = k.size(1), k.size(2)
    k = k[:, :, None].expand(N, Hkv, H // Hkv, S, D).reshape(N, H, S, D)
    v = v[:, :, None].expand(N, Hkv, H // Hkv, S, D).reshape(N, H, S, D)
    return torch.softmax(q @ k.mT / math.sqrt(D), -1) @ v


def gqa_modulo(q, k, v, mask):  # groups interleaved: head h uses key-value head h % H_kv
    N, H, L, D = q.shape
    Hkv = k.size(1)
    qg = q.view(N, H // Hkv, Hkv, L, D).transpose(1, 2)
    w = torch.softmax(qg @ k.unsqueeze(2).mT / math.sqrt(D), dim=-1)
    return (w @ v.unsqueeze(2)).transpose(1, 2).reshape(N, H, L, D)


def gqa_unscaled(q, k, v, mask):
    N, H, L, D = q.shape
    Hkv = k.size(1)
    qg = q.view(N, Hkv, H // Hkv, L, D)
    w = torch.softmax(qg @ k.unsqueeze(2).mT, dim=-1)
    return (w @ v.unsqueeze(2)).reshape(N, H, L, D)


def gqa_grouped_shape(q, k, v, mask):  # forgets to merge the groups back
    N, H, L, D = q.shape
    Hkv = k.size(1)
    qg = q.view(N, Hkv, H // Hkv, L, D)
    w = torch.softmax(qg @ k.unsqueeze(2).mT / math.sqrt(D), dim=-1)
    return w @ v.unsqueeze(2)


def gqa_loop_views(q, k, v, mask):  # learner test: one head at a time, k[:, h // G] is a view
    G = q.size(1) // k.size(1)
    heads = []
    for h in range(q.size(1)):
        s = (q[:, h] @ k[:, h // G].mT * q.size(-1) ** -0.5).masked_fill(~mask, -math.inf)
        w = torch.softmax(s, -1)
        heads.append(w @ v[:, h // G])
    return torch.stack(heads, 1)


def gqa_fold_then_sdpa(q, k, v, mask):  # learner test: the grouping by hand, then PyTorch's kernel
    N, H, L, D = q.shape
    qf = q.reshape(N, k.size(1), (H // k.size(1)) * L, D)
    rows = mask.repeat(H // k.size(1), 1)  # (G·L, S)
    return F.scaled_dot_product_attention(qf, k, v, attn_mask=rows).view(N, H, L, D)


def gqa_expand_views(q, k, v, mask):  # learner test: expand is a view, but matmul then copies it
    N, H, L, D = q.shape
    Hkv = k.size(1)
    ke = k[:, :, None].expand(N, Hkv, H // Hkv, *k.shape[2:])
    ve = v[:, :, None].expand(N, Hkv, H // Hkv, *v.shape[2:])
    w = (q.view(N, Hkv, H // Hkv, L, D) @ ke.mT / math.sqrt(D)).softmax(-1)
    return (w @ ve).view(N, H, L, D)


def gqa_reference_call(q, k, v, mask):  # learner test: the checker's reference itself
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def _gqa_folded(q, k, v, scale):
    N, H, L, D = q.shape
    Hkv = k.size(1)
    qg = q.reshape(N, Hkv, H // Hkv * L, D)
    return torch.softmax(qg @ k.mT / scale, dim=-1) @ v, (N, Hkv, H // Hkv, L, D)


def gqa_scale_by_keys(q, k, v, mask):  # learner test: √S instead of √D
    out, _ = _gqa_folded(q, k, v, math.sqrt(k.size(2)))
    return out.view(q.shape)


def gqa_scale_by_group(q, k, v, mask):
    out, _ = _gqa_folded(q, k, v, math.sqrt(q.size(-1) * q.size(1) // k.size(1)))
    return out.view(q.shape)


def gqa_softmax_over_queries(q, k, v, mask):  # the output check comes before the copy check
    N, H, L, D = q.shape
    Hkv = k.size(1)
    w = torch.softmax(q.view(N, Hkv, H // Hkv, L, D) @ k.unsqueeze(2).mT / math.sqrt(D), dim=-2)
    return (w @ v.unsqueeze(2)).reshape(N, H, L, D)


def gqa_softmax_over_group_rows(q, k, v, mask):  # learner test 6b, 4.6: dim=-2 on (N, H_kv, G·L, S)
    N, H, L, D = q.shape
    qg = q.reshape(N, k.size(1), H // k.size(1) * L, D)
    return (torch.softmax(qg @ k.mT / math.sqrt(D), dim=-2) @ v).view(N, H, L, D)


def gqa_groups_transposed(q, k, v, mask):  # learner test: transpose(2, 3) before the final reshape
    out, (N, Hkv, G, L, D) = _gqa_folded(q, k, v, math.sqrt(q.size(-1)))
    return out.view(N, Hkv, G, L, D).transpose(2, 3).reshape(N, G * Hkv, L, D)


def gqa_groups_as_l_g(q, k, v, mask):  # learner test 7b, 4.6: the folded rows read as (L, G)
    out, (N, Hkv, G, L, D) = _gqa_folded(q, k, v, math.sqrt(q.size(-1)))
    return out.view(N, Hkv, L, G, D).transpose(2, 3).reshape(N, G * Hkv, L, D)


def gqa_q_transposed(back):
    """Learner test: q.transpose(1, 2) before the reshape into groups (rows of other
    groups' heads mixed in); ``back``: the output transposed back the same way."""

    def gqa(q, k, v, mask):
        N, H, L, D = q.shape
        Hkv = k.size(1)
        rows = q.transpose(1, 2).reshape(N, Hkv, H // Hkv * L, D)
        out = (rows @ k.transpose(-2, -1) / math.sqrt(D)).softmax(-1) @ v
        return out.reshape(N, L, H, D).transpose(1, 2) if back else out.reshape(N, H, L, D)

    gqa.__name__ = f"gqa_q_transposed_{'back' if back else 'once'}"
    return gqa


def gqa_split_order(q, k, v, mask):  # learner test 21b, 4.6: the G·L rows made in (L, G) order
    N, H, L, D = q.shape
    Hkv = k.size(1)
    rows = q.view(N, Hkv, H // Hkv, L, D).permute(0, 1, 3, 2, 4).reshape(N, Hkv, -1, D)
    return (torch.softmax(rows @ k.mT / math.sqrt(D), -1) @ v).reshape(N, H, L, D)


def gqa_split_order_manual_softmax(q, k, v, mask):  # the same, softmax by hand: step unknown
    N, H, L, D = q.shape
    Hkv = k.size(1)
    rows = q.transpose(1, 2).reshape(N, L, Hkv, H // Hkv, D).transpose(1, 2).reshape(N, Hkv, -1, D)
    e = (rows @ k.mT / math.sqrt(D)).exp()
    return (e / e.sum(-1, keepdim=True) @ v).reshape(N, H, L, D)


def gqa_permuted_both_ways(q, k, v, mask):  # rows in (L, G) order, merged back the same way: right
    N, H, L, D = q.shape
    Hkv, G = k.size(1), H // k.size(1)
    rows = q.movedim(2, 1).reshape(N, L, Hkv, G, D).permute(0, 2, 1, 3, 4).reshape(N, Hkv, L * G, D)
    s = (rows @ k.mT / math.sqrt(D)).masked_fill(~mask.repeat_interleave(G, 0), -math.inf)
    out = torch.softmax(s, -1) @ v
    return out.view(N, Hkv, L, G, D).permute(0, 1, 3, 2, 4).reshape(N, H, L, D)


def gqa_rows_l_g_mask_tiled(q, k, v, mask):  # rows in (L, G) order, the mask tiled for (G, L)
    N, H, L, D = q.shape
    Hkv, G = k.size(1), H // k.size(1)
    qg = q.view(N, Hkv, G, L, D).transpose(2, 3).reshape(N, Hkv, L * G, D)
    s = (qg @ k.mT / math.sqrt(D)).masked_fill(~mask.repeat(G, 1), -math.inf)
    return (s.softmax(-1) @ v).view(N, Hkv, L, G, D).transpose(2, 3).reshape(N, H, L, D)


def gqa_repeat_tiled(q, k, v, mask):  # learner mistake: repeat where repeat_interleave was meant
    G = q.size(1) // k.size(1)
    kk, vv = k.repeat(1, G, 1, 1), v.repeat(1, G, 1, 1)
    return torch.softmax(q @ kk.mT / math.sqrt(q.size(-1)), -1) @ vv


def gqa_ignores_mask(q, k, v, mask):  # the grouping right, the mask left out
    N, H, L, D = q.shape
    qg = q.reshape(N, k.size(1), H // k.size(1) * L, D)
    return (torch.softmax(qg @ k.mT / math.sqrt(D), -1) @ v).view(N, H, L, D)


def gqa_weights_zeroed(q, k, v, mask):  # learner test, 4.6: masked weights zeroed, not renormalised
    N, H, L, D = q.shape
    G = H // k.size(1)
    s = q.reshape(N, k.size(1), G * L, D) @ k.mT / math.sqrt(D)
    w = s.softmax(-1).masked_fill(~mask.repeat(G, 1), 0.0)
    return (w @ v).view(N, H, L, D)


def gqa_mask_transposed(q, k, v, mask):  # learner test, 4.6: mask.T on the (…, L, S) scores
    N, H, L, D = q.shape
    Hkv, G = k.size(1), H // k.size(1)
    s = (q.reshape(N, Hkv, G * L, D) @ k.mT / math.sqrt(D)).view(N, Hkv, G, L, -1)
    s = s.masked_fill(~mask.T, -math.inf)
    return (s.softmax(-1).view(N, Hkv, G * L, -1) @ v).view(N, H, L, D)


def gqa_skeleton(q, k, v, mask):
    pass


@pytest.mark.parametrize(
    "fn",
    [
        gqa_merged_rows,
        gqa_mask_tiled,
        gqa_einsum,
        gqa_einsum_unsqueezed,
        gqa_loop_views,
        gqa_fold_then_sdpa,
        gqa_permuted_both_ways,
    ],
)
def test_grouped_attention_accepts(fn, capsys):
    assert_passes(ex.check_grouped_attention, fn, capsys)


def test_grouped_attention_skeleton(capsys):
    assert_skeleton(ex.check_grouped_attention, gqa_skeleton, capsys)


@pytest.mark.parametrize(
    ("fn", "keyword"),
    [
        (gqa_repeat_interleave, "repeat_interleave"),
        (gqa_expand_reshape, "复制成了 H 份"),
        (gqa_einsum_expanded(only_v=False), "einsum（其中 clone 得到形状"),  # learner test 64
        (gqa_einsum_expanded(only_v=True), "einsum（其中 clone 得到形状"),
        (gqa_modulo, "h % H_kv"),
        (gqa_modulo, "直接 reshape 为 (N, H_kv, G·L, D)"),  # learner test 24b
        (gqa_unscaled, "√D"),
        (gqa_grouped_shape, "reshape 回 (N, H, L, D)"),
        (gqa_five_dims, "矩阵乘法沿组的维度广播 k、v"),
        (gqa_expand_views, "矩阵乘法沿组的维度广播 k、v"),
        (gqa_reference_call, "检查器用来比较的参考实现"),
        (gqa_scale_by_keys, "√S"),
        (gqa_softmax_over_group_rows, "softmax 的 dim 写错了"),
        (gqa_groups_transposed, "不要先 transpose(2, 3)"),
        (gqa_groups_as_l_g, "当成了 (N, H_kv, L, G, D)"),
        (gqa_q_transposed(back=True), "变形 q 之前先交换了 H 和 L"),
        (gqa_q_transposed(back=False), "变形 q 之前先交换了 H 和 L"),
        (gqa_split_order, "拆分 q 时 G·L 这一维的顺序错了"),
        (gqa_split_order_manual_softmax, "拆分 q 与合并输出时 G·L 这一维的顺序不一致"),
        (gqa_repeat_tiled, "k.repeat(1, G, 1, 1) 把整组键值头重复 G 遍"),
        # the causal prefill after a cache (the review of ch04, round 21)
        (gqa_ignores_mask, "mask 没有用上"),
        (gqa_mask_interleaved, "mask.repeat_interleave(G, 0) 给的是"),
        (gqa_rows_l_g_mask_tiled, "掩码却用 mask.repeat(G, 1) 按 (G, L) 铺开"),  # learner test 30b
        (gqa_mask_multiplied, "分数乘了掩码"),
        (gqa_own_tril, "自己用 tril() 造了一个因果掩码"),
        (gqa_mask_first_group, "mask 只加在了每组的前 L 行"),
        (gqa_mask_as_is, "view 成 (N, H_kv, G, L, S)，mask 就能直接广播"),
        (gqa_weights_zeroed, "没有重新归一化"),
        (gqa_mask_transposed, "mask 被转置了"),
    ],
)
def test_grouped_attention_rejects(fn, keyword, capsys):
    assert_rejects(ex.check_grouped_attention, fn, keyword, capsys)


GQA_REJECTS = [
    pytest.param(ex.check_grouped_attention, fn, None, id=fn.__name__)
    for fn in (gqa_modulo, gqa_unscaled, gqa_scale_by_group, gqa_softmax_over_queries,
               gqa_scale_by_keys, gqa_groups_transposed, gqa_groups_as_l_g, gqa_q_transposed(back=True),
               gqa_q_transposed(back=False), gqa_split_order, gqa_split_order_manual_softmax,
               gqa_repeat_tiled, gqa_ignores_mask, gqa_mask_interleaved, gqa_mask_multiplied,
               gqa_mask_as_is, gqa_rows_l_g_mask_tiled, gqa_own_tril, gqa_mask_first_group,
               gqa_weights_zeroed, gqa_mask_transposed)
]  # fmt: skip


def test_grouped_attention_hints_all_reached(capsys):
    from transformer_course.exercises import efficient

    tables = {
        "_GQA_MISTAKES": efficient._GQA_MISTAKES,
        "_REGROUP_HINTS": [(hint, step) for step, hint in efficient._REGROUP_HINTS.items()],
        "_REPEAT_NOTE": [(efficient._REPEAT_NOTE, "repeat")],
        "GQA_CRASHES": efficient.GQA_CRASHES,
    }
    assert_every_hint_reached(tables, GQA_REJECTS, capsys)


def test_grouped_attention_names_an_inverted_mask(capsys):
    """learner test 58 (4.6): mask ↔ ~mask got only "含 NaN 或 inf", with no hint"""

    def inverted(q, k, v, mask):
        return gqa_mask_tiled(q, k, v, ~mask)

    assert_rejects(ex.check_grouped_attention, inverted, "掩码方向反了", capsys)


def test_grouped_attention_regroup_hint_names_the_step(capsys):
    # learner test 21b, 4.6: rows split in (L, G) order and merged as (G, L) give the
    # same output as a transpose(2, 3) in the merge; only the merge mistake is told
    # about transpose(2, 3), the split mistake about the split
    split = rejection(ex.check_grouped_attention, gqa_split_order)
    merge = rejection(ex.check_grouped_attention, gqa_groups_transposed)
    assert "transpose(2, 3)" not in split and "拆分 q 时" in split, split
    assert "合并各组时先交换了 G 和 L" in merge and "拆分 q" not in merge, merge


# sparsemax
# ---------------------------------------------------------------------------


def sparsemax_sorted(z):
    zs, _ = torch.sort(z, dim=-1, descending=True)
    k = torch.arange(1, z.size(-1) + 1, dtype=z.dtype)
    cs = zs.cumsum(-1)
    support = (1 + k * zs > cs).sum(-1, keepdim=True)
    tau = (cs.gather(-1, support - 1) - 1) / support
    return torch.clamp(z - tau, min=0)


def sparsemax_bisection(z):  # a different algorithm: bisection on tau
    lo = z.max(-1, keepdim=True).values - 1
    hi = z.max(-1, keepdim=True).values
    for _ in range(100):
        mid = (lo + hi) / 2
        too_big = (z - mid).clamp(min=0).sum(-1, keepdim=True) > 1
        lo, hi = torch.where(too_big, mid, lo), torch.where(too_big, hi, mid)
    return (z - (lo + hi) / 2).clamp(min=0)


def sparsemax_tau(z):  # τ by hand: the checker refuses tc.sparsemax_threshold
    zs = z.sort(dim=-1, descending=True).values
    k = torch.arange(1, z.size(-1) + 1, dtype=z.dtype)
    cs = zs.cumsum(-1)
    support = (1 + k * zs > cs).sum(-1, keepdim=True)
    return (cs.gather(-1, support - 1) - 1) / support


def sparsemax_no_clamp(z):
    return z - sparsemax_tau(z)


def sparsemax_tau_plus_one(z):  # learner test 65: + 1 where − 1 belongs
    zs = z.sort(dim=-1, descending=True).values
    k = torch.arange(1, z.size(-1) + 1, dtype=z.dtype)
    cs = zs.cumsum(-1)
    support = (1 + k * zs > cs).sum(-1, keepdim=True)
    return torch.clamp(z - (cs.gather(-1, support - 1) + 1) / support, min=0)


def sparsemax_k_from_zero(z):
    zs, _ = torch.sort(z, dim=-1, descending=True)
    k = torch.arange(1, z.size(-1) + 1, dtype=z.dtype)
    cs = zs.cumsum(-1)
    support = (1 + k * zs > cs).sum(-1, keepdim=True)
    tau = (cs.gather(-1, support - 1) - 1) / (support - 1).clamp(min=1)
    return torch.clamp(z - tau, min=0)


def sparsemax_ranks_from_zero(z):  # learner test: arange(0, n) in the support test
    zs = z.sort(dim=-1, descending=True).values
    k = torch.arange(0, z.size(-1), dtype=z.dtype)
    cs = zs.cumsum(-1)
    support = (1 + k * zs > cs).sum(-1, keepdim=True).clamp(min=1)
    tau = (cs.gather(-1, support - 1) - 1) / support
    return torch.clamp(z - tau, min=0)


def _sparsemax_support(z, criterion):
    zs = z.sort(dim=-1, descending=True).values
    k = torch.arange(1, z.size(-1) + 1, dtype=z.dtype)
    cs = zs.cumsum(-1)
    support = criterion(k, zs, cs).sum(-1, keepdim=True).clamp(min=1)
    return torch.clamp(z - (cs.gather(-1, support - 1) - 1) / support, min=0)


def sparsemax_no_k(z):  # learner test: 1 + z_(k) > cumsum, the rank k left out
    return _sparsemax_support(z, lambda k, zs, cs: 1 + zs > cs)


def sparsemax_no_one(z):  # k·z_(k) > cumsum, the 1 left out
    return _sparsemax_support(z, lambda k, zs, cs: k * zs > cs)


def sparsemax_at_least_without_one(z):  # learner test 6b, 4.7: k·z_(k) >= cumsum
    return _sparsemax_support(z, lambda k, zs, cs: k * zs >= cs)


def sparsemax_sum_shifted(z):  # learner test: gathers cs at k, not k - 1
    zs = z.sort(dim=-1, descending=True).values
    n = z.size(-1)
    cs = zs.cumsum(-1)
    support = (1 + torch.arange(1, n + 1, dtype=z.dtype) * zs > cs).sum(-1, keepdim=True)
    return torch.clamp(z - (cs.gather(-1, support.clamp(max=n - 1)) - 1) / support, min=0)


def sparsemax_tau_without_minus_one(z):  # learner test
    zs = z.sort(dim=-1, descending=True).values
    cs = zs.cumsum(-1)
    support = (1 + torch.arange(1, z.size(-1) + 1, dtype=z.dtype) * zs > cs).sum(-1, keepdim=True)
    return torch.clamp(z - cs.gather(-1, support - 1) / support, min=0)


def sparsemax_tau_without_parentheses(z):  # learner test 44b, 4.7: cs[k-1] / k - 1
    zs = z.sort(dim=-1, descending=True).values
    cs = zs.cumsum(-1)
    support = (1 + torch.arange(1, z.size(-1) + 1, dtype=z.dtype) * zs > cs).sum(-1, keepdim=True)
    tau = cs.gather(-1, support - 1) / support - 1
    return torch.clamp(z - tau, min=0)


def sparsemax_one_row_only(z):  # learner test: right for a vector, int() of a count
    zs = z.sort(descending=True).values
    k = torch.arange(1, z.size(-1) + 1, dtype=z.dtype)
    cs = zs.cumsum(-1)
    support = int((1 + k * zs > cs).sum())
    tau = (cs[..., support - 1] - 1) / support
    return torch.clamp(z - tau, min=0)


def sparsemax_one_support_for_all_rows(z):  # learner test 6b, 4.7: int() of the whole count
    zs = z.sort(dim=-1, descending=True).values
    k = torch.arange(1, z.size(-1) + 1, dtype=z.dtype)
    cs = zs.cumsum(-1)
    support = int((1 + k * zs > cs).sum())
    return torch.clamp(z - (cs[..., support - 1 : support] - 1) / support, min=0)


def sparsemax_tau_over_length(z):  # learner test 19, 4.7: τ divided by n, not k(z)
    zs = z.sort(dim=-1, descending=True).values
    k = torch.arange(1, z.size(-1) + 1, dtype=z.dtype)
    cs = zs.cumsum(-1)
    support = (1 + k * zs > cs).sum(-1, keepdim=True)
    return torch.clamp(z - (cs.gather(-1, support - 1) - 1) / z.size(-1), min=0)


def sparsemax_tau_from_the_mean_of_the_support(z):  # τ = mean of the support, no −1/k
    zs = z.sort(dim=-1, descending=True).values
    k = torch.arange(1, z.size(-1) + 1, dtype=z.dtype)
    cs = zs.cumsum(-1)
    support = (1 + k * zs > cs).sum(-1, keepdim=True)
    return torch.clamp(z - cs.gather(-1, support - 1) / support + 0.5 / support, min=0)


def sparsemax_cumsum_unsorted(z):  # sorted for z_(k), but the sums from z as given
    zs = z.sort(dim=-1, descending=True).values
    k = torch.arange(1, z.size(-1) + 1, dtype=z.dtype)
    cs = z.cumsum(-1)
    support = (1 + k * zs > cs).sum(-1, keepdim=True).clamp(min=1)
    return torch.clamp(z - (cs.gather(-1, support - 1) - 1) / support, min=0)


def sparsemax_softmax(z):
    return torch.softmax(z, -1)


def sparsemax_ascending(z):
    zs, _ = torch.sort(z, dim=-1)
    k = torch.arange(1, z.size(-1) + 1, dtype=z.dtype)
    cs = zs.cumsum(-1)
    support = (1 + k * zs > cs).sum(-1, keepdim=True).clamp(min=1)
    tau = (cs.gather(-1, support - 1) - 1) / support
    return torch.clamp(z - tau, min=0)


def sparsemax_output_sorted(z):
    """Learner test: the right threshold, but zs (sorted) clamped instead of z."""
    zs, _ = torch.sort(z, dim=-1, descending=True)
    k = torch.arange(1, z.size(-1) + 1, dtype=z.dtype)
    cs = zs.cumsum(-1)
    support = (1 + k * zs > cs).sum(-1, keepdim=True)
    tau = (cs.gather(-1, support - 1) - 1) / support
    return torch.clamp(zs - tau, min=0)


def sparsemax_renormalised(z):
    """Learner test (find-the-bug): the support test left without its 1, and the
    output divided by its sum instead."""
    zs, _ = torch.sort(z, dim=-1, descending=True)
    k = torch.arange(1, z.size(-1) + 1, dtype=z.dtype)
    cs = zs.cumsum(-1)
    support = (k * zs > cs).sum(-1, keepdim=True).clamp(min=1)
    tau = (cs.gather(-1, support - 1) - 1) / support
    p = torch.clamp(z - tau, min=0)
    return p / p.sum(-1, keepdim=True)


def sparsemax_unsorted(z):  # learner test: the support test and tau on z as it is
    k = torch.arange(1, z.size(-1) + 1, dtype=z.dtype)
    cs = z.cumsum(-1)
    support = (1 + k * z > cs).sum(-1, keepdim=True)
    tau = (cs.gather(-1, support - 1) - 1) / support
    return torch.clamp(z - tau, min=0)


def sparsemax_mean_threshold(z):  # tau from every entry, not the support: (sum z - 1) / n
    tau = (z.sum(-1, keepdim=True) - 1) / z.size(-1)
    return torch.clamp(z - tau, min=0)


def sparsemax_support_plus_one(z):  # learner test 18b, 4.7: the 1 left out, k + 1 in the tau line
    zs = z.sort(dim=-1, descending=True).values
    k = torch.arange(1, z.size(-1) + 1, dtype=z.dtype)
    cs = zs.cumsum(-1)
    support = (k * zs > cs).sum(-1, keepdim=True).clamp(min=1)
    support = (support + 1).clamp(max=z.size(-1))
    return torch.clamp(z - (cs.gather(-1, support - 1) - 1) / support, min=0)


def sparsemax_argmax(z):  # learner test 18b, 4.7: a one-hot of the largest entry
    return torch.zeros_like(z).scatter(-1, z.argmax(-1, keepdim=True), 1.0)


def sparsemax_in_place(z):  # learner test 18b, 4.7: right values, the caller's z edited
    tau = sparsemax_tau(z)
    z -= tau
    return z.clamp_(min=0)


def sparsemax_skeleton(z):
    raise NotImplementedError


@pytest.mark.parametrize("fn", [sparsemax_sorted, sparsemax_bisection])
def test_sparsemax_accepts(fn, capsys):
    assert_passes(ex.check_sparsemax, fn, capsys)


@pytest.mark.parametrize(
    "fn",
    [
        lambda z: tc.sparsemax(z),  # learner test 58 (4.7): accepted
        tc.sparsemax,
        lambda z: torch.clamp(z - tc.sparsemax_threshold(z), min=0),
    ],
)
@pytest.mark.parametrize("exercise", [None, "4.7"])
def test_sparsemax_refuses_the_reference(fn, exercise, capsys):
    message = rejection(lambda c: ex.check_sparsemax(c, exercise=exercise), fn)
    assert "检查器用来比较的参考实现" in message, message
    assert ("抄过来" in message) == (exercise is not None), message


def test_sparsemax_skeleton(capsys):
    assert_skeleton(ex.check_sparsemax, sparsemax_skeleton, capsys)


SPARSEMAX_REJECTS = [
    (sparsemax_no_clamp, "截断"),
    (sparsemax_tau_plus_one, "τ 里写成了 + 1"),
    (sparsemax_k_from_zero, "k 从 1 数起"),
    (sparsemax_ranks_from_zero, "名次 k 从 0 数起了"),
    (sparsemax_at_least_without_one, "支撑集的判据少了 1，> 又换成了 ≥"),
    (sparsemax_no_k, "判据少了名次 k"),
    (sparsemax_sum_shifted, "不是 cs[k]"),
    (sparsemax_tau_without_minus_one, "τ 少了 −1"),
    (sparsemax_tau_without_parentheses, "τ 那一行少了括号"),
    (sparsemax_tau_over_length, "应除以支撑集的大小 k(z)"),
    (sparsemax_tau_from_the_mean_of_the_support, "非零的位置（支撑集）对了，值不对：τ 算错了"),
    (sparsemax_no_one, "判据少了 1"),
    (sparsemax_one_row_only, "一维输入通过了，有多行的输入出错"),
    (sparsemax_one_support_for_all_rows, "对每一行分别做"),
    (sparsemax_softmax, "softmax 的结果"),
    (sparsemax_ascending, "从大到小"),
    (sparsemax_output_sorted, "排好的顺序"),
    (sparsemax_renormalised, "输出除以了自己的和"),
    (sparsemax_unsorted, "没有先排序"),
    (sparsemax_cumsum_unsorted, "前 k 大之和是从原顺序的 z 累加的"),
    (sparsemax_mean_threshold, "τ 用了全部元素"),
    (sparsemax_support_plus_one, "支撑集大小多加了 1"),
    (sparsemax_argmax, "argmax 的 one-hot"),
]


@pytest.mark.parametrize("exercise", [None, "4.7"])
def test_sparsemax_rejects_an_in_place_edit_of_z(exercise, capsys):
    """Learner test 18b: right values, but the caller's z changed (the page's
    attention scores would be corrupted); the checker gives the learner its own copy."""
    message = rejection(lambda c: ex.check_sparsemax(c, exercise=exercise), sparsemax_in_place)
    assert "原地修改了传进来的 z" in message and "torch.clamp(z - tau, min=0)" in message, message


def test_sparsemax_tau_without_parentheses_in_the_bug_hunt(capsys):
    """Learner test 44b (4.7): the support fixed, the τ line broken by a missing pair of
    parentheses: the hint names the τ line, not the support test."""
    message = rejection(lambda c: ex.check_sparsemax(c, exercise="4.7"), sparsemax_tau_without_parentheses)
    assert "τ 那一行少了括号" in message and "判据" not in message, message


def test_sparsemax_support_plus_one_in_the_bug_hunt(capsys):
    """Learner test 18b (4.7): the page's bug patched with k + 1 in the tau line is
    told where to look, without the corrected criterion."""
    message = rejection(lambda c: ex.check_sparsemax(c, exercise="4.7"), sparsemax_support_plus_one)
    assert "τ 那一行里把支撑集大小加了 1" in message and "1 + k·z_(k)" not in message, message


def test_sparsemax_two_support_mistakes_are_told_apart(capsys):
    """Learner test 15 (4.7): a rank k from 0 and k·z_(k) >= the sum are different
    mistakes (they differ on [0.9, 0.8, 0.1]); each hint names only its own."""
    z = torch.tensor([0.9, 0.8, 0.1], dtype=torch.float64)
    assert not torch.allclose(sparsemax_ranks_from_zero(z), sparsemax_at_least_without_one(z))
    message = rejection(ex.check_sparsemax, sparsemax_ranks_from_zero)
    assert "名次 k 从 0 数起了" in message and "≥" not in message, message
    message = rejection(ex.check_sparsemax, sparsemax_at_least_without_one)
    assert "从 0 数起" not in message, message


@pytest.mark.parametrize(("fn", "keyword"), SPARSEMAX_REJECTS)
def test_sparsemax_rejects(fn, keyword, capsys):
    assert_rejects(ex.check_sparsemax, fn, keyword, capsys)


def test_sparsemax_hints_all_reached(capsys):
    from transformer_course.exercises import efficient

    rejects = [pytest.param(ex.check_sparsemax, fn, keyword) for fn, keyword in SPARSEMAX_REJECTS]
    assert_every_hint_reached({"_SPARSEMAX_MISTAKES": efficient._SPARSEMAX_MISTAKES}, rejects, capsys)


# KV-cache bytes
# ---------------------------------------------------------------------------


def kv_bytes(cfg, batch, seq_len, bytes_per_element=4):
    heads = cfg.num_kv_heads or cfg.num_heads
    return 2 * cfg.num_layers * batch * heads * cfg.head_dim * seq_len * bytes_per_element


def kv_bytes_float(cfg, batch, seq_len, bytes_per_element=4):  # a float that is whole
    ratio = (cfg.num_kv_heads or cfg.num_heads) / cfg.num_heads
    return 2.0 * cfg.num_layers * batch * seq_len * cfg.d_model * ratio * bytes_per_element


def kv_bytes_no_none(cfg, batch, seq_len, bytes_per_element=4):
    return 2 * cfg.num_layers * batch * cfg.num_kv_heads * cfg.head_dim * seq_len * bytes_per_element


def kv_bytes_one_copy(cfg, batch, seq_len, bytes_per_element=4):
    return kv_bytes(cfg, batch, seq_len, bytes_per_element) // 2


def kv_bytes_query_heads(cfg, batch, seq_len, bytes_per_element=4):
    return 2 * cfg.num_layers * batch * cfg.d_model * seq_len * bytes_per_element


def kv_bytes_head_dim_d_model(cfg, batch, seq_len, bytes_per_element=4):
    """Learner test: each key-value head taken d_model wide."""
    heads = cfg.num_kv_heads or cfg.num_heads
    return 2 * cfg.num_layers * batch * seq_len * heads * cfg.d_model * bytes_per_element


def kv_bytes_head_dim_over_kv_heads(cfg, batch, seq_len, bytes_per_element=4):
    """Learner test: head_dim taken as d_model // num_kv_heads (same value as num_heads
    heads); the hint must name this route too, not only num_heads."""
    heads = cfg.num_kv_heads or cfg.num_heads
    head_dim = cfg.d_model // heads
    return 2 * cfg.num_layers * batch * seq_len * heads * head_dim * bytes_per_element


def kv_bytes_fixed_4(cfg, batch, seq_len, bytes_per_element=4):
    """Learner test: the argument ignored, 4 bytes written in."""
    return kv_bytes(cfg, batch, seq_len, 4)


def kv_bytes_in_bits(cfg, batch, seq_len, bytes_per_element=4):
    """Learner test: bits, not bytes."""
    return 8 * kv_bytes(cfg, batch, seq_len, bytes_per_element)


def kv_bytes_no_kv_heads(cfg, batch, seq_len, bytes_per_element=4):
    """Learner test: one head's width only. On the first config (H_kv = 2) this equals
    forgetting the factor 2; the hint must still name the heads."""
    return 2 * cfg.num_layers * batch * seq_len * cfg.head_dim * bytes_per_element


def kv_bytes_no_batch(cfg, batch, seq_len, bytes_per_element=4):  # learner test 6b, 5.22
    return kv_bytes(cfg, 1, seq_len, bytes_per_element)


def kv_bytes_skeleton(cfg, batch, seq_len, bytes_per_element=4):
    pass


@pytest.mark.parametrize("fn", [kv_bytes, kv_bytes_float])
def test_kv_cache_bytes_accepts(fn, capsys):
    assert_passes(ex.check_kv_cache_bytes, fn, capsys)


def test_kv_cache_bytes_skeleton(capsys):
    assert_skeleton(ex.check_kv_cache_bytes, kv_bytes_skeleton, capsys)


@pytest.mark.parametrize(
    ("fn", "keyword"),
    [
        (kv_bytes_one_copy, "两份"),
        (kv_bytes_query_heads, "num_kv_heads"),
        (kv_bytes_head_dim_over_kv_heads, "d_model // num_kv_heads"),
        (kv_bytes_no_none, "None"),
        (kv_bytes_head_dim_d_model, "每个头的宽度用了 d_model"),
        (kv_bytes_in_bits, "比特数"),
        (kv_bytes_fixed_4, "不要写死 4"),
        (kv_bytes_no_kv_heads, "漏了键值头数"),
        (kv_bytes_no_batch, "漏了批大小"),
    ],
)
def test_kv_cache_bytes_rejects(fn, keyword, capsys):
    assert_rejects(ex.check_kv_cache_bytes, fn, keyword, capsys)


# prefix-LM mask
# ---------------------------------------------------------------------------


def prefix_columns(L, prefix):
    mask = tc.causal_mask(L).clone()
    mask[:, :prefix] = True
    return mask


def prefix_block(L, prefix):  # a different but equal construction
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    return (j <= i) | ((i < prefix) & (j < prefix))


def prefix_rows(L, prefix):
    mask = tc.causal_mask(L).clone()
    mask[:prefix, :] = True
    return mask


def prefix_inverted(L, prefix):
    return ~prefix_columns(L, prefix)


def prefix_float(L, prefix):
    return prefix_columns(L, prefix).float()


def prefix_off_by_one(L, prefix):
    mask = tc.causal_mask(L).clone()
    mask[:, : prefix + 1] = True
    return mask


def prefix_plain_causal(L, prefix):
    """Learner test: the prefix ignored."""
    return tc.causal_mask(L)


def prefix_transposed(L, prefix):
    """Learner test: upper triangle plus the prefix block (rows and columns swapped)."""
    mask = torch.ones(L, L, dtype=torch.bool).triu()
    mask[:prefix, :prefix] = True
    return mask


def prefix_zero_means_all(L, prefix):
    """Learner test: `prefix or L` opens the whole sequence when prefix = 0."""
    mask = tc.causal_mask(L).clone()
    mask[: prefix or L, : prefix or L] = True
    return mask


def prefix_future_after_prefix(L, prefix):  # no hint of its own: the fallback names the future
    mask = tc.causal_mask(L).clone()
    mask[:, :prefix] = True
    mask[prefix:, -1] = True
    return mask


def prefix_block_false(L, prefix):
    """Learner test 15 (4.21): the prefix block set to False (True read as masked)."""
    mask = tc.causal_mask(L).clone()
    mask[:prefix, :prefix] = False
    return mask


def prefix_bidirectional(L, prefix):  # learner test, 4.21: no causal part, all True
    return torch.ones(L, L, dtype=torch.bool)


def prefix_columns_only(L, prefix):  # learner test, 4.21: no causal part, the prefix columns only
    return (torch.arange(L) < prefix).expand(L, L)


def prefix_block_only(L, prefix):  # learner test, 4.21: no causal part, the prefix block only
    seen = torch.arange(L) < prefix
    return seen[:, None] & seen[None, :]


def prefix_skeleton(L, prefix):
    pass


@pytest.mark.parametrize("fn", [prefix_columns, prefix_block])
def test_prefix_lm_mask_accepts(fn, capsys):
    assert_passes(ex.check_prefix_lm_mask, fn, capsys)


def prefix_additive(L, prefix):  # learner test 25b: 0 / −∞ instead of True / False
    return torch.zeros(L, L).masked_fill(~prefix_columns(L, prefix), -math.inf)


def prefix_suffix_blind(L, prefix):  # learner test 25b: the suffix cannot see the prefix
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    return ((i < prefix) & (j < prefix)) | ((i >= prefix) & (j >= prefix) & (j <= i))


def prefix_and_self(L, prefix):  # learner test 36b: the suffix sees the prefix and itself only
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    return (j < prefix) & ((i < prefix) | (j <= i)) | (i == j)


def prefix_block_and_diagonal(L, prefix):  # learner test 36b: the suffix sees only itself
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    return (i < prefix) & (j < prefix) | (i == j)


def test_prefix_lm_mask_skeleton(capsys):
    assert_skeleton(ex.check_prefix_lm_mask, prefix_skeleton, capsys)


@pytest.mark.parametrize(
    ("fn", "keyword"),
    [
        (prefix_rows, "整行"),
        (prefix_inverted, "方向反了"),
        (prefix_float, "布尔"),
        (prefix_additive, "你返回的是加性掩码"),
        (prefix_suffix_blind, "前缀之后的位置看不到前缀了"),
        (prefix_and_self, "只看得到前缀和自己"),
        (prefix_block_and_diagonal, "只看得到自己（只有对角线）"),
        (prefix_off_by_one, "多开了一列"),
        (prefix_plain_causal, "普通的因果掩码"),
        (prefix_transposed, "掩码转置了"),
        (prefix_zero_means_all, "prefix = 0 时没有前缀"),
        (prefix_future_after_prefix, "前缀之后的键 j 被更早的位置 i < j 看到了"),
        (prefix_block_false, "前缀块 mask[:3, :3] 全是 False"),
        (prefix_bidirectional, "没有因果的部分"),
        (prefix_columns_only, "没有因果的部分：前缀之后的位置只看得到前缀"),
        (prefix_block_only, "只有前缀块，没有因果的部分"),
    ],
)
def test_prefix_lm_mask_rejects(fn, keyword, capsys):
    assert_rejects(ex.check_prefix_lm_mask, fn, keyword, capsys)


# streaming (online-softmax) attention
# ---------------------------------------------------------------------------


def streaming_safe_max(Q, blocks):  # the recurrence of 4.1.4 with a guarded maximum
    c = torch.full(Q.shape[:-1] + (1,), -math.inf)
    ell, o = torch.zeros_like(c), None
    for K, V, mask in blocks:
        s = (Q @ K.mT / math.sqrt(Q.size(-1))).masked_fill(~mask, -math.inf)
        c_new = torch.maximum(c, s.amax(-1, keepdim=True))
        c_safe = torch.where(c_new == -math.inf, torch.zeros_like(c_new), c_new)
        fix, p = torch.exp(c - c_safe), torch.exp(s - c_safe)
        ell = ell * fix + p.sum(-1, keepdim=True)
        o = p @ V if o is None else o * fix + p @ V
        c = c_new
    return o / ell


def streaming_logsumexp(Q, blocks):  # running log-sum-exp and a normalized output
    lse, out = None, None
    for K, V, mask in blocks:
        s = torch.where(mask, Q @ K.transpose(-2, -1) * Q.size(-1) ** -0.5, -math.inf)
        block_lse = torch.logsumexp(s, dim=-1, keepdim=True)  # -inf where all masked
        block_out = torch.nan_to_num(torch.softmax(s, -1)) @ V
        if lse is None:
            lse, out = block_lse, block_out
            continue
        new = torch.logaddexp(lse, block_lse)
        w_old = torch.nan_to_num(torch.exp(lse - new))
        w_blk = torch.nan_to_num(torch.exp(block_lse - new))
        out, lse = w_old * out + w_blk * block_out, new
    return out


def streaming_while_next(Q, blocks):  # next() by hand, a large finite fill value
    it = iter(blocks)
    c = ell = o = None
    while (item := next(it, None)) is not None:
        K, V, mask = item
        s = (Q @ K.mT) / math.sqrt(Q.size(-1))
        s = s.masked_fill(~mask, -1e30)
        m = s.amax(-1, keepdim=True)
        c_new = m if c is None else torch.maximum(c, m)
        p = torch.exp(s - c_new) * mask
        if c is None:
            ell, o = p.sum(-1, keepdim=True), p @ V
        else:
            fix = torch.exp(c - c_new)
            ell, o = ell * fix + p.sum(-1, keepdim=True), o * fix + p @ V
        c = c_new
    return o / ell


def streaming_skeleton(Q, blocks):
    # 在这里写你的代码
    pass


def streaming_full_matrix(Q, blocks):  # the old loophole: concatenate, then softmax
    Ks, Vs, masks = zip(*blocks, strict=True)
    K, V, mask = torch.cat(Ks, -2), torch.cat(Vs, -2), torch.cat(masks, -1)
    s = (Q @ K.mT / math.sqrt(Q.size(-1))).masked_fill(~mask, -math.inf)
    return torch.softmax(s, -1) @ V


def streaming_two_pass(Q, blocks):  # exact, but keeps every block for a second pass
    blocks = list(blocks)
    scale = 1 / math.sqrt(Q.size(-1))
    c = torch.full(Q.shape[:-1] + (1,), -math.inf)
    for K, _, mask in blocks:
        s = (Q @ K.mT * scale).masked_fill(~mask, -math.inf)
        c = torch.maximum(c, s.amax(-1, keepdim=True))
    ell, o = 0, 0
    for K, V, mask in blocks:
        p = torch.exp((Q @ K.mT * scale).masked_fill(~mask, -math.inf) - c)
        ell, o = ell + p.sum(-1, keepdim=True), o + p @ V
    return o / ell


def streaming_partials(Q, blocks):  # one (max, sum, output) per block, combined at the end
    parts = []
    for K, V, mask in blocks:
        s = (Q @ K.mT / math.sqrt(Q.size(-1))).masked_fill(~mask, -math.inf)
        m = s.amax(-1, keepdim=True).clamp(min=-1e30)
        p = torch.exp(s - m)
        parts.append((m, p.sum(-1, keepdim=True), p @ V))
    c = torch.stack([m for m, _, _ in parts]).amax(0)
    ell = sum(torch.exp(m - c) * e for m, e, _ in parts)
    return sum(torch.exp(m - c) * o for m, _, o in parts) / ell


def streaming_unguarded(Q, blocks):  # the page's 4.1.4 code plus a mask: NaN
    c = torch.full(Q.shape[:-1] + (1,), -math.inf)
    ell, o = torch.zeros_like(c), 0
    for K, V, mask in blocks:
        s = (Q @ K.mT / math.sqrt(Q.size(-1))).masked_fill(~mask, -math.inf)
        c_new = torch.maximum(c, s.amax(-1, keepdim=True))
        fix, p = torch.exp(c - c_new), torch.exp(s - c_new)
        ell, o, c = ell * fix + p.sum(-1, keepdim=True), o * fix + p @ V, c_new
    return o / ell


def streaming_no_max(Q, blocks):  # exp of the raw scores: overflows for large scores
    ell, o = 0, 0
    for K, V, mask in blocks:
        p = torch.exp(Q @ K.mT / math.sqrt(Q.size(-1))) * mask
        ell, o = ell + p.sum(-1, keepdim=True), o + p @ V
    return o / ell


def _streaming_with(Q, blocks, *, rescale_ell=True, rescale_o=True, inverted=False,
                    scale=True, by_block=False, use_mask=True):  # fmt: skip
    c = torch.full(Q.shape[:-1] + (1,), -math.inf)
    ell, o = torch.zeros_like(c), 0
    for K, V, mask in blocks:
        s = Q @ K.mT / (math.sqrt(K.size(-2) if by_block else Q.size(-1)) if scale else 1)
        if use_mask:
            s = s.masked_fill(mask if inverted else ~mask, -math.inf)
        c_new = torch.maximum(c, s.amax(-1, keepdim=True))
        c_safe = torch.where(torch.isinf(c_new), 0.0, c_new)
        fix, p = torch.exp(c - c_safe), torch.exp(s - c_safe)
        ell = (ell * fix if rescale_ell else ell) + p.sum(-1, keepdim=True)
        o = (o * fix if rescale_o else o) + p @ V
        c = c_new
    return o / ell


def streaming_no_rescale(Q, blocks):
    return _streaming_with(Q, blocks, rescale_ell=False, rescale_o=False)


def streaming_o_not_rescaled(Q, blocks):
    return _streaming_with(Q, blocks, rescale_o=False)


def streaming_inverted(Q, blocks):
    return _streaming_with(Q, blocks, inverted=True)


def streaming_weak_fill(Q, blocks):  # learner test 45d, 4.5: s + (~m) * -30, a finite fill
    c = torch.full(Q.shape[:-1] + (1,), -math.inf)
    ell, o = torch.zeros_like(c), 0
    for K, V, mask in blocks:
        s = Q @ K.mT / math.sqrt(Q.size(-1)) + (~mask) * -30.0
        c_new = torch.maximum(c, s.amax(-1, keepdim=True))
        fix, p = torch.exp(c - c_new), torch.exp(s - c_new)
        ell, o, c = ell * fix + p.sum(-1, keepdim=True), o * fix + p @ V, c_new
    return o / ell


def streaming_bool_index_fill(Q, blocks):  # learner test 45d, 4.5: s[~m] = -1e30, no broadcast
    c = torch.full(Q.shape[:-1] + (1,), -math.inf)
    ell, o = torch.zeros_like(c), 0
    for K, V, mask in blocks:
        s = Q @ K.mT / math.sqrt(Q.size(-1))
        s[~mask] = -1e30
        c_new = torch.maximum(c, s.amax(-1, keepdim=True))
        fix, p = torch.exp(c - c_new), torch.exp(s - c_new)
        ell, o, c = ell * fix + p.sum(-1, keepdim=True), o * fix + p @ V, c_new
    return o / ell


def _keeping(which):
    """streaming_safe_max that also keeps one tensor of every block (1: V_j, 2: mask_j) in a list."""

    def fn(Q, blocks):
        kept = []

        def tap():
            for block in blocks:
                kept.append(block[which])
                yield block

        return streaming_safe_max(Q, tap())

    return fn


streaming_keeps_masks = _keeping(2)  # learner test 47e, 4.5: every mask_j kept in a list
streaming_keeps_values = _keeping(1)  # the same with V_j


def streaming_one_max_for_all_rows(Q, blocks):  # learner test 49f: a global maximum
    c = torch.full((1, 1), -math.inf)
    ell, o = 0, 0
    for K, V, mask in blocks:
        s = (Q @ K.mT / math.sqrt(Q.size(-1))).masked_fill(~mask, -math.inf)
        c_new = torch.maximum(c, s.amax(-2, keepdim=True).amax(-1, keepdim=True))
        c_safe = torch.where(torch.isinf(c_new), 0.0, c_new)
        fix, p = torch.exp(c - c_safe), torch.exp(s - c_safe)
        ell, o, c = ell * fix + p.sum(-1, keepdim=True), o * fix + p @ V, c_new
    return o / ell


def streaming_unscaled(Q, blocks):
    return _streaming_with(Q, blocks, scale=False)


def streaming_scale_by_block(Q, blocks):  # learner test 25b: √(block size) where √D belongs
    return _streaming_with(Q, blocks, by_block=True)


def streaming_mask_ignored(Q, blocks):  # learner test 25b: mask_j never used
    return _streaming_with(Q, blocks, use_mask=False)


def streaming_mask_after_exp(Q, blocks):  # learner test: the running max includes masked scores
    c = torch.full(Q.shape[:-1] + (1,), -math.inf)
    ell, o = torch.zeros_like(c), 0
    for K, V, mask in blocks:
        s = Q @ K.mT / math.sqrt(Q.size(-1))
        c_new = torch.maximum(c, s.amax(-1, keepdim=True))
        fix, p = torch.exp(c - c_new), torch.exp(s - c_new) * mask
        ell, o, c = ell * fix + p.sum(-1, keepdim=True), o * fix + p @ V, c_new
    return o / ell


def streaming_mask_after_exp_max_visible(Q, blocks):  # learner test 58: c over visible keys only
    c = torch.full(Q.shape[:-1] + (1,), -math.inf)
    ell, o = torch.zeros_like(c), 0
    for K, V, mask in blocks:
        s = Q @ K.mT / math.sqrt(Q.size(-1))
        c_new = torch.maximum(c, s.masked_fill(~mask, -math.inf).amax(-1, keepdim=True))
        c_safe = torch.where(torch.isinf(c_new), 0.0, c_new)
        fix, p = torch.exp(c - c_safe), torch.exp(s - c_safe) * mask
        ell, o, c = ell * fix + p.sum(-1, keepdim=True), o * fix + p @ V, c_new
    return o / ell


def streaming_scale_by_dv(Q, blocks):  # learner test: √D_v where √D belongs
    c, ell, o = None, None, None
    for K, V, mask in blocks:
        s = (Q @ K.mT / math.sqrt(V.size(-1))).masked_fill(~mask, -math.inf)
        m = s.amax(-1, keepdim=True)
        c_new = m if c is None else torch.maximum(c, m)
        c_safe = torch.where(torch.isinf(c_new), 0.0, c_new)
        p = torch.exp(s - c_safe)
        if c is None:
            ell, o = p.sum(-1, keepdim=True), p @ V
        else:
            fix = torch.exp(c - c_safe)
            ell, o = ell * fix + p.sum(-1, keepdim=True), o * fix + p @ V
        c = c_new
    return o / ell


def streaming_peek_dropped(Q, blocks):  # learner test: next() to learn D_v, that block never used
    it = iter(blocks)
    _, V0, _ = next(it)
    c = torch.full(Q.shape[:-1] + (1,), -math.inf)
    ell, o = torch.zeros_like(c), torch.zeros(Q.shape[:-1] + (V0.size(-1),))
    del V0
    for K, V, mask in it:
        s = (Q @ K.mT / math.sqrt(Q.size(-1))).masked_fill(~mask, -math.inf)
        c_new = torch.maximum(c, s.amax(-1, keepdim=True))
        c_safe = torch.where(torch.isinf(c_new), 0.0, c_new)
        fix, p = torch.exp(c - c_safe), torch.exp(s - c_safe)
        ell, o, c = ell * fix + p.sum(-1, keepdim=True), o * fix + p @ V, c_new
    return o / ell


def streaming_fix_inverted(Q, blocks):  # learner test 10b, 4.5: exp(c_new − c_old)
    c = torch.full(Q.shape[:-1] + (1,), -math.inf)
    ell, o = torch.zeros_like(c), 0
    for K, V, mask in blocks:
        s = (Q @ K.mT / math.sqrt(Q.size(-1))).masked_fill(~mask, -math.inf)
        c_new = torch.maximum(c, s.amax(-1, keepdim=True))
        c_safe = torch.where(torch.isinf(c_new), 0.0, c_new)
        fix = torch.nan_to_num(torch.exp(c_safe - torch.where(torch.isinf(c), c_safe, c)), nan=0.0)
        p = torch.exp(s - c_safe)
        ell, o, c = ell * fix + p.sum(-1, keepdim=True), o * fix + p @ V, c_new
    return o / ell


def streaming_ell_not_rescaled(Q, blocks):  # learner test 20b, 4.5: the mirror of o_fix
    return _streaming_with(Q, blocks, rescale_ell=False)


def streaming_skip_masked_block(Q, blocks):  # learner test 20b: a row fully masked -> skip the block
    c = ell = o = None
    for K, V, mask in blocks:
        s = (Q @ K.mT / math.sqrt(Q.size(-1))).masked_fill(~mask, -math.inf)
        if torch.isinf(s.amax(-1)).any():
            continue
        if c is None:
            c = torch.full(s.shape[:-1] + (1,), -math.inf)
            ell, o = torch.zeros_like(c), torch.zeros(s.shape[:-1] + (V.size(-1),))
        c_new = torch.maximum(c, s.amax(-1, keepdim=True))
        fix, p = torch.exp(c - c_new), torch.exp(s - c_new)
        ell, o, c = ell * fix + p.sum(-1, keepdim=True), o * fix + p @ V, c_new
    return o / ell


def streaming_skip_empty_block(Q, blocks):  # skips a block only when every row is masked: right
    c = torch.full(Q.shape[:-1] + (1,), -math.inf)
    ell, o = torch.zeros_like(c), 0
    for K, V, mask in blocks:
        if not mask.any():
            continue
        s = torch.einsum("...ld,...bd->...lb", Q, K) / math.sqrt(Q.size(-1))
        s = s.masked_fill(~mask, -math.inf)
        c_new = torch.maximum(c, s.amax(-1, keepdim=True))
        c_safe = torch.where(torch.isinf(c_new), 0.0, c_new)
        fix, p = torch.exp(c - c_safe), torch.exp(s - c_safe)
        ell, o, c = ell * fix + p.sum(-1, keepdim=True), o * fix + p @ V, c_new
    return o / ell


def streaming_not_normalized(Q, blocks):  # forgets the final / ℓ
    c, o = torch.full(Q.shape[:-1] + (1,), -math.inf), 0
    for K, V, mask in blocks:
        s = (Q @ K.mT / math.sqrt(Q.size(-1))).masked_fill(~mask, -math.inf)
        c_new = torch.maximum(c, s.amax(-1, keepdim=True))
        c_safe = torch.where(torch.isinf(c_new), 0.0, c_new)
        o, c = o * torch.exp(c - c_safe) + torch.exp(s - c_safe) @ V, c_new
    return o


def streaming_c_not_updated(Q, blocks):  # never assigns c = c_new
    c = torch.full(Q.shape[:-1] + (1,), -math.inf)
    ell, o = torch.zeros_like(c), 0
    for K, V, mask in blocks:
        s = (Q @ K.mT / math.sqrt(Q.size(-1))).masked_fill(~mask, -math.inf)
        c_new = torch.maximum(c, s.amax(-1, keepdim=True))
        c_safe = torch.where(torch.isinf(c_new), 0.0, c_new)
        fix, p = torch.exp(c - c_safe), torch.exp(s - c_safe)
        ell, o = ell * fix + p.sum(-1, keepdim=True), o * fix + p @ V
    return o / ell


def streaming_block_max(Q, blocks):  # c_new from the current block only
    c = torch.full(Q.shape[:-1] + (1,), -math.inf)
    ell, o = torch.zeros_like(c), 0
    for K, V, mask in blocks:
        s = (Q @ K.mT / math.sqrt(Q.size(-1))).masked_fill(~mask, -math.inf)
        c_new = s.amax(-1, keepdim=True)
        c_safe = torch.where(torch.isinf(c_new), 0.0, c_new)
        fix, p = torch.exp(c - c_safe), torch.exp(s - c_safe)
        ell, o, c = ell * fix + p.sum(-1, keepdim=True), o * fix + p @ V, c_new
    return o / ell


def streaming_block_max_unguarded(Q, blocks):  # c_new from the block, no c_safe: NaN mid-stream
    c = torch.full(Q.shape[:-1] + (1,), -math.inf)
    ell, o = torch.zeros_like(c), 0
    for K, V, mask in blocks:
        s = (Q @ K.mT / math.sqrt(Q.size(-1))).masked_fill(~mask, -math.inf)
        c_new = s.amax(-1, keepdim=True)
        fix, p = torch.exp(c - c_new), torch.exp(s - c_new)
        ell, o, c = ell * fix + p.sum(-1, keepdim=True), o * fix + p @ V, c_new
    return o / ell


def streaming_normalized_o(Q, blocks):  # o kept normalized, the old ℓ never put back
    c = torch.full(Q.shape[:-1] + (1,), -math.inf)
    ell, o = torch.zeros_like(c), 0
    for K, V, mask in blocks:
        s = (Q @ K.mT / math.sqrt(Q.size(-1))).masked_fill(~mask, -math.inf)
        c_new = torch.maximum(c, s.amax(-1, keepdim=True))
        c_safe = torch.where(torch.isinf(c_new), 0.0, c_new)
        fix, p = torch.exp(c - c_safe), torch.exp(s - c_safe)
        ell = ell * fix + p.sum(-1, keepdim=True)
        o, c = (o * fix + p @ V) / ell, c_new
    return o


def streaming_normalized_o_right(Q, blocks):  # the same, with the old ℓ put back: right
    c = torch.full(Q.shape[:-1] + (1,), -math.inf)
    ell, o = torch.zeros_like(c), 0
    for K, V, mask in blocks:
        s = (Q @ K.mT / math.sqrt(Q.size(-1))).masked_fill(~mask, -math.inf)
        c_new = torch.maximum(c, s.amax(-1, keepdim=True))
        c_safe = torch.where(torch.isinf(c_new), 0.0, c_new)
        fix, p = torch.exp(c - c_safe), torch.exp(s - c_safe)
        ell_new = ell * fix + p.sum(-1, keepdim=True)
        o = torch.nan_to_num((o * ell * fix + p @ V) / ell_new)  # 0/0 before any key
        ell, c = ell_new, c_new
    return o


def streaming_block_softmax_mean(Q, blocks):  # each block's softmax, averaged
    total, n = 0, 0
    for K, V, mask in blocks:
        s = (Q @ K.mT / math.sqrt(Q.size(-1))).masked_fill(~mask, -math.inf)
        total, n = total + torch.nan_to_num(torch.softmax(s, -1)) @ V, n + 1
    return total / n


def _streaming_masked_by(Q, blocks, apply_mask, c0=-math.inf):
    c = torch.full(Q.shape[:-1] + (1,), c0)
    ell, o = torch.zeros_like(c), 0
    for K, V, mask in blocks:
        s = apply_mask(Q @ K.mT / math.sqrt(Q.size(-1)), mask)
        c_new = torch.maximum(c, s.amax(-1, keepdim=True))
        fix, p = torch.exp(c - c_new), torch.exp(s - c_new)
        ell, o, c = ell * fix + p.sum(-1, keepdim=True), o * fix + p @ V, c_new
    return o / ell


def streaming_c_starts_at_zero(Q, blocks):  # learner test 63, 4.5: no NaN, but underflow
    return _streaming_masked_by(Q, blocks, lambda s, mask: s.masked_fill(~mask, -math.inf), c0=0.0)


def streaming_own_block_max(Q, blocks):  # learner test 66: each block's own max, summed
    ell, o = 0, 0
    for K, V, mask in blocks:
        s = (Q @ K.mT / math.sqrt(Q.size(-1))).masked_fill(~mask, -math.inf)
        m = s.amax(-1, keepdim=True)
        p = torch.exp(s - torch.where(torch.isinf(m), torch.zeros_like(m), m))
        ell, o = ell + p.sum(-1, keepdim=True), o + p @ V
    return o / ell


def streaming_mask_in_ell_only(Q, blocks):  # learner test 65: o from the unmasked scores
    c = torch.full(Q.shape[:-1] + (1,), -math.inf)
    ell, o = torch.zeros_like(c), 0
    for K, V, mask in blocks:
        raw = Q @ K.mT / math.sqrt(Q.size(-1))
        s = raw.masked_fill(~mask, -math.inf)
        c_new = torch.maximum(c, s.amax(-1, keepdim=True))
        safe = torch.where(torch.isinf(c_new), torch.zeros_like(c_new), c_new)
        fix = torch.exp(c - safe)
        ell, o, c = ell * fix + torch.exp(s - safe).sum(-1, keepdim=True), o * fix + torch.exp(raw - safe) @ V, c_new
    return o / ell


def streaming_mask_multiplied(Q, blocks):  # learner test 21b, 4.5: s · mask, not −∞
    return _streaming_masked_by(Q, blocks, lambda s, mask: s * mask)


def streaming_mask_added(Q, blocks):  # the bool mask added to the scores (+1 / +0)
    return _streaming_masked_by(Q, blocks, lambda s, mask: s + mask)


def streaming_additive_mask(Q, blocks):  # an additive 0 / −∞ mask, c guarded: right
    def additive(s, mask):
        return s + torch.zeros(mask.shape).masked_fill(~mask, -math.inf)

    c = torch.full(Q.shape[:-1] + (1,), -math.inf)
    ell, o = torch.zeros_like(c), 0
    for K, V, mask in blocks:
        s = additive(Q @ K.mT / math.sqrt(Q.size(-1)), mask)
        c_new = torch.maximum(c, s.amax(-1, keepdim=True))
        fix = torch.exp(c - c_new).nan_to_num(0.0)
        p = torch.exp(s - c_new).nan_to_num(0.0)
        ell, o, c = ell * fix + p.sum(-1, keepdim=True), o * fix + p @ V, c_new
    return o / ell


def streaming_peek_first(Q, blocks):  # learner test 30b: block 0 peeked to size the state, kept
    it = iter(blocks)
    K0, V0, M0 = next(it)
    scale = 1 / math.sqrt(Q.size(-1))
    c = torch.full(Q.shape[:-1] + (1,), -math.inf)
    ell, o = torch.zeros_like(c), torch.zeros(*Q.shape[:-1], V0.size(-1))

    def add(K, V, mask, c, ell, o):
        s = (Q @ K.mT * scale).masked_fill(~mask, -math.inf)
        c_new = torch.maximum(c, s.amax(-1, keepdim=True))
        fix = torch.exp(c - c_new).nan_to_num(0.0)
        p = torch.exp(s - c_new).nan_to_num(0.0)
        return c_new, ell * fix + p.sum(-1, keepdim=True), o * fix + p @ V

    c, ell, o = add(K0, V0, M0, c, ell, o)
    for K, V, mask in it:
        c, ell, o = add(K, V, mask, c, ell, o)
    return o / ell


def streaming_keeps_last_three(Q, blocks):  # learner test: a deque of the last three blocks
    recent = collections.deque(maxlen=3)

    def kept():
        for block in blocks:
            recent.append(block)
            yield block

    return streaming_safe_max(Q, kept())


def streaming_len(Q, blocks):  # treats the stream as a list
    n = len(blocks)
    return Q[..., :n]


STREAMING_REJECTS = [
    pytest.param(ex.check_streaming_attention, streaming_full_matrix, "不是流式", id="cat"),
    pytest.param(ex.check_streaming_attention, streaming_two_pass, "不要先 list(blocks)", id="list"),
    pytest.param(ex.check_streaming_attention, streaming_peek_first, "first = next(blocks)", id="peek"),
    pytest.param(ex.check_streaming_attention, streaming_partials, "同时占了", id="parts"),
    pytest.param(ex.check_streaming_attention, streaming_unguarded, "−∞ − (−∞)", id="nan"),
    pytest.param(ex.check_streaming_attention, streaming_no_max, "溢出", id="no_max"),
    pytest.param(ex.check_streaming_attention, streaming_no_rescale, "校正旧的累计量",
                 id="no_rescale"),
    pytest.param(ex.check_streaming_attention, streaming_o_not_rescaled, "分子 o 没有",
                 id="o_fix"),
    pytest.param(ex.check_streaming_attention, streaming_fix_inverted, "校正因子写反了",
                 id="fix_inverted"),
    pytest.param(ex.check_streaming_attention, streaming_inverted, "方向反了", id="inverted"),
    pytest.param(ex.check_streaming_attention, streaming_one_max_for_all_rows, "自己的最大值", id="global_max"),
    pytest.param(ex.check_streaming_attention, streaming_keeps_masks, "不是流式的", id="keeps_masks"),
    pytest.param(ex.check_streaming_attention, streaming_keeps_values, "不是流式的", id="keeps_values"),
    pytest.param(ex.check_streaming_attention, streaming_weak_fill, "屏蔽用的是一个有限的数", id="weak_fill"),
    pytest.param(ex.check_streaming_attention, streaming_bool_index_fill, "不会广播", id="bool_index"),
    pytest.param(ex.check_streaming_attention, streaming_mask_multiplied, "分数乘了掩码",
                 id="mask_multiplied"),
    pytest.param(ex.check_streaming_attention, streaming_mask_added, "把布尔掩码直接加到了分数上",
                 id="mask_added"),
    pytest.param(ex.check_streaming_attention, streaming_unscaled, "√D", id="unscaled"),
    pytest.param(ex.check_streaming_attention, streaming_scale_by_block, "用的是 √b",
                 id="scale_block"),
    pytest.param(ex.check_streaming_attention, streaming_mask_ignored, "mask_j 没有用上",
                 id="mask_ignored"),
    pytest.param(ex.check_streaming_attention, streaming_len, "迭代器", id="len"),
    pytest.param(ex.check_streaming_attention, streaming_mask_after_exp, "先屏蔽再取最大值",
                 id="mask_after_exp"),
    # learner test 58: c over the visible keys only, exp(+100) · 0 = NaN (overflow)
    pytest.param(ex.check_streaming_attention, streaming_mask_after_exp_max_visible, "上溢成 inf",
                 id="mask_after_exp_max_visible"),
    pytest.param(ex.check_streaming_attention, streaming_scale_by_dv, "用的是 √D_v",
                 id="scale_dv"),
    pytest.param(ex.check_streaming_attention, streaming_peek_dropped, "第 1 块没有算进结果",
                 id="peek_dropped"),
    pytest.param(ex.check_streaming_attention, streaming_ell_not_rescaled, "分母 ℓ 没有",
                 id="ell_fix"),
    pytest.param(ex.check_streaming_attention, streaming_skip_masked_block, "跳过了一整块",
                 id="skipped_block"),
    pytest.param(ex.check_streaming_attention, streaming_not_normalized, "没有除以 ℓ",
                 id="not_normalized"),
    pytest.param(ex.check_streaming_attention, streaming_c_not_updated, "c 没有更新",
                 id="c_not_updated"),
    pytest.param(ex.check_streaming_attention, streaming_block_max, "只取了本块的最大值",
                 id="block_max"),
    pytest.param(ex.check_streaming_attention, streaming_block_max_unguarded, "后面某一块里某行全被屏蔽",
                 id="block_max_nan"),
    pytest.param(ex.check_streaming_attention, streaming_normalized_o, "乘回旧的 ℓ",
                 id="normalized_o"),
    pytest.param(ex.check_streaming_attention, streaming_block_softmax_mean, "各块 softmax 的分母不同",
                 id="block_softmax_mean"),
    pytest.param(ex.check_streaming_attention, streaming_c_starts_at_zero, "c 的初值要是 −∞",
                 id="c_starts_at_zero"),
    pytest.param(ex.check_streaming_attention, streaming_mask_in_ell_only, "掩码只用在了分母 ℓ 上",
                 id="mask_in_ell_only"),
    pytest.param(ex.check_streaming_attention, streaming_own_block_max, "每块各用自己的最大值",
                 id="own_block_max"),
]  # fmt: skip


@pytest.mark.parametrize(
    "fn",
    [
        streaming_safe_max,
        streaming_logsumexp,
        streaming_while_next,
        streaming_skip_empty_block,
        streaming_normalized_o_right,
        streaming_additive_mask,
    ],
)
def test_streaming_attention_accepts(fn, capsys):
    assert_passes(ex.check_streaming_attention, fn, capsys)


def test_streaming_attention_skeleton(capsys):
    assert_skeleton(ex.check_streaming_attention, streaming_skeleton, capsys)


@pytest.mark.parametrize(("checker", "fn", "keyword"), STREAMING_REJECTS)
def test_streaming_attention_rejects(checker, fn, keyword, capsys):
    assert_rejects(checker, fn, keyword, capsys)


def test_streaming_attention_counts_the_old_blocks_held(capsys):
    """Keeping the last three blocks was told "旧的块一块都没有释放"; the hint now says
    how many were held, and "一块都没有释放" only when none was let go."""
    kept = rejection(ex.check_streaming_attention, streaming_keeps_last_three)
    assert "最多同时还留着 2 块比上一块更早的块" in kept and "一块都没有释放" not in kept, kept
    assert "一块都没有释放" in rejection(ex.check_streaming_attention, streaming_two_pass)


def test_streaming_attention_hints_all_reached(capsys):
    from transformer_course.exercises import efficient

    assert_every_hint_reached(
        {
            "_STREAMING_MISTAKES": efficient._STREAMING_MISTAKES,
            "STREAMING_CRASHES": efficient.STREAMING_CRASHES,
        },
        STREAMING_REJECTS,
        capsys,
    )


def test_sparsemax_tau_over_n_named_in_the_bug_hunt(capsys):
    # learner test 19: in the find-the-bug exercise a changed τ line that divides by n
    # is named, not sent to the support test (which is right)
    message = rejection(lambda c: ex.check_sparsemax(c, exercise="4.7"), sparsemax_tau_over_length)
    assert "应除以支撑集的大小 k(z)" in message and "支撑集的判据" not in message, message


def test_streaming_attention_scale_by_block_caught_in_the_first_case(capsys):
    # learner test 25b: with b = D in the first case, √b passed it
    message = rejection(ex.check_streaming_attention, streaming_scale_by_block)
    assert "用的是 √b" in message and "Q (2, 3, 8)" in message, message
