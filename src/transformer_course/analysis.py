"""Measurements of a model's attention and of its loss landscape (chapter 3 and its deep
dive import them as ``tc.analysis``).

* attention rows: :func:`mean_distance`, :func:`mean_pairwise_tv`,
  :func:`normalized_entropy`, and :func:`head_stats` (the first two, per layer);
* the residual stream: :class:`NoResidual` (a block without its skips),
  :func:`token_spread`, :func:`residual_stds`, :func:`flat_residual_init`;
* curvature: :func:`curvature` (Hessian-vector products, power iteration) and
  :func:`landscape_run` (a 6-layer MiniGPT at initialization and after training).
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

from ._validate import check_int, check_positive_int, check_tensor, check_type
from .notebook import record_attention
from .training import train_loop
from .utils import set_seed

__all__ = [
    "mean_distance",
    "mean_pairwise_tv",
    "normalized_entropy",
    "head_stats",
    "NoResidual",
    "token_spread",
    "residual_stds",
    "flat_residual_init",
    "curvature",
    "LandscapeRun",
    "landscape_run",
]


def _check_attention(name: str, A: object) -> Tensor:
    """Attention weights ``(N, H, L, S)``."""
    A = check_tensor(name, A, min_dim=4)
    if A.dim() != 4:
        raise ValueError(f"{name} must be (N, H, L, S), got shape {tuple(A.shape)}")
    return A


def mean_distance(A: Tensor, first_query: int = 8) -> Tensor:
    """Mean attention distance ``sum_j (i - j) A_ij`` per head, ``(H,)``.

    ``A (N, H, L, S)`` holds the rows of queries ``first_query .. first_query + L - 1``
    (query ``i`` is row ``i - first_query``) over keys ``0 .. S - 1``.
    """
    A = _check_attention("A", A)
    check_int("first_query", first_query, 0)
    i = torch.arange(first_query, first_query + A.size(-2))[:, None]
    j = torch.arange(A.size(-1))
    return ((i - j).clamp_min(0) * A).sum(-1).mean((0, 2))


def mean_pairwise_tv(A: Tensor) -> float:
    """Total variation distance ``0.5 sum_j |A^h_ij - A^h'_ij|`` between the rows of two
    heads, averaged over rows and over all pairs of heads; ``A (N, H, L, S)``, H >= 2.
    """
    A = _check_attention("A", A)
    if A.size(1) < 2:
        raise ValueError(f"A needs at least 2 heads, got shape {tuple(A.shape)}")
    pairs = list(itertools.combinations(range(A.size(1)), 2))
    tv = [0.5 * (A[:, a] - A[:, b]).abs().sum(-1).mean().item() for a, b in pairs]
    return sum(tv) / len(tv)


def normalized_entropy(W: Tensor) -> float:
    """Mean entropy of causal attention rows over log(visible keys): 1 = uniform.

    ``W (N, H, T, T)``; query ``i`` sees ``i + 1`` keys; query 0 (one key) is skipped.
    """
    W = _check_attention("W", W)
    if W.size(-1) != W.size(-2) or W.size(-1) < 2:
        raise ValueError(
            f"W must be (N, H, T, T) with T >= 2, got shape {tuple(W.shape)}"
        )
    ent = -(W * W.clamp_min(1e-30).log()).sum(-1)[..., 1:]
    return (ent / torch.log(torch.arange(2, W.size(-1) + 1).float())).mean().item()


def head_stats(model: nn.Module, idx: Tensor, first_query: int = 8):
    """Per attention layer of ``model`` (a MiniGPT) on ``idx (N, T)``: the pair
    (:func:`mean_distance` per head, :func:`mean_pairwise_tv`) over queries
    ``first_query .. T - 1``."""
    check_tensor("idx", idx)
    check_int("first_query", first_query, 0, idx.size(-1) - 1)
    with torch.no_grad(), record_attention(model) as maps:
        model(idx)
    rows = [maps[b.self_attn][:, :, first_query:] for b in model.blocks]
    return [(mean_distance(A, first_query), mean_pairwise_tv(A)) for A in rows]


class NoResidual(nn.Module):
    """A Pre-LN GPT block with both skip connections removed (for comparison only)."""

    def __init__(self, block: nn.Module):
        super().__init__()
        for part in ("norm1", "self_attn", "norm2", "ffn"):
            if not hasattr(block, part):
                raise TypeError(
                    f"block must be a GPT TransformerBlock with {part}, "
                    f"got {type(block).__name__}"
                )
        self.block = block

    def forward(self, x: Tensor, attn_mask=None, cache=None) -> Tensor:
        b = self.block
        h = b.self_attn(b.norm1(x), is_causal=True)
        return b.ffn(b.norm2(h))


def token_spread(h: Tensor) -> float:
    """How different the positions of one sequence are: ``||h - mean_t h|| / ||h||``
    for ``h (N, T, E)`` (0 = every position the same)."""
    h = check_tensor("h", h, min_dim=3)
    if h.dim() != 3:
        raise ValueError(f"h must be (N, T, E), got shape {tuple(h.shape)}")
    return ((h - h.mean(1, keepdim=True)).norm() / h.norm()).item()


def residual_stds(model: nn.Module, idx: Tensor) -> Tensor:
    """Standard deviation of the residual stream ``X_0, X_1, ..., X_n`` of a MiniGPT
    with learned positions on ``idx (N, T)`` (no dropout), ``n_layers + 1`` values."""
    check_tensor("idx", idx)
    with torch.no_grad():
        X = model.pos_emb(model.tok_emb(idx))
        stds = [X.std().item()]
        for b in model.blocks:
            X = b(X)
            stds.append(X.std().item())
    return torch.tensor(stds)


def flat_residual_init(model: nn.Module, std: float = 0.02) -> nn.Module:
    """Redraw the two residual projections of every block (``out_proj``, ``w2``) from
    N(0, std^2), undoing GPT-2's 1/sqrt(2 n_layers) scaling; returns ``model``."""
    if isinstance(std, bool) or not isinstance(std, (int, float)) or not std > 0:
        raise ValueError(f"std must be a positive number, got {std!r}")
    for b in model.blocks:
        nn.init.normal_(b.self_attn.out_proj.weight, std=std)
        nn.init.normal_(b.ffn.w2.weight, std=std)
    return model


