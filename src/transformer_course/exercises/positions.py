"""Positional encodings: the sinusoidal table, rotary position embedding, and a head's
projection whose scores on the sinusoidal table depend on the distance only."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from torch import Tensor

from ..positional import RotaryEmbedding, sinusoidal_table
from ._protocol import (
    Skeleton,
    calls_refused,
    checker,
    fail,
    name_of,
    randn,
    run_learner,
    seeded_generator,
)
from ._report import (
    as_tensor,
    check_float,
    check_shape,
    close,
    first_reproduced,
    where_differs,
)


def _pe_variant(max_len: int, d: int, mistake: str, base: float = 10000.0) -> Tensor:
    """The sinusoidal table with one typical mistake (``base``: the frequencies'
    base, 10000 in the formula)."""
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    if mistake == "pos1":
        pos = pos + 1
    i = torch.arange(0, d, 2, dtype=torch.float64)  # 2i
    if mistake == "exp_i":
        freq = 10000.0 ** (-(i / 2) / d)
    elif mistake == "multiply":
        freq = 10000.0 ** (i / d)
    elif mistake in ("per_column", "per_column_2j"):  # every column its own index j
        freq = None
    elif mistake == "int_div":  # arange(0, d, 2) // d is 0: every frequency 1
        freq = torch.ones_like(i)
    else:
        freq = base ** (-i / d)
    pe = torch.zeros(max_len, d, dtype=torch.float64)
    if freq is None:
        j = torch.arange(d, dtype=torch.float64)
        angles = pos * 10000.0 ** (-(2 if mistake == "per_column_2j" else 1) * j / d)
        pe[:, 0::2], pe[:, 1::2] = angles[:, 0::2].sin(), angles[:, 1::2].cos()
        return pe
    angles = pos * freq
    if mistake == "halves":
        return torch.cat([angles.sin(), angles.cos()], dim=1)
    sin, cos = angles.sin(), angles.cos()
    if mistake == "swapped":
        sin, cos = cos, sin
    pe[:, 0::2], pe[:, 1::2] = sin, cos
    return pe


PE_HINTS = [
    (
        "sin 和 cos 的列放反了：偶数列（0, 2, 4, …）是 sin，奇数列是 cos。",
        "swapped",
    ),
    (
        "前一半列放 sin、后一半放 cos 是另一种排法；"
        "本课程（和原论文）交错排列："
        "PE[:, 0::2] = sin，PE[:, 1::2] = cos。",
        "halves",
    ),
    (
        "位置应从 0 开始：第 0 行应为 [0, 1, 0, 1, …]（torch.arange(max_len)）。",
        "pos1",
    ),
    (
        "频率的指数写错了：应为 10000^(2i/d_model)，i 是列对的编号；"
        "写成 torch.arange(0, d_model, 2) / d_model 即是 2i/d_model。",
        "exp_i",
    ),
    (
        "位置应除以 10000^(2i/d_model)（或乘以 10000^(−2i/d_model)），你乘了它。",
        "multiply",
    ),
    (
        "每一列用了自己的列号 j 算频率：同一对 (2i, 2i+1) 应共享一个频率 "
        "10000^(−2i/d_model)。",
        "per_column",
    ),
    (
        "指数用了 2j/d_model，j 是列号（0, 1, 2, …）："
        "这样每列一个频率，列号又被乘了 2。"
        "公式里的 2i 本身就是每对的偶数列号（0, 2, 4, …）："
        "torch.arange(0, d_model, 2) / d_model，同一对 (2i, 2i+1) 共享这个频率。",
        "per_column_2j",
    ),
    (
        "指数 2i/d_model 用了整数除法（// 或整数张量相除），结果全是 0："
        "先转成浮点，torch.arange(0, d_model, 2).float() / d_model。",
        "int_div",
    ),
]


def _base_hint(out: Tensor, max_len: int, d: int) -> str | None:
    """If ``out`` is the table with the frequencies ``b^(−2i/d)`` of another base
    ``b``, what that base says (read from position 1, pair 1: ``b^(−2/d)``)."""
    if max_len < 2 or d < 4:
        return None
    angle = math.atan2(float(out[1, 2]), float(out[1, 3]))
    if not 0 < angle < 1:  # b^(−2/d) for a base b > 1
        return None
    base = angle ** (-d / 2)
    if not close(out, _pe_variant(max_len, d, "", base), 1e-4, 1e-4):
        return None
    # The same table is 10000^(−2i/d') for a denominator d'; a slip in the
    # denominator is likelier than another base.
    denominator = -2 * math.log(10000.0) / math.log(angle)
    slips = ((d - 1, "d_model − 1"), (d + 1, "d_model + 1"), (d / 2, "d_model / 2"))
    for value, written in slips:
        if abs(denominator - value) < 1e-3:
            return (
                f"指数的分母是 {written}（= {value:g}），应是 d_model：频率为 "
                "10000^(−2i/d_model)，即 torch.arange(0, d_model, 2) / d_model。"
            )
    if abs(base - math.e) < 1e-3:
        return (
            "频率的底成了 e：exp(−2i/d_model) 里少了 ln 10000。应为 "
            "exp(−(2i/d_model)·ln 10000) = 10000^(−2i/d_model)（math.log(10000.0)）。"
        )
    return f"频率的底是 {base:.4g}，应是 10000：位置除以 10000^(2i/d_model)。"


@checker("正弦位置编码")
def check_sinusoidal_encoding(fn: Callable) -> str:
    """Grade ``fn(max_len, d_model)``: the sinusoidal table ``(max_len, d_model)`` with
    ``PE[p, 2i] = sin(p / 10000^(2i/d))`` and ``PE[p, 2i+1] = cos(p / 10000^(2i/d))``.
    Compared with :func:`transformer_course.sinusoidal_table`."""
    name = name_of(fn)
    for i, (max_len, d) in enumerate(((7, 8), (1, 2), (50, 16), (11, 6))):
        case = f"max_len={max_len}, d_model={d}"
        refused = (
            f"{name}：不要直接调用 tc.sinusoidal_table（那就是参考答案）：按公式用 "
            "torch.arange、幂和 sin/cos 自己算出每个位置、每一维。"
        )
        with calls_refused((sinusoidal_table,), refused):
            out = run_learner(fn, max_len, d, what=name, case=case, first=i == 0)
        out = as_tensor(out, name, case)
        if tuple(out.shape) == (d, max_len) and d != max_len:
            fail(
                f"{name}({max_len}, {d}) 的形状是 {tuple(out.shape)}：行和列反了，"
                f"应为 (max_len, d_model) = {(max_len, d)}，每行是一个位置。"
            )
        check_shape(
            out, (max_len, d), f"{name}({max_len}, {d})", "", " 行是位置，列是维度。"
        )
        check_float(out, f"{name}({max_len}, {d})")
        ref = sinusoidal_table(max_len, d, dtype=torch.float64)
        if close(out, ref, 1e-4, 1e-4):
            continue
        hint = first_reproduced(
            out, PE_HINTS, functools.partial(_pe_variant, max_len, d), 1e-4, 1e-4
        ) or _base_hint(out.detach().double(), max_len, d)
        fail(
            f"{name}({max_len}, {d}) 与参考不一致（{where_differs(out, ref)}）。"
            + (
                f"\n可能的原因：{hint}"
                if hint
                else "\n对照公式：PE[p, 2i] = sin(p / 10000^(2i/d))，"
                "PE[p, 2i+1] = cos(p / 10000^(2i/d))。"
            )
        )
    return "max_len × d_model = 7×8, 1×2, 50×16, 11×6"


# rotary position embedding


def _rope_variant(x: Tensor, mistake: str) -> Tensor:
    """RoPE (interleaved pairs, positions along dim -2) with one typical mistake."""
    D = x.size(-1)
    two_i = torch.arange(0, D, 2, dtype=torch.float64)
    freq = 10000.0 ** (-(two_i / 2 if mistake == "exp_i" else two_i) / D)
    if mistake == "pos_heads":  # the angle of head h instead of position l
        pos = torch.arange(x.size(1), dtype=torch.float64)[:, None, None]
    else:
        pos = torch.arange(x.size(-2), dtype=torch.float64)[:, None]
    if mistake == "pos1":
        pos = pos + 1
    angles = pos * freq
    if mistake == "angles_reshaped":  # a (D/2, L) table reshaped, not transposed
        angles = angles.T.reshape(angles.shape)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    if mistake == "reversed":
        sin = -sin
    if mistake == "swap_sin_cos":
        cos, sin = sin, cos
    if mistake == "halves":
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    r1, r2 = x1 * cos - x2 * sin, x1 * sin + x2 * cos
    if mistake == "cat":
        return torch.cat([r1, r2], dim=-1)
    return torch.stack([r1, r2], dim=-1).flatten(-2)


ROPE_HINTS = [
    (
        "配对方式不对：本约定是相邻两维 (2i, 2i+1) 一对（交错，x[..., 0::2] 与 "
        "x[..., 1::2]），你用的是前后两半 (i, i + D/2)。",
        "halves",
    ),
    (
        "旋转后要按 (2i, 2i+1) 交错放回"
        "（torch.stack([…], dim=-1).flatten(-2)），"
        "不是前后拼接（torch.cat）。",
        "cat",
    ),
    (
        "旋转方向反了：x₁' = x₁·cos − x₂·sin，x₂' = x₁·sin + x₂·cos。",
        "reversed",
    ),
    ("位置应从 0 开始：第 0 个位置不旋转（torch.arange(L)）。", "pos1"),
    (
        "频率写错了：θ_i = 10000^(−2i/D)，i 是维度对的编号"
        "（torch.arange(0, D, 2) / D 即是 2i/D）。",
        "exp_i",
    ),
    (
        "位置应沿倒数第二维 L 数（x 的形状是 (N, H, L, D) = {shape}），"
        "你用的是头的编号。",
        "pos_heads",
    ),
    (
        "cos 和 sin 用反了：x₁' = x₁·cos − x₂·sin，x₂' = x₁·sin + x₂·cos。",
        "swap_sin_cos",
    ),
    (
        "角度表的行和列对不上：表应是 (L, D/2)，第 m 行第 i 列是 m·θ_i（行是位置，"
        "列是维度对）。你的表像是先算成 (D/2, L)、再 reshape 成 (L, D/2)：reshape "
        "只按内存顺序重新切分，不交换轴。用转置 .T，或直接 "
        "positions[:, None] * theta[None, :]。",
        "angles_reshaped",
    ),
]


def _rotations(x: Tensor, out: Tensor) -> Tensor | None:
    """The unit complex numbers ``(L, D/2)`` by which ``out`` turns each pair
    ``(2i, 2i+1)`` of ``x`` at each position, if ``out`` is such a rotation, the same
    for every batch row and head; else None."""

    def pairs(t: Tensor) -> Tensor:  # (N, H, L, D) -> (N, H, L, D/2) complex
        return torch.view_as_complex(t.double().reshape(*t.shape[:-1], -1, 2))

    z = pairs(out.detach()) / pairs(x)
    first = z[0, 0].expand_as(z)
    if torch.allclose(z, first, atol=1e-4) and torch.allclose(
        z[0, 0].abs(), torch.ones(()).double(), atol=1e-4
    ):
        return z[0, 0]
    return None


def _angle_table_hint(z: Tensor) -> str | None:
    """What is wrong in the angle table of the rotations ``z (L, D/2)``: the
    frequencies (the angles grow with the position, at the wrong rates), or the
    positions (each row is the right table's row of another position)."""
    L, pairs = z.shape
    D = 2 * pairs
    theta = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)

    def turns(positions: Tensor, rates: Tensor) -> Tensor:
        return torch.polar(torch.ones(()).double(), positions[:, None] * rates)

    m = torch.arange(L, dtype=torch.float64)
    if L > 1 and torch.allclose(z, turns(m, z[1].angle()), atol=1e-4):
        i = int((z[1] - turns(m[1:2], theta)[0]).abs().argmax())
        return (
            f"位置是对的（角度与位置 m 成正比），频率不对：第 i 对每前进一个位置应转 "
            f"θ_i = 10000^(−2i/D) 弧度，你的第 {i} 对转了 {float(z[1, i].angle()):.4g}"
            f"（应为 {float(theta[i]):.4g}）。"
        )
    table = turns(torch.arange(2 * L + 2, dtype=torch.float64), theta)
    used = []
    for row in z:
        same = (table - row).abs().amax(-1) < 1e-4
        if not bool(same.any()):
            return None
        used.append(int(same.nonzero()[0]))
    return (
        f"频率是对的，位置不对：第 0..{L - 1} 行用的是位置 {used} 的角度，"
        "应是 0, 1, …, L − 1（torch.arange(L)，沿倒数第二维 L 数）。"
    )


