"""Choosing the next token from logits: greedy, temperature, top-k and top-p (nucleus).

Conventions (each one pinned by an exact-probability test in
``tests/test_sampling.py``):

* **top-k** keeps every logit that is at least the ``k``-th largest of its row, so
  tokens tied with the ``k``-th one are all kept (a row can keep more than ``k`` tokens,
  never fewer).
* **top-p** sorts the probabilities in descending order and keeps a token when the mass
  of the tokens *before* it (the exclusive cumulative sum) is still below ``p``: the
  kept set is the smallest prefix whose mass reaches ``p``. When the first ``m`` tokens
  sum to exactly ``p``, those ``m`` are kept and token ``m + 1`` is not. The most likely
  token is always kept, even when its probability alone exceeds ``p``. Tokens tied with
  the least likely kept token are kept too, so the result does not depend on how the
  sort orders ties.
* Every bad argument raises ``ValueError`` naming the argument and its value. The checks
  are plain Python comparisons on Python numbers (no device synchronisation);
  :func:`check_sampling_args` runs them once, e.g. before a decoding loop.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._validate import check_positive_int, check_real, describe

__all__ = ["check_sampling_args", "top_k_filter", "top_p_filter", "sample_next_token"]


def _check_top_k(k: object) -> int:
    return check_positive_int("top_k", k)


def _check_top_p(p: object) -> float:
    if not 0.0 < check_real("top_p", p) <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {p!r}")
    return float(p)


def _check_temperature(temperature: object) -> float:
    t = check_real("temperature", temperature)
    if not (math.isfinite(t) and t > 0):
        raise ValueError(
            "temperature must be a finite positive number "
            f"(use greedy=True for argmax), got {temperature!r}"
        )
    return t


def check_sampling_args(
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
    greedy: bool = False,
) -> None:
    """Validate the arguments of :func:`sample_next_token` without touching any tensor.

    ``top_k`` and ``top_p`` are always checked (``None`` disables them);
    ``temperature`` only when sampling (``greedy=False``), since greedy decoding ignores
    it.
    """
    if not isinstance(greedy, bool):
        raise ValueError(f"greedy must be a bool, got {greedy!r}")
    if top_k is not None:
        _check_top_k(top_k)
    if top_p is not None:
        _check_top_p(top_p)
    if not greedy:
        _check_temperature(temperature)


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the ``k`` largest logits of each row (ties at the threshold kept), set the
    rest to -inf."""
    k = min(_check_top_k(k), logits.size(-1))
    # topk and sort work on the last dim
    threshold = torch.topk(logits, k).values[..., -1:]
    return logits.masked_fill(logits < threshold, -math.inf)


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches ``p``
    (nucleus sampling, Holtzman et al. 2020); the most likely token is always kept. See
    the module docstring for the exact boundary and tie rules."""
    p = _check_top_p(p)
    # the whole distribution: no rounding in the cumulative sum may drop a tail token
    if p == 1.0:
        return logits
    sorted_logits = torch.sort(logits, descending=True).values
    probs = torch.softmax(sorted_logits, dim=-1)
    cumulative = probs.cumsum(dim=-1)
    # mass of the strictly more likely tokens: the cumulative sum shifted right by one
    before = torch.cat(
        [torch.zeros_like(cumulative[..., :1]), cumulative[..., :-1]], dim=-1
    )
    num_kept = (before < p).sum(dim=-1, keepdim=True)  # >= 1: before[..., 0] == 0 < p
    threshold = sorted_logits.gather(-1, num_kept - 1)
    return logits.masked_fill(logits < threshold, -math.inf)


def _check_logits(logits: object) -> None:
    if (
        not isinstance(logits, Tensor)
        or logits.dim() != 2
        or not logits.is_floating_point()
    ):
        error = ValueError if isinstance(logits, Tensor) else TypeError
        raise error(
            f"logits must be a floating-point (N, V) tensor, got {describe(logits)}"
        )


def sample_next_token(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Pick one token per row of ``logits (N, V)``; returns ``(N, 1)`` ids.

    ``greedy=True`` returns the argmax (``temperature`` is then ignored). Otherwise the
    logits are divided by ``temperature``, filtered by top-k and then top-p, and one
    token is drawn from their softmax with ``generator``.
    """
    _check_logits(logits)
    check_sampling_args(temperature, top_k, top_p, greedy)
    if greedy:
        return logits.argmax(dim=1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    probs = torch.softmax(logits.float(), dim=1)
    return torch.multinomial(probs, num_samples=1, generator=generator)
