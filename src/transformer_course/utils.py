"""Reproducibility and device helpers."""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["set_seed", "get_device"]


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
