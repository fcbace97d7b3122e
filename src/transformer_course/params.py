"""Parameter counts (measured and analytic) and a FLOPs-per-token estimate."""

from __future__ import annotations

from torch import nn

from ._validate import check_type
from .models import GPTConfig, TransformerConfig

__all__ = [
    "count_parameters",
    "gpt_parameter_breakdown",
    "gpt_parameter_count",
    "transformer_parameter_breakdown",
    "transformer_parameter_count",
    "gpt_flops_per_token",
]


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of scalar parameters; tied (shared) tensors are counted once."""
    check_type("model", model, nn.Module)
    return sum(
        p.numel() for p in model.parameters() if p.requires_grad or not trainable_only
    )


def _linear(n_in: int, n_out: int, bias: bool) -> int:
    return n_in * n_out + (n_out if bias else 0)


def _norm(kind: str, E: int, bias: bool) -> int:
    return 2 * E if kind == "layernorm" and bias else E


def _attention(E: int, kv_dim: int, bias: bool) -> int:
    return 2 * _linear(E, E, bias) + 2 * _linear(E, kv_dim, bias)  # q, out; k, v


def _ffn(E: int, d_ff: int, activation: str, bias: bool) -> int:
    n_in = 2 if activation in ("swiglu", "geglu") else 1
    return n_in * _linear(E, d_ff, bias) + _linear(d_ff, E, bias)


def gpt_parameter_breakdown(cfg: GPTConfig) -> dict[str, int]:
    """Exact parameter count of :class:`MiniGPT` per component (sums to the model's
    count)."""
    E, V = cfg.d_model, cfg.vocab_size
    kv_heads = cfg.num_kv_heads or cfg.num_heads
    per_block = (
        2 * _norm(cfg.norm, E, cfg.bias)
        + _attention(E, kv_heads * cfg.head_dim, cfg.bias)
        + _ffn(E, cfg.d_ff, cfg.activation, cfg.bias)
    )
    return {
        "token_embedding": V * E,
        "position_embedding": cfg.context_length * E
        if cfg.positional == "learned"
        else 0,
        "blocks": cfg.num_layers * per_block,
        "final_norm": _norm(cfg.norm, E, cfg.bias) if cfg.norm_first else 0,
        "lm_head": 0 if cfg.tie_weights else V * E,
    }


def gpt_parameter_count(cfg: GPTConfig) -> int:
    """Total of :func:`gpt_parameter_breakdown`."""
    return sum(gpt_parameter_breakdown(cfg).values())


def transformer_parameter_breakdown(cfg: TransformerConfig) -> dict[str, int]:
    """Exact parameter count of :class:`Transformer` per component."""
    E, b = cfg.d_model, cfg.bias
    norm = _norm(cfg.norm, E, b)
    ffn = _ffn(E, cfg.d_ff, cfg.activation, b)
    encoder_layer = _attention(E, E, b) + ffn + 2 * norm
    decoder_layer = 2 * _attention(E, E, b) + ffn + 3 * norm
    return {
        "src_embedding": cfg.src_vocab_size * E,
        "tgt_embedding": 0 if cfg.share_embeddings else cfg.tgt_vocab_size * E,
        "positions": 2 * cfg.context_length * E if cfg.positional == "learned" else 0,
        "encoder": cfg.num_encoder_layers * encoder_layer,
        "decoder": cfg.num_decoder_layers * decoder_layer,
        "final_norms": 2 * norm if cfg.final_norm else 0,
        "lm_head": _linear(E, cfg.tgt_vocab_size, b)
        - (cfg.tgt_vocab_size * E if cfg.tie_weights else 0),
    }


def transformer_parameter_count(cfg: TransformerConfig) -> int:
    """Total of :func:`transformer_parameter_breakdown`."""
    return sum(transformer_parameter_breakdown(cfg).values())


def gpt_flops_per_token(
    cfg: GPTConfig, seq_len: int | None = None, training: bool = True
) -> int:
    """Matmul FLOPs per token of :class:`MiniGPT` (a multiply-add counts as 2 FLOPs).

    Forward: ``2 · (weights of every matmul, including lm_head)`` plus the attention
    matmuls ``Q Kᵀ`` and ``A V``: ``2 · 2 · num_layers · T · d_model`` for a context of
    ``T`` tokens (the full ``T``, as in the PaLM/nanoGPT MFU convention). Training
    (forward + backward) is 3x forward. Norms, softmax and activations are ignored.
    """
    T = cfg.context_length if seq_len is None else seq_len
    bd = gpt_parameter_breakdown(cfg)
    matmul_weights = bd["blocks"] + cfg.vocab_size * cfg.d_model  # lm_head, tied or not
    forward = 2 * matmul_weights + 4 * cfg.num_layers * T * cfg.d_model
    return 3 * forward if training else forward
