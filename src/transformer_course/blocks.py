"""Transformer layers: :class:`TransformerBlock` (self-attention then FFN; the encoder
layer with ``causal=False``, the GPT block with ``causal=True``) and
:class:`DecoderLayer` (self-attention, cross-attention over the encoder output, then
FFN). Both are built from the same parts and wrap every sublayer with
:func:`residual`: Post-LN (``norm_first=False``, the 2017 paper) or Pre-LN
(``norm_first=True``, GPT-2). Masks are bool (``True`` = may attend) or additive float
and broadcast to ``(N, H, L, S)``. To read the attention weights, see
:func:`transformer_course.notebook.record_attention`."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from torch import Tensor, nn

from .attention import KVCache, MultiHeadAttention
from .feedforward import FeedForward
from .norms import build_norm
from .positional import RotaryEmbedding

__all__ = ["TransformerBlock", "DecoderLayer", "residual"]


def residual(
    x: Tensor,
    sublayer: Callable[[Tensor], Tensor],
    norm: nn.Module,
    drop: nn.Module,
    norm_first: bool,
) -> Tensor:
    """One sublayer with its residual connection: Pre-LN ``x + F(LN(x))`` or Post-LN
    ``LN(x + F(x))`` (dropout on ``F``'s output)."""
    if norm_first:
        return x + drop(sublayer(norm(x)))
    return norm(x + drop(sublayer(x)))


def _norm_layer(norm: str, d_model: int, eps: float | None, bias: bool) -> nn.Module:
    """The block's norm: ``bias`` (the linear layers' flag) reaches LayerNorm's beta
    only; RMSNorm has none."""
    return build_norm(norm, d_model, eps, bias if norm == "layernorm" else None)


class TransformerBlock(nn.Module):
    """Self-attention then FFN, each wrapped in a residual connection and a norm.

    ``causal=False`` (default) is the encoder layer of the 2017 paper (with its
    defaults: ReLU, Post-LN, like ``nn.TransformerEncoderLayer``); ``causal=True`` masks
    future positions, as in the GPT block (use ``norm_first=True``,
    ``activation="gelu_tanh"`` for GPT-2). ``num_kv_heads`` enables grouped/multi-query
    attention, ``rotary`` rotary position embeddings, and
    ``forward(..., cache=KVCache())`` incremental (cached) decoding. ``eps=None`` keeps
    the norm's own default.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = False,
        norm: str = "layernorm",
        bias: bool = True,
        eps: float | None = None,
        causal: bool = False,
        num_kv_heads: int | None = None,
        rotary: RotaryEmbedding | None = None,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.causal = causal
        self.self_attn = MultiHeadAttention(
            d_model,
            num_heads,
            num_kv_heads=num_kv_heads,
            dropout=dropout,
            bias=bias,
            rotary=rotary,
        )
        self.ffn = FeedForward(d_model, d_ff, activation, dropout=dropout, bias=bias)
        self.norm1 = _norm_layer(norm, d_model, eps, bias)
        self.norm2 = _norm_layer(norm, d_model, eps, bias)
        self.drop = nn.Dropout(dropout)

    @classmethod
    def gpt(cls, d_model: int, num_heads: int, d_ff: int, **kwargs) -> TransformerBlock:
        """The GPT(-2) block: ``causal=True``, ``norm_first=True`` (Pre-LN),
        ``activation="gelu"`` unless ``kwargs`` say otherwise; every other argument as
        in the constructor."""
        kwargs = {"causal": True, "norm_first": True, "activation": "gelu", **kwargs}
        return cls(d_model, num_heads, d_ff, **kwargs)

    def forward(
        self, x: Tensor, attn_mask: Tensor | None = None, cache: KVCache | None = None
    ) -> Tensor:
        attend = partial(
            self.self_attn, attn_mask=attn_mask, is_causal=self.causal, cache=cache
        )
        x = residual(x, attend, self.norm1, self.drop, self.norm_first)
        return residual(x, self.ffn, self.norm2, self.drop, self.norm_first)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder output
    (``memory``), then FFN, each wrapped by :func:`residual`.

    The norms are numbered in sublayer order, as in ``nn.TransformerDecoderLayer``:
    ``norm1`` self-attention, ``norm2`` cross-attention, ``norm3`` FFN. ``cache`` (a
    :class:`KVCache`) makes the self-attention incremental.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = False,
        norm: str = "layernorm",
        bias: bool = True,
        eps: float | None = None,
        causal: bool = True,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.causal = causal
        self.self_attn = MultiHeadAttention(
            d_model, num_heads, dropout=dropout, bias=bias
        )
        self.cross_attn = MultiHeadAttention(
            d_model, num_heads, dropout=dropout, bias=bias
        )
        self.ffn = FeedForward(d_model, d_ff, activation, dropout=dropout, bias=bias)
        self.norm1 = _norm_layer(norm, d_model, eps, bias)
        self.norm2 = _norm_layer(norm, d_model, eps, bias)
        self.norm3 = _norm_layer(norm, d_model, eps, bias)
        self.drop = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        attn_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        attend = partial(
            self.self_attn, attn_mask=attn_mask, is_causal=self.causal, cache=cache
        )
        # cross-attention: queries from x, keys and values from the memory
        cross = partial(self.cross_attn, key=memory, attn_mask=memory_mask)
        x = residual(x, attend, self.norm1, self.drop, self.norm_first)
        x = residual(x, cross, self.norm2, self.drop, self.norm_first)
        return residual(x, self.ffn, self.norm3, self.drop, self.norm_first)
