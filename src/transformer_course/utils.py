"""Reproducibility, device and argument-checking helpers."""

from __future__ import annotations

import random
from numbers import Real

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "set_seed",
    "get_device",
    "check_int",
    "check_positive_int",
    "check_dropout",
    "check_fraction",
    "check_non_negative",
    "check_choice",
    "check_divisible",
    "check_heads",
    "check_type",
    "check_tensor",
    "check_qk",
    "check_qkv",
]


def set_seed(seed: int) -> None:
    """Seed Python's ``random``, NumPy and PyTorch (CPU and CUDA)."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {seed!r}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def get_device(name: str = "cpu") -> torch.device:
    """Return a device: ``"cpu"`` (the default), ``"cuda"``, ``"mps"`` or ``"auto"``.

    ``"auto"`` picks CUDA, then MPS, then CPU. Asking for an accelerator that is not
    present raises ``ValueError`` instead of failing later inside a kernel.
    """
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' was requested but CUDA is not available")
        return torch.device("cuda")
    if name == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError("device 'mps' was requested but MPS is not available")
        return torch.device("mps")
    raise ValueError(
        f"unknown device {name!r}; expected 'cpu', 'cuda', 'mps' or 'auto'"
    )


def _require_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    return value


def check_int(
    name: str, value: object, minimum: int | None = None, maximum: int | None = None
) -> int:
    """Return ``value`` if it is an ``int`` in ``[minimum, maximum]`` (a bound that is
    None is not checked); otherwise raise naming ``name`` and the value.
    """
    if _require_int(name, value) < (value if minimum is None else minimum):
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_positive_int(name: str, value: object) -> int:
    """Return ``value`` if it is a positive ``int``; otherwise raise naming ``name``
    and the value.
    """
    if _require_int(name, value) <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def _check_real(name: str, value: object) -> float:
    if not isinstance(value, Real) or isinstance(value, bool):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    return float(value)


def check_dropout(name: str, p: object) -> float:
    """Return ``p`` if it is a dropout probability in ``[0, 1)``; otherwise raise
    naming ``name`` and the value."""
    if not 0.0 <= _check_real(name, p) < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {p}")
    return p


def check_non_negative(name: str, x: object) -> float:
    """Return ``x`` if it is a real number >= 0; otherwise raise naming ``name``."""
    if _check_real(name, x) < 0:
        raise ValueError(f"{name} must be >= 0, got {x}")
    return x


def check_fraction(name: str, p: object) -> float:
    """Return ``p`` if it is a fraction in ``(0, 1)`` (both ends excluded)."""
    if not 0.0 < _check_real(name, p) < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {p}")
    return p


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``choices``; otherwise raise listing them."""
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; expected one of {choices}")
    return value


def check_divisible(name: str, value: int, by_name: str, by: int) -> None:
    """Raise unless ``by`` divides ``value`` (e.g. ``d_model`` by ``num_heads``)."""
    if value % by:
        raise ValueError(f"{name}={value} is not divisible by {by_name}={by}")


def check_heads(d_model: int, num_heads: int, num_kv_heads: int | None = None) -> None:
    """Positive sizes; ``num_heads`` divides ``d_model`` and ``num_kv_heads`` (if
    given) divides ``num_heads``."""
    check_positive_int("d_model", d_model)
    check_positive_int("num_heads", num_heads)
    if num_kv_heads is not None:
        check_positive_int("num_kv_heads", num_kv_heads)
    check_divisible("d_model", d_model, "num_heads", num_heads)
    if num_kv_heads is not None:
        check_divisible("num_heads", num_heads, "num_kv_heads", num_kv_heads)


def check_type(name: str, value: object, cls: type) -> object:
    """Return ``value`` if it is a ``cls``; otherwise raise ``TypeError``."""
    if not isinstance(value, cls):
        raise TypeError(f"{name} must be {cls.__name__}, got {type(value).__name__}")
    return value


def check_tensor(name: str, x: object, min_dim: int = 2) -> Tensor:
    """Return ``x`` if it is a tensor with at least ``min_dim`` dims; else raise."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < min_dim:
        raise ValueError(
            f"{name} must have at least {min_dim} dims, got shape {tuple(x.shape)}"
        )
    return x


def check_qk(query: object, key: object) -> tuple[Tensor, Tensor]:
    """Attention inputs ``query (..., L, D)`` and ``key (..., S, D)``: tensors that
    share the feature size D."""
    q, k = check_tensor("query", query), check_tensor("key", key)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            "query and key must share the last dim D, "
            f"got query {tuple(q.shape)} and key {tuple(k.shape)}"
        )
    return q, k


def check_qkv(
    query: object, key: object, value: object
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`check_qk`, plus ``value (..., S, Dv)`` of the keys' length S, and batch
    dims of the three that broadcast."""
    q, k = check_qk(query, key)
    v = check_tensor("value", value)
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            "key and value must share the length S, "
            f"got key {tuple(k.shape)} and value {tuple(v.shape)}"
        )
    try:
        torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError as err:
        raise ValueError(
            f"batch dims of query {tuple(q.shape)}, key {tuple(k.shape)} "
            f"and value {tuple(v.shape)} do not broadcast"
        ) from err
    return q, k, v
