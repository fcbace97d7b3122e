"""Transformer layers: :class:`TransformerBlock` (self-attention then FFN; the encoder
layer with ``causal=False``, the GPT block with ``causal=True``) and
:class:`DecoderLayer` (the same plus cross-attention over the encoder output). Both
support Post-LN (``norm_first=False``, the 2017 paper) and Pre-LN (``norm_first=True``,
GPT-2). Masks are bool (``True`` = may attend) or additive float and broadcast to
``(N, H, L, S)``. With ``need_weights=True`` each attention module keeps its per-head
weights in its ``attn_weights`` attribute (``block.self_attn.attn_weights``,
``layer.cross_attn.attn_weights``)."""

from __future__ import annotations

from torch import Tensor, nn

from .attention import KVCache, MultiHeadAttention
from .feedforward import FeedForward
from .norms import build_norm
from .positional import RotaryEmbedding

__all__ = ["TransformerBlock", "DecoderLayer"]


class TransformerBlock(nn.Module):
    """Self-attention then FFN, each wrapped in a residual connection and a norm.

    ``causal=False`` (default) is the encoder layer of the 2017 paper (with its
    defaults: ReLU, Post-LN, like ``nn.TransformerEncoderLayer``); ``causal=True`` masks
    future positions, as in the GPT block (use ``norm_first=True``,
    ``activation="gelu_tanh"`` for GPT-2). ``num_kv_heads`` enables grouped/multi-query
    attention, ``rotary`` rotary position embeddings, and
    ``forward(..., cache=KVCache())`` incremental (cached) decoding.
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
        eps: float = 1e-5,
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
        self.norm1 = build_norm(norm, d_model, eps, bias)
        self.norm2 = build_norm(norm, d_model, eps, bias)
        self.drop = nn.Dropout(dropout)

    @classmethod
    def gpt(cls, d_model: int, num_heads: int, d_ff: int, **kwargs) -> TransformerBlock:
        """The GPT(-2) block: ``causal=True``, ``norm_first=True`` (Pre-LN),
        ``activation="gelu"`` unless ``kwargs`` say otherwise; every other argument as
        in the constructor."""
        kwargs = {"causal": True, "norm_first": True, "activation": "gelu", **kwargs}
        return cls(d_model, num_heads, d_ff, **kwargs)

    def forward(
        self,
        x: Tensor,
        attn_mask: Tensor | None = None,
        need_weights: bool = False,
        cache: KVCache | None = None,
    ) -> Tensor:
        attn_args = dict(
            attn_mask=attn_mask,
            is_causal=self.causal,
            need_weights=need_weights,
            cache=cache,
        )
        if self.norm_first:  # Pre-LN: x + F(LN(x))
            x = x + self.drop(self.self_attn(self.norm1(x), **attn_args))
            return x + self.drop(self.ffn(self.norm2(x)))
        # Post-LN: LN(x + F(x))
        x = self.norm1(x + self.drop(self.self_attn(x, **attn_args)))
        return self.norm2(x + self.drop(self.ffn(x)))


class DecoderLayer(TransformerBlock):
    """Masked self-attention, cross-attention over the encoder output
    (``memory``), then FFN.

    A :class:`TransformerBlock` (``causal=True`` by default) with a cross-attention
    sublayer in the middle. The norms are numbered in sublayer order, as in
    ``nn.TransformerDecoderLayer``: ``norm1`` self-attention, ``norm2`` cross-attention,
    ``norm3`` FFN. ``cache`` (a :class:`KVCache`) makes the self-attention incremental.
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
        eps: float = 1e-5,
        causal: bool = True,
    ) -> None:
        super().__init__(
            d_model, num_heads, d_ff, dropout=dropout, activation=activation,
            norm_first=norm_first, norm=norm, bias=bias, eps=eps, causal=causal,
        )  # fmt: skip
        self.cross_attn = MultiHeadAttention(
            d_model, num_heads, dropout=dropout, bias=bias
        )
        self.norm3 = build_norm(norm, d_model, eps, bias)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        attn_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        need_weights: bool = False,
        cache: KVCache | None = None,
    ) -> Tensor:
        attn_args = dict(
            attn_mask=attn_mask,
            is_causal=self.causal,
            need_weights=need_weights,
            cache=cache,
        )
        # cross-attention: queries from x, keys and values from the memory
        cross_args = dict(attn_mask=memory_mask, need_weights=need_weights)
        if self.norm_first:  # Pre-LN: x + F(LN(x)) for each sublayer
            x = x + self.drop(self.self_attn(self.norm1(x), **attn_args))
            x = x + self.drop(self.cross_attn(self.norm2(x), memory, **cross_args))
            return x + self.drop(self.ffn(self.norm3(x)))
        # Post-LN: LN(x + F(x)) for each sublayer
        x = self.norm1(x + self.drop(self.self_attn(x, **attn_args)))
        x = self.norm2(x + self.drop(self.cross_attn(x, memory, **cross_args)))
        return self.norm3(x + self.drop(self.ffn(x)))
