"""Complete models: the encoder-decoder Transformer of Vaswani et al. (2017) and a
decoder-only MiniGPT in the style of GPT-2 / nanoGPT.

Both configs share their names: ``d_model``, ``num_heads``, ``d_ff``, ``dropout``,
``context_length``, ``activation``, ``norm``, ``norm_first``, ``positional``,
``tie_weights``, ``bias``, ``eps``; each is checked once, when the config is built. Both
models name their parts alike: ``tok_emb``, ``pos_emb``, ``drop``, ``blocks``,
``norm_f``, ``lm_head`` (the encoder-decoder prefixes ``src_``/``tgt_`` to the
embeddings and ``encoder_``/``decoder_`` to the stacks and final norms)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._validate import (
    check_choice,
    check_dropout,
    check_heads,
    check_id_tensor,
    check_int,
    check_positive_int,
    check_token_ids,
)
from .attention import KVCache
from .blocks import DecoderLayer, TransformerBlock, _norm_layer
from .feedforward import ACTIVATIONS
from .masks import padding_mask
from .norms import NORMS
from .positional import POSITIONAL_ENCODINGS, RotaryEmbedding, build_positional
from .sampling import check_sampling_args, sample_next_token

__all__ = ["TransformerConfig", "Transformer", "GPTConfig", "MiniGPT"]

# targets equal to this are skipped by the loss (F.cross_entropy's default)
IGNORE_INDEX = -100


def _check_common(
    cfg: TransformerConfig | GPTConfig, positional_choices: tuple[str, ...]
) -> None:
    """The rules both configs share (each rule is one ``utils`` helper)."""
    check_heads(cfg.d_model, cfg.num_heads, getattr(cfg, "num_kv_heads", None))
    check_positive_int("d_ff", cfg.d_ff)
    check_positive_int("context_length", cfg.context_length)
    check_dropout("dropout", cfg.dropout)
    check_choice("activation", cfg.activation, ACTIVATIONS)
    check_choice("norm", cfg.norm, NORMS)
    check_choice("positional encoding", cfg.positional, positional_choices)
    if cfg.positional == "sinusoidal" and cfg.d_model % 2:
        raise ValueError(
            f"sinusoidal positions need an even d_model, got {cfg.d_model}"
        )
    head_dim = cfg.d_model // cfg.num_heads
    if cfg.positional == "rope" and head_dim % 2:
        raise ValueError(f"rope needs an even head_dim, got {head_dim}")


@dataclass
class TransformerConfig:
    """Hyper-parameters of the encoder-decoder model; the defaults are the
    paper's base model.
    """

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 512
    num_heads: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    # longest source or target sequence (rows of the position tables)
    context_length: int = 512
    activation: str = "relu"
    norm_first: bool = False
    norm: str = "layernorm"
    positional: str = "sinusoidal"
    # one table for source and target tokens (shared vocabulary)
    share_embeddings: bool = False
    tie_weights: bool = False  # lm_head reuses the target embedding matrix
    final_norm: bool = True  # a norm after each stack, as nn.Transformer has
    bias: bool = True
    pad_id: int | None = 0
    eps: float | None = None  # None: the norm's own default (1e-5 / 1e-6)

    def __post_init__(self) -> None:
        check_positive_int("src_vocab_size", self.src_vocab_size)
        check_positive_int("tgt_vocab_size", self.tgt_vocab_size)
        check_positive_int("num_encoder_layers", self.num_encoder_layers)
        check_positive_int("num_decoder_layers", self.num_decoder_layers)
        _check_common(self, ("sinusoidal", "learned"))
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                "share_embeddings needs equal vocabularies, got "
                f"src_vocab_size={self.src_vocab_size}, "
                f"tgt_vocab_size={self.tgt_vocab_size}"
            )


class TiedLMHead(nn.Linear):
    """Output layer sharing its weight W with ``embedding`` (V, E), a table that the
    model multiplies by sqrt(E) at its input: ``logits = (h / sqrt(E)) W^T + b``
    (Mesh TensorFlow / T5's rescaling for tied embeddings; see :class:`Transformer`).
    """

    def __init__(self, embedding: nn.Embedding, bias: bool = True) -> None:
        vocab_size, d_model = embedding.weight.shape
        super().__init__(d_model, vocab_size, bias=bias)
        self.weight = embedding.weight  # the same Parameter: tied

    def forward(self, h: Tensor) -> Tensor:
        return F.linear(h * self.in_features**-0.5, self.weight, self.bias)


class Transformer(nn.Module):
    """Encoder-decoder Transformer: embeddings (scaled by sqrt(d_model)) + positions, an
    encoder stack of :class:`TransformerBlock` (``causal=False``), a decoder stack of
    :class:`DecoderLayer` and a linear output layer (``lm_head``).

    ``forward(src (N, S), tgt (N, L))`` returns logits ``(N, L, tgt_vocab_size)``;
    source padding (``cfg.pad_id``) is masked in the encoder and in the cross-attention,
    and the target self-attention is causal.

    The paper multiplies the embeddings by sqrt(d_model) but gives no initialisation;
    the token embeddings follow its authors' tensor2tensor code: N(0, 1/d_model), so
    the scaled embedding has unit variance, like the positions it is added to.

    With ``tie_weights`` the output layer is a :class:`TiedLMHead`: the decoder state
    is multiplied by d_model^-0.5 before the shared matrix, as Mesh TensorFlow / T5 do
    for tied embeddings. The residual path carries sqrt(d_model)·E_y to the last norm,
    so the state h is aligned with the input token's own row E_y; unscaled, that
    token's logit h·E_y grows like sqrt(d_model) and the untrained model copies its
    input (loss 2.3-5.7 ln V at d_model = 512, 50 <= V <= 2000). Scaled, that logit is
    at most about 1 and the others have std about d_model^-0.5: the untrained loss is
    within 10% of ln V, tied or not.
    """

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        E = cfg.d_model
        self.src_tok_emb = nn.Embedding(cfg.src_vocab_size, E)
        self.tgt_tok_emb = (
            self.src_tok_emb
            if cfg.share_embeddings
            else nn.Embedding(cfg.tgt_vocab_size, E)
        )
        self.src_pos_emb = build_positional(cfg.positional, E, cfg.context_length)
        self.tgt_pos_emb = build_positional(cfg.positional, E, cfg.context_length)
        self.drop = nn.Dropout(cfg.dropout)
        layer_args = dict(
            d_model=E, num_heads=cfg.num_heads, d_ff=cfg.d_ff, dropout=cfg.dropout,
            activation=cfg.activation, norm_first=cfg.norm_first, norm=cfg.norm,
            bias=cfg.bias, eps=cfg.eps,
        )  # fmt: skip
        self.encoder_blocks = nn.ModuleList(
            TransformerBlock(**layer_args, causal=False)
            for _ in range(cfg.num_encoder_layers)
        )
        self.decoder_blocks = nn.ModuleList(
            DecoderLayer(**layer_args) for _ in range(cfg.num_decoder_layers)
        )
        self.encoder_norm_f = self._final_norm()
        self.decoder_norm_f = self._final_norm()
        self.lm_head = (
            TiedLMHead(self.tgt_tok_emb, bias=cfg.bias)
            if cfg.tie_weights
            else nn.Linear(E, cfg.tgt_vocab_size, bias=cfg.bias)
        )
        for emb in (self.src_tok_emb, self.tgt_tok_emb):  # x · sqrt(E) ~ N(0, 1)
            nn.init.normal_(emb.weight, std=E**-0.5)

    def _final_norm(self) -> nn.Module:
        cfg = self.cfg
        if not cfg.final_norm:
            return nn.Identity()
        return _norm_layer(cfg.norm, cfg.d_model, cfg.eps, cfg.bias)

    def src_mask(self, src: Tensor) -> Tensor | None:
        """Key-padding mask ``(N, 1, 1, S)`` of the source, or ``None`` when ``pad_id``
        is None.
        """
        return None if self.cfg.pad_id is None else padding_mask(src, self.cfg.pad_id)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Source ids ``(N, S)`` -> memory ``(N, S, E)``."""
        check_id_tensor("src", src)
        x = self.src_tok_emb(src) * math.sqrt(self.cfg.d_model)
        x = self.drop(self.src_pos_emb(x))
        for block in self.encoder_blocks:
            x = block(x, attn_mask=src_mask)
        return self.encoder_norm_f(x)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        caches: list[KVCache] | None = None,
    ) -> Tensor:
        """Target ids ``(N, L)`` and memory ``(N, S, E)`` -> decoder states
        ``(N, L, E)``.

        With ``caches`` (one :class:`KVCache` per layer) ``tgt`` holds only the new
        positions.
        """
        check_id_tensor("tgt", tgt)
        offset = caches[0].offset if caches else 0
        x = self.tgt_tok_emb(tgt) * math.sqrt(self.cfg.d_model)
        x = self.drop(self.tgt_pos_emb(x, offset=offset))
        for i, block in enumerate(self.decoder_blocks):
            cache = caches[i] if caches else None
            x = block(x, memory, tgt_mask, src_mask, cache)
        return self.decoder_norm_f(x)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        src_mask = self.src_mask(src)
        memory = self.encode(src, src_mask)
        return self.lm_head(self.decode(tgt, memory, src_mask))

    @torch.no_grad()
    def greedy_decode(
        self, src: Tensor, bos_id: int, eos_id: int, max_len: int
    ) -> Tensor:
        """Greedy decoding with a KV cache: returns ``(N, T)`` ids starting with
        ``bos_id``, ``T <= max_len``; after a sequence emits ``eos_id`` it is padded
        with ``cfg.pad_id`` (or ``eos_id`` when ``pad_id`` is None)."""
        check_token_ids("src", src, self.cfg.src_vocab_size)
        check_positive_int("max_len", max_len)
        was_training = self.training
        self.eval()
        try:
            src_mask = self.src_mask(src)
            memory = self.encode(src, src_mask)
            caches = [KVCache(capacity=max_len) for _ in self.decoder_blocks]
            ys = torch.full(
                (src.size(0), 1), bos_id, dtype=torch.long, device=src.device
            )
            done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
            fill = eos_id if self.cfg.pad_id is None else self.cfg.pad_id
            for _ in range(max_len - 1):
                hidden = self.decode(ys[:, -1:], memory, src_mask, caches=caches)
                next_id = self.lm_head(hidden[:, -1]).argmax(dim=-1)
                next_id = torch.where(done, torch.full_like(next_id, fill), next_id)
                ys = torch.cat([ys, next_id[:, None]], dim=1)
                done |= next_id == eos_id
                if bool(done.all()):
                    break
        finally:
            self.train(was_training)
        return ys


