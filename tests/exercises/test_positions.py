"""The sinusoidal table and RoPE.

Each checker accepts correct implementations written in different styles with one "✓"
line, treats a skeleton as "尚未实现" (an error with solution=True), and rejects
hand-written wrong implementations with a Chinese hint that names the mistake."""

import math
import warnings

import pytest
import torch

import transformer_course as tc
from transformer_course import exercises as ex
from transformer_course.exercises import positions

from .support import assert_every_hint_reached, assert_passes, assert_rejects, assert_skeleton

# 5. sinusoidal encoding
# ---------------------------------------------------------------------------


def sinusoidal(max_len, d_model):
    return tc.sinusoidal_table(max_len, d_model)


def sinusoidal_written_out(max_len, d_model):
    pos = torch.arange(max_len).unsqueeze(1)
    div = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe


def sinusoidal_skeleton(max_len, d_model):
    pass


def make_pe(mistake):
    """A learner's table, written in a loop over positions and column pairs, with one
    mistake."""

    def fn(max_len, d_model):
        pe = torch.zeros(max_len, d_model)
        for p in range(max_len):
            pos = p + 1 if mistake == "pos1" else p
            for j in range(0, d_model, 2):
                expo = (j // 2) / d_model if mistake == "exp_i" else j / d_model
                expo = j // d_model if mistake == "int_div" else expo
                angle = pos * 10000.0**expo if mistake == "multiply" else pos / 10000.0**expo
                if mistake == "per_column":  # column j + 1 uses its own index
                    pe[p, j], pe[p, j + 1] = math.sin(angle), math.cos(pos / 10000.0 ** ((j + 1) / d_model))
                elif mistake == "swapped":
                    pe[p, j], pe[p, j + 1] = math.cos(angle), math.sin(angle)
                elif mistake == "halves":
                    pe[p, j // 2], pe[p, d_model // 2 + j // 2] = math.sin(angle), math.cos(angle)
                else:
                    pe[p, j], pe[p, j + 1] = math.sin(angle), math.cos(angle)
        return pe

    return fn


def pe_exponent_per_column(max_len, d_model):
    """Learner test 7a, 2.14: exponent 2j/d with j the column index."""
    j = torch.arange(d_model).float()
    angles = torch.arange(max_len)[:, None].float() / 10000 ** (2 * j / d_model)
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2], pe[:, 1::2] = angles[:, 0::2].sin(), angles[:, 1::2].cos()
    return pe


def pe_with_log(log):
    """Learner test 10a (2.4): exp(−2i/d · log(...)) with the log of 10000 left out
    (``log`` = 1: base e) or taken to base 10 (base e⁴)."""

    def fn(max_len, d_model):
        omega = torch.exp(-torch.arange(0, d_model, 2).float() / d_model * log)
        angles = torch.arange(max_len).float()[:, None] * omega
        return torch.stack([angles.sin(), angles.cos()], -1).flatten(1)

    return fn


def pe_with_denominator(denominator):
    """Learner test 34a (2.4): 10000 ** (arange(0, d, 2) / (d − 1)) — the slip is the
    denominator, not the base (an equivalent base fits the same table)."""

    def fn(max_len, d_model):
        angles = torch.arange(max_len).float()[:, None] / 10000 ** (
            torch.arange(0, d_model, 2).float() / denominator(d_model)
        )
        return torch.stack([angles.sin(), angles.cos()], -1).flatten(1)

    return fn


def test_sinusoidal_encoding(capsys):
    for fn in (sinusoidal_written_out, make_pe(None)):
        assert_passes(ex.check_sinusoidal_encoding, fn, capsys)
    assert_skeleton(ex.check_sinusoidal_encoding, sinusoidal_skeleton, capsys)


written = sinusoidal_written_out
PE_REJECTS = [
    pytest.param(ex.check_sinusoidal_encoding, make_pe("swapped"), "sin 和 cos 的列放反了", id="sin/cos swapped"),
    pytest.param(ex.check_sinusoidal_encoding, make_pe("halves"), "交错排列", id="sin half, cos half"),
    pytest.param(ex.check_sinusoidal_encoding, make_pe("pos1"), "位置应从 0 开始", id="positions from 1"),
    pytest.param(ex.check_sinusoidal_encoding, make_pe("exp_i"), "指数写错了", id="exponent i instead of 2i"),
    pytest.param(ex.check_sinusoidal_encoding, make_pe("multiply"), "你乘了它", id="multiplied by the frequency"),
    pytest.param(ex.check_sinusoidal_encoding, make_pe("per_column"), "共享一个频率", id="frequency per column"),
    pytest.param(ex.check_sinusoidal_encoding, pe_exponent_per_column, "列号又被乘了 2", id="exponent 2j per column"),
    pytest.param(ex.check_sinusoidal_encoding, lambda n, d: written(n, d).T, "行和列反了", id="transposed"),
    pytest.param(ex.check_sinusoidal_encoding, lambda n, d: written(n, d).long(), "浮点", id="integer table"),
    pytest.param(ex.check_sinusoidal_encoding, lambda n, d: written(n, d).numpy(), "numpy", id="numpy array"),
    pytest.param(ex.check_sinusoidal_encoding, make_pe("int_div"), "整数除法", id="integer division in the exponent"),
    pytest.param(ex.check_sinusoidal_encoding, pe_with_log(1.0), "少了 ln 10000", id="base e"),
    pytest.param(ex.check_sinusoidal_encoding, pe_with_log(math.log10(10000.0)), "频率的底是 54.6", id="log10"),
    pytest.param(ex.check_sinusoidal_encoding, sinusoidal, "不要直接调用", id="the package table called"),
    pytest.param(
        ex.check_sinusoidal_encoding, pe_with_denominator(lambda d: d - 1), "分母是 d_model − 1", id="2i/(d-1)"
    ),
    pytest.param(
        ex.check_sinusoidal_encoding, pe_with_denominator(lambda d: d // 2), "分母是 d_model / 2", id="2i/(d/2)"
    ),
]


# ---------------------------------------------------------------------------
# 6. RoPE
# ---------------------------------------------------------------------------


def rope(x):
    return tc.RotaryEmbedding(x.size(-1))(x)


def rope_complex(x):
    """RoPE written with complex numbers (pairs (2i, 2i+1) as one complex number)."""
    N, H, L, D = x.shape
    theta = 10000.0 ** (-torch.arange(0, D, 2).float() / D)
    angles = torch.arange(L).float()[:, None] * theta
    z = torch.view_as_complex(x.float().reshape(N, H, L, D // 2, 2).contiguous())
    return torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


def make_rope(mistake):
    def fn(x):
        N, H, L, D = x.shape
        theta = 10000.0 ** (-torch.arange(0, D, 2).float() / (2 * D if mistake == "exp_i" else D))
        pos = torch.arange(L).float() + (1 if mistake == "pos1" else 0)
        angles = pos[:, None] * theta
        cos, sin = angles.cos(), angles.sin()
        if mistake == "reversed":
            sin = -sin
        if mistake == "swap_sin_cos":
            cos, sin = sin, cos
        if mistake == "pos_heads":
            hpos = torch.arange(H).float()[:, None, None] * theta  # (H, 1, D/2)
            cos, sin = hpos.cos(), hpos.sin()
        if mistake == "halves":
            x1, x2 = x[..., : D // 2], x[..., D // 2 :]
        else:
            x1, x2 = x[..., 0::2], x[..., 1::2]
        r1, r2 = x1 * cos - x2 * sin, x1 * sin + x2 * cos
        if mistake in ("halves", "cat"):
            return torch.cat([r1, r2], dim=-1)
        if mistake == "half_output":
            return r1
        if mistake == "no_cos":
            return torch.stack([x1 - x2 * sin, x1 * sin + x2], dim=-1).flatten(-2)
        return torch.stack([r1, r2], dim=-1).flatten(-2)

    return fn


def rope_with_angles(kind):
    """Learner test 10b (5.7): a wrongly built angle table: a (D/2, L) table reshaped
    to (L, D/2), base 1000 instead of 10000, positions counted backwards."""

    def fn(x):
        N, H, L, D = x.shape
        theta = (1000.0 if kind == "base" else 10000.0) ** (-torch.arange(0, D, 2).double() / D)
        pos = torch.arange(L).double()
        angles = (pos.flip(0) if kind == "reversed" else pos)[:, None] * theta
        if kind == "reshaped":
            angles = (theta[:, None] * pos[None, :]).reshape(L, D // 2)
        z = torch.view_as_complex(x.double().reshape(N, H, L, D // 2, 2).contiguous())
        return torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)).flatten(-2).float()

    return fn


def rope_skeleton(x):
    raise NotImplementedError("TODO")


def test_rope(capsys):
    for fn in (rope, rope_complex, make_rope(None)):
        assert_passes(ex.check_rope, fn, capsys)
    assert_skeleton(ex.check_rope, rope_skeleton, capsys)


ROPE_REJECTS = [
    pytest.param(ex.check_rope, make_rope("halves"), "配对方式不对", id="split-halves pairing"),
    pytest.param(ex.check_rope, make_rope("cat"), "交错放回", id="pairs concatenated back"),
    pytest.param(ex.check_rope, make_rope("reversed"), "旋转方向反了", id="rotation reversed"),
    pytest.param(ex.check_rope, make_rope("pos1"), "位置应从 0 开始", id="positions from 1"),
    pytest.param(ex.check_rope, make_rope("exp_i"), "频率写错了", id="frequency exponent"),
    pytest.param(ex.check_rope, make_rope("half_output"), "形状", id="returns one half"),
    pytest.param(ex.check_rope, make_rope("no_cos"), "长度", id="cos missing"),
    pytest.param(ex.check_rope, make_rope("swap_sin_cos"), "cos 和 sin 用反了", id="cos and sin swapped"),
    pytest.param(ex.check_rope, make_rope("pos_heads"), "头的编号", id="positions counted along the heads"),
    pytest.param(ex.check_rope, rope_with_angles("reshaped"), "再 reshape 成 (L, D/2)", id="angle table reshaped"),
    pytest.param(ex.check_rope, rope_with_angles("base"), "频率不对：", id="angle table: other frequencies"),
    pytest.param(
        ex.check_rope, rope_with_angles("reversed"), "位置 [4, 3, 2, 1, 0] 的角度", id="angle table: positions"
    ),
]


REJECTS = PE_REJECTS + ROPE_REJECTS


@pytest.mark.parametrize("checker, candidate, keyword", REJECTS)
def test_rejects(checker, candidate, keyword, capsys):
    assert_rejects(checker, candidate, keyword, capsys)


def test_every_hint_is_reached(capsys):
    tables = {"PE_HINTS": positions.PE_HINTS, "ROPE_HINTS": positions.ROPE_HINTS}
    assert_every_hint_reached(tables, REJECTS, capsys)


# a projection whose scores depend on the distance only (ch03, exercise 3.13)
# ---------------------------------------------------------------------------

E_P, D_P = 64, 8


def pair_selection(pairs, dtype=torch.float64):
    """The (E, 2·len(pairs)) matrix that picks the dimension pairs (2i, 2i+1)."""
    S = torch.zeros(E_P, 2 * len(pairs), dtype=dtype)
    for j, i in enumerate(pairs):
        S[2 * i, 2 * j] = S[2 * i + 1, 2 * j + 1] = 1.0
    return S


def rotation_scalings(ab, dtype=torch.float64):
    """Block-diagonal [[a, b], [-b, a]] for each (a, b)."""
    return torch.block_diag(*[torch.tensor([[a, b], [-b, a]], dtype=dtype) for a, b in ab])


PAIRS = [0, 5, 17, 31]  # the highest and the lowest frequency included
AB = [(0.7, -1.2), (2.0, 0.5), (-0.3, 0.9), (1.1, 1.1)]


def the_pages_solution():
    S = pair_selection(PAIRS)
    return S @ rotation_scalings(AB), S


def rotated_in_the_head_space():
    """W_q = S C R, W_k = S R with R orthogonal (float32): M = S C Sᵀ still."""
    S, C = pair_selection(PAIRS, torch.float32), rotation_scalings(AB, torch.float32)
    R, _ = torch.linalg.qr(torch.randn(D_P, D_P, generator=torch.Generator().manual_seed(1)))
    return S @ C @ R, S @ R


def other_conventions_as_numpy():
    """Rotations the other way ([[a, -b], [b, a]]), a scale of 100, W_k negated."""
    S = pair_selection([2, 3, 9, 20])
    return (100 * S @ rotation_scalings(AB).T).numpy(), (-S).numpy()


def one_pair_only():
    """Rank 2 ≤ D: the other six columns zero."""
    S = torch.cat([pair_selection([7]), torch.zeros(E_P, D_P - 2, dtype=torch.float64)], dim=1)
    return S @ torch.block_diag(rotation_scalings([(1.0, 3.0)]), torch.eye(D_P - 2)), S


@pytest.mark.parametrize(
    "construct", [the_pages_solution, rotated_in_the_head_space, other_conventions_as_numpy, one_pair_only]
)
def test_distance_only_projection_accepts(construct, capsys):
    W_q, W_k = construct()
    assert ex.check_distance_only_projection(W_q, W_k) is None
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("✓ 只依赖距离的投影：W_q、W_k 通过"), lines


def test_distance_only_projection_takes_parameters_silently(capsys):
    """Learner test 27a, 3.13: nn.Parameter inputs (requires_grad) print no torch warning."""
    W_q, W_k = (torch.nn.Parameter(torch.as_tensor(W, dtype=torch.float32)) for W in the_pages_solution())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ex.check_distance_only_projection(W_q, W_k) is None
    assert capsys.readouterr().out.startswith("✓ 只依赖距离的投影")


def test_distance_only_projection_skeleton(capsys):
    ex.check_distance_only_projection(None, None, exercise="3.13")
    assert capsys.readouterr().out.strip() == "尚未实现：W_q、W_k 还是 None（写好后重新运行本单元格）"
    ex.check_distance_only_projection(*the_pages_solution()[:1], None)
    assert capsys.readouterr().out.startswith("尚未实现：W_k 还是 None")
    with pytest.raises(ex.ExerciseError, match="骨架"):
        ex.check_distance_only_projection(None, None, solution=True)
    ex.progress(3)
    assert "  … 尚未实现：练习 3.13\n" in capsys.readouterr().out
    with pytest.raises(TypeError, match="W_q, W_k"):
        ex.check_distance_only_projection(the_pages_solution())  # the pair as one argument


def projection(W_q, W_k, keyword, id):
    return pytest.param(lambda pair: ex.check_distance_only_projection(*pair), (W_q, W_k), keyword, id=id)


S_P, C_P = pair_selection(PAIRS), rotation_scalings(AB)
REFLECT = torch.diag(torch.tensor([1.0, -1.0] * (D_P // 2), dtype=torch.float64))
EYE = torch.eye(E_P, dtype=torch.float64)

PROJECTION_REJECTS = [
    projection(torch.zeros(E_P, D_P), S_P, "零矩阵", "W_q zero"),
    projection(S_P * (torch.arange(D_P) < 4), S_P * (torch.arange(D_P) >= 4), "零矩阵", "orthogonal columns"),
    projection(*torch.randn(2, E_P, D_P, generator=torch.Generator().manual_seed(2)), "随机的", "random"),
    projection(S_P @ C_P + torch.outer(EYE[2], EYE[0, :D_P]), S_P, "第 1 对维度 (2, 3) 与第 0 对 (0, 1)", "mixed"),
    # the pairs (i, i + 32): the table read as [sin ... | cos ...]
    projection(EYE[:, [0, 32, 1, 33, 2, 34, 3, 35]], EYE[:, [0, 32, 1, 33, 2, 34, 3, 35]] @ C_P, "不能混合", "halves"),
    projection(S_P @ (C_P + REFLECT), S_P, "含反射的部分", "reflection"),
    projection(EYE[:, 1:9], EYE[:, 1:9], "只用到了其中一维", "pairs shifted by one"),
    projection((S_P @ C_P).T, S_P.T, "转置了", "transposed"),
    projection(torch.zeros(E_P, 6), S_P, "应为 (64, 8)", "D = 6"),
    projection("W_q", S_P, "应是形状 (64, 8) 的张量，得到 str", "a string"),
    projection(S_P * math.nan, S_P, "NaN", "NaN"),
]


@pytest.mark.parametrize("checker, candidate, keyword", PROJECTION_REJECTS)
def test_distance_only_projection_rejects(checker, candidate, keyword, capsys):
    assert_rejects(checker, candidate, keyword, capsys)


def test_a_reflection_on_the_slowest_pair_is_caught(monkeypatch, capsys):
    # ω_31 ≈ 1.3e-4: over a thousand positions a reflection there barely moves the
    # scores (p < 1500), small beside a large rotation-scaling on the fastest pair
    S = torch.cat([pair_selection([0, 31]), torch.zeros(E_P, D_P - 4, dtype=torch.float64)], dim=1)
    C = torch.diag(torch.tensor([1000.0, 1000.0, 1.0, -1.0] + [0.0] * (D_P - 4), dtype=torch.float64))
    monkeypatch.setattr(positions, "_POSITIONS", 1500)
    ex.check_distance_only_projection(S @ C, S)  # a short table misses it
    assert capsys.readouterr().out.startswith("✓")
    monkeypatch.undo()
    checker = lambda pair: ex.check_distance_only_projection(*pair)  # noqa: E731
    assert_rejects(checker, (S @ C, S), "第 31 对维度 (62, 63)", capsys)


def test_every_projection_hint_is_reached(capsys):
    assert_every_hint_reached({"PROJECTION_HINTS": positions.PROJECTION_HINTS}, PROJECTION_REJECTS, capsys)
