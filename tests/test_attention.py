import itertools
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


@pytest.mark.parametrize("p", [0.25, 0.5])
def test_dropout_drops_a_fraction_p_and_scales_the_rest(p):
    q, k, v = _qkv(batch=(64,), L=4, S=6)
    torch.manual_seed(1)
    out, w = tc.scaled_dot_product_attention(q, k, v, dropout_p=p)
    _, w0 = tc.scaled_dot_product_attention(q, k, v)
    # kept weights are scaled by 1/(1-p); about a fraction p is dropped; the output uses the dropped weights
    assert p - 0.1 < (w == 0).float().mean() < p + 0.1
    torch.testing.assert_close(w[w > 0], w0[w > 0] / (1 - p))
    torch.testing.assert_close(out, w @ v)


def test_reference_runs_on_the_meta_device():
    """Shapes only (no values): the causal mask is built on the inputs' device."""
    q, k, v = (t.to("meta") for t in _qkv(L=3, S=5, Dv=2))
    out, w = tc.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.device.type == "meta" and out.shape == (2, 3, 3, 2) and w.shape == (2, 3, 3, 5)


_DIMS = r"^(query|key|value) must have at least 2 dims, got shape "


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(query=torch.randn(2, 4, 8), key=torch.randn(2, 5, 7), value=torch.randn(2, 5, 3)),
         r"^query and key must share the last dim D, got query \(2, 4, 8\) and key \(2, 5, 7\)$"),
        (dict(query=torch.randn(2, 4, 8), key=torch.randn(2, 5, 8), value=torch.randn(2, 6, 3)),
         r"^key and value must share the length S, got key \(2, 5, 8\) and value \(2, 6, 3\)$"),
        (dict(query=torch.randn(8), key=torch.randn(5, 8), value=torch.randn(5, 3)),
         _DIMS + r"\(8,\)$"),
        (dict(query=torch.randn(4, 8), key=torch.randn(8), value=torch.randn(5, 3)),
         _DIMS + r"\(8,\)$"),
        (dict(query=torch.randn(4, 8), key=torch.randn(1, 8), value=torch.randn(3)),
         _DIMS + r"\(3,\)$"),
        (dict(query=torch.randn(4, 8), key=torch.randn(5, 8), value=torch.randn(5, 3), dropout_p=1.0),
         r"^dropout_p must be in \[0, 1\), got 1.0$"),
        (dict(query=torch.randn(4, 8), key=torch.randn(5, 8), value=torch.randn(5, 3), dropout_p=-0.1),
         r"^dropout_p must be in \[0, 1\), got -0.1$"),
        (dict(query=torch.randn(4, 8), key=torch.randn(5, 8), value=torch.randn(5, 3),
              attn_mask=torch.ones(4, 5, dtype=torch.bool), is_causal=True),
         r"^pass either attn_mask or is_causal=True, not both$"),
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
    y, _ = _out_w(mha, x)
    y_perm, _ = _out_w(mha, x[:, perm])
    torch.testing.assert_close(y_perm, y[:, perm], atol=1e-5, rtol=1e-5)


def test_additive_attention_is_v_tanh_of_wq_q_plus_wk_k_pair_by_pair():
    att = tc.AdditiveAttention(query_dim=6, key_dim=5, hidden_dim=7)
    # one bias, in W_k: a bias in W_q would duplicate it, a bias of v would cancel in the softmax
    assert att.w_query.bias is None and att.v.bias is None and att.w_key.bias.shape == (7,)
    Wq, Wk, b, v = att.w_query.weight, att.w_key.weight, att.w_key.bias, att.v.weight[0]
    q, k, val = torch.randn(2, 3, 6), torch.randn(2, 4, 5), torch.randn(2, 4, 9)
    mask = torch.tensor([True, True, False, True])
    out, w = att(q, k, val, attn_mask=mask)
    assert out.shape == (2, 3, 9) and w.shape == (2, 3, 4)
    scores = torch.empty(2, 3, 4)
    with torch.no_grad():
        for n, i, j in itertools.product(range(2), range(3), range(4)):
            scores[n, i, j] = v @ torch.tanh(Wq @ q[n, i] + Wk @ k[n, j] + b)
    expected = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
    torch.testing.assert_close(w, expected)
    torch.testing.assert_close(out, expected @ val)


