"""Attention masks.

Convention used everywhere in this package (the one of
``F.scaled_dot_product_attention``):

* a **boolean** mask is ``True`` where a query **may attend** to a key;
* a **float** mask is **added** to the scores: ``0`` keeps a position, ``-inf`` removes
  it.

``nn.MultiheadAttention`` and ``nn.Transformer`` use the opposite boolean convention
(``True`` = blocked); :func:`to_torch_mask` is the one place that converts.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._validate import check_positive_int, describe

__all__ = [
    "causal_mask",
    "padding_mask",
    "to_torch_mask",
    "bool_to_additive",
    "check_mask",
    "merge_masks",
]


def causal_mask(
    L: int,
    S: int | None = None,
    device: torch.device | str | None = None,
    window: int | None = None,
) -> Tensor:
    """Boolean causal mask of shape ``(L, S)``; ``True`` = may attend.

    The mask is aligned to the lower-right corner: query ``i`` (the ``i``-th of the last
    ``L`` positions of a sequence of length ``S``) may see key ``j`` iff
    ``j <= i + (S - L)``. For ``L == S`` this is the usual lower-triangular matrix; for
    ``L < S`` it is what incremental decoding with a KV cache needs (the new queries sit
    at the end). This is the one meaning of "causal" (and of ``is_causal=True``)
    everywhere in the package.

    ``window`` (sliding-window attention) also hides keys more than ``window - 1``
    positions back: query ``i`` sees ``i + (S - L) - window < j <= i + (S - L)``, at
    most ``window`` keys.
    """
    S = L if S is None else S
    _check_causal_sizes(L, S, window)
    mask = torch.ones(L, S, dtype=torch.bool, device=device).tril(diagonal=S - L)
    if window is not None:  # hide keys more than window - 1 positions back
        mask = mask.triu(diagonal=S - L - window + 1)
    return mask


def _check_causal_sizes(L: int, S: int, window: int | None) -> None:
    check_positive_int("L", L)
    check_positive_int("S", S)
    if S < L:
        raise ValueError(
            "causal_mask needs S >= L (queries are the last L of S keys), "
            f"got L={L}, S={S}"
        )
    if window is not None:
        check_positive_int("window", window)


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Key-padding mask of shape ``(N, 1, 1, S)`` from token ids ``(N, S)``;
    ``True`` = real token.

    The two singleton dimensions broadcast over heads and queries, so the result can be
    combined with a causal mask by ``&``: ``padding_mask(t, 0) & causal_mask(S)`` has
    shape ``(N, 1, S, S)``.
    """
    if not isinstance(tokens, Tensor):
        raise TypeError(f"tokens must be a 2-D tensor (N, S), got {describe(tokens)}")
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be a 2-D tensor (N, S), got {describe(tokens)}")
    return (tokens != pad_id)[:, None, None, :]


def to_torch_mask(mask: Tensor) -> Tensor:
    """Convert our boolean mask (``True`` = may attend) to the
    ``nn.MultiheadAttention`` / ``nn.Transformer`` convention (``True`` = not allowed).
    Float (additive) masks mean the same thing in both APIs and are returned
    unchanged."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a tensor, got {type(mask).__name__}")
    if mask.dtype == torch.bool:
        return ~mask
    if mask.is_floating_point():
        return mask
    raise TypeError(f"mask must be bool or floating point, got dtype {mask.dtype}")


def bool_to_additive(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Boolean mask (``True`` = may attend) to an additive float mask
    (``0`` / ``-inf``)."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"bool_to_additive expects a bool tensor, got {describe(mask)}")
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill(~mask, float("-inf"))


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether ``shape`` broadcasts to exactly ``target`` (not to a larger shape)."""
    try:
        return torch.broadcast_shapes(shape, target) == target
    except RuntimeError:  # not broadcastable at all
        return False


def check_mask(
    mask: Tensor, target_shape: tuple[int, ...], check_values: bool = True
) -> None:
    """Raise unless ``mask`` is bool or float and broadcasts to ``target_shape``
    (e.g. ``(N, H, L, S)``).

    With ``check_values`` a float mask holding ``NaN`` or ``+inf`` raises ``ValueError``
    (either would turn the softmax into ``NaN``); this reads the mask's values, a host
    synchronisation on an accelerator, so callers on a hot path (every layer, every
    decoding step) skip it.
    """
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(
            "mask must be bool (True = may attend) or float (additive), "
            f"got {mask.dtype}"
        )
    if not _broadcasts_to(tuple(mask.shape), tuple(target_shape)):
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to "
            f"{tuple(target_shape)}"
        )
    if check_values and mask.is_floating_point() and mask.device.type != "meta":
        bad = torch.isnan(mask) | torch.isposinf(mask)
        if bool(bad.any()):
            raise ValueError(
                f"float mask holds {mask[bad][0].item()} at {int(bad.sum())} "
                "position(s); an additive mask may only hold finite values and -inf"
            )


def merge_masks(
    attn_mask: Tensor | None,
    L: int,
    S: int,
    is_causal: bool = False,
    window: int | None = None,
    device: torch.device | str | None = None,
) -> Tensor | None:
    """One mask for ``L`` queries (the last ``L`` of ``S`` positions) and ``S`` keys,
    or ``None``.

    Combines the caller's ``attn_mask`` (bool or additive float, any shape broadcastable
    to ``(..., L, S)``) with the causal mask (``is_causal``) and a sliding ``window``
    (see :func:`causal_mask`). A bool ``attn_mask`` stays bool (``&``); a float one
    stays float (``-inf`` where the structural mask hides a key). Returns ``None`` when
    nothing is hidden, e.g. for one query at the last position that may see all
    ``S <= window`` keys.
    """
    needs_window = window is not None and S > window
    if needs_window and not is_causal:  # the package only slides a causal window
        raise ValueError(f"a sliding window ({window}) needs is_causal=True")
    if not is_causal or (L == 1 and not needs_window):
        # one query at the last position sees every key: the causal mask is all True
        return attn_mask
    # causal_mask's window hides keys only when S > window, so it is passed on as it is
    structural = causal_mask(L, S, device=device, window=window)
    if attn_mask is None:
        return structural
    if attn_mask.dtype == torch.bool:
        return attn_mask & structural
    return attn_mask.masked_fill(~structural, float("-inf"))
