"""Efficient attention: small reference implementations of the ideas of section 10.

Three ways to avoid the (L, S) matrix of exact softmax attention:

* kernelised **linear attention** (Katharopoulos et al., 2020, "Transformers are RNNs",
  arXiv:2006.16236): the similarity exp(q . k / sqrt(D)) is replaced by phi(q) . phi(k)
  with the feature map phi(x) = elu(x) + 1, so that phi(Q) (phi(K)^T V) costs O(L D Dv)
  instead of O(L S D); the causal version is a recurrence (an RNN) over prefix sums;
* **sliding-window (local) attention** (as in Longformer, arXiv:2004.05150): query i
  only sees the ``window`` keys nearest to it (the last ``window`` when causal, as
  ``causal_mask(window=)``); ``local_attention`` computes it in O(L * window * D)
  without an (L, L) matrix, and ``sliding_window_mask`` gives the same pattern as a
  boolean mask for exact attention;
* **low-rank attention** (Linformer, arXiv:2006.04768): keys and values are projected
  along the sequence axis from length S to k, so the weights are (L, k) instead of
  (L, S).

Shapes use PyTorch's letters: query (..., L, D), key (..., S, D), value (..., S, Dv).
Boolean masks follow ``F.scaled_dot_product_attention``: True = may attend.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ._validate import (
    check_int,
    check_non_negative,
    check_positive_int,
    check_qk,
    check_qkv,
    check_tensor,
)

__all__ = [
    "elu_feature_map",
    "linear_attention",
    "linear_attention_recurrent",
    "linear_attention_weights",
    "local_attention",
    "low_rank_attention",
    "sliding_window_mask",
]

FeatureMap = Callable[[Tensor], Tensor]


def elu_feature_map(x: Tensor) -> Tensor:
    """The feature map phi(x) = elu(x) + 1 of Katharopoulos et al. (2020);
    strictly positive."""
    return F.elu(x) + 1.0


def _check_causal_lengths(q: Tensor, k: Tensor) -> None:
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(
            "causal linear attention and local attention need L == S "
            "(self-attention), "
            f"got L={q.shape[-2]} and S={k.shape[-2]}"
        )


def _check_self_attention(
    query: Tensor, key: Tensor, value: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`~transformer_course.utils.check_qkv` plus L == S."""
    q, k, v = check_qkv(query, key, value)
    _check_causal_lengths(q, k)
    return q, k, v


def linear_attention_weights(
    query: Tensor,
    key: Tensor,
    feature_map: FeatureMap = elu_feature_map,
    causal: bool = False,
) -> Tensor:
    """The (L, S) weight matrix that linear attention uses implicitly
    (quadratic reference).

    A[i, j] = phi(q_i) . phi(k_j) / sum_j' phi(q_i) . phi(k_j'), the sum running over
    j' <= i when ``causal`` (then L must equal S). Rows are non-negative and sum to one
    when phi > 0.

    Args:
        query: (..., L, D).
        key: (..., S, D).
        feature_map: phi, applied elementwise to the last dim; must return positive
            values.
        causal: if True, query i only weighs keys j <= i.

    Returns:
        weights (..., L, S). ``linear_attention(q, k, v) == weights @ v`` up to
        rounding.
    """
    q, k = check_qk(query, key)
    # (..., L, D) @ (..., D, S) -> (..., L, S)
    sim = feature_map(q) @ feature_map(k).transpose(-2, -1)
    if causal:
        _check_causal_lengths(q, k)
        L = q.shape[-2]
        keep = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
        sim = sim.masked_fill(~keep, 0.0)
    return sim / sim.sum(dim=-1, keepdim=True)