@pytest.mark.parametrize("dims,name", [((0, 5, 7), "query_dim"), ((6, 0, 7), "key_dim"), ((6, 5, 0), "hidden_dim")])
def test_additive_attention_rejects_non_positive_sizes(dims, name):
    with pytest.raises(ValueError, match=rf"^{name} must be positive, got 0$"):
        tc.AdditiveAttention(*dims)


_3D = r"^AdditiveAttention expects 3-D query, key, value, got shapes "


@pytest.mark.parametrize(
    "shapes,match",
    [
        (((3, 6), (2, 4, 5), (2, 4, 9)), _3D + r"\(3, 6\), \(2, 4, 5\), \(2, 4, 9\)$"),
        (((2, 3, 6), (4, 5), (2, 4, 9)), _3D + r"\(2, 3, 6\), \(4, 5\), \(2, 4, 9\)$"),
        (((2, 3, 6), (2, 4, 5), (4, 9)), _3D + r"\(2, 3, 6\), \(2, 4, 5\), \(4, 9\)$"),
        (((2, 3, 6), (2, 4, 5), (2, 3, 9)), r"^key \(2, 4, 5\) and value \(2, 3, 9\) differ in \(N, S\)$"),
    ],
)
def test_additive_attention_rejects_bad_shapes(shapes, match):
    with pytest.raises(ValueError, match=match):
        tc.AdditiveAttention(6, 5, 7)(*(torch.randn(shape) for shape in shapes))


def _out_w(mha, *args, need_weights=False, **kwargs):
    """``(output, weights)``: ``MultiHeadAttention`` returns the output alone, or with
    ``need_weights=True`` the pair; weights ``None`` without."""
    if need_weights:
        out, w = mha(*args, need_weights=True, **kwargs)
        assert isinstance(out, torch.Tensor) and isinstance(w, torch.Tensor)
        return out, w
    out = mha(*args, **kwargs)
    assert isinstance(out, torch.Tensor)
    return out, None


def _ours_and_torch_mha(E=16, H=4):
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
    ours = tc.MultiHeadAttention(E, H).eval()
    tc.load_torch_mha(ours, theirs)
    return ours, theirs


def test_mha_equals_nn_multihead_attention_self_and_cross():
    ours, theirs = _ours_and_torch_mha()
    x, mem, val = torch.randn(2, 5, 16), torch.randn(2, 7, 16), torch.randn(2, 7, 16)
    pad = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    exp_self, _ = theirs(x, x, x, need_weights=False)
    exp_cross, exp_w = theirs(x, mem, val, key_padding_mask=~pad, average_attn_weights=False)
    got_cross, got_w = _out_w(ours, x, mem, val, attn_mask=pad[:, None, None, :], need_weights=True)
    assert not hasattr(ours, "attn_weights")  # returned, never stored on the module
    got_self, none = _out_w(ours, x)
    assert none is None
    torch.testing.assert_close(got_self, exp_self)
    torch.testing.assert_close(got_cross, exp_cross)
    torch.testing.assert_close(got_w, exp_w)


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
@pytest.mark.parametrize("S", [5, 7])
def test_mha_is_causal_and_masks_equal_nn_multihead_attention_with_one_explicit_mask(S, mask_kind, need_weights):
    """is_causal is lower-right aligned (the L queries are the last L of S positions) and combines with attn_mask."""
    ours, theirs = _ours_and_torch_mha()
    x = torch.randn(2, 5, 16)
    kv = x if S == 5 else torch.randn(2, S, 16)
    allowed = torch.tensor([[j <= i + S - 5 for j in range(S)] for i in range(5)]).expand(2, 1, 5, S)
    mask = None
    if mask_kind is not None:
        mask = torch.rand(2, 1, 5, S) > 0.3
        mask[..., 0] = True  # every query keeps a key
        allowed = allowed & mask
        mask = tc.bool_to_additive(mask) if mask_kind == "float" else mask
    exp, exp_w = theirs(x, kv, kv, attn_mask=~allowed.expand(2, 4, 5, S).reshape(8, 5, S), average_attn_weights=False)
    got, w = _out_w(ours, x, kv, kv, attn_mask=mask, is_causal=True, need_weights=need_weights)
    torch.testing.assert_close(got, exp)
    if need_weights:
        torch.testing.assert_close(w, exp_w)


