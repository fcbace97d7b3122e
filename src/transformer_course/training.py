"""Training utilities: the Noam learning-rate schedule, label smoothing and a compact
loop."""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR

from ._validate import (
    check_int,
    check_positive_int,
    check_positive_real,
    check_real,
    describe,
)

__all__ = [
    "noam_lr",
    "noam_scheduler",
    "cosine_lr",
    "decay_param_groups",
    "derived_seed",
    "smoothed_targets",
    "label_smoothing_loss",
    "TrainHistory",
    "train_loop",
]


def noam_lr(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """``factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)``
    (Vaswani et al. 2017, eq. 3).

    It rises linearly for ``warmup`` steps, peaks at ``step == warmup`` and then decays
    as ``1/sqrt(step)``. ``step`` counts from 1.
    """
    check_positive_int("step", step)
    check_positive_int("d_model", d_model)
    check_positive_int("warmup", warmup)
    check_positive_real("factor", factor)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def noam_scheduler(
    optimizer: torch.optim.Optimizer, d_model: int, warmup: int, factor: float = 1.0
) -> LambdaLR:
    """A ``LambdaLR`` following :func:`noam_lr`; give the optimizer ``lr=1.0``.

    ``LambdaLR`` calls the lambda with 0 before the first step; step ``s`` of training
    uses ``noam_lr(s + 1)``.
    """
    return LambdaLR(optimizer, lambda s: noam_lr(s + 1, d_model, warmup, factor))


def cosine_lr(
    step: int, *, lr: float, min_lr: float, warmup: int, decay_steps: int
) -> float:
    """Linear warm-up to ``lr`` over ``warmup`` steps, then cosine decay to ``min_lr``
    at ``decay_steps`` (nanoGPT's schedule); ``step`` counts from 0."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= decay_steps:
        return min_lr
    progress = (step - warmup) / max(1, decay_steps - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


def decay_param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW parameter groups: weight decay on the matrices (``dim >= 2``: linear
    layers and embeddings), none on biases and norm gains (nanoGPT's grouping)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def derived_seed(*parts: object) -> int:
    """A 64-bit seed that depends only on ``parts``, e.g. ``(seed, rank, step)``: the
    one seeding rule for batches, dropout masks and validation batches, so that a
    resumed run draws exactly what an uninterrupted one would: the first 8 bytes
    (big-endian) of the SHA-256 of the parts' ``str`` joined by ``/``. The rule is
    fixed, so a checkpoint resumed by a later version of the package draws the same."""
    key = "/".join(map(str, parts)).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big")


def smoothed_targets(targets: Tensor, num_classes: int, smoothing: float) -> Tensor:
    """Target distributions ``(1 - ε) · onehot + ε / V`` of shape
    ``(*targets.shape, V)``.

    This is the definition used by ``F.cross_entropy(label_smoothing=ε)``: the ``ε``
    mass is spread over **all** ``V`` classes, the true one included, so the true class
    gets ``1 - ε + ε/V``.
    """
    check_positive_int("num_classes", num_classes)
    if not 0.0 <= check_real("smoothing", smoothing) < 1.0:
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing!r}")
    if targets.dtype != torch.long:
        raise ValueError(f"targets must be an int64 (long) tensor, got {targets.dtype}")
    if targets.numel() and (
        int(targets.min()) < 0 or int(targets.max()) >= num_classes
    ):
        raise ValueError(
            f"targets must lie in [0, {num_classes}), "
            f"got values {int(targets.min())}..{int(targets.max())}"
        )
    onehot = F.one_hot(targets, num_classes).float()
    return onehot * (1.0 - smoothing) + smoothing / num_classes


def label_smoothing_loss(
    logits: Tensor, targets: Tensor, smoothing: float, ignore_index: int = -100
) -> Tensor:
    """Mean cross-entropy between ``softmax(logits)`` and :func:`smoothed_targets`,
    skipping ``ignore_index``; equal to
    ``F.cross_entropy(logits, targets, label_smoothing=smoothing)``.

    ``logits (M, V)``, ``targets (M,)``. A target outside ``[0, V)`` other than
    ``ignore_index`` raises ``ValueError``; if every target is ignored the mean is over
    nothing and the result is NaN, as with ``F.cross_entropy``.
    """
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(
            "expected logits (M, V) and targets (M,), "
            f"got logits {tuple(logits.shape)}, targets {tuple(targets.shape)}"
        )
    keep = targets != ignore_index
    logits, targets = logits[keep], targets[keep]
    q = smoothed_targets(targets, logits.size(1), smoothing)
    return -(q * F.log_softmax(logits, dim=1)).sum(dim=1).mean()


@dataclass
class TrainHistory:
    """What :func:`train_loop` measured: per-step losses and learning rates, total
    seconds."""

    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    seconds: float = 0.0


def _check_loop_args(num_steps: int, log_every: int, grad_clip: float | None) -> None:
    check_positive_int("num_steps", num_steps)
    check_int("log_every", log_every, 0)
    if grad_clip is not None:
        check_positive_real("grad_clip", grad_clip)


def _check_loss(loss: object, step: int) -> None:
    """A finite scalar tensor, or ``ValueError`` / ``FloatingPointError`` naming the
    step (one host synchronisation per step, as ``loss.item()`` needs anyway)."""
    if not isinstance(loss, Tensor) or loss.dim() != 0:
        raise ValueError(
            "compute_loss must return a scalar tensor, "
            f"got {describe(loss)} at step {step}"
        )
    if not torch.isfinite(loss):
        raise FloatingPointError(f"loss is {loss.item()} at step {step}")


def train_loop(
    compute_loss: Callable[[int], Tensor],
    optimizer: torch.optim.Optimizer,
    num_steps: int,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    grad_clip: float | None = None,
    log_every: int = 0,
) -> TrainHistory:
    """Run ``num_steps`` optimisation steps; ``compute_loss(step)`` draws a batch and
    returns the loss.

    Each step: zero grads, backward, optional gradient-norm clipping, optimizer and
    scheduler steps. Prints a line every ``log_every`` steps (0 = silent). Returns a
    :class:`TrainHistory`.
    """
    _check_loop_args(num_steps, log_every, grad_clip)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    history = TrainHistory()
    start = time.perf_counter()
    for step in range(num_steps):
        optimizer.zero_grad(set_to_none=True)
        loss = compute_loss(step)
        _check_loss(loss, step)
        loss.backward()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
        history.lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        history.steps.append(step)
        history.losses.append(loss.item())
        if log_every and (step % log_every == 0 or step == num_steps - 1):
            print(f"step {step:5d}  loss {loss.item():.4f}  lr {history.lrs[-1]:.2e}")
    history.seconds = time.perf_counter() - start
    return history
