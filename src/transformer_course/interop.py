"""Copying weights from PyTorch's own modules, to prove our modules compute the same thing."""

from __future__ import annotations

import torch
from torch import nn

from .attention import MultiHeadAttention
from .blocks import DecoderLayer, EncoderLayer
from .models import Transformer
from .norms import LayerNorm

__all__ = ["load_torch_mha", "load_torch_transformer"]


@torch.no_grad()
def load_torch_mha(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    """Copy an ``nn.MultiheadAttention`` (packed ``in_proj_weight``) into ``ours``."""
    if ours.num_kv_heads != ours.num_heads:
        raise ValueError(f"nn.MultiheadAttention has no grouped heads; ours has num_kv_heads={ours.num_kv_heads}")
    if theirs.embed_dim != ours.d_model or theirs.num_heads != ours.num_heads:
        raise ValueError(
            f"shape mismatch: theirs (embed_dim={theirs.embed_dim}, num_heads={theirs.num_heads}), "
            f"ours (d_model={ours.d_model}, num_heads={ours.num_heads})"
        )
    if theirs.in_proj_weight is None:
        raise ValueError("only nn.MultiheadAttention with kdim == vdim == embed_dim is supported")
    for proj, w in zip((ours.q_proj, ours.k_proj, ours.v_proj), theirs.in_proj_weight.chunk(3), strict=True):
        proj.weight.copy_(w)
    if theirs.in_proj_bias is not None:
        for proj, b in zip((ours.q_proj, ours.k_proj, ours.v_proj), theirs.in_proj_bias.chunk(3), strict=True):
            proj.bias.copy_(b)
    ours.out_proj.weight.copy_(theirs.out_proj.weight)
    if theirs.out_proj.bias is not None:
        ours.out_proj.bias.copy_(theirs.out_proj.bias)


@torch.no_grad()
def _load_norm(ours: nn.Module, theirs: nn.LayerNorm) -> None:
    if not isinstance(ours, LayerNorm):
        raise ValueError(f"expected our LayerNorm, got {type(ours).__name__}")
    ours.weight.copy_(theirs.weight)
    ours.bias.copy_(theirs.bias)


@torch.no_grad()
def _load_ffn(ours: EncoderLayer | DecoderLayer, theirs: nn.Module) -> None:
    ours.ffn.w1.load_state_dict(theirs.linear1.state_dict())
    ours.ffn.w2.load_state_dict(theirs.linear2.state_dict())


@torch.no_grad()
def load_torch_transformer(ours: Transformer, theirs: nn.Transformer) -> None:
    """Copy the encoder/decoder stacks of an ``nn.Transformer`` into ``ours``.

    ``nn.Transformer`` has no embeddings or output layer: those of ``ours`` are kept. Both
    models must agree on sizes, ``norm_first``, and have final norms (``cfg.final_norm``).
    """
    cfg = ours.cfg
    enc, dec = theirs.encoder.layers, theirs.decoder.layers
    if len(enc) != cfg.num_encoder_layers or len(dec) != cfg.num_decoder_layers:
        raise ValueError(
            f"layer counts differ: theirs ({len(enc)}, {len(dec)}), "
            f"ours ({cfg.num_encoder_layers}, {cfg.num_decoder_layers})"
        )
    if not cfg.final_norm or cfg.norm != "layernorm":
        raise ValueError("nn.Transformer has final LayerNorms: use final_norm=True, norm='layernorm'")
    for o, t in zip(ours.encoder_layers, enc, strict=True):
        load_torch_mha(o.self_attn, t.self_attn)
        _load_ffn(o, t)
        _load_norm(o.norm1, t.norm1)
        _load_norm(o.norm2, t.norm2)
    for o, t in zip(ours.decoder_layers, dec, strict=True):
        load_torch_mha(o.self_attn, t.self_attn)
        load_torch_mha(o.cross_attn, t.multihead_attn)
        _load_ffn(o, t)
        _load_norm(o.norm1, t.norm1)
        _load_norm(o.norm2, t.norm2)
        _load_norm(o.norm3, t.norm3)
    _load_norm(ours.encoder_norm, theirs.encoder.norm)
    _load_norm(ours.decoder_norm, theirs.decoder.norm)