@checker("旋转位置编码 RoPE")
def check_rope(fn: Callable) -> str:
    """Grade ``fn(x)``: rotary position embedding of ``x (N, H, L, D)``, D even.

    Feature pair ``(2i, 2i+1)`` of the vector at position ``m`` (``m = 0..L-1``, along
    dim -2) is rotated by the angle ``m · 10000^(-2i/D)``:
    ``(x₁, x₂) -> (x₁ cos − x₂ sin, x₁ sin + x₂ cos)``. Returns a tensor of the shape of
    ``x``. Compared with :class:`transformer_course.RotaryEmbedding` (its default,
    interleaved pairs).
    """
    name = name_of(fn)
    g = seeded_generator(6)
    shapes = ((2, 3, 5, 8), (1, 2, 7, 4), (2, 1, 1, 6), (3, 2, 9, 2))
    for i, shape in enumerate(shapes):
        case = f"x {shape}"
        x = randn(g, *shape)
        out = as_tensor(
            run_learner(fn, x.clone(), what=name, case=case, first=i == 0), name, case
        )
        check_shape(out, shape, f"{name} 的输出", case, " RoPE 只旋转，不改变形状。")
        check_float(out, f"{name} 的输出")
        ref = RotaryEmbedding(shape[-1])(x)
        if close(out, ref):
            continue
        hint = first_reproduced(
            out, ROPE_HINTS, functools.partial(_rope_variant, x), shape=shape
        )
        z = _rotations(x, out) if hint is None else None
        if z is not None:
            hint = _angle_table_hint(z)
        if hint is None:
            norms = out.detach().double().norm(dim=-1)
            if not torch.allclose(norms, x.double().norm(dim=-1), rtol=1e-4):
                hint = (
                    "旋转不改变向量的长度，你的输出却改变了它：检查每一对用的是"
                    "同一个角度的 cos 和 sin，且 cos² + sin² = 1。"
                )
            else:
                hint = (
                    "对照公式：第 m 个位置、第 i 对 (x[2i], x[2i+1]) 旋转角度 "
                    "m · 10000^(−2i/D)。"
                )
        fail(
            f"{name} 的输出与参考（tc.RotaryEmbedding）不一致（{case}；"
            f"{where_differs(out, ref)}）。\n可能的原因：{hint}"
        )
    return "4 种形状 (N, H, L, D)，含 L = 1 与 D = 2"


