"""Positional information: the sinusoidal table, learned position embeddings and
rotary embeddings (RoPE), plus the rotation ``T_k`` that shifts a sinusoidal encoding
by ``k``."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ._validate import check_int, check_positive_int

__all__ = [
    "POSITIONAL_ENCODINGS",
    "build_positional",
    "sinusoidal_table",
    "relative_position_transform",
    "SinusoidalPositionalEncoding",
    "LearnedPositionalEmbedding",
    "RotaryEmbedding",
]


POSITIONAL_ENCODINGS = ("sinusoidal", "learned", "rope", "none")


def _check_even(name: str, value: int) -> None:
    if value % 2:
        raise ValueError(
            f"{name} must be even (dimensions come in sin/cos pairs), got {value}"
        )


def _inverse_frequencies(dim: int, base: float) -> Tensor:
    """``w_i = base^(-2i/dim)`` for ``i = 0 .. dim/2 - 1``, in float64."""
    if base <= 1.0:
        raise ValueError(f"base must be > 1, got {base}")
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def sinusoidal_table(
    max_len: int,
    d_model: int,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """The table of Vaswani et al. (2017), shape ``(max_len, d_model)``:

    ``PE[p, 2i] = sin(p · w_i)``, ``PE[p, 2i+1] = cos(p · w_i)`` with
    ``w_i = base^(-2i/d_model)``. Computed in float64 and cast to ``dtype``.
    """
    check_positive_int("max_len", max_len)
    check_positive_int("d_model", d_model)
    _check_even("d_model", d_model)
    # (max_len, d/2), float64
    angles = torch.arange(max_len)[:, None] * _inverse_frequencies(d_model, base)
    # (max_len, d/2, 2): (sin, cos) pairs
    pe = torch.stack([angles.sin(), angles.cos()], dim=-1)
    # (max_len, d/2, 2) -> (max_len, d_model), interleaved
    return pe.flatten(1).to(dtype)


def relative_position_transform(
    k: int, d_model: int, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> Tensor:
    """The matrix ``T_k`` with ``PE[p + k] = T_k @ PE[p]`` for every position ``p``.

    It is block diagonal; block ``i`` acts on the pair ``(sin, cos)`` of frequency
    ``w_i`` as ``[[cos(k w_i), sin(k w_i)], [-sin(k w_i), cos(k w_i)]]`` (angle addition
    formulas), so it depends on the offset ``k`` only, never on ``p``. ``k`` may be
    negative.
    """
    check_int("k", k)  # any int: negative offsets look back
    check_positive_int("d_model", d_model)
    _check_even("d_model", d_model)
    phi = k * _inverse_frequencies(d_model, base)
    c, s = phi.cos(), phi.sin()
    # (d/2, 2, 2)
    blocks = torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], -1)], -2)
    return torch.block_diag(*blocks).to(dtype)


def _check_offset(offset: int) -> None:
    check_int("offset", offset, 0)


def _check_sequence(x: Tensor, offset: int, max_len: int, what: str) -> None:
    _check_offset(offset)
    if offset + x.size(-2) > max_len:
        raise ValueError(
            f"positions {offset}..{offset + x.size(-2) - 1} exceed the {what} "
            f"of length {max_len}"
        )


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal table to ``x`` of shape ``(N, L, E)``.

    The table is the buffer ``pe`` of shape ``(max_len, d_model)`` (default
    ``max_len=5000``, ``base=10000``), recomputed on construction rather than saved in
    the ``state_dict``; ``forward(x, offset)`` adds rows ``offset .. offset + L - 1``
    (``offset`` is the number of earlier, cached positions).
    """

    def __init__(
        self, d_model: int, max_len: int = 5000, base: float = 10000.0
    ) -> None:
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.register_buffer(
            "pe", sinusoidal_table(max_len, d_model, base), persistent=False
        )

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        if x.size(-1) != self.d_model:
            raise ValueError(
                f"last dim of x must be d_model={self.d_model}, got {tuple(x.shape)}"
            )
        _check_sequence(x, offset, self.max_len, "positional table")
        return x + self.pe[offset : offset + x.size(-2)].to(x.dtype)


