"""Efficient attention (chapter 4): grouped-query attention, sparsemax, KV-cache bytes and
the prefix-LM mask.

Correct implementations in different styles pass with one "✓" line, skeletons are
"尚未实现", and hand-written mutants are rejected with a hint that names the mistake."""

import math

import pytest
import torch

import transformer_course as tc
from transformer_course import exercises as ex

from .support import assert_passes, assert_rejects, assert_skeleton

# grouped-query attention
# ---------------------------------------------------------------------------


def gqa_five_dims(q, k, v):
    N, H, L, D = q.shape
    Hkv = k.size(1)
    qg = q.view(N, Hkv, H // Hkv, L, D)
    w = torch.softmax(qg @ k.unsqueeze(2).mT / math.sqrt(D), dim=-1)
    return (w @ v.unsqueeze(2)).reshape(N, H, L, D)


def gqa_merged_rows(q, k, v):
    N, H, L, D = q.shape
    Hkv = k.size(1)
    qg = q.reshape(N, Hkv, (H // Hkv) * L, D)  # G·L query rows per key-value head
    out = torch.softmax(qg @ k.transpose(-2, -1) * D**-0.5, dim=-1) @ v
    return out.view(N, H, L, D)


def gqa_einsum(q, k, v):
    N, H, L, D = q.shape
    Hkv = k.size(1)
    qg = q.unflatten(1, (Hkv, H // Hkv))
    s = torch.einsum("nhgld,nhsd->nhgls", qg, k) / math.sqrt(D)
    return torch.einsum("nhgls,nhsd->nhgld", s.softmax(-1), v).flatten(1, 2)


def gqa_repeat_interleave(q, k, v):
    G = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    return torch.softmax(q @ k.mT / math.sqrt(q.size(-1)), -1) @ v


def gqa_expand_reshape(q, k, v):  # copies through expand + reshape
    N, H, L, D = q.shape
    Hkv, S = k.size(1), k.size(2)
    k = k[:, :, None].expand(N, Hkv, H // Hkv, S, D).reshape(N, H, S, D)
    v = v[:, :, None].expand(N, Hkv, H // Hkv, S, D).reshape(N, H, S, D)
    return torch.softmax(q @ k.mT / math.sqrt(D), -1) @ v


def gqa_modulo(q, k, v):  # groups interleaved: head h uses key-value head h % H_kv
    N, H, L, D = q.shape
    Hkv = k.size(1)
    qg = q.view(N, H // Hkv, Hkv, L, D).transpose(1, 2)
    w = torch.softmax(qg @ k.unsqueeze(2).mT / math.sqrt(D), dim=-1)
    return (w @ v.unsqueeze(2)).transpose(1, 2).reshape(N, H, L, D)


def gqa_unscaled(q, k, v):
    N, H, L, D = q.shape
    Hkv = k.size(1)
    qg = q.view(N, Hkv, H // Hkv, L, D)
    w = torch.softmax(qg @ k.unsqueeze(2).mT, dim=-1)
    return (w @ v.unsqueeze(2)).reshape(N, H, L, D)


def gqa_grouped_shape(q, k, v):  # forgets to merge the groups back
    N, H, L, D = q.shape
    Hkv = k.size(1)
    qg = q.view(N, Hkv, H // Hkv, L, D)
    w = torch.softmax(qg @ k.unsqueeze(2).mT / math.sqrt(D), dim=-1)
    return w @ v.unsqueeze(2)


def gqa_skeleton(q, k, v):
    pass


@pytest.mark.parametrize("fn", [gqa_five_dims, gqa_merged_rows, gqa_einsum])
def test_grouped_attention_accepts(fn, capsys):
    assert_passes(ex.check_grouped_attention, fn, capsys)


def test_grouped_attention_skeleton(capsys):
    assert_skeleton(ex.check_grouped_attention, gqa_skeleton, capsys)


@pytest.mark.parametrize(
    ("fn", "keyword"),
    [
        (gqa_repeat_interleave, "repeat_interleave"),
        (gqa_expand_reshape, "复制成了 H 份"),
        (gqa_modulo, "h % H_kv"),
        (gqa_unscaled, "√D"),
        (gqa_grouped_shape, "reshape 回 (N, H, L, D)"),
    ],
)
def test_grouped_attention_rejects(fn, keyword, capsys):
    assert_rejects(ex.check_grouped_attention, fn, keyword, capsys)


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


def sparsemax_no_clamp(z):
    return z - tc.sparsemax_threshold(z)


def sparsemax_k_from_zero(z):
    zs, _ = torch.sort(z, dim=-1, descending=True)
    k = torch.arange(1, z.size(-1) + 1, dtype=z.dtype)
    cs = zs.cumsum(-1)
    support = (1 + k * zs > cs).sum(-1, keepdim=True)
    tau = (cs.gather(-1, support - 1) - 1) / (support - 1).clamp(min=1)
    return torch.clamp(z - tau, min=0)


def sparsemax_softmax(z):
    return torch.softmax(z, -1)


def sparsemax_ascending(z):
    zs, _ = torch.sort(z, dim=-1)
    k = torch.arange(1, z.size(-1) + 1, dtype=z.dtype)
    cs = zs.cumsum(-1)
    support = (1 + k * zs > cs).sum(-1, keepdim=True).clamp(min=1)
    tau = (cs.gather(-1, support - 1) - 1) / support
    return torch.clamp(z - tau, min=0)


def sparsemax_skeleton(z):
    raise NotImplementedError


@pytest.mark.parametrize("fn", [sparsemax_sorted, sparsemax_bisection, tc.sparsemax])
def test_sparsemax_accepts(fn, capsys):
    assert_passes(ex.check_sparsemax, fn, capsys)


def test_sparsemax_skeleton(capsys):
    assert_skeleton(ex.check_sparsemax, sparsemax_skeleton, capsys)


@pytest.mark.parametrize(
    ("fn", "keyword"),
    [
        (sparsemax_no_clamp, "截断"),
        (sparsemax_k_from_zero, "k 从 1 数起"),
        (sparsemax_softmax, "softmax 的结果"),
        (sparsemax_ascending, "从大到小"),
    ],
)
def test_sparsemax_rejects(fn, keyword, capsys):
    assert_rejects(ex.check_sparsemax, fn, keyword, capsys)


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
        (kv_bytes_no_none, "None"),
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


def prefix_skeleton(L, prefix):
    pass


@pytest.mark.parametrize("fn", [prefix_columns, prefix_block])
def test_prefix_lm_mask_accepts(fn, capsys):
    assert_passes(ex.check_prefix_lm_mask, fn, capsys)


def test_prefix_lm_mask_skeleton(capsys):
    assert_skeleton(ex.check_prefix_lm_mask, prefix_skeleton, capsys)


@pytest.mark.parametrize(
    ("fn", "keyword"),
    [
        (prefix_rows, "整行"),
        (prefix_inverted, "方向反了"),
        (prefix_float, "布尔"),
        (prefix_off_by_one, "多开了一列"),
    ],
)
def test_prefix_lm_mask_rejects(fn, keyword, capsys):
    assert_rejects(ex.check_prefix_lm_mask, fn, keyword, capsys)
