"""The position-wise feed-forward network and its gated variants."""

from __future__ import annotations

from functools import partial

import torch.nn.functional as F
from torch import Tensor, nn

from ._validate import check_choice, check_dropout, check_positive_int

__all__ = ["ACTIVATIONS", "FeedForward"]

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swiglu", "geglu")
_GATED = {"swiglu": F.silu, "geglu": F.gelu}
# "gelu" is the exact x·Φ(x); "gelu_tanh" is GPT-2's approximation
# 0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³))), fused by PyTorch.
_PLAIN = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
}


class FeedForward(nn.Module):
    """``FFN(x) = w2(act(w1 x))``, applied to every position independently.

    ``act`` is ``relu``, ``gelu`` (exact) or ``gelu_tanh`` (the tanh
    approximation of GPT-2).

    Gated variants (Shazeer 2020) add a second input projection ``w3``:
    ``swiglu``: ``w2(silu(w1 x) * w3 x)``, ``geglu``: ``w2(gelu(w1 x) * w3 x)``. At
    equal ``d_ff`` they have 1.5x the weights of the plain FFN; use
    ``d_ff ≈ 2/3 · 4 · d_model`` to match budgets.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        activation: str = "relu",
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("d_ff", d_ff)
        self.activation = check_choice("activation", activation, ACTIVATIONS)
        check_dropout("dropout", dropout)
        self.w1 = nn.Linear(d_model, d_ff, bias=bias)
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)
        self.w3 = nn.Linear(d_model, d_ff, bias=bias) if activation in _GATED else None
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        if self.w3 is None:
            hidden = _PLAIN[self.activation](self.w1(x))
        else:
            hidden = _GATED[self.activation](self.w1(x)) * self.w3(x)
        return self.w2(self.drop(hidden))  # (N, L, d_ff) -> (N, L, E)
