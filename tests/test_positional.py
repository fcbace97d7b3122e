import math
import re

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


def _closed_form_row(p: int, d: int, base: float) -> list[float]:
    return [(math.sin if j % 2 == 0 else math.cos)(p / base ** ((j - j % 2) / d)) for j in range(d)]


def _closed_form_table(max_len: int, d: int, base: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor([_closed_form_row(p, d, base) for p in range(max_len)], dtype=dtype)


@pytest.mark.parametrize("base", [10000.0, 100.0, 1.5])  # any base > 1 works
def test_sinusoidal_table_is_float32_by_default_and_matches_the_closed_form(base):
    torch.testing.assert_close(tc.sinusoidal_table(30, 8, base), _closed_form_table(30, 8, base))  # checks dtype too


def test_sinusoidal_table_default_base_is_10000():  # float64: tight enough to tell 10000 from, say, 10001
    f64 = torch.float64
    torch.testing.assert_close(tc.sinusoidal_table(30, 8, dtype=f64), _closed_form_table(30, 8, 10000.0, f64))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_tables_come_in_the_requested_dtype(dtype):
    assert tc.sinusoidal_table(4, 8, dtype=dtype).dtype == dtype
    assert tc.relative_position_transform(3, 8, dtype=dtype).dtype == dtype


def test_relative_position_transform_is_the_closed_form_block_matrix_in_float32_by_default():
    k, d = 3, 4
    expected = torch.zeros(d, d)
    for i in range(d // 2):
        phi = k * 10000.0 ** (-2 * i / d)
        expected[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor(
            [[math.cos(phi), math.sin(phi)], [-math.sin(phi), math.cos(phi)]]
        )
    torch.testing.assert_close(tc.relative_position_transform(k, d), expected)  # checks dtype too


_EVEN = "must be even (dimensions come in sin/cos pairs), got 7"


@pytest.mark.parametrize(
    ("make", "args", "message"),
    [
        (tc.sinusoidal_table, (0, 8), "max_len must be positive, got 0"),
        (tc.sinusoidal_table, (10, 0), "d_model must be positive, got 0"),
        (tc.sinusoidal_table, (10, 7), f"d_model {_EVEN}"),
        (tc.sinusoidal_table, (10, 8, 1.0), "base must be > 1, got 1.0"),
        (tc.relative_position_transform, (1, 0), "d_model must be positive, got 0"),
        (tc.relative_position_transform, (1, 7), f"d_model {_EVEN}"),
        (tc.SinusoidalPositionalEncoding, (7,), f"d_model {_EVEN}"),
        (tc.LearnedPositionalEmbedding, (0, 10), "d_model must be positive, got 0"),
        (tc.LearnedPositionalEmbedding, (8, 0), "max_len must be positive, got 0"),
        (tc.RotaryEmbedding, (0,), "head_dim must be positive, got 0"),
        (tc.RotaryEmbedding, (8, 0), "max_len must be positive, got 0"),
        (tc.RotaryEmbedding, (7,), f"head_dim {_EVEN}"),
        (tc.RotaryEmbedding, (8, 16, 0.5), "base must be > 1, got 0.5"),
    ],
)
def test_bad_arguments_raise_value_errors_naming_them(make, args, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        make(*args)


def test_module_adds_the_closed_form_table_with_default_base_10000_and_offset():
    mod = tc.SinusoidalPositionalEncoding(8, max_len=20)  # default base
    assert "pe" in dict(mod.named_buffers())
    x = torch.randn(2, 5, 8)
    expected = _closed_form_table(20, 8, 10000.0)[3:8]
    torch.testing.assert_close(mod(x, offset=3), x + expected)
    other = tc.SinusoidalPositionalEncoding(8, max_len=20, base=100.0)
    torch.testing.assert_close(other(x), x + _closed_form_table(20, 8, 100.0)[:5])


def test_sinusoidal_module_default_table_covers_positions_0_to_4999():
    mod = tc.SinusoidalPositionalEncoding(8)
    x = torch.zeros(1, 1, 8)
    torch.testing.assert_close(mod(x, offset=4999)[0], torch.tensor([_closed_form_row(4999, 8, 10000.0)]))
    with pytest.raises(ValueError, match=r"^positions 5000\.\.5000 exceed the positional table of length 5000$"):
        mod(x, offset=5000)


@pytest.mark.parametrize(
    ("cls", "what"),
    [
        (tc.SinusoidalPositionalEncoding, "positional table"),
        (tc.LearnedPositionalEmbedding, "position embedding table"),
    ],
)
def test_additive_modules_reject_positions_past_the_table_and_wrong_widths(cls, what):
    mod = cls(8, 10)
    with pytest.raises(ValueError, match=rf"^positions 8\.\.11 exceed the {what} of length 10$"):
        mod(torch.zeros(2, 4, 8), offset=8)
    with pytest.raises(ValueError, match=r"^last dim of x must be d_model=8, got \(1, 2, 6\)$"):
        mod(torch.zeros(1, 2, 6))


@pytest.mark.parametrize("offset", [-1, 1.5, True])
@pytest.mark.parametrize("cls", [tc.SinusoidalPositionalEncoding, tc.LearnedPositionalEmbedding, tc.RotaryEmbedding])
def test_bad_offsets_raise_errors_naming_offset(cls, offset):
    error, message = (ValueError, "must be >= 0") if offset == -1 else (TypeError, "must be an int")
    with pytest.raises(error, match=rf"^offset {message}, got {re.escape(repr(offset))}$"):
        cls(8, 16)(torch.zeros(2, 3, 8), offset=offset)


def test_fixed_tables_are_buffers_recomputed_on_construction_not_saved_in_the_state_dict():
    sinusoidal, rope = tc.SinusoidalPositionalEncoding(8, 16), tc.RotaryEmbedding(8, 16)
    assert set(dict(sinusoidal.named_buffers())) == {"pe"} and set(dict(rope.named_buffers())) == {"cos", "sin"}
    assert list(sinusoidal.state_dict()) == [] and list(rope.state_dict()) == []
    assert list(tc.LearnedPositionalEmbedding(8, 16).state_dict()) == ["embedding.weight"]  # trained: saved


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_outputs_keep_the_input_dtype(dtype):
    x = torch.randn(2, 3, 8).to(dtype)
    assert tc.SinusoidalPositionalEncoding(8, 16)(x).dtype == dtype
    for interleaved in (True, False):
        rope = tc.RotaryEmbedding(8, max_len=16, interleaved=interleaved)
        assert rope(x).dtype == dtype and rope(x, offset=20).dtype == dtype  # from the table / computed


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


def test_learned_positional_embedding_adds_the_rows_of_positions_offset_to_offset_plus_L():
    mod = tc.LearnedPositionalEmbedding(8, max_len=10)
    x = torch.randn(3, 4, 8)
    rows = mod.embedding.weight
    torch.testing.assert_close(mod(x), x + torch.stack([rows[p] for p in range(4)]))  # default offset 0
    torch.testing.assert_close(mod(x, offset=2), x + torch.stack([rows[p] for p in range(2, 6)]))


def _rotate_by_loops(x: torch.Tensor, offset: int, base: float, interleaved: bool) -> torch.Tensor:
    """RoPE of ``x`` (N, L, D) written out pair by pair, with the angle ``(offset + m) base^(-2i/D)``."""
    D = x.size(-1)
    expected = torch.empty_like(x)
    for m in range(x.size(1)):
        for i in range(D // 2):
            theta = (offset + m) * base ** (-2 * i / D)
            a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + D // 2)
            c, s = math.cos(theta), math.sin(theta)
            expected[:, m, a] = x[:, m, a] * c - x[:, m, b] * s
            expected[:, m, b] = x[:, m, a] * s + x[:, m, b] * c
    return expected


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("offset", [0, 5, 30])  # 30 + 3 rows lie past the table of 16: computed on the spot
def test_rope_equals_the_closed_form_rotation(interleaved, offset):
    rope = tc.RotaryEmbedding(8, max_len=16, interleaved=interleaved)
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    expected = _rotate_by_loops(x, offset, 10000.0, interleaved)
    torch.testing.assert_close(rope(x, offset=offset), expected, atol=1e-6, rtol=1e-6)  # float32 table


def test_rope_grows_its_table_by_doubling_when_a_position_lies_past_it():
    rope = tc.RotaryEmbedding(8, max_len=4)
    x = torch.zeros(2, 8)

    def from_table(offset: int) -> bool:  # a view of the buffers, no recomputation
        cos, sin = rope._cos_sin(offset, 2, x)
        table = rope.cos.untyped_storage().data_ptr(), rope.sin.untyped_storage().data_ptr()
        return (cos.untyped_storage().data_ptr(), sin.untyped_storage().data_ptr()) == table

    assert from_table(2) and rope.max_len == 4  # positions 2, 3: the last rows
    assert from_table(3) and rope.max_len == 8  # position 4 lies past the table: 4 -> 8
    storage = rope.cos.untyped_storage().data_ptr()
    assert from_table(6) and rope.cos.untyped_storage().data_ptr() == storage  # no regrowth
    assert from_table(20) and rope.max_len == 22  # more than double: exactly what is asked
    angles = torch.arange(22, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, 8, 2) / 8)
    torch.testing.assert_close(rope.cos, angles.cos().float())
    torch.testing.assert_close(rope.sin, angles.sin().float())


def test_rope_default_table_holds_positions_0_to_4095():
    rope = tc.RotaryEmbedding(8)
    assert rope.max_len == 4096 and rope.cos.shape == rope.sin.shape == (4096, 4)
    rope(torch.zeros(1, 1, 8), offset=4095)  # the last row: read from the table, no growth
    assert rope.max_len == 4096


def test_rope_grown_table_stays_on_the_module_device():
    rope = tc.RotaryEmbedding(8, max_len=4).to("meta")  # meta: shapes only, and no silent move to the CPU
    out = rope(torch.empty(2, 3, 8, device="meta"), offset=10)  # positions 10..12: the table grows to 13
    assert rope.max_len == 13 and rope.cos.device.type == rope.sin.device.type == "meta"
    assert out.device.type == "meta" and out.shape == (2, 3, 8)


def test_build_positional_passes_max_len_and_base_through_and_defaults_to_base_10000():
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    sinusoidal = tc.build_positional("sinusoidal", 8, 20, base=100.0)
    torch.testing.assert_close(sinusoidal(x.float(), offset=15), x.float() + _closed_form_table(20, 8, 100.0)[15:])
    with pytest.raises(ValueError, match="of length 20$"):
        sinusoidal(x, offset=16)
    rope = tc.build_positional("rope", 8, 12, base=100.0)
    assert rope.cos.shape == (12, 4)  # the table covers max_len positions
    expected = _rotate_by_loops(x, 3, 100.0, interleaved=True)
    torch.testing.assert_close(rope(x, offset=3), expected, atol=1e-6, rtol=1e-6)  # float32 table
    # past the table the angles are computed in float64: tight enough to tell base 10000 from, say, 10001
    default_base = tc.build_positional("rope", 8, 12)
    torch.testing.assert_close(default_base(x, offset=100), _rotate_by_loops(x, 100, 10000.0, interleaved=True))


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


def test_rope_rejects_wrong_widths_and_the_transform_non_int_offsets():
    with pytest.raises(ValueError, match=r"^last dim of x must be head_dim=4, got \(2, 6\)$"):
        tc.RotaryEmbedding(4, max_len=8)(torch.randn(2, 6))
    for k in (1.5, True):
        with pytest.raises(TypeError, match=f"^k must be an int, got {k!r}$"):
            tc.relative_position_transform(k, 8)