@dataclass
class GPTConfig:
    """Hyper-parameters of :class:`MiniGPT` (defaults: a small model for CPU demos),
    checked once, here."""

    vocab_size: int
    context_length: int = 128
    d_model: int = 128
    num_heads: int = 4
    num_layers: int = 4
    d_ff: int | None = None  # default 4 * d_model
    num_kv_heads: int | None = None
    dropout: float = 0.0
    positional: str = "learned"
    norm: str = "layernorm"
    norm_first: bool = True
    activation: str = "gelu"
    tie_weights: bool = True
    bias: bool = True
    eps: float | None = None  # None: the norm's own default (1e-5 / 1e-6)
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model
        check_positive_int("vocab_size", self.vocab_size)
        check_positive_int("num_layers", self.num_layers)
        _check_common(self, POSITIONAL_ENCODINGS)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


def _positions(cfg: GPTConfig) -> tuple[nn.Module | None, RotaryEmbedding | None]:
    """``(pos_emb, rotary)``: one of the two, by ``cfg.positional``."""
    if cfg.positional == "rope":
        rope = build_positional("rope", cfg.head_dim, cfg.context_length, cfg.rope_base)
        return None, rope
    return build_positional(cfg.positional, cfg.d_model, cfg.context_length), None


class MiniGPT(nn.Module):
    """Decoder-only language model (GPT-2 layout): token embedding + positions,
    ``num_layers`` causal :class:`TransformerBlock`s, a final norm (Pre-LN only) and the
    ``lm_head``.

    Initialisation follows GPT-2: every weight ~ N(0, 0.02²), biases 0, and the two
    projections that write into the residual stream (``self_attn.out_proj``,
    ``ffn.w2``) use std ``0.02 / sqrt(2 · num_layers)`` so the residual sum keeps its
    scale with depth.
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        E = cfg.d_model
        self.tok_emb = nn.Embedding(cfg.vocab_size, E)
        # absolute positions are added to x; rotary ones turn q and k in every block
        self.pos_emb, rotary = _positions(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        block_args = dict(
            dropout=cfg.dropout, activation=cfg.activation, norm_first=cfg.norm_first,
            norm=cfg.norm, bias=cfg.bias, eps=cfg.eps, num_kv_heads=cfg.num_kv_heads,
            rotary=rotary,
        )  # fmt: skip
        self.blocks = nn.ModuleList(
            TransformerBlock.gpt(E, cfg.num_heads, cfg.d_ff, **block_args)
            for _ in range(cfg.num_layers)
        )
        self.norm_f = (
            _norm_layer(cfg.norm, E, cfg.eps, cfg.bias)
            if cfg.norm_first
            else nn.Identity()
        )
        self.lm_head = nn.Linear(E, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        residual_std = 0.02 / math.sqrt(2 * cfg.num_layers)
        for block in self.blocks:
            nn.init.normal_(block.self_attn.out_proj.weight, std=residual_std)
            nn.init.normal_(block.ffn.w2.weight, std=residual_std)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    @property
    def rolling_cache(self) -> bool:
        """Whether generation past the context window can roll the KV cache
        (no absolute positions).
        """
        return self.cfg.positional in ("rope", "none")

    def new_caches(self) -> list[KVCache]:
        """One empty :class:`KVCache` per block, with room for
        ``context_length`` positions.

        Without absolute positions (``rope``, ``none``) the caches roll: they keep the
        last ``context_length`` positions, so decoding can go on past the window
        (sliding-window attention).
        """
        C = self.cfg.context_length
        window = C if self.rolling_cache else None
        return [KVCache(capacity=C, window=window) for _ in self.blocks]

    def hidden_states(
        self, input_ids: Tensor, caches: list[KVCache] | None = None
    ) -> Tensor:
        """Final hidden states ``(N, T, E)``, after the final norm."""
        x = self.tok_emb(input_ids)  # (N, T) -> (N, T, E)
        if self.pos_emb is not None:
            x = self.pos_emb(x, offset=caches[0].offset if caches else 0)
        x = self.drop(x)
        for i, block in enumerate(self.blocks):
            x = block(x, cache=caches[i] if caches else None)
        return self.norm_f(x)

    def forward(
        self,
        input_ids: Tensor,
        targets: Tensor | None = None,
        caches: list[KVCache] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """``input_ids (N, T)`` -> ``(logits (N, T, V), loss)``; ``loss`` is the mean
        next-token cross-entropy against ``targets (N, T)`` (``-100`` ignored), or
        ``None``. With ``caches`` the ids are the new positions only. Only shapes are
        checked here (free); the ids' range is checked where data enters: ``generate``,
        ``lm_batch``, the trainer."""
        self._check_shapes(input_ids, targets, caches)
        logits = self.lm_head(self.hidden_states(input_ids, caches))
        loss = None
        if targets is not None:
            # (N*T, V) logits against (N*T,) targets
            loss = F.cross_entropy(
                logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX
            )
        return logits, loss

    def _check_shapes(
        self, input_ids: Tensor, targets: Tensor | None, caches: list[KVCache] | None
    ) -> None:
        """2-D long ids and targets of one shape, one cache per block, and no more
        positions than ``context_length`` (unless the caches roll)."""
        check_id_tensor("input_ids", input_ids)
        if caches is not None and len(caches) != len(self.blocks):
            raise ValueError(f"expected {len(self.blocks)} caches, got {len(caches)}")
        offset = caches[0].offset if caches else 0
        T, C = input_ids.size(1), self.cfg.context_length
        rolls = caches is not None and caches[0].window is not None
        if offset + T > C and not (rolls and T <= C):
            raise ValueError(
                f"sequence of {offset + T} positions (cached {offset} + new {T}) "
                f"exceeds context_length={C}"
            )
        if targets is not None:
            check_id_tensor("targets", targets)
            if targets.shape != input_ids.shape:
                raise ValueError(
                    f"targets shape {tuple(targets.shape)} != "
                    f"input_ids shape {tuple(input_ids.shape)}"
                )

    def generate(
        self,
        input_ids: Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        greedy: bool = False,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Append ``max_new_tokens`` tokens to ``input_ids (N, T)``; returns
        ``(N, T + max_new_tokens)``. The sampling options (keywords) are those of
        :func:`~transformer_course.sample_next_token`.

        The model sees at most ``context_length`` = C tokens. With ``use_cache``
        (default) each step feeds only the newest token; past the window the caches roll
        (rotary or no positions: sliding-window attention), or, with absolute positions,
        the cache is rebuilt from the last ``C // 2`` tokens once every ``C // 2`` steps
        (the tokens can then differ from ``use_cache=False``, which re-encodes the last
        C tokens every step). The loop runs under ``torch.inference_mode`` (no autograd
        bookkeeping on any operation: less overhead per token than ``no_grad``); the
        result is a normal tensor, usable in a later training step. The train/eval mode
        is restored, also on an error.
        """
        check_token_ids("input_ids", input_ids, self.cfg.vocab_size)
        check_int("prompt tokens per row", input_ids.size(1), 1)
        check_int("max_new_tokens", max_new_tokens, 0)
        check_sampling_args(temperature, top_k, top_p, greedy)
        sampling = dict(
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            greedy=greedy,
            generator=generator,
        )
        was_training = self.training
        self.eval()
        try:
            with torch.inference_mode():
                out = self._generate(input_ids, max_new_tokens, use_cache, sampling)
        finally:
            self.train(was_training)
        # an inference tensor cannot be saved for backward (the embedding saves its ids)
        return out.clone()

    def _generate(
        self, input_ids: Tensor, max_new_tokens: int, use_cache: bool, sampling: dict
    ) -> Tensor:
        N, T0 = input_ids.shape
        C = self.cfg.context_length
        # (N, T0 + new): filled left to right
        out = input_ids.new_empty(N, T0 + max_new_tokens)
        out[:, :T0] = input_ids
        n = T0  # tokens in `out` so far
        caches = self.new_caches() if use_cache else None
        for step in range(max_new_tokens):
            if step == 0 or not use_cache:
                # the last C tokens (with the cache: the prefill of the prompt)
                hidden = self.hidden_states(out[:, max(0, n - C) : n], caches)
            elif len(caches[0]) < C or self.rolling_cache:
                hidden = self.hidden_states(out[:, n - 1 : n], caches)
            else:  # full cache and absolute positions: re-encode the last C // 2 tokens
                for cache in caches:
                    cache.reset()
                hidden = self.hidden_states(out[:, n - max(1, C // 2) : n], caches)
            logits = self.lm_head(hidden[:, -1])  # (N, V): the last position only
            out[:, n] = sample_next_token(logits, **sampling)[:, 0]  # (N, 1) -> (N,)
            n += 1
        return out
