"""Copying weights from other implementations: PyTorch's own modules (to prove that
ours compute the same thing) and GPT-2 checkpoints in Hugging Face naming (to run real
weights with MiniGPT)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from .attention import MultiHeadAttention
from .blocks import DecoderLayer, TransformerBlock
from .models import GPTConfig, MiniGPT, Transformer
from .norms import LayerNorm

__all__ = ["load_torch_mha", "load_torch_transformer", "load_hf_gpt2"]


@torch.no_grad()
def load_torch_mha(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    """Copy an ``nn.MultiheadAttention`` (packed ``in_proj_weight``) into ``ours``."""
    if ours.num_kv_heads != ours.num_heads:
        raise ValueError(
            "nn.MultiheadAttention has no grouped heads; "
            f"ours has num_kv_heads={ours.num_kv_heads}"
        )
    if theirs.embed_dim != ours.d_model or theirs.num_heads != ours.num_heads:
        raise ValueError(
            f"shape mismatch: theirs (embed_dim={theirs.embed_dim}, "
            f"num_heads={theirs.num_heads}), "
            f"ours (d_model={ours.d_model}, num_heads={ours.num_heads})"
        )
    if theirs.in_proj_weight is None:
        raise ValueError(
            "only nn.MultiheadAttention with kdim == vdim == embed_dim is supported"
        )
    for proj, w in zip(
        (ours.q_proj, ours.k_proj, ours.v_proj),
        theirs.in_proj_weight.chunk(3),
        strict=True,
    ):
        proj.weight.copy_(w)
    if theirs.in_proj_bias is not None:
        for proj, b in zip(
            (ours.q_proj, ours.k_proj, ours.v_proj),
            theirs.in_proj_bias.chunk(3),
            strict=True,
        ):
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
def _load_ffn(ours: TransformerBlock | DecoderLayer, theirs: nn.Module) -> None:
    ours.ffn.w1.load_state_dict(theirs.linear1.state_dict())
    ours.ffn.w2.load_state_dict(theirs.linear2.state_dict())


@torch.no_grad()
def load_torch_transformer(ours: Transformer, theirs: nn.Transformer) -> None:
    """Copy the encoder/decoder stacks of an ``nn.Transformer`` into ``ours``.

    ``nn.Transformer`` has no embeddings or output layer: those of ``ours`` are kept.
    Both models must agree on sizes, ``norm_first``, and have final norms
    (``cfg.final_norm``).
    """
    cfg = ours.cfg
    enc, dec = theirs.encoder.layers, theirs.decoder.layers
    if len(enc) != cfg.num_encoder_layers or len(dec) != cfg.num_decoder_layers:
        raise ValueError(
            f"layer counts differ: theirs ({len(enc)}, {len(dec)}), "
            f"ours ({cfg.num_encoder_layers}, {cfg.num_decoder_layers})"
        )
    if not cfg.final_norm or cfg.norm != "layernorm":
        raise ValueError(
            "nn.Transformer has final LayerNorms: use final_norm=True, norm='layernorm'"
        )
    for o, t in zip(ours.encoder_blocks, enc, strict=True):
        load_torch_mha(o.self_attn, t.self_attn)
        _load_ffn(o, t)
        _load_norm(o.norm1, t.norm1)
        _load_norm(o.norm2, t.norm2)
    for o, t in zip(ours.decoder_blocks, dec, strict=True):
        load_torch_mha(o.self_attn, t.self_attn)
        load_torch_mha(o.cross_attn, t.multihead_attn)
        _load_ffn(o, t)
        _load_norm(o.norm1, t.norm1)
        _load_norm(o.norm2, t.norm2)
        _load_norm(o.norm3, t.norm3)
    _load_norm(ours.encoder_norm_f, theirs.encoder.norm)
    _load_norm(ours.decoder_norm_f, theirs.decoder.norm)


_GPT2_REQUIRED = ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions")


def _gpt2_config(config: Mapping) -> GPTConfig:
    if not isinstance(config, Mapping):
        raise TypeError(
            "config must be a mapping (e.g. GPT2Config.to_dict()), "
            f"got {type(config).__name__}"
        )
    missing = [k for k in _GPT2_REQUIRED if k not in config]
    if missing:
        raise ValueError(
            f"config lacks {missing}; a GPT-2 config needs {list(_GPT2_REQUIRED)}"
        )
    n_inner = config.get("n_inner")  # None (the usual value) means 4 * n_embd
    return GPTConfig(
        vocab_size=config["vocab_size"], context_length=config["n_positions"],
        d_model=config["n_embd"], num_heads=config["n_head"],
        num_layers=config["n_layer"], d_ff=n_inner,
        eps=config.get("layer_norm_epsilon", 1e-5),
        activation="gelu_tanh", positional="learned", norm="layernorm",
        norm_first=True, tie_weights=True, bias=True, dropout=0.0,
    )  # fmt: skip


@torch.no_grad()
def load_hf_gpt2(state_dict: Mapping[str, Tensor], config: Mapping) -> MiniGPT:
    """A :class:`MiniGPT` holding the weights of a GPT-2 checkpoint
    in Hugging Face naming.

    ``state_dict``: as ``GPT2LMHeadModel.state_dict()`` gives it (keys
    ``transformer.h.0.attn.c_attn.weight`` ...) or as a ``model.safetensors`` file of
    the hub holds it (the same keys without ``transformer.``). ``config``: a dict with
    ``n_layer``, ``n_head``, ``n_embd``, ``vocab_size`` and ``n_positions`` (required);
    ``n_inner`` and ``layer_norm_epsilon`` are used when present, every other key is
    ignored. GPT-2's ``Conv1D`` layers store their weight as (in, out), the transpose of
    ``nn.Linear``; ``c_attn`` packs the query, key and value projections.

    The model uses GPT-2's tanh GELU (``activation="gelu_tanh"``), learned positions,
    Pre-LN and a tied output layer; its logits equal ``GPT2LMHeadModel``'s.
    """
    cfg = _gpt2_config(config)
    sd = {k.removeprefix("transformer."): v for k, v in state_dict.items()}
    model = MiniGPT(cfg)
    E = cfg.d_model
    used: set[str] = set()

    def take(key: str, shape: tuple[int, ...]) -> Tensor:
        if key not in sd:
            raise ValueError(f"state_dict lacks {key!r} (or 'transformer.{key}')")
        value = sd[key]
        if tuple(value.shape) != shape:
            raise ValueError(
                f"{key!r} has shape {tuple(value.shape)}, "
                f"expected {shape} for this config"
            )
        used.add(key)
        return value

    model.tok_emb.weight.copy_(take("wte.weight", (cfg.vocab_size, E)))
    model.pos_emb.embedding.weight.copy_(take("wpe.weight", (cfg.context_length, E)))
    for i, block in enumerate(model.blocks):
        p = f"h.{i}."
        block.norm1.weight.copy_(take(p + "ln_1.weight", (E,)))
        block.norm1.bias.copy_(take(p + "ln_1.bias", (E,)))
        # Conv1D (E, 3E) -> Linear layout (3E, E)
        w_qkv = take(p + "attn.c_attn.weight", (E, 3 * E)).t()
        b_qkv = take(p + "attn.c_attn.bias", (3 * E,))
        attn = block.self_attn
        for proj, w, b in zip(
            (attn.q_proj, attn.k_proj, attn.v_proj),
            w_qkv.chunk(3),
            b_qkv.chunk(3),
            strict=True,
        ):
            proj.weight.copy_(w)
            proj.bias.copy_(b)
        attn.out_proj.weight.copy_(take(p + "attn.c_proj.weight", (E, E)).t())
        attn.out_proj.bias.copy_(take(p + "attn.c_proj.bias", (E,)))
        block.norm2.weight.copy_(take(p + "ln_2.weight", (E,)))
        block.norm2.bias.copy_(take(p + "ln_2.bias", (E,)))
        block.ffn.w1.weight.copy_(take(p + "mlp.c_fc.weight", (E, cfg.d_ff)).t())
        block.ffn.w1.bias.copy_(take(p + "mlp.c_fc.bias", (cfg.d_ff,)))
        block.ffn.w2.weight.copy_(take(p + "mlp.c_proj.weight", (cfg.d_ff, E)).t())
        block.ffn.w2.bias.copy_(take(p + "mlp.c_proj.bias", (E,)))
    model.norm_f.weight.copy_(take("ln_f.weight", (E,)))
    model.norm_f.bias.copy_(take("ln_f.bias", (E,)))
    if "lm_head.weight" in sd and not torch.equal(
        sd["lm_head.weight"], sd["wte.weight"]
    ):
        raise ValueError(
            "lm_head.weight differs from wte.weight; MiniGPT ties them as GPT-2 does"
        )
    # Buffers of older checkpoints (causal masks) carry no weights.
    unknown = sorted(
        k
        for k in sd
        if k not in used
        and k != "lm_head.weight"
        and not k.endswith((".attn.bias", ".attn.masked_bias"))
    )
    if unknown:
        raise ValueError(
            f"state_dict holds keys a GPT-2 model does not have: {unknown[:5]}"
        )
    return model
