import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import transformer_course as tc


def _qkv(batch=(2, 3), L=4, S=6, D=8, Dv=5, dtype=torch.float32):
    return (
        torch.randn(*batch, L, D, dtype=dtype),
        torch.randn(*batch, S, D, dtype=dtype),
        torch.randn(*batch, S, Dv, dtype=dtype),
    )


def test_reference_matches_sdpa_without_mask():
    q, k, v = _qkv()
    out, w = tc.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    assert w.shape == (2, 3, 4, 6)


def test_reference_matches_sdpa_bool_and_additive_masks_with_broadcast():
    q, k, v = _qkv(batch=(2, 3))
    bool_mask = torch.rand(2, 1, 4, 6) > 0.4
    bool_mask[..., 0] = True
    add_mask = torch.randn(4, 6)
    for m in (bool_mask, add_mask, tc.bool_to_additive(bool_mask)):
        out, _ = tc.scaled_dot_product_attention(q, k, v, attn_mask=m)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=m))


@pytest.mark.parametrize("L,S", [(4, 4), (3, 7), (1, 5)])
def test_reference_is_causal_is_lower_right_aligned(L, S):
    q, k, v = _qkv(L=L, S=S)
    out, w = tc.scaled_dot_product_attention(q, k, v, is_causal=True)
    # query i is position S - L + i of the sequence: it sees keys 0 .. S - L + i
    allowed = torch.tensor([[j <= S - L + i for j in range(S)] for i in range(L)])
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=allowed))
    assert w[..., ~allowed].eq(0).all()
    if L == S:  # PyTorch's is_causal (top-left aligned) agrees for square masks
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_reference_is_causal_rejects_more_queries_than_keys():
    q, k, v = _qkv(L=7, S=3)
    with pytest.raises(ValueError, match="S >= L"):
        tc.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_reference_custom_scale_and_extra_batch_dims():
    q, k, v = _qkv(batch=(2, 2, 3))
    out, _ = tc.scaled_dot_product_attention(q, k, v, scale=0.3)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.3))


def test_default_scale_is_inverse_sqrt_d():
    q, k, v = _qkv(D=16)
    _, w = tc.scaled_dot_product_attention(q, k, v)
    manual = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(16), dim=-1)
    torch.testing.assert_close(w, manual)


def test_fully_masked_row_gives_zero_weights_and_output_not_nan():
    q, k, v = _qkv(batch=(1,), L=3, S=4)
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1] = False
    q.requires_grad_(True)
    out, w = tc.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert not torch.isnan(out).any() and not torch.isnan(w).any()
    assert w[0, 1].eq(0).all() and out[0, 1].eq(0).all()
    torch.testing.assert_close(w[0, [0, 2]].sum(-1), torch.ones(2))
    out.sum().backward()
    assert torch.isfinite(q.grad).all()
    # additive -inf row behaves the same
    out2, w2 = tc.scaled_dot_product_attention(q, k, v, attn_mask=tc.bool_to_additive(mask))
    torch.testing.assert_close(out2, out)


def test_dropout_zero_in_expectation_and_scaled():
    q, k, v = _qkv(batch=(64,), L=4, S=6)
    torch.manual_seed(1)
    _, w = tc.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    nonzero = w[w > 0]
    _, w0 = tc.scaled_dot_product_attention(q, k, v)
    # kept weights are scaled by 1/(1-p); about half are dropped
    assert 0.35 < (w == 0).float().mean() < 0.65
    assert torch.allclose(w[w > 0], 2 * w0[w > 0])
    assert nonzero.numel() > 0


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(query=torch.randn(2, 4, 8), key=torch.randn(2, 5, 7), value=torch.randn(2, 5, 3)), "8 vs 7"),
        (dict(query=torch.randn(2, 4, 8), key=torch.randn(2, 5, 8), value=torch.randn(2, 6, 3)), "5 vs 6"),
        (dict(query=torch.randn(8), key=torch.randn(5, 8), value=torch.randn(5, 3)), "at least 2 dims"),
        (dict(query=torch.randn(4, 8), key=torch.randn(5, 8), value=torch.randn(5, 3), dropout_p=1.0), "dropout_p"),
        (dict(query=torch.randn(4, 8), key=torch.randn(5, 8), value=torch.randn(5, 3),
              attn_mask=torch.ones(4, 5, dtype=torch.bool), is_causal=True), "not both"),
        (dict(query=torch.randn(4, 8), key=torch.randn(5, 8), value=torch.randn(5, 3),
              attn_mask=torch.ones(3, 5, dtype=torch.bool)), "does not broadcast"),
    ],
)  # fmt: skip
def test_reference_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tc.scaled_dot_product_attention(**kwargs)


