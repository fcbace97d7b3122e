"""Sparse normalisation for attention: sparsemax (Martins & Astudillo, 2016).

``softmax`` maps scores to a distribution in which every entry is strictly positive.
``sparsemax`` is the Euclidean projection of the scores onto the probability simplex,

    sparsemax(z) = argmin_{p in simplex} ||p - z||^2 = max(z - tau(z), 0),

where the threshold ``tau(z)`` is chosen so that the result sums to one. Entries below
the threshold become exactly zero, so an attention row can ignore keys completely.

Closed form (sort ``z`` in decreasing order as ``z_(1) >= ... >= z_(n)``)::

    k(z)   = max{k : 1 + k z_(k) > sum_{j <= k} z_(j)}
    tau(z) = (sum_{j <= k(z)} z_(j) - 1) / k(z)

Its Jacobian is ``diag(s) - s s^T / |S|`` with ``s`` the 0/1 indicator of the support
``S = {i : p_i > 0}``, so the backward pass is ``g_in = s * (g_out - mean_S(g_out))``.

Scores equal to ``-inf`` (masked keys) never enter the support. A slice whose scores are
all ``-inf`` (a fully masked query row) gives all zeros, like
:func:`transformer_course.attention.scaled_dot_product_attention`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._validate import check_qkv

__all__ = [
    "SparsemaxFunction",
    "sparsemax",
    "sparsemax_attention",
    "sparsemax_threshold",
]


def _check_input(input: Tensor, dim: int) -> int:
    """Validate ``input`` and ``dim``; return ``dim`` as a non-negative index."""
    if not isinstance(input, Tensor):
        raise TypeError(f"input must be a torch.Tensor, got {type(input).__name__}")
    if not input.is_floating_point():
        raise ValueError(f"input must have a floating dtype, got dtype={input.dtype}")
    if input.dim() == 0:
        raise ValueError("input must have at least one dimension, got a 0-d tensor")
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    if not -input.dim() <= dim < input.dim():
        raise ValueError(
            f"dim={dim} is out of range for a tensor with {input.dim()} dimensions"
        )
    dim = dim % input.dim()
    if input.shape[dim] == 0:
        raise ValueError(
            f"input has size 0 along dim={dim} (shape {tuple(input.shape)})"
        )
    if torch.isnan(input).any():
        raise ValueError("input contains NaN")
    if torch.isposinf(input).any():
        raise ValueError("input contains +inf; only -inf (masked entries) is allowed")
    return dim


def _threshold(z: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    """Return ``(tau, k)`` along ``dim`` (kept as a size-1 dim);
    ``k == 0`` for all -inf slices."""
    z_sorted, _ = torch.sort(z, dim=dim, descending=True)
    n = z.shape[dim]
    shape = [1] * z.dim()
    shape[dim] = n
    ks = torch.arange(1, n + 1, device=z.device, dtype=z.dtype).view(shape)
    cumsum = z_sorted.cumsum(dim)
    # -inf entries: 1 + k * (-inf) = -inf is never > cumsum,
    # so they stay out of the support.
    in_support = (1 + ks * z_sorted) > cumsum
    # support size k(z), 0 for an all -inf slice
    k = in_support.sum(dim=dim, keepdim=True)
    k_safe = k.clamp(min=1)
    top_sum = cumsum.gather(dim, k_safe - 1)
    tau = (top_sum - 1) / k_safe.to(z.dtype)
    # An all -inf slice: put tau at +inf so that max(z - tau, 0) is 0 everywhere.
    tau = torch.where(k == 0, torch.full_like(tau, math.inf), tau)
    return tau, k


def sparsemax_threshold(input: Tensor, dim: int = -1) -> Tensor:
    """Closed-form sparsemax threshold ``tau(z)`` along ``dim``
    (that dim kept with size 1).

    ``sparsemax(z) == clamp(z - tau(z), min=0)``. For a slice whose entries are all
    ``-inf`` the threshold is ``+inf``. Raises ``ValueError`` for non-floating input,
    NaN, ``+inf``, an empty ``dim`` or an out-of-range ``dim``.
    """
    dim = _check_input(input, dim)
    tau, _ = _threshold(input.detach(), dim)
    return tau


class SparsemaxFunction(torch.autograd.Function):
    """Autograd function for sparsemax with the closed-form backward pass.

    ``forward(ctx, input, dim)`` with ``dim`` already a non-negative index; use
    :func:`sparsemax` which validates its arguments.
    """

    @staticmethod
    def forward(ctx, input: Tensor, dim: int) -> Tensor:  # type: ignore[override]
        tau, _ = _threshold(input, dim)
        output = torch.clamp(input - tau, min=0)
        ctx.dim = dim
        ctx.save_for_backward(output)
        return output

    @staticmethod
    def backward(ctx, grad_output: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        (output,) = ctx.saved_tensors
        dim = ctx.dim
        support = (output > 0).to(grad_output.dtype)
        size = support.sum(dim=dim, keepdim=True).clamp(min=1)
        mean_on_support = (grad_output * support).sum(dim=dim, keepdim=True) / size
        grad_input = support * (grad_output - mean_on_support)
        return grad_input, None


def sparsemax(input: Tensor, dim: int = -1) -> Tensor:
    """Sparsemax of ``input`` along ``dim``: the Euclidean projection onto the simplex.

    Every slice along ``dim`` sums to 1 and entries below the threshold are exactly 0.
    ``-inf`` entries (masked) get 0; an all ``-inf`` slice gives all zeros.
    Differentiable (closed-form Jacobian). Raises ``ValueError`` for non-floating input,
    NaN, ``+inf``, an empty ``dim`` or an out-of-range ``dim``; ``TypeError`` if
    ``input`` is not a tensor.

    >>> sparsemax(torch.tensor([2.0, 1.0, -1.0]))
    tensor([1., 0., 0.])
    >>> sparsemax(torch.tensor([1.0, 0.6, -0.5]))
    tensor([0.7000, 0.3000, 0.0000])
    """
    dim = _check_input(input, dim)
    return SparsemaxFunction.apply(input, dim)


def sparsemax_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention with sparsemax in place of softmax.

    Shapes: query (..., L, D), key (..., S, D), value (..., S, Dv) -> output
    (..., L, Dv), weights (..., L, S). ``attn_mask``: a bool mask (True = may attend) or
    a float additive mask (0 / ``-inf``), broadcastable to (..., L, S). ``scale``
    defaults to ``1 / sqrt(D)``.
    A fully masked query row gets all-zero weights and a zero output row.
    Raises ``ValueError`` for mismatched shapes or a non-broadcastable mask.
    """
    check_qkv(query, key, value)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    elif scale <= 0:
        raise ValueError(f"scale must be positive, got scale={scale}")
    scores = (query @ key.transpose(-2, -1)) * scale  # (..., L, S)
    if attn_mask is not None:
        try:
            torch.broadcast_shapes(attn_mask.shape, scores.shape)
        except RuntimeError as err:
            raise ValueError(
                f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
                f"the scores of shape {tuple(scores.shape)}"
            ) from err
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, -math.inf)
        else:
            scores = scores + attn_mask
    weights = sparsemax(scores, dim=-1)
    return weights @ value, weights