@pytest.mark.parametrize(
    "L,S,window,is_causal,mask_is_none",
    [(5, 5, None, True, True), (1, 1, None, True, True), (4, 4, 4, True, True), (5, 5, 4, False, False),
     (2, 5, None, False, False), (1, 5, None, False, True)],
)  # fmt: skip
def test_square_causal_attention_leaves_the_mask_to_the_fused_kernel(
    monkeypatch, L, S, window, is_causal, mask_is_none
):
    """is_causal=True and no mask lets F.scaled_dot_product_attention pick a flash kernel; a mask would rule it out."""
    calls = []
    sdpa = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    mha = tc.MultiHeadAttention(16, 4).eval()
    cache = tc.KVCache(window=window)
    x = torch.randn(1, S, 16)
    if S > L:
        mha(x[:, : S - L], is_causal=True, cache=cache)
    calls.clear()
    mha(x[:, S - L :], is_causal=True, cache=cache)
    ((kwargs),) = calls
    assert kwargs["is_causal"] is is_causal and (kwargs["attn_mask"] is None) is mask_is_none


def test_mha_fused_and_explicit_paths_agree():
    mha = tc.MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 6, 16)
    a, _ = _out_w(mha, x, is_causal=True)
    b, w = _out_w(mha, x, is_causal=True, need_weights=True)
    torch.testing.assert_close(a, b)
    assert w.shape == (2, 4, 6, 6)
    assert w[..., ~tc.causal_mask(6)].eq(0).all()


@pytest.mark.parametrize("need_weights", [False, True])
def test_mha_dropout_acts_in_training_mode_only(need_weights):
    torch.manual_seed(0)
    mha = tc.MultiHeadAttention(16, 4, dropout=0.5)
    plain = tc.MultiHeadAttention(16, 4)  # training mode, no dropout
    plain.load_state_dict(mha.state_dict())
    x = torch.randn(2, 6, 16)
    expected, w0 = _out_w(plain, x, is_causal=True, need_weights=True)
    got, _ = _out_w(mha.eval(), x, is_causal=True, need_weights=need_weights)
    torch.testing.assert_close(got, expected)
    got, w = _out_w(mha.train(), x, is_causal=True, need_weights=need_weights)
    assert (got - expected).abs().max() > 1e-2
    if need_weights:  # the weights that multiplied the values: some dropped, the others doubled
        visible = tc.causal_mask(6).expand_as(w)
        assert w[visible].eq(0).any()
        torch.testing.assert_close(w[w > 0], 2 * w0[w > 0])


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
    for need_weights in (False, True):
        got, w = _out_w(gqa, x, is_causal=True, need_weights=need_weights)
        expected, expected_w = _out_w(full, x, is_causal=True, need_weights=need_weights)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(w, expected_w)


class _RecordingRotary(tc.RotaryEmbedding):
    def forward(self, x, offset=0):
        self.offsets.append(offset)
        return super().forward(x, offset)