def test_reference_gradcheck_float64():
    q, k, v = (t.requires_grad_(True) for t in _qkv(batch=(2,), L=3, S=4, D=4, Dv=3, dtype=torch.float64))
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    assert torch.autograd.gradcheck(
        lambda a, b, c: tc.scaled_dot_product_attention(a, b, c, attn_mask=mask)[0], (q, k, v)
    )


@settings(max_examples=30, deadline=None)
@given(
    L=st.integers(1, 6), S=st.integers(1, 6), D=st.integers(1, 8),
    scale=st.floats(0.01, 10.0), seed=st.integers(0, 10_000),
)  # fmt: skip
def test_property_rows_are_distributions(L, S, D, scale, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(2, L, D, generator=g), torch.randn(2, S, D, generator=g), torch.randn(2, S, 3, generator=g)
    _, w = tc.scaled_dot_product_attention(q, k, v, scale=scale)
    assert (w >= 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(2, L))


@settings(max_examples=20, deadline=None)
@given(L=st.integers(2, 7), seed=st.integers(0, 10_000))
def test_property_self_attention_without_positions_is_permutation_equivariant(L, seed):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    mha = tc.MultiHeadAttention(8, 2).eval()
    x = torch.randn(1, L, 8, generator=g)
    perm = torch.randperm(L, generator=g)
    y, _ = mha(x)
    y_perm, _ = mha(x[:, perm])
    torch.testing.assert_close(y_perm, y[:, perm], atol=1e-5, rtol=1e-5)


def test_additive_attention_shapes_mask_and_formula():
    att = tc.AdditiveAttention(query_dim=6, key_dim=5, hidden_dim=7)
    q, k, v = torch.randn(2, 3, 6), torch.randn(2, 4, 5), torch.randn(2, 4, 9)
    mask = torch.tensor([True, True, False, True])
    out, w = att(q, k, v, attn_mask=mask)
    assert out.shape == (2, 3, 9) and w.shape == (2, 3, 4)
    assert w[..., 2].eq(0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3))
    # score(q_i, k_j) = v^T tanh(W_q q_i + W_k k_j), computed one pair at a time
    s = att.v(torch.tanh(att.w_query(q[0, 1]) + att.w_key(k[0, 3])))
    scores = torch.stack([att.v(torch.tanh(att.w_query(q[0, 1]) + att.w_key(k[0, j]))) for j in range(4)])
    expected = torch.softmax(scores.squeeze(-1).masked_fill(~mask, float("-inf")), -1)
    torch.testing.assert_close(w[0, 1], expected)
    assert s.shape == (1,)
    with pytest.raises(ValueError, match="3-D"):
        att(q[0], k, v)
    with pytest.raises(ValueError, match="hidden_dim must be positive"):
        tc.AdditiveAttention(6, 5, 0)


def test_mha_equals_nn_multihead_attention_self_and_cross():
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    ours = tc.MultiHeadAttention(16, 4).eval()
    tc.load_torch_mha(ours, theirs)
    x, mem = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    pad = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    exp_self, _ = theirs(x, x, x, need_weights=False)
    exp_cross, exp_w = theirs(x, mem, mem, key_padding_mask=~pad, average_attn_weights=False)
    got_self, none = ours(x)
    got_cross, got_w = ours(x, mem, mem, attn_mask=pad[:, None, None, :], need_weights=True)
    assert none is None
    torch.testing.assert_close(got_self, exp_self)
    torch.testing.assert_close(got_cross, exp_cross)
    torch.testing.assert_close(got_w, exp_w)