# a rank-D projection whose scores depend on the distance only (ch03, exercise 3.13)

PROJECTION_E, PROJECTION_D = 64, 8  # the exercise's d_model and head dimension
_POSITIONS = 12000  # p = 0..: long enough that the lowest frequency turns a radian
_OFFSETS = (1, 7, 40, 1000)
_RTOL = 1e-5  # relative to |M|·E/2, the largest a score can be

PROJECTION_HINTS = [
    (
        "M 几乎处处非零（{count} 个 2×2 块把不同频率的维度混在一起）：像是随机的 "
        "W_q、W_k。只依赖距离的 M 是块对角的：W_q、W_k 只挑出若干对维度 "
        "(2i, 2i+1)（同一频率 ω_i 的 sin 和 cos），在每一对上做缩放乘旋转。",
        "random",
    ),
    (
        "M 在第 {i} 对维度 ({i0}, {i1}) 与第 {j} 对 ({j0}, {j1}) 之间有非零的 2×2 块"
        "（这样的块共 {count} 个）：不同频率的维度不能混合，M 应是块对角的。"
        "编码表是交错排列的：第 2i、2i+1 维是同一频率 ω_i 的 sin 和 cos。",
        "mixed",
    ),
    (
        "第 {i} 对维度 ({i0}, {i1}) 上的 2×2 块 {block} 的秩为 1：这一对只用到了"
        "其中一维。sin 和 cos 两维要成对挑出：第 2i、2i+1 维（同一频率 ω_i）一起选，"
        "选出的维度不要错开一位。",
        "half_pair",
    ),
    (
        "第 {i} 对维度 ({i0}, {i1}) 上的 2×2 块 {block} 不是缩放乘旋转 "
        "[[a, b], [−b, a]]：它含反射的部分（两个对角元不相等，或两个副对角元"
        "不互为相反数），分数随 p 按 2ω_{i} 的频率变化。",
        "reflection",
    ),
]