def linear_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    feature_map: FeatureMap = elu_feature_map,
    causal: bool = False,
    eps: float = 1e-6,
    chunk_size: int = 64,
) -> Tensor:
    """Kernelised linear attention of Katharopoulos et al. (2020),
    without an (L, S) matrix.

    out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j) + eps),
    with the sums over all j (non-causal) or over j <= i (causal; needs L == S).
    The non-causal form costs O(L D Dv) instead of the O(L S D) of softmax attention.
    The causal form is computed chunk by chunk: inside a chunk of ``chunk_size``
    positions the masked (C, C) kernel matrix is used, across chunks the running sums
    sum_j phi(k_j) v_j^T and sum_j phi(k_j) of all earlier chunks (the RNN state of
    :func:`linear_attention_recurrent`); cost O(L C D + L D Dv), memory linear in L.

    Args:
        query: (..., L, D).
        key: (..., S, D).
        value: (..., S, Dv).
        feature_map: phi; the default elu(x) + 1 is strictly positive.
        causal: if True, output i only depends on positions j <= i (L must equal S).
        eps: added to the normaliser for numerical safety (>= 0; 0 gives the exact
            ratio).
        chunk_size: C, positions per chunk of the causal form (>= 1); does not change
            the result.

    Returns:
        output (..., L, Dv).
    """
    q, k, v = check_qkv(query, key, value)
    check_non_negative("eps", eps)
    check_int("chunk_size", chunk_size, 1)
    phi_q = feature_map(q)  # (..., L, D)
    phi_k = feature_map(k)  # (..., S, D)
    if causal:
        _check_causal_lengths(q, k)
        return _causal_linear_attention(phi_q, phi_k, v, eps, chunk_size)
    kv = phi_k.transpose(-2, -1) @ v  # (..., D, S) @ (..., S, Dv) -> (..., D, Dv)
    z = phi_k.sum(dim=-2)  # (..., S, D) -> (..., D)
    num = phi_q @ kv  # (..., L, D) @ (..., D, Dv) -> (..., L, Dv)
    den = phi_q @ z.unsqueeze(-1)  # (..., L, D) @ (..., D, 1) -> (..., L, 1)
    return num / (den + eps)


