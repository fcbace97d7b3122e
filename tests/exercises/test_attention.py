"""Scaled dot-product attention and the causal mask.

Each checker accepts correct implementations written in different styles with one "✓"
line, treats a skeleton as "尚未实现" (an error with solution=True), and rejects
hand-written wrong implementations with a Chinese hint that names the mistake."""

import math

import pytest
import torch
import torch.nn.functional as F

import transformer_course as tc
from transformer_course import exercises as ex

from .support import assert_passes, assert_rejects, assert_skeleton

# 1. self-attention
# ---------------------------------------------------------------------------


def attention(Q, K, V, attn_mask=None):
    return tc.scaled_dot_product_attention(Q, K, V, attn_mask)


def attention_output_only(Q, K, V, attn_mask=None):
    return tc.scaled_dot_product_attention(Q, K, V, attn_mask)[0]


def attention_written_out(Q, K, V, attn_mask=None):
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
    if attn_mask is not None:
        scores = scores.masked_fill(attn_mask == 0, float("-inf"))
    weights = F.softmax(scores, dim=-1)
    return weights @ V, weights


def make_attention(scale="sqrt", dim=-1, masking="ok", value="V", ret="both", tr=None):
    def fn(Q, K, V, attn_mask=None):
        Kt = K.transpose(-2, -1) if tr is None else K.transpose(*tr)
        scores = Q @ Kt
        if scale == "sqrt":
            scores = scores / math.sqrt(Q.size(-1))
        elif scale == "d":
            scores = scores / Q.size(-1)
        if attn_mask is not None:
            if masking == "ok" or masking == "after":
                if masking == "ok":
                    scores = scores.masked_fill(~attn_mask, float("-inf"))
            elif masking == "inverted":
                scores = scores.masked_fill(attn_mask, float("-inf"))
            elif masking == "zero":
                scores = scores.masked_fill(~attn_mask, 0.0)
        weights = torch.softmax(scores, dim=dim)
        if attn_mask is not None and masking == "after":
            weights = weights * attn_mask
        out = weights @ (V if value == "V" else K)
        return {
            "both": (out, weights),
            "out": out,
            "weights": weights,
            "swapped": (weights, out),
            "list": out.tolist(),
        }[ret]

    return fn


def attention_skeleton(Q, K, V, attn_mask=None):
    pass


def test_self_attention_accepts(capsys):
    for fn in (attention, attention_output_only, attention_written_out):
        assert_passes(ex.check_self_attention, fn, capsys)
    assert_passes(ex.check_self_attention, attention, capsys, solution=True)


def test_self_attention_skeleton(capsys):
    assert_skeleton(ex.check_self_attention, attention_skeleton, capsys)


@pytest.mark.parametrize(
    "kwargs, keyword",
    [
        pytest.param(dict(scale="none"), "没有除以 √d_k", id="missing scale"),
        pytest.param(dict(scale="none", ret="out"), "没有除以 √d_k", id="missing scale, output only"),
        pytest.param(dict(scale="d"), "除以了 d_k", id="scale by d instead of sqrt(d)"),
        pytest.param(dict(dim=-2), "softmax 的 dim 可能写错了", id="softmax on the wrong axis"),
        pytest.param(dict(dim=-2, ret="out"), "softmax 的 dim 可能写错了", id="softmax axis, output only"),
        pytest.param(dict(masking="inverted"), "掩码方向可能反了（True = 可以看）", id="mask inverted"),
        pytest.param(dict(masking="inverted", ret="out"), "掩码方向可能反了", id="mask inverted, output only"),
        pytest.param(dict(masking="zero"), "被屏蔽的位置仍有权重", id="masked scores set to 0"),
        pytest.param(dict(masking="zero", ret="out"), "填成了 0", id="masked scores set to 0, output only"),
        pytest.param(dict(masking="ignored"), "被屏蔽的位置仍有权重", id="mask ignored"),
        pytest.param(dict(masking="ignored", ret="out"), "掩码没有起作用", id="mask ignored, output only"),
        pytest.param(dict(masking="after", ret="out"), "softmax 之后才乘掩码", id="mask after softmax"),
        pytest.param(dict(value="K"), "应是 V", id="weights times K"),
        pytest.param(dict(tr=(1, 2)), "K.transpose(-2, -1)", id="transpose hard-coded for 3-D"),
        pytest.param(dict(ret="weights"), "weights @ V", id="returns the weights"),
        pytest.param(dict(ret="swapped"), "顺序反了", id="(weights, output)"),
        pytest.param(dict(ret="list"), "应是 torch.Tensor", id="returns a list"),
    ],
)
def test_self_attention_rejects(kwargs, keyword, capsys):
    assert_rejects(ex.check_self_attention, make_attention(**kwargs), keyword, capsys)