def _projection(W: object, what: str) -> Tensor:
    """The learner's ``W`` as a float64 ``(E, D)`` tensor."""
    E, D = PROJECTION_E, PROJECTION_D
    try:
        W = torch.as_tensor(W).detach().double()
    except (TypeError, ValueError, RuntimeError):
        fail(f"{what} 应是形状 ({E}, {D}) 的张量，得到 {type(W).__name__}。")
    if tuple(W.shape) == (D, E):
        fail(
            f"{what} 的形状是 {(D, E)}：转置了。投影 W 是 E × D = {E} × {D} 的矩阵"
            "（每行对应一个模型维度），M = W_q W_kᵀ 才是 E × E。"
        )
    check_shape(W, (E, D), what, "", f" 投影是 (E, D) = ({E}, {D})。")
    if not bool(torch.isfinite(W).all()):
        fail(f"{what} 含 NaN 或 inf。")
    return W


def _projection_mistake(M: Tensor) -> tuple[str, dict]:
    """Which part of ``M`` makes the scores depend on p: blocks mixing two frequency
    pairs (many of them: a random projection), or a diagonal block with a reflection
    (of rank 1: one dimension of a pair)."""
    pairs = M.size(0) // 2
    blocks = M.view(pairs, 2, pairs, 2).transpose(1, 2)  # (i, j, 2, 2)
    tol = _RTOL * float(M.norm())
    off = blocks.norm(dim=(-2, -1)).fill_diagonal_(0) > tol
    count = int(off.sum())
    if count > pairs * (pairs - 1) // 2:
        return "random", {"count": count}
    if count:
        i, j = (int(k) for k in off.nonzero()[0])
        return "mixed", {"i": i, "j": j, "i0": 2 * i, "i1": 2 * i + 1,
                         "j0": 2 * j, "j1": 2 * j + 1, "count": count}  # fmt: skip
    diagonal = blocks[range(pairs), range(pairs)]  # (pairs, 2, 2)
    # a 2×2 block is a + b·J (rotation-scaling) plus c·R + d·RJ (a reflection)
    c = (diagonal[:, 0, 0] - diagonal[:, 1, 1]) / 2
    d = (diagonal[:, 0, 1] + diagonal[:, 1, 0]) / 2
    i = int(torch.hypot(c, d).argmax())
    block = [[round(float(x), 3) for x in row] for row in diagonal[i]]
    # rank 1: one dimension of the pair (a = ±c, b = ±d: as much reflection as
    # rotation-scaling)
    half = abs(float(torch.linalg.det(diagonal[i]))) <= tol * float(M.norm())
    fmt = {"i": i, "i0": 2 * i, "i1": 2 * i + 1, "block": block}
    return ("half_pair" if half else "reflection"), fmt


