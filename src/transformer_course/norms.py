"""Layer normalisation and RMS normalisation, written from their definitions."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .utils import check_positive_int

__all__ = ["LayerNorm", "RMSNorm", "NORMS", "build_norm"]

NORMS = ("layernorm", "rmsnorm")


class LayerNorm(nn.Module):
    """``y = (x - mean) / sqrt(var + eps) * gamma + beta`` over the last dimension.

    ``var`` is the biased (population) variance, as in ``nn.LayerNorm``. ``elementwise_affine``
    adds ``gamma`` (``weight``, init 1); ``bias`` adds ``beta`` (init 0).
    """

    def __init__(self, dim: int, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True):
        super().__init__()
        check_positive_int("dim", dim)
        if eps <= 0:
            raise ValueError(f"eps must be positive, got {eps}")
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(dim)) if elementwise_affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if elementwise_affine and bias else None

    def forward(self, x: Tensor) -> Tensor:
        if x.size(-1) != self.dim:
            raise ValueError(f"last dim of x must be {self.dim}, got {tuple(x.shape)}")
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, unbiased=False, keepdim=True)
        y = (x - mean) * torch.rsqrt(var + self.eps)
        if self.weight is not None:
            y = y * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y


class RMSNorm(nn.Module):
    """``y = x / sqrt(mean(x²) + eps) * gamma`` (Zhang & Sennrich 2019): no centring, no beta."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        check_positive_int("dim", dim)
        if eps <= 0:
            raise ValueError(f"eps must be positive, got {eps}")
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        if x.size(-1) != self.dim:
            raise ValueError(f"last dim of x must be {self.dim}, got {tuple(x.shape)}")
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


def build_norm(name: str, dim: int, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """``"layernorm"`` -> :class:`LayerNorm` (``bias`` toggles beta), ``"rmsnorm"`` -> :class:`RMSNorm`."""
    if name == "layernorm":
        return LayerNorm(dim, eps=eps, bias=bias)
    if name == "rmsnorm":
        return RMSNorm(dim, eps=eps)
    raise ValueError(f"unknown norm {name!r}; expected one of {NORMS}")
