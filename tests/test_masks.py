import re

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


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"L": 0, "S": 3}, "L must be positive, got 0"),
        ({"L": -1}, "L must be positive, got -1"),
        ({"L": 2, "S": 0}, "S must be positive, got 0"),
        ({"L": 2, "S": 3, "window": 0}, "window must be positive, got 0"),
        ({"L": 3, "S": 2}, "causal_mask needs S >= L (queries are the last L of S keys), got L=3, S=2"),
    ],
)
def test_causal_mask_rejects_bad_sizes_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        tc.causal_mask(**kwargs)


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
    got = ours(x, attn_mask=mask)
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
    tc.masks.check_mask(torch.ones(2, 1, 1, 5, dtype=torch.bool), (2, 4, 3, 5))
    with pytest.raises(ValueError, match=r"\(3, 5\) does not broadcast to \(2, 4, 3, 6\)"):
        tc.masks.check_mask(torch.ones(3, 5, dtype=torch.bool), (2, 4, 3, 6))
    message = r"^mask must be bool \(True = may attend\) or float \(additive\), got torch\.int64$"
    with pytest.raises(TypeError, match=message):
        tc.masks.check_mask(torch.ones(3, 5, dtype=torch.long), (3, 5))


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


@pytest.mark.parametrize(
    "convert, message",
    [
        (tc.to_torch_mask, "mask must be a tensor, got list"),
        (lambda m: tc.masks.check_mask(m, (1, 1)), "mask must be a tensor, got list"),
        (tc.bool_to_additive, "bool_to_additive expects a bool tensor, got list"),
    ],
)
def test_non_tensor_masks_raise_type_error_naming_the_type(convert, message):
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        convert([[True, False]])


def test_bad_tokens_and_mask_dtypes_are_named():
    with pytest.raises(TypeError, match=r"^tokens must be a 2-D tensor \(N, S\), got list$"):
        tc.padding_mask([[1, 2, 0]], 0)
    with pytest.raises(TypeError, match=r"^bool_to_additive expects a bool tensor, got torch\.float32 \(2, 2\)$"):
        tc.bool_to_additive(torch.ones(2, 2))


def test_bool_to_additive_dtype_default_and_explicit():
    m = torch.tensor([[True, False], [False, True]])
    inf = float("inf")
    assert tc.bool_to_additive(m).dtype == torch.float32
    out = tc.bool_to_additive(m, dtype=torch.float64)
    assert out.dtype == torch.float64
    assert out.tolist() == [[0.0, -inf], [-inf, 0.0]]


def test_masks_are_built_on_the_requested_device():
    # the meta device has no data, so this checks the device argument on a CPU-only machine
    assert tc.causal_mask(3, 5, device="meta").device.type == "meta"
    assert tc.merge_masks(None, 3, 5, is_causal=True, window=2, device="meta").device.type == "meta"
    assert tc.bool_to_additive(torch.ones(2, 3, dtype=torch.bool, device="meta")).device.type == "meta"


@pytest.mark.parametrize("mask_shape", [(3, 6), (2, 3, 5), (1, 1, 1, 3, 5)])
def test_check_mask_rejects_masks_that_do_not_broadcast_to_the_target(mask_shape):
    message = f"mask of shape {mask_shape} does not broadcast to (3, 5)"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        tc.masks.check_mask(torch.ones(mask_shape, dtype=torch.bool), (3, 5))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_check_mask_names_bad_float_values(bad):
    mask = torch.zeros(3, 5)
    mask[1, 2] = mask[2, 0] = bad
    message = f"float mask holds {bad} at 2 position(s); an additive mask may only hold finite values and -inf"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        tc.masks.check_mask(mask, (3, 5))
    tc.masks.check_mask(mask, (3, 5), check_values=False)  # the hot-path callers skip the value check
    tc.masks.check_mask(torch.full((3, 5), -float("inf")), (3, 5))  # -inf is what an additive mask is for


@pytest.mark.parametrize(("first", "second"), [(float("nan"), float("inf")), (float("inf"), float("nan"))])
def test_check_mask_names_the_first_bad_value_in_row_major_order(first, second):
    mask = torch.zeros(3, 5)
    mask[1, 2], mask[2, 0] = first, second
    with pytest.raises(ValueError, match=rf"^float mask holds {first} at 2 position\(s\)"):
        tc.masks.check_mask(mask, (3, 5))
    mask[2, 0] = 0.0  # a single bad value
    with pytest.raises(ValueError, match=rf"^float mask holds {first} at 1 position\(s\)"):
        tc.masks.check_mask(mask, (3, 5))


def brute_force_causal(L, S, window):
    """Query i sits at position S - L + i; it sees key j iff j <= S - L + i and (window) S - L + i - j < window."""
    return torch.tensor(
        [[j <= S - L + i and (window is None or S - L + i - j < window) for j in range(S)] for i in range(L)]
    )


@pytest.mark.parametrize("L, S", [(1, 1), (1, 4), (2, 4), (3, 3), (4, 6)])
@pytest.mark.parametrize("window", [None, 1, 2, 3, 4, 6])
def test_merge_masks_equals_brute_force(L, S, window):
    expected = brute_force_causal(L, S, window)
    merged = tc.merge_masks(None, L, S, is_causal=True, window=window)
    if expected.all():  # nothing hidden: the docstring promises None
        assert merged is None
    else:
        assert torch.equal(merged, expected)
    pad = torch.rand(2, 1, L, S) > 0.3
    assert torch.equal(tc.merge_masks(pad, L, S, is_causal=True, window=window), pad & expected)
    additive = torch.randn(2, 1, L, S)
    merged = tc.merge_masks(additive, L, S, is_causal=True, window=window)
    assert torch.equal(merged, torch.where(expected, additive, -float("inf")))


def test_merge_masks_window_that_hides_nothing_needs_no_causal_flag():
    pad = torch.tensor([True, False, True])
    assert tc.merge_masks(pad, 2, 3, window=3) is pad  # S <= window: the window hides nothing
    assert tc.merge_masks(None, 1, 3, is_causal=True, window=3) is None
    with pytest.raises(ValueError, match=r"^a sliding window \(2\) needs is_causal=True$"):
        tc.merge_masks(pad, 2, 3, window=2)


def test_check_mask_reads_no_values_on_the_meta_device():
    """Shapes only: a float mask on ``meta`` has no values to check, so the value check is skipped."""
    tc.masks.check_mask(torch.zeros(3, 5, device="meta"), (3, 5))
    tc.masks.check_mask(torch.zeros(3, 5, device="meta"), (2, 3, 5), check_values=True)