def test_mha_fused_and_explicit_paths_agree():
    mha = tc.MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 6, 16)
    a, _ = mha(x, is_causal=True)
    b, w = mha(x, is_causal=True, need_weights=True)
    torch.testing.assert_close(a, b)
    assert w.shape == (2, 4, 6, 6)
    assert w[..., ~tc.causal_mask(6)].eq(0).all()


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
def test_grouped_query_attention_equals_mha_with_repeated_kv_weights(num_kv_heads):
    H, E = 4, 16
    D = E // H
    gqa = tc.MultiHeadAttention(E, H, num_kv_heads=num_kv_heads).eval()
    full = tc.MultiHeadAttention(E, H).eval()
    assert gqa.k_proj.out_features == num_kv_heads * D
    group = H // num_kv_heads
    with torch.no_grad():
        full.q_proj.load_state_dict(gqa.q_proj.state_dict())
        full.out_proj.load_state_dict(gqa.out_proj.state_dict())
        for src, dst in ((gqa.k_proj, full.k_proj), (gqa.v_proj, full.v_proj)):
            # (Hkv*D, E) -> (Hkv, D, E) -> repeat each kv head for its group -> (H*D, E)
            dst.weight.copy_(src.weight.view(num_kv_heads, D, E).repeat_interleave(group, 0).reshape(E, E))
            dst.bias.copy_(src.bias.view(num_kv_heads, D).repeat_interleave(group, 0).reshape(E))
    x = torch.randn(2, 5, E)
    torch.testing.assert_close(gqa(x, is_causal=True)[0], full(x, is_causal=True)[0])


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(d_model=10, num_heads=4), "d_model=10 is not divisible by num_heads=4"),
        (dict(d_model=16, num_heads=4, num_kv_heads=3), "num_heads=4 is not divisible by num_kv_heads=3"),
        (dict(d_model=16, num_heads=4, dropout=1.5), "dropout"),
        (dict(d_model=16, num_heads=4, rotary=tc.RotaryEmbedding(8)), "rotary.head_dim=8"),
        (dict(d_model=0, num_heads=4), "d_model must be positive"),
    ],
)
def test_mha_rejects_bad_configuration(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tc.MultiHeadAttention(**kwargs)


def test_mha_rejects_bad_inputs_and_masks():
    mha = tc.MultiHeadAttention(16, 4)
    with pytest.raises(ValueError, match=r"\(N, T, 16\)"):
        mha(torch.randn(2, 5, 12))
    with pytest.raises(ValueError, match="does not broadcast to"):
        mha(torch.randn(2, 5, 16), attn_mask=torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="mismatch"):
        mha(torch.randn(2, 5, 16), torch.randn(3, 5, 16))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_mha_rejects_non_finite_inputs(bad):
    mha = tc.MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16)
    x[1, 2, 3] = bad
    with pytest.raises(ValueError, match="query holds NaN or infinite values"):
        mha(x)
    with pytest.raises(ValueError, match="key holds NaN or infinite values"):
        mha(torch.randn(2, 5, 16), x, x)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_float_masks_with_nan_or_plus_inf_are_rejected(bad):
    mha = tc.MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16)
    mask = torch.zeros(5, 5)
    mask[0, 1] = float("-inf")  # allowed
    mha(x, attn_mask=mask)
    mask[2, 3] = bad
    with pytest.raises(ValueError, match=f"float mask holds {bad}"):
        mha(x, attn_mask=mask)
    q, k, v = _qkv(L=5, S=5)
    with pytest.raises(ValueError, match=f"float mask holds {bad}"):
        tc.scaled_dot_product_attention(q, k, v, attn_mask=mask)