def _norm(v: list[Tensor]) -> float:
    """Euclidean norm of a list of tensors taken as one vector."""
    return math.sqrt(sum((t**2).sum().item() for t in v))


def _random_unit(params: list[Tensor], generator: torch.Generator) -> list[Tensor]:
    """A unit vector, uniform on the sphere, shaped like ``params``."""
    u = [torch.randn(p.shape, generator=generator) for p in params]
    n = _norm(u)
    return [t / n for t in u]


def curvature(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    generator: torch.Generator,
    iters: int = 10,
    n_random: int = 3,
) -> tuple[float, float]:
    """``(kappa, top)`` of the loss ``model(x, y)[1]``: the random-direction curvature
    ``||H u||`` (mean over ``n_random`` unit directions; 0.0 when ``n_random = 0``) and
    the spectral norm ``||H||_2`` after ``iters`` steps of power iteration (a lower
    bound), both from Hessian-vector products (autograd twice; H is never formed)."""
    check_positive_int("iters", iters)
    check_int("n_random", n_random, 0)
    check_type("generator", generator, torch.Generator)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    params = list(model.parameters())
    with sdpa_kernel(SDPBackend.MATH):  # the fused kernel has no second derivative
        grads = torch.autograd.grad(model(x, y)[1], params, create_graph=True)

        def hvp(v):  # Hessian-vector product: d(grad . v) / d theta
            hv = torch.autograd.grad(grads, params, v, retain_graph=True)
            return [t.detach() for t in hv]

        kappa = sum(
            _norm(hvp(_random_unit(params, generator))) for _ in range(n_random)
        )
        kappa /= max(n_random, 1)
        v = _random_unit(params, generator)
        for _ in range(iters):  # power iteration
            hv = hvp(v)
            top = _norm(hv)
            v = [t / top for t in hv]
    return kappa, top


class LandscapeRun(NamedTuple):
    """What :func:`landscape_run` measures."""

    at_init: tuple[float, float]  # (kappa, ||H||_2) at initialization
    losses: list[float]  # training loss per step
    trained: tuple[float, float]  # (kappa, ||H||_2) after training
    spread: tuple[float, float]  # token_spread of the last hidden states: before, after


def landscape_run(
    train_data: Tensor,
    vocab_size: int,
    seed: int,
    residual: bool = True,
    steps: int = 30,
) -> LandscapeRun:
    """A 6-layer MiniGPT (E = 32, 4 heads, context 32; without skips when ``residual``
    is False), measured on one fixed batch of 8 windows of ``train_data`` at
    initialization and after ``steps`` AdamW steps (lr 3e-3, batches of 16)."""
    from .data import lm_batch
    from .models import GPTConfig, MiniGPT

    check_int("seed", seed, 0)
    check_positive_int("steps", steps)
    check_type("residual", residual, bool)
    set_seed(seed)
    m = MiniGPT(GPTConfig(vocab_size=vocab_size, context_length=32, d_model=32,
                          num_heads=4, num_layers=6))  # fmt: skip
    if not residual:
        m.blocks = nn.ModuleList(NoResidual(b) for b in m.blocks)
    g = torch.Generator().manual_seed(seed)
    x_fix, y_fix = lm_batch(train_data, 8, 32, generator=g)  # where we measure
    at_init = curvature(m, x_fix, y_fix, g)
    with torch.no_grad():
        spread0 = token_spread(m.hidden_states(x_fix))
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    hist = train_loop(
        lambda s: m(*lm_batch(train_data, 16, 32, generator=g))[1], opt, steps
    )
    with torch.no_grad():
        spread1 = token_spread(m.hidden_states(x_fix))
    trained = curvature(m, x_fix, y_fix, g)
    return LandscapeRun(at_init, hist.losses, trained, (spread0, spread1))