# ---------------------------------------------------------------------------
# 2. causal mask
# ---------------------------------------------------------------------------


def mask_package(L):
    return tc.causal_mask(L)


def mask_skeleton(L):
    pass


def test_causal_mask(capsys):
    assert_passes(ex.check_causal_mask, mask_package, capsys)
    assert_passes(ex.check_causal_mask, lambda L: torch.tril(torch.ones(L, L)).bool(), capsys)
    assert_skeleton(ex.check_causal_mask, mask_skeleton, capsys)


@pytest.mark.parametrize(
    "fn, keyword",
    [
        pytest.param(lambda L: torch.ones(L, L, dtype=torch.bool).triu(1), "True = 可以看", id="blocked convention"),
        pytest.param(lambda L: torch.ones(L, L, dtype=torch.bool).triu(), "方向反了", id="upper triangle"),
        pytest.param(lambda L: torch.ones(L, L, dtype=torch.bool).tril(-1), "对角线上应为 True", id="diagonal missing"),
        pytest.param(lambda L: torch.ones(L, L).tril(), "torch.bool", id="float mask"),
        pytest.param(lambda L: torch.ones(L, L, dtype=torch.bool), "没有屏蔽", id="all True"),
        pytest.param(lambda L: torch.ones(L, L, dtype=torch.bool).tril(1), "i + 1", id="one step ahead"),
        pytest.param(lambda L: torch.ones(L, L + 1, dtype=torch.bool).tril(), "形状", id="wrong shape"),
        pytest.param(lambda L: torch.ones(L, L).tril().tolist(), "torch.Tensor", id="returns a list"),
    ],
)
def test_causal_mask_rejects(fn, keyword, capsys):
    assert_rejects(ex.check_causal_mask, fn, keyword, capsys)


def test_inverted_random_mask_with_weights(capsys):
    def inverted(Q, K, V, attn_mask=None):
        scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
        if attn_mask is not None:
            scores = scores.masked_fill(attn_mask, -1e9)  # -1e9: no NaN in fully masked rows
        w = torch.softmax(scores, dim=-1)
        return w @ V, w

    assert_rejects(ex.check_self_attention, inverted, "掩码方向可能反了（True = 可以看）", capsys)


def attention_three_values(Q, K, V, mask=None):
    out, weights = tc.scaled_dot_product_attention(Q, K, V, mask)
    return out, weights, None


def attention_swapped(Q, K, V, mask=None):
    out, weights = tc.scaled_dot_product_attention(Q, K, V, mask)
    return weights, out


def attention_nan(Q, K, V, mask=None):
    return tc.scaled_dot_product_attention(Q, K, V, mask)[0] * math.nan


@pytest.mark.parametrize(
    "checker, candidate, keyword",
    [
        pytest.param(ex.check_self_attention, attention_three_values, "3 个值的元组", id="attention: three values"),
        pytest.param(ex.check_self_attention, attention_swapped, "顺序反了", id="attention: (weights, output)"),
        pytest.param(ex.check_self_attention, attention_nan, "含 NaN 或 inf", id="attention: NaN without a mask"),
    ],
)
def test_rejects_more_mistakes(checker, candidate, keyword, capsys):
    assert_rejects(checker, candidate, keyword, capsys)
