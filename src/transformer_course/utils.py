"""Reproducibility and device helpers."""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["set_seed", "get_device", "check_int", "check_positive_int"]


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


def check_int(name: str, value: object, minimum: int) -> int:
    """Return ``value`` if it is an ``int`` >= ``minimum``; otherwise raise naming
    ``name`` and the value.
    """
    if _require_int(name, value) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_positive_int(name: str, value: object) -> int:
    """Return ``value`` if it is a positive ``int``; otherwise raise naming ``name``
    and the value.
    """
    if _require_int(name, value) <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value