def test_mha_rotates_queries_and_keys_at_their_absolute_positions():
    E, H, T = 16, 4, 7
    rope = _RecordingRotary(E // H)
    rope.offsets = []
    mha = tc.MultiHeadAttention(E, H, rotary=rope).eval()
    x = torch.randn(2, T, E)

    def heads(t):
        return t.view(2, T, H, E // H).transpose(1, 2)

    with torch.no_grad():  # by hand: rotate q and k (not v) from position 0, then causal attention
        rotate = tc.RotaryEmbedding(E // H)
        q, k, v = rotate(heads(mha.q_proj(x))), rotate(heads(mha.k_proj(x))), heads(mha.v_proj(x))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        expected = mha.out_proj(out.transpose(1, 2).reshape(2, T, E))
        torch.testing.assert_close(mha(x, is_causal=True), expected)
        assert rope.offsets == [0, 0]  # queries, keys
        cache = tc.KVCache()
        parts = [mha(x[:, a:b], is_causal=True, cache=cache) for a, b in ((0, 3), (3, 4), (4, T))]
    assert rope.offsets == [0, 0, 0, 0, 3, 3, 4, 4]
    torch.testing.assert_close(torch.cat(parts, 1), expected)


@pytest.mark.parametrize("need_weights", [False, True])
def test_mha_runs_on_the_meta_device(need_weights):
    """Shapes only (e.g. counting FLOPs): masks are built on the inputs' device, values are not checked."""
    mha = tc.MultiHeadAttention(16, 4, num_kv_heads=2).to("meta")
    x = torch.empty(2, 5, 16, device="meta")
    cache = tc.KVCache()
    mha(x[:, :2], is_causal=True, cache=cache)
    out, w = _out_w(mha, x[:, 2:], is_causal=True, need_weights=need_weights, cache=cache)  # 3 queries, 5 keys
    assert out.device.type == "meta" and out.shape == (2, 3, 16)
    assert w is None if not need_weights else w.shape == (2, 4, 3, 5)


_CONFIG = dict(d_model=16, num_heads=4)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(d_model=10, num_heads=4), r"^d_model=10 is not divisible by num_heads=4$"),
        (dict(_CONFIG, num_kv_heads=3), r"^num_heads=4 is not divisible by num_kv_heads=3$"),
        (dict(_CONFIG, dropout=1.0), r"^dropout must be in \[0, 1\), got 1.0$"),
        (dict(_CONFIG, dropout=-0.5), r"^dropout must be in \[0, 1\), got -0.5$"),
        (dict(_CONFIG, rotary=tc.RotaryEmbedding(8)), r"^rotary.head_dim=8 != head_dim=4$"),
        (dict(d_model=0, num_heads=4), r"^d_model must be positive, got 0$"),
        (dict(d_model=16, num_heads=0), r"^num_heads must be positive, got 0$"),
        (dict(_CONFIG, num_kv_heads=0), r"^num_kv_heads must be positive, got 0$"),
    ],
)
def test_mha_rejects_bad_configuration(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tc.MultiHeadAttention(**kwargs)


def test_mha_defaults_and_boundary_configurations():
    mha = tc.MultiHeadAttention(16, 4)
    assert mha.num_kv_heads == 4 and mha.k_proj.out_features == 16 and mha.dropout == 0.0
    assert tc.MultiHeadAttention(16, 4, dropout=0.999).dropout == 0.999


def test_mha_rejects_bad_inputs_and_masks():
    mha = tc.MultiHeadAttention(16, 4)
    with pytest.raises(ValueError, match="does not broadcast to"):
        mha(torch.randn(2, 5, 16), attn_mask=torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="mismatch"):
        mha(torch.randn(2, 5, 16), torch.randn(3, 5, 16))


@pytest.mark.parametrize("which", ["query", "key", "value"])
def test_mha_names_the_input_with_a_bad_shape(which):
    inputs = dict(query=torch.randn(2, 5, 16), key=torch.randn(2, 7, 16), value=torch.randn(2, 7, 16))
    inputs[which] = torch.randn(2, 7, 12)
    with pytest.raises(ValueError, match=rf"^{which} must have shape \(N, T, 16\), got \(2, 7, 12\)$"):
        tc.MultiHeadAttention(16, 4)(**inputs)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_float_masks_with_nan_or_plus_inf_are_rejected_by_the_reference(bad):
    mha = tc.MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16)
    mask = torch.zeros(5, 5)
    mask[0, 1] = float("-inf")  # allowed
    mha(x, attn_mask=mask)
    mask[2, 3] = bad
    with pytest.raises(ValueError, match=f"float mask holds {bad}"):
        mha(x, attn_mask=mask, need_weights=True)  # the explicit reference reads the mask's values
    mha(x, attn_mask=mask)  # the fused path reads no values: no host synchronisation per layer
    q, k, v = _qkv(L=5, S=5)
    with pytest.raises(ValueError, match=f"float mask holds {bad}"):
        tc.scaled_dot_product_attention(q, k, v, attn_mask=mask)
