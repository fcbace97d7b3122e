"""Argument checks shared by the package (private): one policy for every public
entry point.

* ``TypeError`` when the argument has the wrong type (``bool`` is not an ``int``),
  ``ValueError`` when it has the right type and a wrong value;
* every message names the argument and the value it got (:func:`describe`).

Configs are checked once, when they are built; modules built from a config trust it.
Modules that a learner builds directly check their constructor arguments. Checks that
read tensor *values* (:func:`check_token_ids`) synchronise an accelerator with the host,
so they run only at the boundaries (``generate``, ``lm_batch``, the trainer's data),
never inside ``forward``.
"""

from __future__ import annotations

import math
from numbers import Real

import torch
from torch import Tensor


def describe(x: object) -> str:
    """What we got, for an error message: ``dtype (shape)`` of a tensor, else the
    type's name."""
    if isinstance(x, Tensor):
        return f"{x.dtype} {tuple(x.shape)}"
    return type(x).__name__


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
    _require_int(name, value)
    if minimum is not None and value < minimum:
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


def check_real(name: str, value: object) -> float:
    """Return ``value`` as a float if it is a real number (not a ``bool``); otherwise
    raise ``TypeError``."""
    if not isinstance(value, Real) or isinstance(value, bool):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    return float(value)


def check_positive_real(name: str, value: object) -> float:
    """Return ``value`` if it is a finite real number > 0."""
    x = check_real(name, value)
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{name} must be a finite positive number, got {value!r}")
    return x


def check_dropout(name: str, p: object) -> float:
    """Return ``p`` if it is a dropout probability in ``[0, 1)``; otherwise raise
    naming ``name`` and the value."""
    if not 0.0 <= check_real(name, p) < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {p}")
    return p


def check_non_negative(name: str, x: object) -> float:
    """Return ``x`` if it is a real number >= 0; otherwise raise naming ``name``."""
    if check_real(name, x) < 0:
        raise ValueError(f"{name} must be >= 0, got {x}")
    return x


def check_fraction(name: str, p: object) -> float:
    """Return ``p`` if it is a fraction in ``(0, 1)`` (both ends excluded)."""
    if not 0.0 < check_real(name, p) < 1.0:
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


def check_id_tensor(name: str, ids: object) -> Tensor:
    """Return ``ids`` if it is a 2-D ``LongTensor (N, T)`` (type and shape only: free,
    no host synchronisation, so ``forward`` may call it)."""
    if not isinstance(ids, Tensor):
        raise TypeError(f"{name} must be a 2-D LongTensor (N, T), got {describe(ids)}")
    if ids.dim() != 2 or ids.dtype != torch.long:
        raise ValueError(f"{name} must be a 2-D LongTensor (N, T), got {describe(ids)}")
    return ids


def check_token_ids(
    name: str, ids: object, vocab_size: int, ignore_index: int | None = None
) -> Tensor:
    """:func:`check_id_tensor`, plus every id in ``[0, vocab_size)`` (or equal to
    ``ignore_index``): one pass and one host synchronisation, for the boundaries."""
    check_id_tensor(name, ids)
    if ids.device.type == "meta":  # shapes only: no values to check
        return ids
    bad = (ids < 0) | (ids >= vocab_size)
    if ignore_index is not None:
        bad &= ids != ignore_index
    if bool(bad.any()):
        allowed = f"[0, {vocab_size})" + (
            "" if ignore_index is None else f" or {ignore_index}"
        )
        raise ValueError(
            f"{name} must lie in {allowed}, "
            f"got {ids[bad][0].item()} ({int(bad.sum())} bad)"
        )
    return ids