class LearnedPositionalEmbedding(nn.Module):
    """A trainable vector per position (BERT, GPT-2); ``forward(x, offset)`` adds
    them to ``x``."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("max_len", max_len)
        self.d_model, self.max_len = d_model, max_len
        self.embedding = nn.Embedding(max_len, d_model)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        if x.size(-1) != self.d_model:
            raise ValueError(
                f"last dim of x must be d_model={self.d_model}, got {tuple(x.shape)}"
            )
        _check_sequence(x, offset, self.max_len, "position embedding table")
        # rows of positions offset .. offset+L-1
        return x + self.embedding.weight[offset : offset + x.size(-2)]


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE, Su et al. 2021)
    for vectors of size ``head_dim``.

    Feature pair ``i`` of the vector at position ``m`` is rotated by the angle
    ``m · w_i`` with ``w_i = base^(-2i/head_dim)``. Rotating both queries and keys makes
    ``q_mᵀ k_n`` depend on the positions only through ``m - n``.

    Pairing: ``interleaved=True`` (default, as in the RoFormer paper and in the
    sinusoidal table) pairs features ``(2i, 2i+1)``; ``interleaved=False`` pairs
    ``(i, i + head_dim/2)`` (the "split halves" layout of GPT-NeoX/Llama code). The two
    differ by a fixed permutation of features.

    The buffers ``cos`` and ``sin`` of shape ``(max_len, head_dim/2)`` (default
    ``max_len=4096``) hold the angles of positions ``0 .. max_len - 1``; like the
    sinusoidal table they are recomputed on construction, not saved in the
    ``state_dict``, and grown when a position past them is asked for.
    """

    def __init__(
        self,
        head_dim: int,
        max_len: int = 4096,
        base: float = 10000.0,
        interleaved: bool = True,
    ) -> None:
        super().__init__()
        check_positive_int("head_dim", head_dim)
        check_positive_int("max_len", max_len)
        _check_even("head_dim", head_dim)
        self.head_dim, self.max_len = head_dim, max_len
        self.interleaved, self.base = interleaved, base
        # (max_len, D/2), float64
        angles = torch.arange(max_len)[:, None] * _inverse_frequencies(head_dim, base)
        # (max_len, D/2) each
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def _cos_sin(self, offset: int, L: int, x: Tensor) -> tuple[Tensor, Tensor]:
        """cos and sin of the angles of positions ``offset .. offset + L - 1``,
        each ``(L, D/2)``.

        A position past the table (a rolling KV cache keeps counting) grows the table to
        at least twice its size, so that a long generation computes it a few times, not
        once per step and layer.
        """
        if offset + L > self.max_len:
            self._grow(max(offset + L, 2 * self.max_len))
        return (
            self.cos[offset : offset + L].to(x.dtype),
            self.sin[offset : offset + L].to(x.dtype),
        )

    def _grow(self, size: int) -> None:
        """Recompute the ``cos``/``sin`` buffers for positions ``0 .. size - 1``."""
        # (size, D/2), float64
        inverse = _inverse_frequencies(self.head_dim, self.base)
        angles = torch.arange(size)[:, None] * inverse
        self.cos = angles.cos().to(self.cos.device, torch.float32)
        self.sin = angles.sin().to(self.sin.device, torch.float32)
        self.max_len = size

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """Rotate ``x`` of shape ``(..., L, head_dim)`` whose first row sits at
        position ``offset``.

        Any non-negative ``offset`` works: a position past ``max_len`` grows the table.
        """
        if x.size(-1) != self.head_dim:
            raise ValueError(
                f"last dim of x must be head_dim={self.head_dim}, got {tuple(x.shape)}"
            )
        _check_offset(offset)
        cos, sin = self._cos_sin(offset, x.size(-2), x)  # (L, D/2) each
        if self.interleaved:
            x1, x2 = x[..., 0::2], x[..., 1::2]  # (..., L, D/2) each
            return torch.stack(
                [x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1
            ).flatten(-2)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def build_positional(
    kind: str, dim: int, max_len: int, base: float = 10000.0
) -> nn.Module | None:
    """The positional module named ``kind`` (one of :data:`POSITIONAL_ENCODINGS`),
    like ``build_norm``.

    ``"sinusoidal"`` and ``"learned"`` return a module that adds positions to embeddings
    of size ``dim`` (``d_model``); ``"rope"`` returns a :class:`RotaryEmbedding` for
    vectors of size ``dim`` (``head_dim``) that attention applies to queries and keys;
    ``"none"`` returns ``None``.
    """
    if kind == "sinusoidal":
        return SinusoidalPositionalEncoding(dim, max_len, base=base)
    if kind == "learned":
        return LearnedPositionalEmbedding(dim, max_len)
    if kind == "rope":
        return RotaryEmbedding(dim, max_len, base=base)
    if kind == "none":
        return None
    raise ValueError(
        f"unknown positional encoding {kind!r}; expected one of {POSITIONAL_ENCODINGS}"
    )
