"""Small synthetic tasks and the training helpers behind chapter 4's design experiments.

Chapter 4 and its deep dive train the same tiny models on the same tasks (the chapter
shows one or two seeds, the deep dive reruns them at more seeds), so the builders
live here once. Every function takes its seed explicitly; the same seed gives the
same result.

Tasks:

* the **four-lag task** (``lag_batch``): random sequences of ``LAG_VOCAB`` symbols,
  length ``LAG_LENGTH``; from position 7 on, each position outputs
  ``x[i-1], x[i-3], x[i-5], x[i-7]`` (``LAGS``); ``lag_transformer`` builds a model
  for it;
* the **lag-3 task** (``lag3_batch``): random sequences of ``PE_VOCAB`` symbols;
  position ``i`` outputs ``x[i-3]``. Trained on length 24, tested on length
  ``PE_TEST_LENGTH``;
* the **attention-pattern tasks** of section 4.2.2 (``train_pattern_task``): any
  batch function; ``attention_profile`` summarises the heads it trains.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._validate import check_choice, check_int, check_positive_int
from .blocks import TransformerBlock
from .masks import causal_mask
from .models import GPTConfig, MiniGPT
from .norms import build_norm
from .notebook import record_attention
from .positional import POSITIONAL_ENCODINGS, LearnedPositionalEmbedding
from .training import TrainHistory, train_loop
from .utils import set_seed

LAGS = (1, 3, 5, 7)
LAG_VOCAB, LAG_LENGTH = 8, 12
PE_VOCAB, PE_LAG, PE_TEST_LENGTH = 16, 3, 48
OPTIMIZERS = ("adamw", "sgd")


class TinyTransformer(nn.Module):
    """Token embedding + learned positions + ``num_layers`` ``TransformerBlock`` s +
    a linear head. ``causal=True`` masks every layer (decoder), else bidirectional."""

    def __init__(self, vocab: int, n_out: int, max_len: int, d_model: int = 32,
                 num_heads: int = 2, num_layers: int = 1, d_ff: int = 64,
                 causal: bool = False, norm_first: bool = True,
                 norm: str = "layernorm", activation: str = "relu",
                 num_kv_heads: int | None = None) -> None:  # fmt: skip
        super().__init__()
        check_positive_int("num_layers", num_layers)
        self.causal = causal
        self.emb = nn.Embedding(vocab, d_model)
        self.pos = LearnedPositionalEmbedding(d_model, max_len)
        block = dict(norm_first=norm_first, norm=norm, activation=activation,
                     num_kv_heads=num_kv_heads)  # fmt: skip
        self.layers = nn.ModuleList(
            TransformerBlock(d_model, num_heads, d_ff, **block)
            for _ in range(num_layers)
        )
        self.norm = build_norm(norm, d_model) if norm_first else nn.Identity()
        self.head = nn.Linear(d_model, n_out)

    def forward(self, x: Tensor) -> Tensor:
        mask = causal_mask(x.size(1)) if self.causal else None  # True = may attend
        h = self.pos(self.emb(x))  # (N, L) -> (N, L, E)
        for layer in self.layers:
            h = layer(h, attn_mask=mask)
        return self.head(self.norm(h))  # (N, L, E) -> (N, L, n_out)


def fit(
    model: nn.Module,
    loss_fn: Callable[[int], Tensor],
    steps: int,
    lr: float = 1e-2,
    warmup: int = 0,
    optimizer: str = "adamw",
    lr_scale: dict[str, float] | None = None,
) -> TrainHistory:
    """Train with AdamW (no weight decay) or SGD. ``warmup > 0`` ramps the learning
    rate linearly to ``lr`` over the first ``warmup`` steps; ``lr_scale`` maps a
    parameter-name prefix to a factor on ``lr``. ``foreach=True`` merges the updates
    into a few tensor ops, much faster for tiny models."""
    check_positive_int("steps", steps)
    check_choice("optimizer", optimizer, OPTIMIZERS)
    groups = collections.defaultdict(list)
    for name, param in model.named_parameters():
        factor = [f for pre, f in (lr_scale or {}).items() if name.startswith(pre)]
        groups[factor[0] if factor else 1.0].append(param)
    params = [{"params": ps, "lr": lr * f} for f, ps in groups.items()]
    if optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=lr, foreach=True)
    else:
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, foreach=True)
    sched = None
    if warmup:
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: min(1.0, (step + 1) / warmup)
        )
    return train_loop(loss_fn, opt, steps, scheduler=sched)


def tail_mean(history: TrainHistory, k: int = 20) -> float:
    """Mean training loss over the last ``k`` steps."""
    check_int("k", k, minimum=1, maximum=len(history.losses))
    return sum(history.losses[-k:]) / k


def attention_profile(w: Tensor) -> tuple[Tensor, Tensor]:
    """w: attention weights (N, H, L, S). Each head's mean attention distance and its
    effective number of keys exp(H(a)), both averaged over queries, shape (H,)."""
    if not isinstance(w, Tensor) or w.dim() != 4:
        shape = tuple(w.shape) if isinstance(w, Tensor) else type(w).__name__
        raise ValueError(f"w must be attention weights (N, H, L, S), got {shape}")
    L, S = w.shape[-2:]
    dist = (torch.arange(L)[:, None] - torch.arange(S)[None, :]).abs().float()
    mean_dist = (w * dist).sum(-1).mean(dim=(0, 2))
    entropy = -(w * w.clamp_min(1e-12).log()).sum(-1)  # (N, H, L)
    return mean_dist, entropy.exp().mean(dim=(0, 2))


def train_pattern_task(
    batch_fn: Callable[[int, torch.Generator], tuple[Tensor, ...]],
    seed: int,
    *,
    vocab: int,
    n_out: int,
    causal: bool,
    num_layers: int = 1,
    steps: int = 100,
    lr: float = 1e-2,
    align: Callable[[Tensor], Tensor] | None = None,
    length: int = 16,
) -> dict:
    """Train a ``TinyTransformer`` (E = 32, 2 heads) on ``batch_fn(n, gen)``, which
    returns ``(x, y, *extra)``: x (n, length) tokens, y the targets of the positions
    that ``align`` (default: all) cuts from the logits (n, length, n_out). Returns the
    accuracy on 256 sequences drawn from ``seed + 1``, each layer's attention weights
    (N, H, L, L) on them, and those sequences: ``x``, ``y`` and ``extra``."""
    if not callable(batch_fn):
        raise TypeError(f"batch_fn must be callable, got {type(batch_fn).__name__}")
    check_positive_int("length", length)
    cut = align if align is not None else (lambda z: z)
    set_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = TinyTransformer(vocab, n_out, length, num_layers=num_layers, causal=causal)

    def loss_fn(step: int) -> Tensor:
        x, y = batch_fn(64, gen)[:2]
        return F.cross_entropy(cut(model(x)).flatten(0, 1), y.flatten())

    fit(model, loss_fn, steps, lr=lr)
    x, y, *extra = batch_fn(256, torch.Generator().manual_seed(seed + 1))
    with torch.no_grad(), record_attention(model) as attn_maps:
        logits = model(x)
    weights = [attn_maps[layer.self_attn] for layer in model.layers]
    acc = (cut(logits).argmax(-1) == y).float().mean().item()
    return dict(acc=acc, weights=weights, x=x, y=y, extra=extra)


def lag_batch(n: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """``n`` four-lag sequences: x (n, 12); y (n, 5, 4), the answers from position 7."""
    check_positive_int("n", n)
    x = torch.randint(0, LAG_VOCAB, (n, LAG_LENGTH), generator=gen)
    return x, torch.stack([x[:, max(LAGS) - k : LAG_LENGTH - k] for k in LAGS], -1)


def lag_transformer(
    num_heads: int,
    num_layers: int = 1,
    num_kv_heads: int | None = None,
    norm_first: bool = True,
    norm: str = "layernorm",
    activation: str = "relu",
) -> TinyTransformer:
    """A causal ``TinyTransformer`` (E = 32) shaped for the four-lag task: sequences
    of ``LAG_VOCAB`` symbols, ``LAG_LENGTH`` long, in; at each position
    ``len(LAGS) * LAG_VOCAB`` logits out, the four answers that :func:`lag_loss`
    scores. The other arguments are ``TinyTransformer``'s."""
    return TinyTransformer(LAG_VOCAB, LAG_VOCAB * len(LAGS), LAG_LENGTH, causal=True,
                           num_heads=num_heads, num_layers=num_layers,
                           num_kv_heads=num_kv_heads, norm_first=norm_first,
                           norm=norm, activation=activation)  # fmt: skip


