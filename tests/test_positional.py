import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import transformer_course as tc


def test_sinusoidal_table_matches_formula():
    pe = tc.sinusoidal_table(50, 16)
    assert pe.shape == (50, 16)
    pos, i = 7, 3
    w = 10000 ** (-2 * i / 16)
    assert math.isclose(pe[pos, 2 * i].item(), math.sin(pos * w), abs_tol=1e-6)
    assert math.isclose(pe[pos, 2 * i + 1].item(), math.cos(pos * w), abs_tol=1e-6)
    assert torch.equal(pe[0, 0::2], torch.zeros(8)) and torch.equal(pe[0, 1::2], torch.ones(8))


def _closed_form_table(max_len: int, d: int, base: float) -> torch.Tensor:
    return torch.tensor(
        [
            [(math.sin if j % 2 == 0 else math.cos)(p / base ** ((j - j % 2) / d)) for j in range(d)]
            for p in range(max_len)
        ]
    )


def test_module_adds_the_closed_form_table_with_default_base_10000_and_offset():
    mod = tc.SinusoidalPositionalEncoding(8, max_len=20)  # default base
    assert "pe" in dict(mod.named_buffers())
    x = torch.randn(2, 5, 8)
    expected = _closed_form_table(20, 8, 10000.0)[3:8]
    torch.testing.assert_close(mod(x, offset=3), x + expected)
    other = tc.SinusoidalPositionalEncoding(8, max_len=20, base=100.0)
    torch.testing.assert_close(other(x), x + _closed_form_table(20, 8, 100.0)[:5])
    with pytest.raises(ValueError, match=r"positions 18\.\.22 exceed"):
        mod(x, offset=18)
    with pytest.raises(ValueError, match="d_model=8"):
        mod(torch.zeros(1, 2, 6))


@pytest.mark.parametrize("bad", [7, 15])
def test_odd_d_model_rejected(bad):
    with pytest.raises(ValueError, match=f"even.*{bad}"):
        tc.SinusoidalPositionalEncoding(bad)
    with pytest.raises(ValueError, match=f"even.*{bad}"):
        tc.RotaryEmbedding(bad)


@settings(max_examples=25, deadline=None)
@given(k=st.integers(-40, 40), d=st.sampled_from([2, 8, 32, 64]))
def test_relative_position_transform_shifts_every_position(k, d):
    pe = tc.sinusoidal_table(200, d, dtype=torch.float64)
    T = tc.relative_position_transform(k, d, dtype=torch.float64)
    lo, hi = max(0, -k), min(200, 200 - k)
    # PE[pos + k] = T_k PE[pos] for all valid pos at once: rows are positions
    torch.testing.assert_close(pe[lo:hi] @ T.T, pe[lo + k : hi + k])
    # block diagonal: zero outside the 2x2 blocks, each block orthogonal
    block_mask = torch.block_diag(*[torch.ones(2, 2)] * (d // 2)).bool()
    assert T[~block_mask].eq(0).all()
    torch.testing.assert_close(T @ T.T, torch.eye(d, dtype=torch.float64))


def test_learned_positional_embedding():
    mod = tc.LearnedPositionalEmbedding(8, max_len=10)
    x = torch.zeros(3, 4, 8)
    torch.testing.assert_close(mod(x, offset=2), mod.embedding.weight[2:6].expand(3, 4, 8))
    with pytest.raises(ValueError, match="exceed"):
        mod(torch.zeros(1, 11, 8))


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("offset", [0, 5, 30])  # 30 + 3 rows lie past the table of 16: computed on the spot
def test_rope_equals_the_closed_form_rotation(interleaved, offset):
    D = 8
    rope = tc.RotaryEmbedding(D, max_len=16, interleaved=interleaved)
    x = torch.randn(2, 3, D, dtype=torch.float64)
    y = rope(x, offset=offset)
    expected = torch.empty_like(x)
    for m in range(3):
        for i in range(D // 2):
            theta = (offset + m) * 10000.0 ** (-2 * i / D)
            a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + D // 2)
            c, s = math.cos(theta), math.sin(theta)
            expected[:, m, a] = x[:, m, a] * c - x[:, m, b] * s
            expected[:, m, b] = x[:, m, a] * s + x[:, m, b] * c
    torch.testing.assert_close(y, expected, atol=1e-6, rtol=1e-6)


def test_build_positional_names_each_module():
    assert isinstance(tc.build_positional("sinusoidal", 8, 10), tc.SinusoidalPositionalEncoding)
    assert isinstance(tc.build_positional("learned", 8, 10), tc.LearnedPositionalEmbedding)
    assert isinstance(tc.build_positional("rope", 4, 10), tc.RotaryEmbedding)
    assert tc.build_positional("none", 8, 10) is None
    with pytest.raises(ValueError, match="unknown positional encoding 'alibi'"):
        tc.build_positional("alibi", 8, 10)


@pytest.mark.parametrize("interleaved", [True, False])
def test_rope_preserves_norm_and_position_zero(interleaved):
    rope = tc.RotaryEmbedding(8, max_len=16, interleaved=interleaved)
    x = torch.randn(2, 3, 16, 8)
    y = rope(x)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(y[..., 0, :], x[..., 0, :])


@settings(max_examples=25, deadline=None)
@given(m=st.integers(0, 60), n=st.integers(0, 60), shift=st.integers(0, 60), interleaved=st.booleans())
def test_rope_scores_depend_only_on_relative_position(m, n, shift, interleaved):
    rope = tc.RotaryEmbedding(16, max_len=128, interleaved=interleaved)
    g = torch.Generator().manual_seed(m * 1000 + n)
    q, k = torch.randn(1, 16, generator=g), torch.randn(1, 16, generator=g)
    s1 = rope(q, offset=m) @ rope(k, offset=n).T
    s2 = rope(q, offset=m + shift) @ rope(k, offset=n + shift).T
    torch.testing.assert_close(s1, s2, atol=1e-4, rtol=1e-4)


def test_rope_pairings_are_a_permutation_of_each_other():
    D = 8
    inter = tc.RotaryEmbedding(D, max_len=16, interleaved=True)
    split = tc.RotaryEmbedding(D, max_len=16, interleaved=False)
    perm = torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])  # interleaved -> halves
    x = torch.randn(5, D)
    torch.testing.assert_close(inter(x, offset=3)[:, perm], split(x[:, perm], offset=3))


def test_rope_interleaved_matches_complex_multiplication():
    rope = tc.RotaryEmbedding(8, max_len=16)
    x = torch.randn(6, 8)
    theta = 10000 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    rot = torch.polar(torch.ones(6, 4, dtype=torch.float64), torch.arange(6.0, dtype=torch.float64)[:, None] * theta)
    z = torch.view_as_complex(x.double().view(6, 4, 2).contiguous()) * rot
    torch.testing.assert_close(rope(x).double(), torch.view_as_real(z).reshape(6, 8), atol=1e-5, rtol=1e-5)


def test_bad_offsets_rejected():
    rope = tc.RotaryEmbedding(4, max_len=8)
    with pytest.raises(ValueError, match="offset"):
        rope(torch.randn(2, 4), offset=-1)
    with pytest.raises(ValueError, match="head_dim=4"):
        rope(torch.randn(2, 6))
    with pytest.raises(TypeError, match="k must be an int"):
        tc.relative_position_transform(1.5, 8)
