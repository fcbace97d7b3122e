"""Tests for transformer_course.efficient_attention (linear, local and low-rank attention)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import transformer_course as tc
from transformer_course.efficient_attention import (
    elu_feature_map,
    linear_attention,
    linear_attention_recurrent,
    linear_attention_weights,
    local_attention,
    low_rank_attention,
    sliding_window_mask,
)


def _qkv(*batch: int, L: int = 7, S: int = 7, D: int = 4, Dv: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, L, D, generator=g, dtype=torch.float64)
    k = torch.randn(*batch, S, D, generator=g, dtype=torch.float64)
    v = torch.randn(*batch, S, Dv, generator=g, dtype=torch.float64)
    return q, k, v


# ---------------------------------------------------------------- feature map
def test_elu_feature_map_is_elu_plus_one_and_positive():
    x = torch.linspace(-30, 30, 101, dtype=torch.float64)
    phi = elu_feature_map(x)
    torch.testing.assert_close(phi, F.elu(x) + 1)
    assert (phi > 0).all()
    torch.testing.assert_close(phi[x > 0], x[x > 0] + 1)


# ---------------------------------------------------------------- linear attention
def test_linear_attention_matches_quadratic_form_noncausal():
    q, k, v = _qkv(2, 3, L=5, S=9, D=4, Dv=6)
    out = linear_attention(q, k, v, eps=0.0)
    assert out.shape == (2, 3, 5, 6)
    weights = linear_attention_weights(q, k)
    assert weights.shape == (2, 3, 5, 9)
    torch.testing.assert_close(out, weights @ v)


def test_linear_attention_matches_quadratic_form_causal_and_recurrent():
    q, k, v = _qkv(2, L=8, S=8, D=3, Dv=5)
    out = linear_attention(q, k, v, causal=True, eps=0.0)
    weights = linear_attention_weights(q, k, causal=True)
    torch.testing.assert_close(out, weights @ v)
    torch.testing.assert_close(out, linear_attention_recurrent(q, k, v, eps=0.0))
    assert torch.all(weights.triu(1) == 0)


@settings(max_examples=30, deadline=None)
@given(L=st.integers(1, 13), chunk_size=st.integers(1, 16), seed=st.integers(0, 1000))
def test_causal_linear_attention_chunking_property(L, chunk_size, seed):
    q, k, v = _qkv(2, L=L, S=L, D=3, Dv=2, seed=seed)
    out = linear_attention(q, k, v, causal=True, eps=0.0, chunk_size=chunk_size)
    expected = linear_attention_weights(q, k, causal=True) @ v
    torch.testing.assert_close(out, expected)


def test_linear_attention_default_eps_is_close_to_exact():
    q, k, v = _qkv(4, L=6, S=6)
    torch.testing.assert_close(linear_attention(q, k, v), linear_attention(q, k, v, eps=0.0), rtol=1e-5, atol=1e-5)


def test_linear_attention_weights_rows_are_distributions():
    q, k, _ = _qkv(3, L=6, S=6)
    for causal in (False, True):
        w = linear_attention_weights(q, k, causal=causal)
        assert (w >= 0).all()
        torch.testing.assert_close(w.sum(-1), torch.ones(3, 6, dtype=torch.float64))


def test_causal_linear_attention_ignores_the_future():
    q, k, v = _qkv(2, L=10, S=10)
    out = linear_attention(q, k, v, causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[..., 6:, :] += 5.0
    v2[..., 6:, :] -= 3.0
    out2 = linear_attention(q, k2, v2, causal=True)
    torch.testing.assert_close(out[..., :6, :], out2[..., :6, :])
    assert not torch.allclose(out[..., 6:, :], out2[..., 6:, :])
    # first position sees only itself: its output is its own value
    torch.testing.assert_close(out[..., 0, :], v[..., 0, :], rtol=1e-5, atol=1e-5)


def test_linear_attention_custom_feature_map_and_float32():
    q, k, v = (t.float() for t in _qkv(L=5, S=4))
    out = linear_attention(q, k, v, feature_map=lambda x: x.square() + 1.0, eps=0.0)
    w = linear_attention_weights(q, k, feature_map=lambda x: x.square() + 1.0)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, w @ v)


def test_linear_attention_gradcheck():
    q, k, v = (t.requires_grad_() for t in _qkv(L=4, S=4, D=3, Dv=2))
    assert torch.autograd.gradcheck(lambda a, b, c: linear_attention(a, b, c), (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b, c: linear_attention(a, b, c, causal=True), (q, k, v))


def test_linear_attention_bad_input():
    q, k, v = _qkv(L=5, S=4)
    with pytest.raises(ValueError, match="L == S"):
        linear_attention(q, k, v, causal=True)
    with pytest.raises(ValueError, match="L == S"):
        linear_attention_weights(q, k, causal=True)
    with pytest.raises(ValueError, match="L == S"):
        linear_attention_recurrent(q, k, v)
    with pytest.raises(ValueError, match="last dim"):
        linear_attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match="last dim"):
        linear_attention_weights(q, k[..., :3])
    with pytest.raises(ValueError, match="length S"):
        linear_attention(q, k, v[:3])
    with pytest.raises(ValueError, match="eps"):
        linear_attention(q, k, v, eps=-1.0)
    with pytest.raises(ValueError, match="chunk_size must be >= 1, got 0"):
        linear_attention(q, k[:, :], v, chunk_size=0)
    with pytest.raises(ValueError, match="eps"):
        linear_attention_recurrent(q, q, q, eps=-1.0)
    with pytest.raises(ValueError, match="at least 2 dims"):
        linear_attention(q[0], k, v)
    with pytest.raises(ValueError, match="broadcast"):
        linear_attention(q.expand(2, 5, 4), k.expand(3, 4, 4), v)
    with pytest.raises(TypeError, match="torch.Tensor"):
        linear_attention(q.tolist(), k, v)


# ---------------------------------------------------------------- sliding window
def test_sliding_window_mask_values():
    """``window`` = the number of keys a query sees: centred (odd) or, causal, the last ``window``."""
    m = sliding_window_mask(5, 3)
    expected = torch.tensor(
        [
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [0, 1, 1, 1, 0],
            [0, 0, 1, 1, 1],
            [0, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert m.dtype == torch.bool and m.shape == (5, 5)
    assert torch.equal(m, expected)
    mc = sliding_window_mask(5, 2, causal=True)
    assert torch.equal(mc, expected & torch.ones(5, 5, dtype=torch.bool).tril())
    assert torch.equal(sliding_window_mask(4, 1), torch.eye(4, dtype=torch.bool))
    assert torch.equal(sliding_window_mask(4, 1, causal=True), torch.eye(4, dtype=torch.bool))
    assert sliding_window_mask(6, 11).all() and not sliding_window_mask(6, 9).all()
    assert torch.equal(sliding_window_mask(6, 6, causal=True), torch.ones(6, 6, dtype=torch.bool).tril())
    assert not torch.equal(sliding_window_mask(6, 5, causal=True), torch.ones(6, 6, dtype=torch.bool).tril())


@pytest.mark.parametrize("L", [1, 4, 7])
@pytest.mark.parametrize("window", [1, 2, 3, 8])
def test_causal_sliding_window_is_causal_mask_with_the_same_window(L, window):
    assert torch.equal(sliding_window_mask(L, window, causal=True), tc.causal_mask(L, window=window))


def test_sliding_window_mask_bad_input():
    with pytest.raises(ValueError, match="L must be positive, got 0"):
        sliding_window_mask(0, 3)
    with pytest.raises(ValueError, match="window must be positive, got 0"):
        sliding_window_mask(4, 0)
    with pytest.raises(ValueError, match=r"must be odd \(the query and \(window - 1\) / 2 keys on each side\), got 4"):
        sliding_window_mask(4, 4)
    sliding_window_mask(4, 4, causal=True)  # a causal window may be even
    with pytest.raises(TypeError, match="window must be an int"):
        sliding_window_mask(4, 1.5)
    with pytest.raises(TypeError, match="L must be an int"):
        sliding_window_mask(True, 1)


_WINDOWS = [(1, False), (3, False), (7, False), (41, False), (1, True), (2, True), (4, True), (21, True)]


@pytest.mark.parametrize("window,causal", _WINDOWS)
def test_local_attention_equals_masked_exact_attention(window, causal):
    q, k, v = _qkv(2, 3, L=11, S=11, D=4, Dv=5)
    mask = sliding_window_mask(11, window, causal=causal)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out = local_attention(q, k, v, window, causal=causal)
    assert out.shape == (2, 3, 11, 5)
    torch.testing.assert_close(out, expected)


def test_local_attention_with_full_window_is_exact_attention():
    q, k, v = _qkv(2, L=9, S=9)
    torch.testing.assert_close(local_attention(q, k, v, window=17), F.scaled_dot_product_attention(q, k, v))
    torch.testing.assert_close(
        local_attention(q, k, v, window=9, causal=True),
        F.scaled_dot_product_attention(q, k, v, is_causal=True),
    )


def test_local_attention_custom_scale():
    q, k, v = _qkv(L=6, S=6)
    mask = sliding_window_mask(6, 5)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    torch.testing.assert_close(local_attention(q, k, v, 5, scale=0.3), expected)


@settings(max_examples=30, deadline=None)
@given(
    L=st.integers(1, 12),
    window=st.integers(1, 15),
    causal=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_local_attention_property(L, window, causal, seed):
    window = window if causal or window % 2 else window + 1  # a centred window is odd
    q, k, v = _qkv(2, L=L, S=L, D=3, Dv=2, seed=seed)
    mask = sliding_window_mask(L, window, causal=causal)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(local_attention(q, k, v, window, causal=causal), expected)


def test_local_attention_gradcheck():
    q, k, v = (t.requires_grad_() for t in _qkv(L=5, S=5, D=3, Dv=2))
    assert torch.autograd.gradcheck(lambda a, b, c: local_attention(a, b, c, 3), (q, k, v))


def test_local_attention_bad_input():
    q, k, v = _qkv(L=5, S=4)
    with pytest.raises(ValueError, match="L == S"):
        local_attention(q, k, v, 1)
    q, k, v = _qkv(L=5, S=5)
    with pytest.raises(ValueError, match="window must be positive"):
        local_attention(q, k, v, -2)
    with pytest.raises(ValueError, match="must be odd"):
        local_attention(q, k, v, 2)
    with pytest.raises(TypeError, match="window must be an int"):
        local_attention(q, k, v, None)


# ---------------------------------------------------------------- low rank
def test_low_rank_identity_projection_is_exact_attention():
    q, k, v = _qkv(2, 3, L=5, S=8, D=4, Dv=6)
    eye = torch.eye(8, dtype=torch.float64)
    out, w = low_rank_attention(q, k, v, eye)
    assert out.shape == (2, 3, 5, 6) and w.shape == (2, 3, 5, 8)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))


def test_low_rank_shapes_and_definition():
    q, k, v = _qkv(2, L=5, S=8, D=4, Dv=6)
    g = torch.Generator().manual_seed(1)
    E = torch.randn(3, 8, generator=g, dtype=torch.float64)
    Fp = torch.randn(3, 8, generator=g, dtype=torch.float64)
    out, w = low_rank_attention(q, k, v, E, Fp)
    assert out.shape == (2, 5, 6) and w.shape == (2, 5, 3)
    expected_w = torch.softmax(q @ (E @ k).transpose(-2, -1) / math.sqrt(4), dim=-1)
    torch.testing.assert_close(w, expected_w)
    torch.testing.assert_close(out, expected_w @ (Fp @ v))
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 5, dtype=torch.float64))
    # shared projection: proj_v defaults to proj_k
    out_shared, _ = low_rank_attention(q, k, v, E)
    torch.testing.assert_close(out_shared, expected_w @ (E @ v))
    out_scaled, _ = low_rank_attention(q, k, v, E, scale=1.0)
    torch.testing.assert_close(out_scaled, torch.softmax(q @ (E @ k).transpose(-2, -1), dim=-1) @ (E @ v))


def test_low_rank_bad_input():
    q, k, v = _qkv(L=5, S=8)
    with pytest.raises(ValueError, match=r"proj_k must have shape \(k, S=8\)"):
        low_rank_attention(q, k, v, torch.randn(3, 7, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"proj_v must have shape \(k, S=8\)"):
        low_rank_attention(q, k, v, torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 8, 1))
    with pytest.raises(ValueError, match="same k"):
        low_rank_attention(q, k, v, torch.randn(3, 8, dtype=torch.float64), torch.randn(2, 8, dtype=torch.float64))
    with pytest.raises(TypeError, match="proj_k must be a torch.Tensor"):
        low_rank_attention(q, k, v, [[1.0] * 8])
