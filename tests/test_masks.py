import pytest
import torch
import torch.nn.functional as F

import transformer_course as tc


def test_causal_mask_square_is_lower_triangular():
    m = tc.causal_mask(4)
    assert m.dtype == torch.bool
    assert torch.equal(m, torch.ones(4, 4, dtype=torch.bool).tril())


def test_causal_mask_rectangular_is_lower_right_aligned():
    m = tc.causal_mask(2, 5)  # last two queries of a 5-token sequence
    expected = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(m, expected)
    # it is the bottom rows of the full square mask
    assert torch.equal(m, tc.causal_mask(5)[-2:])


@pytest.mark.parametrize("L,S", [(0, 3), (3, 2), (-1, None)])
def test_causal_mask_rejects_bad_sizes(L, S):
    with pytest.raises(ValueError, match=str(L) if L <= 0 else "S >= L"):
        tc.causal_mask(L, S)


def test_causal_mask_rejects_non_int():
    with pytest.raises(TypeError, match="L must be an int"):
        tc.causal_mask(2.0)


def test_padding_mask_shape_and_values():
    tokens = torch.tensor([[5, 6, 0, 0], [7, 0, 0, 0]])
    m = tc.padding_mask(tokens, pad_id=0)
    assert m.shape == (2, 1, 1, 4)
    assert m[0, 0, 0].tolist() == [True, True, False, False]
    combined = m & tc.causal_mask(4)
    assert combined.shape == (2, 1, 4, 4)
    assert combined[0, 0, 3].tolist() == [True, True, False, False]
    assert combined[1, 0, 0].tolist() == [True, False, False, False]


def test_padding_mask_rejects_1d():
    with pytest.raises(ValueError, match=r"\(4,\)"):
        tc.padding_mask(torch.tensor([1, 2, 3, 0]), 0)


def test_to_torch_mask_inverts_bool_and_keeps_float():
    m = tc.causal_mask(3)
    assert torch.equal(tc.to_torch_mask(m), ~m)
    f = tc.bool_to_additive(m)
    assert tc.to_torch_mask(f) is f
    with pytest.raises(TypeError, match="int64"):
        tc.to_torch_mask(torch.ones(2, 2, dtype=torch.long))


def test_to_torch_mask_agrees_with_nn_multihead_attention():
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    ours = tc.MultiHeadAttention(8, 2).eval()
    tc.load_torch_mha(ours, mha)
    x = torch.randn(2, 5, 8)
    mask = tc.causal_mask(5)
    expected, _ = mha(x, x, x, attn_mask=tc.to_torch_mask(mask), need_weights=False)
    got, _ = ours(x, attn_mask=mask)
    torch.testing.assert_close(got, expected)


def test_bool_to_additive_matches_sdpa_semantics():
    q, k, v = torch.randn(3, 4, 8), torch.randn(3, 6, 8), torch.randn(3, 6, 8)
    m = torch.rand(4, 6) > 0.3
    m[:, 0] = True
    a = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    b = F.scaled_dot_product_attention(q, k, v, attn_mask=tc.bool_to_additive(m))
    torch.testing.assert_close(a, b)
    assert tc.bool_to_additive(m)[~m].eq(float("-inf")).all()
    with pytest.raises(TypeError, match="bool"):
        tc.bool_to_additive(m.float())


def test_check_mask_names_shapes():
    tc.check_mask(torch.ones(2, 1, 1, 5, dtype=torch.bool), (2, 4, 3, 5))
    with pytest.raises(ValueError, match=r"\(3, 5\) does not broadcast to \(2, 4, 3, 6\)"):
        tc.check_mask(torch.ones(3, 5, dtype=torch.bool), (2, 4, 3, 6))
    with pytest.raises(TypeError, match="int64"):
        tc.check_mask(torch.ones(3, 5, dtype=torch.long), (3, 5))


def test_causal_mask_with_window_written_out():
    L, S, W = 3, 7, 2
    expected = torch.tensor([[S - L + i - W < j <= S - L + i for j in range(S)] for i in range(L)])
    assert torch.equal(tc.causal_mask(L, S, window=W), expected)


def test_merge_masks_combines_caller_causal_and_window_masks():
    L, S = 3, 5
    causal = torch.tensor([[j <= i + 2 for j in range(S)] for i in range(L)])
    assert tc.merge_masks(None, L, S) is None
    assert torch.equal(tc.merge_masks(None, L, S, is_causal=True), causal)
    assert tc.merge_masks(None, 1, S, is_causal=True) is None  # the last position sees everything
    pad = torch.tensor([True, True, False, True, True])
    assert torch.equal(tc.merge_masks(pad, L, S, is_causal=True), pad & causal)
    additive = torch.randn(L, S)
    merged = tc.merge_masks(additive, L, S, is_causal=True)
    assert torch.equal(merged[causal], additive[causal]) and torch.isneginf(merged[~causal]).all()
    window = tc.merge_masks(None, 1, S, is_causal=True, window=3)
    assert torch.equal(window, torch.tensor([[False, False, True, True, True]]))
    with pytest.raises(ValueError, match="needs is_causal=True"):
        tc.merge_masks(None, L, S, window=2)
