"""Transformer layers: encoder layer, decoder layer (with cross-attention) and the
decoder-only block of GPT. Each supports Post-LN (``norm_first=False``, the 2017 paper) and
Pre-LN (``norm_first=True``). Masks are bool (``True`` = may attend) or additive float and
broadcast to ``(N, H, L, S)``."""

from __future__ import annotations

from torch import Tensor, nn

from .attention import KVCache, MultiHeadAttention
from .feedforward import FeedForward
from .norms import build_norm
from .positional import RotaryEmbedding

__all__ = ["EncoderLayer", "DecoderLayer", "GPTBlock"]


class _Sublayers(nn.Module):
    """Shared residual wiring: ``x + drop(f(x))`` followed or preceded by a norm."""

    norm_first: bool
    drop: nn.Dropout

    def _residual(self, x: Tensor, norm: nn.Module, sublayer) -> Tensor:
        if self.norm_first:
            return x + self.drop(sublayer(norm(x)))  # Pre-LN: x + F(LN(x))
        return norm(x + self.drop(sublayer(x)))  # Post-LN: LN(x + F(x))


class EncoderLayer(_Sublayers):
    """Self-attention then FFN, each wrapped in a residual connection and a norm.

    After ``forward(..., need_weights=True)`` the per-head weights are in
    ``self.attn_weights["self"]`` with shape ``(N, H, L, L)``.
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
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, bias=bias)
        self.ffn = FeedForward(d_model, d_ff, activation, dropout=dropout, bias=bias)
        self.norm1 = build_norm(norm, d_model, eps, bias)
        self.norm2 = build_norm(norm, d_model, eps, bias)
        self.drop = nn.Dropout(dropout)
        self.attn_weights: dict[str, Tensor] | None = None

    def forward(self, x: Tensor, src_mask: Tensor | None = None, need_weights: bool = False) -> Tensor:
        weights = {}

        def attend(h: Tensor) -> Tensor:
            out, weights["self"] = self.self_attn(h, attn_mask=src_mask, need_weights=need_weights)
            return out

        x = self._residual(x, self.norm1, attend)
        x = self._residual(x, self.norm2, self.ffn)
        self.attn_weights = weights if need_weights else None
        return x


class DecoderLayer(_Sublayers):
    """Masked self-attention, cross-attention over the encoder output (``memory``), then FFN.

    ``tgt_is_causal`` (default) adds the causal mask to the self-attention; ``cache`` (a
    :class:`KVCache`) makes the self-attention incremental. After ``need_weights=True``:
    ``self.attn_weights["self"]`` ``(N, H, L, S_self)`` and ``["cross"]`` ``(N, H, L, S_src)``.
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
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, bias=bias)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, bias=bias)
        self.ffn = FeedForward(d_model, d_ff, activation, dropout=dropout, bias=bias)
        self.norm1 = build_norm(norm, d_model, eps, bias)
        self.norm2 = build_norm(norm, d_model, eps, bias)
        self.norm3 = build_norm(norm, d_model, eps, bias)
        self.drop = nn.Dropout(dropout)
        self.attn_weights: dict[str, Tensor] | None = None

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        tgt_is_causal: bool = True,
        need_weights: bool = False,
        cache: KVCache | None = None,
    ) -> Tensor:
        weights = {}

        def self_attend(h: Tensor) -> Tensor:
            out, weights["self"] = self.self_attn(
                h, attn_mask=tgt_mask, is_causal=tgt_is_causal, need_weights=need_weights, cache=cache
            )
            return out

        def cross_attend(h: Tensor) -> Tensor:
            out, weights["cross"] = self.cross_attn(
                h, memory, memory, attn_mask=memory_mask, need_weights=need_weights
            )
            return out

        x = self._residual(x, self.norm1, self_attend)
        x = self._residual(x, self.norm2, cross_attend)
        x = self._residual(x, self.norm3, self.ffn)
        self.attn_weights = weights if need_weights else None
        return x


class GPTBlock(_Sublayers):
    """The decoder-only block: causal self-attention and FFN (no cross-attention).

    Pre-LN by default, as in GPT-2. ``num_kv_heads`` enables grouped/multi-query attention and
    ``rotary`` rotary position embeddings. After ``need_weights=True`` the per-head weights are
    in ``self.attn_weights["self"]``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        activation: str = "gelu",
        norm_first: bool = True,
        norm: str = "layernorm",
        bias: bool = True,
        num_kv_heads: int | None = None,
        rotary: RotaryEmbedding | None = None,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.attn = MultiHeadAttention(
            d_model, num_heads, num_kv_heads=num_kv_heads, dropout=dropout, bias=bias, rotary=rotary
        )
        self.ffn = FeedForward(d_model, d_ff, activation, dropout=dropout, bias=bias)
        self.norm1 = build_norm(norm, d_model, eps, bias)
        self.norm2 = build_norm(norm, d_model, eps, bias)
        self.drop = nn.Dropout(dropout)
        self.attn_weights: dict[str, Tensor] | None = None

    def forward(
        self,
        x: Tensor,
        attn_mask: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> Tensor:
        weights = {}

        def attend(h: Tensor) -> Tensor:
            out, weights["self"] = self.attn(
                h, attn_mask=attn_mask, is_causal=True, need_weights=need_weights, cache=cache
            )
            return out

        x = self._residual(x, self.norm1, attend)
        x = self._residual(x, self.norm2, self.ffn)
        self.attn_weights = weights if need_weights else None
        return x
