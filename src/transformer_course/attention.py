"""Attention: the explicit scaled dot-product reference, additive (Bahdanau) attention,
the KV cache and multi-head attention with grouped key/value heads.

Masks follow the package convention (see :mod:`transformer_course.masks`): a boolean mask is
``True`` where a query may attend; a float mask is added to the scores (``0`` / ``-inf``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .masks import causal_mask, check_mask
from .positional import RotaryEmbedding
from .utils import check_positive_int

__all__ = [
    "masked_softmax",
    "scaled_dot_product_attention",
    "AdditiveAttention",
    "KVCache",
    "MultiHeadAttention",
]



def masked_softmax(scores: Tensor, attn_mask: Tensor | None = None) -> Tensor:
    """Softmax over the last dimension of ``scores`` after applying ``attn_mask``.

    ``attn_mask`` is bool (``True`` = may attend) or additive float, broadcastable to
    ``scores``. A row in which every position is masked gets **all-zero weights** (instead of
    the ``NaN`` that ``softmax`` of a row of ``-inf`` produces): a query that may attend to
    nothing reads nothing.
    """
    if attn_mask is not None:
        check_mask(attn_mask, tuple(scores.shape))
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    dead = torch.isneginf(scores.amax(dim=-1, keepdim=True))  # rows with nothing to attend to
    weights = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1)
    return weights.masked_fill(dead, 0.0)


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """softmax(Q Kᵀ · scale + mask) V, written out; returns ``(output, weights)``.

    Shapes: ``query (..., L, D)``, ``key (..., S, D)``, ``value (..., S, Dv)``; leading batch
    dimensions broadcast. Output ``(..., L, Dv)``, weights ``(..., L, S)``.

    * ``attn_mask``: bool (``True`` = may attend) or additive float, broadcastable to ``(..., L, S)``.
    * ``is_causal``: the mask ``tril(ones(L, S))`` aligned to the **top-left** corner, exactly as
      ``F.scaled_dot_product_attention`` does; for the last ``L`` queries of a cached sequence
      pass ``attn_mask=causal_mask(L, S)`` (lower-right aligned) instead.
    * ``scale`` defaults to ``1/sqrt(D)``.
    * ``dropout_p`` is applied to the weights whenever it is positive (as in ``F``'s function);
      the returned weights are the ones that multiplied ``value``.
    * A fully masked query row yields zero weights and a zero output row, not ``NaN``.
    """
    if query.dim() < 2 or key.dim() < 2 or value.dim() < 2:
        raise ValueError(
            "query, key and value need at least 2 dims (..., length, features), got shapes "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    if query.size(-1) != key.size(-1):
        raise ValueError(
            f"query and key feature sizes differ: {query.size(-1)} vs {key.size(-1)}"
        )
    if key.size(-2) != value.size(-2):
        raise ValueError(f"key and value lengths differ: {key.size(-2)} vs {value.size(-2)}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if is_causal and attn_mask is not None:
        raise ValueError("pass either attn_mask or is_causal=True, not both")
    L, S = query.size(-2), key.size(-2)
    if scale is None:
        scale = 1.0 / math.sqrt(query.size(-1))
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale  # (..., L, D) @ (..., D, S) -> (..., L, S)
    if is_causal:
        attn_mask = torch.ones(L, S, dtype=torch.bool, device=query.device).tril()
    weights = masked_softmax(scores, attn_mask)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return torch.matmul(weights, value), weights  # (..., L, S) @ (..., S, Dv) -> (..., L, Dv)


class AdditiveAttention(nn.Module):
    """Additive attention of Bahdanau et al. (2015): ``score(q, k) = vᵀ tanh(W_q q + W_k k)``.

    ``forward(query (N, L, Dq), key (N, S, Dk), value (N, S, Dv), attn_mask=None)`` returns
    ``(output (N, L, Dv), weights (N, L, S))``; ``attn_mask`` (bool, ``True`` = may attend, or
    additive float) broadcasts to ``(N, L, S)``.
    """

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int) -> None:
        super().__init__()
        check_positive_int("query_dim", query_dim)
        check_positive_int("key_dim", key_dim)
        check_positive_int("hidden_dim", hidden_dim)
        self.w_query = nn.Linear(query_dim, hidden_dim, bias=False)
        self.w_key = nn.Linear(key_dim, hidden_dim, bias=True)
        self.v = nn.Linear(hidden_dim, 1, bias=False)

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        if query.dim() != 3 or key.dim() != 3 or value.dim() != 3:
            raise ValueError(
                "AdditiveAttention expects 3-D query, key, value, got shapes "
                f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
            )
        if key.shape[:2] != value.shape[:2]:
            raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} differ in (N, S)")
        # (N, L, 1, hidden) + (N, 1, S, hidden) -> (N, L, S, hidden) -> (N, L, S)
        hidden = torch.tanh(self.w_query(query)[:, :, None, :] + self.w_key(key)[:, None, :, :])
        scores = self.v(hidden).squeeze(-1)
        weights = masked_softmax(scores, attn_mask)
        return torch.bmm(weights, value), weights  # (N, L, S) @ (N, S, Dv) -> (N, L, Dv)


class KVCache:
    """Keys and values of the positions already processed, each ``(N, Hkv, S, D)``.

    :class:`MultiHeadAttention` appends the new positions' keys/values with :meth:`update` and
    attends over everything cached, so each decoding step projects only the newest token.
    """

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.size(-2)

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``k``, ``v`` of shape ``(N, Hkv, S_new, D)`` and return the full cache."""
        if k.shape != v.shape or k.dim() != 4:
            raise ValueError(f"k and v must be 4-D and equal in shape, got {tuple(k.shape)}, {tuple(v.shape)}")
        if self.k is None:
            self.k, self.v = k, v
        else:
            if self.k.shape[:2] != k.shape[:2] or self.k.size(-1) != k.size(-1):
                raise ValueError(
                    f"new keys {tuple(k.shape)} do not match cached keys {tuple(self.k.shape)}"
                )
            self.k = torch.cat([self.k, k], dim=-2)  # (N, Hkv, S_old + S_new, D)
            self.v = torch.cat([self.v, v], dim=-2)
        return self.k, self.v

    def reset(self) -> None:
        self.k = self.v = None

    def nbytes(self) -> int:
        """Memory held by the cache in bytes."""
        if self.k is None:
            return 0
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


class MultiHeadAttention(nn.Module):
    """Multi-head attention with optional grouped/multi-query key-value heads.

    ``num_kv_heads`` (Hkv) defaults to ``num_heads`` (H); ``Hkv = 1`` is multi-query attention,
    ``1 < Hkv < H`` grouped-query attention: query head ``h`` uses key/value head
    ``h // (H // Hkv)``. ``rotary`` (a :class:`RotaryEmbedding` of size ``head_dim``) rotates
    queries and keys by their absolute positions, counted from the cache length.

    ``forward(query, key=None, value=None, attn_mask=None, is_causal=False, need_weights=False,
    cache=None)`` returns ``(output (N, L, E), weights)``: ``weights`` is ``(N, H, L, S)`` per
    head when ``need_weights`` (computed by the explicit reference), else ``None`` and the fused
    ``F.scaled_dot_product_attention`` runs. ``attn_mask`` is bool (``True`` = may attend) or
    additive float, broadcastable to ``(N, H, L, S)``; ``is_causal`` means
    ``causal_mask(L, S)`` (lower-right aligned, right for cached decoding).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        rotary: RotaryEmbedding | None = None,
    ) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("num_heads", num_heads)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        check_positive_int("num_kv_heads", num_kv_heads)
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not divisible by num_kv_heads={num_kv_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = d_model // num_heads
        if rotary is not None and rotary.head_dim != self.head_dim:
            raise ValueError(f"rotary.head_dim={rotary.head_dim} != head_dim={self.head_dim}")
        self.dropout = dropout
        kv_dim = num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, kv_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, kv_dim, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.rotary = rotary

    def _split_heads(self, x: Tensor, heads: int) -> Tensor:
        N, T, _ = x.shape
        return x.view(N, T, heads, self.head_dim).transpose(1, 2)  # (N, T, heads*D) -> (N, heads, T, D)

    def _check_input(self, name: str, x: Tensor) -> None:
        if x.dim() != 3 or x.size(-1) != self.d_model:
            raise ValueError(f"{name} must have shape (N, T, {self.d_model}), got {tuple(x.shape)}")

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        key = query if key is None else key
        value = key if value is None else value
        self._check_input("query", query)
        self._check_input("key", key)
        self._check_input("value", value)
        if key.shape[:2] != value.shape[:2] or key.size(0) != query.size(0):
            raise ValueError(
                f"batch/length mismatch: query {tuple(query.shape)}, key {tuple(key.shape)}, "
                f"value {tuple(value.shape)}"
            )
        N, L, E = query.shape
        H, Hkv = self.num_heads, self.num_kv_heads
        q = self._split_heads(self.q_proj(query), H)  # (N, L, E) -> (N, H, L, D)
        k = self._split_heads(self.k_proj(key), Hkv)  # (N, S_new, Hkv*D) -> (N, Hkv, S_new, D)
        v = self._split_heads(self.v_proj(value), Hkv)
        if self.rotary is not None:
            offset = len(cache) if cache is not None else 0
            q = self.rotary(q, offset=offset)
            k = self.rotary(k, offset=offset)
        if cache is not None:
            k, v = cache.update(k, v)  # (N, Hkv, S, D) with S = cached + new
        S = k.size(-2)
        if Hkv != H:  # each key/value head serves H // Hkv consecutive query heads
            k = k.repeat_interleave(H // Hkv, dim=1)  # (N, Hkv, S, D) -> (N, H, S, D)
            v = v.repeat_interleave(H // Hkv, dim=1)
        if attn_mask is not None:
            check_mask(attn_mask, (N, H, L, S))
        fused_causal = False
        # A single query (one step of cached decoding) sits at the last position and may see
        # every key: its lower-right causal mask is all True. Building and applying it only costs
        # time (on a CPU, F.scaled_dot_product_attention with one query and 64 keys took 2.4x as
        # long with the mask as without), so it is skipped.
        if is_causal and L > 1:
            if attn_mask is None and L == S and not need_weights:
                fused_causal = True  # let the fused kernel build the (square) causal mask
            else:
                causal = causal_mask(L, S, device=query.device)
                if attn_mask is None:
                    attn_mask = causal
                elif attn_mask.dtype == torch.bool:
                    attn_mask = attn_mask & causal
                else:
                    attn_mask = attn_mask.masked_fill(~causal, float("-inf"))
        dropout_p = self.dropout if self.training else 0.0
        if need_weights:
            out, weights = scaled_dot_product_attention(q, k, v, attn_mask, dropout_p=dropout_p)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=fused_causal
            )
            weights = None
        out = out.transpose(1, 2).reshape(N, L, E)  # (N, H, L, D) -> (N, L, H, D) -> (N, L, E)
        return self.out_proj(out), weights