def _lag_logits(model: nn.Module, x: Tensor) -> Tensor:
    """The four answers' logits (N, 5, 4, LAG_VOCAB), from position 7 on."""
    return model(x)[:, max(LAGS) :].unflatten(-1, (len(LAGS), LAG_VOCAB))


def lag_loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """Cross-entropy of a model with 4 * LAG_VOCAB outputs on the four-lag answers."""
    return F.cross_entropy(_lag_logits(model, x).flatten(0, 2), y.flatten())


def train_lag_model(
    num_heads: int, seed: int, num_kv_heads: int | None = None, steps: int = 150
) -> tuple[TinyTransformer, TrainHistory, float]:
    """One causal layer (E = 32) on the four-lag task; returns the model, its history
    and the accuracy on 500 test sequences drawn from ``seed + 1``."""
    check_positive_int("steps", steps)
    set_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = lag_transformer(num_heads, num_kv_heads=num_kv_heads, activation="gelu")
    hist = fit(model, lambda step: lag_loss(model, *lag_batch(32, gen)), steps)
    x, y = lag_batch(500, torch.Generator().manual_seed(seed + 1))
    with torch.no_grad():
        acc = (_lag_logits(model, x).argmax(-1) == y).float().mean().item()
    return model, hist, acc


def train_norm_variant(
    norm_first: bool,
    warmup: int,
    seed: int,
    norm: str = "layernorm",
    steps: int = 80,
    lr: float = 3e-2,
    optimizer: str = "adamw",
) -> TrainHistory:
    """A causal 3-layer, 4-head ``TinyTransformer`` (Pre-LN if ``norm_first``, else
    Post-LN) trained on the four-lag task; returns its training history."""
    check_int("warmup", warmup, minimum=0)
    set_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = lag_transformer(4, num_layers=3, norm_first=norm_first, norm=norm)
    return fit(
        model,
        lambda step: lag_loss(model, *lag_batch(32, gen)),
        steps,
        lr=lr,
        warmup=warmup,
        optimizer=optimizer,
    )