@checker("只依赖距离的投影", values=("W_q", "W_k"))
def check_distance_only_projection(W_q: object, W_k: object) -> str:
    """Grade ``W_q, W_k``: two ``(64, 8)`` projections (E = 64, D = 8) whose
    ``M = W_q W_kᵀ`` (rank at most D by its shape) gives projected scores
    ``PE_pᵀ M PE_(p+k)`` on the sinusoidal table that do not depend on ``p``, for
    several distances ``k``; ``M = 0`` is refused as trivial. Any such ``M`` is
    accepted: any choice of frequency pairs, scales and rotation directions."""
    missing = [n for n, W in (("W_q", W_q), ("W_k", W_k)) if W is None]
    if missing:
        raise Skeleton("、".join(missing), "还是 None")
    W_q, W_k = _projection(W_q, "W_q"), _projection(W_k, "W_k")
    M = W_q @ W_k.T  # (E, E)
    if float(M.norm()) <= 1e-6 * float(W_q.norm() * W_k.norm()):
        fail(
            "M = W_q W_kᵀ 是零矩阵（W_q 或 W_k 为零，或两者的列互相正交）："
            "分数恒为 0，与 p 无关，这个头却什么也看不到。请构造非零的 M。"
        )
    E = PROJECTION_E
    pe = sinusoidal_table(_POSITIONS, E, dtype=torch.float64)
    for k in _OFFSETS:
        scores = ((pe[:-k] @ M) * pe[k:]).sum(-1)  # s(p, p + k) for every p
        spread = float(scores.max() - scores.min())
        if spread <= _RTOL * float(M.norm()) * E / 2:
            continue
        mistake, fmt = _projection_mistake(M)
        hint = next(h for h, m in PROJECTION_HINTS if m == mistake).format(**fmt)
        fail(
            f"距离 k = {k} 时，投影后的分数 PE_pᵀ M PE_(p+k) 随 p 变化"
            f"（p = 0..{_POSITIONS - k - 1}，最大与最小相差 {spread:.3g}）：{hint}"
        )
    rank = int(torch.linalg.matrix_rank(M))
    return (
        f"M 的秩为 {rank} ≤ D = {PROJECTION_D}；距离 k = "
        f"{', '.join(map(str, _OFFSETS))} 时分数与 p 无关"
    )