def _causal_linear_attention(
    phi_q: Tensor, phi_k: Tensor, v: Tensor, eps: float, chunk_size: int
) -> Tensor:
    """The causal form of :func:`linear_attention`, chunk by chunk (see there)."""
    L, C = phi_q.shape[-2], chunk_size
    nc = -(-L // C)  # number of chunks, ceil(L / C)
    extra = nc * C - L
    # padded query rows are 1 (finite, discarded): (..., nc, C, D)
    pq = F.pad(phi_q, (0, 0, 0, extra), value=1.0).unflatten(-2, (nc, C))
    # padded keys/values are 0 (they add nothing)
    pk = F.pad(phi_k, (0, 0, 0, extra)).unflatten(-2, (nc, C))  # (..., nc, C, D)
    pv = F.pad(v, (0, 0, 0, extra)).unflatten(-2, (nc, C))  # (..., nc, C, Dv)
    # inside each chunk: the masked kernel matrix
    tril = torch.ones(C, C, dtype=torch.bool, device=phi_q.device).tril()
    a = (pq @ pk.transpose(-2, -1)).masked_fill(~tril, 0.0)  # (..., nc, C, C)
    num = a @ pv  # (..., nc, C, Dv)
    den = a.sum(dim=-1, keepdim=True)  # (..., nc, C, 1)
    # across chunks: state of all earlier chunks (exclusive prefix sum over chunks)
    # (..., nc, D, C) @ (..., nc, C, Dv) -> (..., nc, D, Dv)
    kv = pk.transpose(-2, -1) @ pv
    kv_before = torch.cumsum(kv, dim=-3) - kv  # (..., nc, D, Dv)
    z = pk.sum(dim=-2)  # (..., nc, D)
    z_before = torch.cumsum(z, dim=-2) - z  # (..., nc, D)
    num = num + pq @ kv_before  # (..., nc, C, D) @ (..., nc, D, Dv) -> (..., nc, C, Dv)
    # (..., nc, C, D) @ (..., nc, D, 1) -> (..., nc, C, 1)
    den = den + pq @ z_before.unsqueeze(-1)
    out = num / (den + eps)  # (..., nc, C, Dv)
    return out.flatten(-3, -2)[..., :L, :]  # (..., nc * C, Dv) -> (..., L, Dv)


def linear_attention_recurrent(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    feature_map: FeatureMap = elu_feature_map,
    eps: float = 1e-6,
) -> Tensor:
    """Causal linear attention written as an RNN: one step per position, O(D Dv) state.

    state_i = state_{i-1} + phi(k_i) v_i^T, z_i = z_{i-1} + phi(k_i),
    out_i = phi(q_i)^T state_i / (phi(q_i)^T z_i + eps).
    Equals ``linear_attention(..., causal=True)``;
    meant for reading and testing, not speed.

    Args:
        query: (..., L, D).
        key: (..., L, D).
        value: (..., L, Dv).
        feature_map: phi.
        eps: added to the normaliser (>= 0).

    Returns:
        output (..., L, Dv).
    """
    q, k, v = check_qkv(query, key, value)
    _check_causal_lengths(q, k)
    check_non_negative("eps", eps)
    phi_q, phi_k = feature_map(q), feature_map(k)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    D, Dv = q.shape[-1], v.shape[-1]
    state = q.new_zeros(*batch, D, Dv)  # running sum of phi(k_j) v_j^T
    z = q.new_zeros(*batch, D)  # running sum of phi(k_j)
    outputs = []
    for i in range(q.shape[-2]):
        state = state + phi_k[..., i, :, None] * v[..., i, None, :]  # (..., D, Dv)
        z = z + phi_k[..., i, :]
        num = (phi_q[..., i, :, None] * state).sum(dim=-2)  # (..., Dv)
        den = (phi_q[..., i, :] * z).sum(dim=-1, keepdim=True)  # (..., 1)
        outputs.append(num / (den + eps))
    return torch.stack(outputs, dim=-2)  # L x (..., Dv) -> (..., L, Dv)


def _reach(window: int, causal: bool) -> int:
    """How far a window of ``window`` keys reaches: query i sees i - r .. i (causal)
    or i - r .. i + r (centred, so ``window`` must be odd)."""
    check_positive_int("window", window)
    if not causal and window % 2 == 0:
        raise ValueError(
            "a non-causal window is centred on its query, so it must be odd "
            f"(the query and (window - 1) / 2 keys on each side), got {window}"
        )
    return window - 1 if causal else (window - 1) // 2


def sliding_window_mask(
    L: int, window: int, causal: bool = False, device: torch.device | str | None = None
) -> Tensor:
    """Boolean (L, L) band mask, True = may attend: each query sees at most ``window``
    keys, as in :func:`~transformer_course.causal_mask` (``window=``).

    Causal: query i sees keys i - window < j <= i. Non-causal: the window is centred
    (``window`` odd): query i sees keys with |i - j| <= (window - 1) / 2. Use it as
    ``attn_mask`` of scaled dot-product attention.
    """
    check_positive_int("L", L)
    reach = _reach(window, causal)
    i = torch.arange(L, device=device).unsqueeze(1)  # (L, 1)
    j = torch.arange(L, device=device).unsqueeze(0)  # (1, L)
    mask = (i - j).abs() <= reach  # (L, L)
    if causal:
        mask = mask & (j <= i)
    return mask


def local_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    window: int,
    causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    """Sliding-window softmax attention computed block by block, in O(L * window * D).

    Same result as exact attention with
    ``attn_mask=sliding_window_mask(L, window, causal)``, but no (L, L) matrix is
    formed. A query sees keys up to r positions away (r = window - 1 causal,
    (window - 1) / 2 centred). The sequence is cut into blocks of B = max(r, 1)
    positions; a query in block c can only see keys in blocks c - 1, c, c + 1, so each
    block computes a (B, 3B) score matrix, masked to the exact band. Self-attention
    only (L == S). Shapes: query/key (..., L, D), value (..., L, Dv) -> (..., L, Dv).
    """
    q, k, v = _check_self_attention(query, key, value)
    reach = _reach(window, causal)
    L, D = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    B = max(reach, 1)  # block size
    nb = -(-L // B)  # number of blocks, ceil(L / B)
    extra = nb * B - L  # padding that makes L a multiple of B
    q_blocks = F.pad(q, (0, 0, 0, extra)).unflatten(-2, (nb, B))  # (..., nb, B, D)
    # one zero block before and after, then overlapping windows of 3 blocks, stride B:
    # (..., (nb + 2) * B, D) -> (..., nb, D, 3B), blocks c-1, c, c+1
    k_blocks = F.pad(k, (0, 0, B, extra + B)).unfold(-2, 3 * B, B)
    v_blocks = F.pad(v, (0, 0, B, extra + B)).unfold(-2, 3 * B, B).transpose(-2, -1)
    # (..., nb, B, D) @ (..., nb, D, 3B) -> (..., nb, B, 3B)
    scores = (q_blocks @ k_blocks) * scale
    c = torch.arange(nb, device=q.device).view(nb, 1, 1)
    # query positions i (nb, B, 1) and key positions j (nb, 1, 3B)
    i = c * B + torch.arange(B, device=q.device).view(1, B, 1)
    j = (c - 1) * B + torch.arange(3 * B, device=q.device).view(1, 1, 3 * B)
    # (nb, B, 3B); j = i always allowed
    allowed = ((i - j).abs() <= reach) & (j >= 0) & (j < L)
    if causal:
        allowed = allowed & (j <= i)
    allowed = allowed | (i >= L)  # padded query rows (discarded) read the zero padding
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    out = weights @ v_blocks  # (..., nb, B, 3B) @ (..., nb, 3B, Dv) -> (..., nb, B, Dv)
    return out.flatten(-3, -2)[..., :L, :]  # (..., nb * B, Dv) -> (..., L, Dv)


def _check_projections(
    proj_k: Tensor, proj_v: Tensor | None, S: int
) -> tuple[Tensor, Tensor]:
    """``(E, F)`` of :func:`low_rank_attention`, both ``(k, S)``; F defaults to E."""
    proj_k = check_tensor("proj_k", proj_k)
    proj_v = proj_k if proj_v is None else check_tensor("proj_v", proj_v)
    for name, p in (("proj_k", proj_k), ("proj_v", proj_v)):
        if p.dim() != 2 or p.shape[1] != S:
            raise ValueError(f"{name} must have shape (k, S={S}), got {tuple(p.shape)}")
    if proj_k.shape[0] != proj_v.shape[0]:
        raise ValueError(
            "proj_k and proj_v must have the same k, "
            f"got {tuple(proj_k.shape)} and {tuple(proj_v.shape)}"
        )
    return proj_k, proj_v


def low_rank_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    proj_k: Tensor,
    proj_v: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Linformer-style attention: keys and values projected along the length
    axis, S -> k.

    K' = E K, V' = F V with E = ``proj_k`` (k, S) and F = ``proj_v`` (k, S; defaults to
    E, the shared projection of the Linformer paper); out = softmax(Q K'^T * scale) V'.
    With E = F = identity (k = S) this is exact attention.

    Args:
        query: (..., L, D).
        key: (..., S, D).
        value: (..., S, Dv).
        proj_k: E, shape (k, S).
        proj_v: F, shape (k, S), or None to reuse ``proj_k``.
        scale: score scale, default 1 / sqrt(D).

    Returns:
        (output (..., L, Dv), weights (..., L, k)).
    """
    q, k, v = check_qkv(query, key, value)
    proj_k, proj_v = _check_projections(proj_k, proj_v, k.shape[-2])
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k_low = proj_k @ k  # (k, S) @ (..., S, D) -> (..., k, D)
    v_low = proj_v @ v  # (k, S) @ (..., S, Dv) -> (..., k, Dv)
    # (..., L, D) @ (..., D, k) -> (..., L, k)
    scores = (q @ k_low.transpose(-2, -1)) * scale
    weights = torch.softmax(scores, dim=-1)
    return weights @ v_low, weights  # (..., L, Dv), (..., L, k)