def lag3_batch(n: int, length: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """``n`` lag-3 sequences: y[:, i] = x[:, i - 3]; -100 (not scored) before that."""
    check_int("length", length, minimum=PE_LAG + 1)
    x = torch.randint(0, PE_VOCAB, (n, length), generator=gen)
    y = torch.full_like(x, -100)  # -100: the first 3 positions are not scored
    y[:, PE_LAG:] = x[:, :-PE_LAG]  # position i outputs x[i-3]
    return x, y


def train_pe(
    pe: str,
    seed: int,
    train_length: int = 24,
    steps: int = 200,
    gpt: MiniGPT | None = None,
    rope_base: float = 10000.0,
) -> dict:
    """Train (or, given ``gpt``, keep training) a one-layer, two-head ``MiniGPT``
    (E = 32) with positional encoding ``pe`` on lag-3 sequences of ``train_length``;
    test per-position accuracy on length ``PE_TEST_LENGTH`` (data from ``seed + 1``)."""
    check_choice("positional encoding", pe, POSITIONAL_ENCODINGS)
    check_int("train_length", train_length, minimum=PE_LAG + 1, maximum=PE_TEST_LENGTH)
    set_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    if gpt is None:
        cfg = GPTConfig(vocab_size=PE_VOCAB, context_length=PE_TEST_LENGTH, d_model=32,
                        num_heads=2, num_layers=1, d_ff=64, positional=pe,
                        rope_base=rope_base)  # fmt: skip
        gpt = MiniGPT(cfg)
    pos = gpt.pos_emb if hasattr(gpt, "pos_emb") else gpt.pos
    pos_before = pos.embedding.weight.detach().clone() if pe == "learned" else None
    hist = fit(gpt, lambda step: gpt(*lag3_batch(32, train_length, gen))[1], steps)
    x, y = lag3_batch(500, PE_TEST_LENGTH, torch.Generator().manual_seed(seed + 1))
    with torch.no_grad():
        per_pos = (gpt(x)[0].argmax(-1) == y).float().mean(0)  # (PE_TEST_LENGTH,)
    return dict(model=gpt, hist=hist, per_pos=per_pos, pos_before=pos_before,
                inside=per_pos[PE_LAG:train_length].mean().item(),
                outside=per_pos[train_length:].mean().item())  # fmt: skip
