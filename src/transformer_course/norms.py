"""Layer normalisation and RMS normalisation.

Each comes twice: a reference function written from the definition (what the book
teaches) and a module that runs PyTorch's fused kernel (``F.layer_norm`` /
``F.rms_norm``). The tests check that the two agree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._validate import check_positive_int

__all__ = [
    "LayerNorm",
    "RMSNorm",
    "NORMS",
    "build_norm",
    "layer_norm_reference",
    "rms_norm_reference",
]

NORMS = ("layernorm", "rmsnorm")


def layer_norm_reference(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float = 1e-5
) -> Tensor:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last dimension,
    written out.

    ``var`` is the biased (population) variance, as in ``nn.LayerNorm``.
    """
    mean = x.mean(dim=-1, keepdim=True)
    var = x.var(dim=-1, unbiased=False, keepdim=True)
    y = (x - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def rms_norm_reference(x: Tensor, weight: Tensor | None, eps: float = 1e-6) -> Tensor:
    """``x / sqrt(mean(x²) + eps) * weight`` over the last dimension, written out."""
    y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return y if weight is None else y * weight


def _check_eps(eps: float) -> None:
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps}")


class LayerNorm(nn.Module):
    """``y = (x - mean) / sqrt(var + eps) * gamma + beta`` over the last dimension.

    Computes :func:`layer_norm_reference` with the fused ``F.layer_norm``.
    ``elementwise_affine`` adds ``gamma`` (``weight``, init 1); ``bias`` adds ``beta``
    (init 0).
    """

    def __init__(
        self,
        dim: int,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
    ):
        super().__init__()
        check_positive_int("dim", dim)
        _check_eps(eps)
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(dim)) if elementwise_affine else None
        self.bias = (
            nn.Parameter(torch.zeros(dim)) if elementwise_affine and bias else None
        )

    def forward(self, x: Tensor) -> Tensor:
        if x.size(-1) != self.dim:
            raise ValueError(f"last dim of x must be {self.dim}, got {tuple(x.shape)}")
        return F.layer_norm(x, (self.dim,), self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """``y = x / sqrt(mean(x²) + eps) * gamma`` (Zhang & Sennrich 2019): no centring,
    no beta.

    Computes :func:`rms_norm_reference` with the fused ``F.rms_norm``.
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        check_positive_int("dim", dim)
        _check_eps(eps)
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        if x.size(-1) != self.dim:
            raise ValueError(f"last dim of x must be {self.dim}, got {tuple(x.shape)}")
        return F.rms_norm(x, (self.dim,), self.weight, self.eps)


def build_norm(
    name: str, dim: int, eps: float | None = None, bias: bool | None = None
) -> nn.Module:
    """``"layernorm"`` -> :class:`LayerNorm` (``bias`` toggles beta), ``"rmsnorm"`` ->
    :class:`RMSNorm`.

    ``eps=None`` keeps the norm's own default: ``1e-5`` for LayerNorm (as
    ``nn.LayerNorm``), ``1e-6`` for RMSNorm (as LLaMA); any other value is passed on.
    ``bias=None`` keeps LayerNorm's beta; RMSNorm has no beta, so ``bias=True`` with it
    raises ``ValueError``.
    """
    kwargs = {} if eps is None else {"eps": eps}
    if name == "layernorm":
        return LayerNorm(dim, bias=True if bias is None else bias, **kwargs)
    if name == "rmsnorm":
        if bias:
            raise ValueError(f"rmsnorm has no bias, got bias={bias!r}")
        return RMSNorm(dim, **kwargs)
    raise ValueError(f"unknown norm {name!r}; expected one of {NORMS}")
