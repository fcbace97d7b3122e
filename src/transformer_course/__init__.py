"""transformer_course: the small, tested PyTorch library behind the course book.

The top level is the model API. The book's helpers live in :mod:`.notebook` (chapters
import it as ``nb``; ``setup_chapter`` and ``show_source`` are also here), the graders
in :mod:`.exercises`, the figures in :mod:`.viz` and :mod:`.diagrams`, measurements of
attention and of the loss landscape in :mod:`.analysis`, chapter 4's small synthetic
tasks and their trainers in :mod:`.toy_tasks`, the command-line trainer in
:mod:`.train_gpt`.

Conventions: shapes use N (batch), L (query length), S (key length), E (d_model),
H (heads), Hkv (key/value heads), D (head_dim), V (vocabulary). Boolean masks are
``True`` where a query may attend; float masks are additive (``0`` / ``-inf``).
"""

import importlib

from .attention import (
    AdditiveAttention,
    KVCache,
    MultiHeadAttention,
    masked_softmax,
    scaled_dot_product_attention,
)
from .blocks import DecoderLayer, TransformerBlock
from .checkpoint import (
    config_from_dict,
    config_to_dict,
    load_checkpoint,
    save_checkpoint,
    state_dict_sha256,
    unwrap_model,
)
from .data import (
    HELD_OUT_PAIR,
    CharTokenizer,
    WordTokenizer,
    char_ngram_loss,
    copy_task,
    generate_text_corpus,
    lm_batch,
    load_text_corpus,
    split_paragraphs,
    translation_corpus,
)
from .efficient_attention import (
    elu_feature_map,
    linear_attention,
    linear_attention_recurrent,
    linear_attention_weights,
    local_attention,
    low_rank_attention,
    sliding_window_mask,
)
from .feedforward import ACTIVATIONS, FeedForward
from .interop import load_hf_gpt2, load_torch_mha, load_torch_transformer
from .masks import (
    bool_to_additive,
    causal_mask,
    merge_masks,
    padding_mask,
    to_torch_mask,
)
from .models import GPTConfig, MiniGPT, Transformer, TransformerConfig
from .norms import (
    NORMS,
    LayerNorm,
    RMSNorm,
    build_norm,
    layer_norm_reference,
    rms_norm_reference,
)
from .notebook import setup_chapter, show_source
from .params import (
    count_parameters,
    gpt_flops_per_token,
    gpt_parameter_breakdown,
    gpt_parameter_count,
    transformer_parameter_breakdown,
    transformer_parameter_count,
)
from .positional import (
    POSITIONAL_ENCODINGS,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    build_positional,
    relative_position_transform,
    sinusoidal_table,
)
from .sampling import sample_next_token, top_k_filter, top_p_filter
from .sparse import (
    SparsemaxFunction,
    sparsemax,
    sparsemax_attention,
    sparsemax_threshold,
)
from .tokenizer import BPETokenizer
from .training import (
    TrainHistory,
    cosine_lr,
    decay_param_groups,
    derived_seed,
    label_smoothing_loss,
    noam_lr,
    noam_scheduler,
    smoothed_targets,
    train_loop,
)
from .utils import get_device, set_seed

__version__ = "0.1.0"

# Submodules that only some pages need are imported on first use (PEP 562), so
# `import transformer_course` stays light (matplotlib alone takes longer to import than
# the rest of the package together).
_LAZY_MODULES = (
    "viz", "diagrams", "benchmarking", "train_gpt", "exercises", "explorer",
    "notebook", "masks", "analysis", "toy_tasks",
)  # fmt: skip


def __getattr__(name: str):
    if name in _LAZY_MODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ACTIVATIONS", "AdditiveAttention", "bool_to_additive", "build_norm",
    "build_positional", "causal_mask", "char_ngram_loss", "CharTokenizer",
    "config_from_dict", "config_to_dict", "copy_task", "cosine_lr", "count_parameters",
    "decay_param_groups", "derived_seed",
    "DecoderLayer", "elu_feature_map", "FeedForward", "generate_text_corpus",
    "get_device", "gpt_flops_per_token", "gpt_parameter_breakdown",
    "gpt_parameter_count", "GPTConfig", "HELD_OUT_PAIR", "KVCache",
    "label_smoothing_loss", "layer_norm_reference", "LayerNorm",
    "LearnedPositionalEmbedding", "linear_attention", "linear_attention_recurrent",
    "linear_attention_weights", "lm_batch", "load_checkpoint", "load_hf_gpt2",
    "load_text_corpus", "load_torch_mha", "load_torch_transformer",
    "local_attention", "low_rank_attention", "masked_softmax", "merge_masks",
    "MiniGPT", "MultiHeadAttention", "noam_lr", "noam_scheduler", "NORMS",
    "padding_mask", "POSITIONAL_ENCODINGS",
    "relative_position_transform", "rms_norm_reference", "RMSNorm",
    "RotaryEmbedding", "sample_next_token", "save_checkpoint",
    "scaled_dot_product_attention", "set_seed", "setup_chapter",
    "show_source", "sinusoidal_table", "SinusoidalPositionalEncoding",
    "sliding_window_mask", "smoothed_targets", "sparsemax", "sparsemax_attention",
    "sparsemax_threshold", "SparsemaxFunction", "split_paragraphs",
    "state_dict_sha256", "to_torch_mask", "top_k_filter", "top_p_filter",
    "train_loop", "TrainHistory", "Transformer", "transformer_parameter_breakdown",
    "transformer_parameter_count", "TransformerBlock", "TransformerConfig",
    "translation_corpus", "unwrap_model", "WordTokenizer",
    "BPETokenizer",
]  # fmt: skip
