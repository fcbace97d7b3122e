"""Attention: the explicit scaled dot-product reference, additive (Bahdanau) attention,
the KV cache and multi-head attention with grouped key/value heads.

Masks follow the package convention (see :mod:`transformer_course.masks`): a boolean
mask is ``True`` where a query may attend; a float mask is added to the scores (``0`` /
``-inf``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._validate import (
    check_dropout,
    check_heads,
    check_int,
    check_positive_int,
    check_qkv,
)
from .masks import causal_mask, check_mask, merge_masks
from .positional import RotaryEmbedding

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
    ``scores``. A row in which every position is masked gets **all-zero weights**
    (instead of the ``NaN`` that ``softmax`` of a row of ``-inf`` produces): a query
    that may attend to nothing reads nothing.
    """
    if attn_mask is not None:
        check_mask(attn_mask, tuple(scores.shape))
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, -math.inf)
        else:
            scores = scores + attn_mask
    # rows with nothing to attend to
    dead = torch.isneginf(scores.amax(dim=-1, keepdim=True))
    weights = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1)
    return weights.masked_fill(dead, 0.0)


def _check_mask_or_causal(attn_mask: Tensor | None, is_causal: bool) -> None:
    if is_causal and attn_mask is not None:
        raise ValueError("pass either attn_mask or is_causal=True, not both")


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

    Shapes: ``query (..., L, D)``, ``key (..., S, D)``, ``value (..., S, Dv)``; leading
    batch dimensions broadcast. Output ``(..., L, Dv)``, weights ``(..., L, S)``.

    * ``attn_mask``: bool (``True`` = may attend) or additive float, broadcastable to
      ``(..., L, S)``.
    * ``is_causal``: :func:`~transformer_course.causal_mask` ``(L, S)``, aligned to the
      **lower-right** corner (the queries are the last ``L`` of ``S`` positions), as
      everywhere in this package. ``F.scaled_dot_product_attention(is_causal=True)``
      aligns to the top-left instead; the two agree when ``L == S``.
    * ``scale`` defaults to ``1/sqrt(D)``.
    * ``dropout_p`` is applied to the weights whenever it is positive (as in ``F``'s
      function); the returned weights are the ones that multiplied ``value``.
    * A fully masked query row yields zero weights and a zero output row, not ``NaN``.
    """
    check_qkv(query, key, value)
    check_dropout("dropout_p", dropout_p)
    _check_mask_or_causal(attn_mask, is_causal)
    L, S = query.size(-2), key.size(-2)
    if scale is None:
        scale = 1.0 / math.sqrt(query.size(-1))
    # (..., L, D) @ (..., D, S) -> (..., L, S)
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale
    if is_causal:
        attn_mask = causal_mask(L, S, device=query.device)
    weights = masked_softmax(scores, attn_mask)
    # returns `weights` itself when dropout_p == 0
    weights = F.dropout(weights, p=dropout_p)
    # (..., L, S) @ (..., S, Dv) -> (..., L, Dv)
    return torch.matmul(weights, value), weights


def _check_additive_inputs(query: Tensor, key: Tensor, value: Tensor) -> None:
    if query.dim() != 3 or key.dim() != 3 or value.dim() != 3:
        raise ValueError(
            "AdditiveAttention expects 3-D query, key, value, got shapes "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    if key.shape[:2] != value.shape[:2]:
        raise ValueError(
            f"key {tuple(key.shape)} and value {tuple(value.shape)} differ in (N, S)"
        )


class AdditiveAttention(nn.Module):
    """Additive attention of Bahdanau et al. (2015):
    ``score(q, k) = vᵀ tanh(W_q q + W_k k)``.

    ``forward(query (N, L, Dq), key (N, S, Dk), value (N, S, Dv), attn_mask=None)``
    returns ``(output (N, L, Dv), weights (N, L, S))``; ``attn_mask`` (bool, ``True`` =
    may attend, or additive float) broadcasts to ``(N, L, S)``.
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
        _check_additive_inputs(query, key, value)
        # (N, L, 1, hidden) + (N, 1, S, hidden) -> (N, L, S, hidden) -> (N, L, S)
        hidden = torch.tanh(
            self.w_query(query)[:, :, None, :] + self.w_key(key)[:, None, :, :]
        )
        scores = self.v(hidden).squeeze(-1)
        weights = masked_softmax(scores, attn_mask)
        # (N, L, S) @ (N, S, Dv) -> (N, L, Dv)
        return torch.bmm(weights, value), weights


