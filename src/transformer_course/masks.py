"""Attention masks.

Convention used everywhere in this package (the one of ``F.scaled_dot_product_attention``):

* a **boolean** mask is ``True`` where a query **may attend** to a key;
* a **float** mask is **added** to the scores: ``0`` keeps a position, ``-inf`` removes it.

``nn.MultiheadAttention`` and ``nn.Transformer`` use the opposite boolean convention
(``True`` = blocked); :func:`to_torch_mask` is the one place that converts.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .utils import check_positive_int

__all__ = ["causal_mask", "padding_mask", "to_torch_mask", "bool_to_additive", "check_mask"]



def causal_mask(L: int, S: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """Boolean causal mask of shape ``(L, S)``; ``True`` = may attend.

    The mask is aligned to the lower-right corner: query ``i`` (the ``i``-th of the last ``L``
    positions of a sequence of length ``S``) may see key ``j`` iff ``j <= i + (S - L)``.
    For ``L == S`` this is the usual lower-triangular matrix; for ``L < S`` it is what
    incremental decoding with a KV cache needs (the new queries sit at the end).
    """
    L = check_positive_int("L", L)
    S = L if S is None else check_positive_int("S", S)
    if S < L:
        raise ValueError(f"causal_mask needs S >= L (queries are the last L of S keys), got L={L}, S={S}")
    return torch.ones(L, S, dtype=torch.bool, device=device).tril(diagonal=S - L)


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Key-padding mask of shape ``(N, 1, 1, S)`` from token ids ``(N, S)``; ``True`` = real token.

    The two singleton dimensions broadcast over heads and queries, so the result can be combined
    with a causal mask by ``&``: ``padding_mask(t, 0) & causal_mask(S)`` has shape ``(N, 1, S, S)``.
    """
    if not isinstance(tokens, Tensor) or tokens.dim() != 2:
        shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"tokens must be a 2-D tensor (N, S), got {shape}")
    return (tokens != pad_id)[:, None, None, :]


def to_torch_mask(mask: Tensor) -> Tensor:
    """Convert our boolean mask (``True`` = may attend) to the ``nn.MultiheadAttention`` /
    ``nn.Transformer`` convention (``True`` = not allowed). Float (additive) masks mean the same
    thing in both APIs and are returned unchanged."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a tensor, got {type(mask).__name__}")
    if mask.dtype == torch.bool:
        return ~mask
    if mask.is_floating_point():
        return mask
    raise TypeError(f"mask must be bool or floating point, got dtype {mask.dtype}")


def bool_to_additive(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Boolean mask (``True`` = may attend) to an additive float mask (``0`` / ``-inf``)."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"bool_to_additive expects a bool tensor, got {got}")
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill(~mask, float("-inf"))


def check_mask(mask: Tensor, target_shape: tuple[int, ...]) -> None:
    """Raise ``ValueError`` unless ``mask`` broadcasts to ``target_shape`` (e.g. ``(N, H, L, S)``)."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"mask must be bool (True = may attend) or float (additive), got {mask.dtype}")
    try:
        shape = torch.broadcast_shapes(tuple(mask.shape), tuple(target_shape))
    except RuntimeError:
        shape = None
    if shape != tuple(target_shape):
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to {tuple(target_shape)}"
        )