class KVCache:
    """Keys and values of the positions already processed, in preallocated buffers
    ``(N, Hkv, capacity, D)``.

    :meth:`update` writes the new positions' keys/values after the cached ones and
    returns views of everything cached (no ``torch.cat`` per step); the buffers are
    allocated on the first update (``capacity`` positions, or more when needed) and
    doubled when full, so appending costs amortised O(new positions).

    ``window`` makes the cache roll (sliding-window attention): it keeps only what the
    next queries may see, the last ``window - 1`` positions plus the new ones, and the
    attention masks keys more than ``window - 1`` positions back. The buffer then holds
    ``2 * window`` positions and is compacted once every ``window`` or so steps.

    ``offset`` counts every position ever appended (the absolute position of the next
    one, for rotary embeddings); ``len(cache)`` is the number of positions held. The
    first update fixes the dtype and device: a later one with another dtype or device
    raises ``ValueError`` (a float64 input would otherwise be silently rounded into a
    float32 cache).
    """

    def __init__(self, capacity: int = 0, window: int | None = None) -> None:
        check_int("capacity", capacity, 0)
        self.capacity = capacity
        self.window = None if window is None else check_positive_int("window", window)
        self._k: Tensor | None = None  # (N, Hkv, capacity, D) buffers
        self._v: Tensor | None = None
        self._start = 0  # buffer index of the oldest position held
        self._end = 0  # buffer index after the newest position
        self.offset = 0

    def __len__(self) -> int:
        return self._end - self._start

    @property
    def keys(self) -> Tensor | None:
        """The cached keys ``(N, Hkv, len, D)`` (a view of the buffer), or ``None``
        before the first update.
        """
        return None if self._k is None else self._k[:, :, self._start : self._end]

    @property
    def values(self) -> Tensor | None:
        """The cached values ``(N, Hkv, len, D)`` (a view of the buffer), or ``None``
        before the first update.
        """
        return None if self._v is None else self._v[:, :, self._start : self._end]

    def _check(self, k: Tensor, v: Tensor) -> None:
        if k.shape != v.shape or k.dim() != 4:
            raise ValueError(
                "k and v must be 4-D and equal in shape, "
                f"got {tuple(k.shape)}, {tuple(v.shape)}"
            )
        if self._k is None:
            return
        if k.dtype != self._k.dtype or k.device != self._k.device:
            raise ValueError(
                f"the cache holds {self._k.dtype} on {self._k.device}, "
                f"got {k.dtype} on {k.device}; "
                "use one dtype and device per cache (or reset() it)"
            )
        if self._k.shape[:2] != k.shape[:2] or self._k.size(-1) != k.size(-1):
            raise ValueError(
                f"new keys {tuple(k.shape)} do not match cached keys (N, Hkv, D) = "
                f"{(self._k.size(0), self._k.size(1), self._k.size(3))}"
            )

    def _make_room(self, keep: int, new: int, like: Tensor) -> None:
        """Ensure the buffer holds the last ``keep`` positions followed by room for
        ``new`` more.
        """
        start = self._end - keep
        if self._k is not None and start + keep + new <= self._k.size(2):
            self._start = start
            return
        size = max(self.capacity, 2 * (self.window or 0), keep + new)
        if self._k is not None and self.window is None:
            size = max(size, 2 * self._k.size(2))
        N, Hkv, _, D = like.shape
        k = like.new_empty(N, Hkv, size, D)
        v = like.new_empty(N, Hkv, size, D)
        if keep:  # move what is kept to the front of the new buffer
            k[:, :, :keep] = self._k[:, :, start : self._end]
            v[:, :, :keep] = self._v[:, :, start : self._end]
        self._k, self._v, self._start, self._end = k, v, 0, keep

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``k``, ``v`` of shape ``(N, Hkv, S_new, D)``; return the cached keys
        and values.

        Keys come first in the result and old positions before new ones:
        ``(keys, values)``, each ``(N, Hkv, len, D)``.
        """
        self._check(k, v)
        new = k.size(2)
        keep = len(self) if self.window is None else min(len(self), self.window - 1)
        self._make_room(keep, new, k)
        self._k[:, :, self._end : self._end + new] = k
        self._v[:, :, self._end : self._end + new] = v
        self._end += new
        self.offset += new
        return (
            self._k[:, :, self._start : self._end],
            self._v[:, :, self._start : self._end],
        )

    def crop(self, length: int) -> None:
        """Keep the oldest ``length`` of the positions held and forget the newer ones.

        Rewinds the cache, e.g. to reject drafted tokens (speculative decoding) or to
        repeat a decoding step from the same state.
        """
        check_int("length", length, 0, maximum=len(self))
        removed = len(self) - length
        self._end -= removed
        self.offset -= removed

    def reset(self) -> None:
        """Forget every position (the buffers are kept for reuse)."""
        self._start = self._end = self.offset = 0

    def nbytes(self) -> int:
        """Bytes of the cached keys and values (the positions held, not the
        spare capacity).
        """
        if self._k is None:
            return 0
        return 2 * self.keys.numel() * self._k.element_size()


class MultiHeadAttention(nn.Module):
    """Multi-head attention with optional grouped/multi-query key-value heads.

    ``num_kv_heads`` (Hkv) defaults to ``num_heads`` (H); ``Hkv = 1`` is multi-query
    attention, ``1 < Hkv < H`` grouped-query attention: query head ``h`` uses key/value
    head ``h // (H // Hkv)``. ``rotary`` (a :class:`RotaryEmbedding` of size
    ``head_dim``) rotates queries and keys by their absolute positions, counted from
    ``cache.offset``.

    ``forward`` returns the output ``(N, L, E)``, computed by the fused
    ``F.scaled_dot_product_attention``. With ``need_weights=True`` it returns
    ``(output, weights)`` instead, computed by the explicit
    :func:`scaled_dot_product_attention`, with the per-head weights ``(N, H, L, S)``
    (equal outputs up to float rounding; nothing is stored on the module). To read the
    weights of every layer of a whole model use
    :func:`transformer_course.notebook.record_attention`.
    ``attn_mask`` is bool (``True`` = may attend) or additive float, broadcastable to
    ``(N, H, L, S)``; ``is_causal`` means ``causal_mask(L, S)`` (lower-right aligned,
    right for cached decoding).
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
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        check_heads(d_model, num_heads, num_kv_heads)
        check_dropout("dropout", dropout)
        self.d_model = d_model
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = d_model // num_heads
        _check_rotary(rotary, self.head_dim)
        self.dropout = dropout  # a probability: applied to the attention weights
        kv_dim = num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, kv_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, kv_dim, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.rotary = rotary

    def _split_heads(self, x: Tensor) -> Tensor:
        N, T, _ = x.shape
        # (N, T, heads*D) -> (N, heads, T, D)
        return x.view(N, T, -1, self.head_dim).transpose(1, 2)

    def _inputs(
        self, query: Tensor, key: Tensor | None, value: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """``(key, value)``, defaulting to ``query`` (self-attention) and ``key``;
        raises unless the three are ``(N, T, E)`` with matching N and key/value T."""
        key = query if key is None else key
        value = key if value is None else value
        for name, x in (("query", query), ("key", key), ("value", value)):
            if x.dim() != 3 or x.size(-1) != self.d_model:
                raise ValueError(
                    f"{name} must have shape (N, T, {self.d_model}), "
                    f"got {tuple(x.shape)}"
                )
        if key.shape[:2] != value.shape[:2] or key.size(0) != query.size(0):
            raise ValueError(
                f"batch/length mismatch: query {tuple(query.shape)}, "
                f"key {tuple(key.shape)}, value {tuple(value.shape)}"
            )
        return key, value

    def _mask(
        self,
        attn_mask: Tensor | None,
        is_causal: bool,
        q: Tensor,
        k: Tensor,
        cache: KVCache | None,
        need_weights: bool,
    ) -> tuple[Tensor | None, bool]:
        """``(attn_mask, is_causal)`` for the attention call: the fused kernel builds a
        square causal mask itself; every other case gets one merged mask."""
        N, H, L, _ = q.shape
        S = k.size(2)
        window = cache.window if cache is not None else None
        if attn_mask is not None:
            check_mask(attn_mask, (N, H, L, S), check_values=False)
        square = L == S and (window is None or S <= window)
        if is_causal and attn_mask is None and square and not need_weights:
            return None, True
        mask = merge_masks(attn_mask, L, S, is_causal, window, device=q.device)
        return mask, False

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        cache: KVCache | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        key, value = self._inputs(query, key, value)  # self-attention: both = query
        N, L, E = query.shape
        q = self._split_heads(self.q_proj(query))  # (N, L, E) -> (N, H, L, D)
        k = self._split_heads(self.k_proj(key))  # (N, S, Hkv*D) -> (N, Hkv, S, D)
        v = self._split_heads(self.v_proj(value))
        if self.rotary is not None:  # rotate by absolute position
            offset = cache.offset if cache is not None else 0
            q, k = self.rotary(q, offset=offset), self.rotary(k, offset=offset)
        if cache is not None:  # (N, Hkv, S, D): the cached positions, then the new ones
            k, v = cache.update(k, v)
        mask, causal = self._mask(attn_mask, is_causal, q, k, cache, need_weights)
        out, weights = self._attend(q, k, v, mask, causal, need_weights)  # (N,H,L,D)
        out = self.out_proj(out.transpose(1, 2).reshape(N, L, E))  # -> (N, L, E)
        return (out, weights) if need_weights else out

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        causal: bool,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """``(softmax(q kᵀ / √D + mask) v, weights)`` for every head: the fused kernel
        (weights ``None``), or with ``need_weights`` the explicit reference (weights
        ``(N, H, L, S)``)."""
        p = self.dropout if self.training else 0.0
        H, Hkv = self.num_heads, self.num_kv_heads
        if not need_weights:
            gqa = Hkv != H
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal, enable_gqa=gqa
            )
            return out, None
        # each key/value head serves H // Hkv consecutive query heads:
        # (N, Hkv, S, D) -> (N, H, S, D)
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
        return scaled_dot_product_attention(q, k, v, mask, dropout_p=p)


def _check_rotary(rotary: RotaryEmbedding | None, head_dim: int) -> None:
    if rotary is not None and rotary.head_dim != head_dim:
        raise ValueError(f"rotary.head_dim={rotary.head_dim} != head_dim={head_dim}")
