"""Checkpoints that load with ``torch.load(..., weights_only=True)``.

A checkpoint is a plain dictionary that holds only tensors and plain Python values
(``dict``, ``list``, ``tuple``, ``str``, ``int``, ``float``, ``bool``, ``None``):

``{"format": FORMAT, "step": int, "model": state_dict, "optimizer": state_dict | None,
"config": dict | None, "extra": dict}``

Because nothing in it is a pickled class, it loads with PyTorch's safe unpickler
(``weights_only=True``): a checkpoint from an untrusted source cannot run code.
Model configurations (dataclasses such as ``GPTConfig``) are stored as dictionaries and
rebuilt with :func:`config_from_dict`.

Typical use::

    save_checkpoint(
        path, model, optimizer, step=step, config=cfg, tokenizer_chars=tok.chars
    )
    ckpt = load_checkpoint(path)                       # plain dict
    cfg = config_from_dict(GPTConfig, ckpt["config"])
    model = MiniGPT(cfg)
    load_checkpoint(path, model=model, optimizer=opt)  # restores the states in place
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import torch
from torch import nn

from ._validate import check_int

__all__ = [
    "FORMAT",
    "unwrap_model",
    "config_to_dict",
    "config_from_dict",
    "state_dict_sha256",
    "save_checkpoint",
    "atomic_write",
    "load_checkpoint",
    "remove_temp_files",
]

FORMAT = "transformer_course.checkpoint/1"
_KEYS = ("format", "step", "model", "optimizer", "config", "extra")

_PLAIN_LEAVES = (torch.Tensor, str, int, float, bool, type(None))

T = TypeVar("T")


def unwrap_model(model: nn.Module) -> nn.Module:
    """Return the module inside ``DistributedDataParallel`` / ``torch.compile``
    wrappers.

    ``DistributedDataParallel`` keeps the model in ``.module`` and ``torch.compile`` in
    ``._orig_mod``; their state dicts carry ``module.`` / ``_orig_mod.`` prefixes that a
    plain model cannot load. Unwrapping first gives portable state dicts.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel | nn.DataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        else:
            return model


def _check_plain(value: Any, where: str) -> None:
    """Raise TypeError if ``value`` is not loadable with ``weights_only=True``."""
    if isinstance(value, _PLAIN_LEAVES):
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str | int):
                raise TypeError(
                    f"{where}: dictionary key {key!r} has type {type(key).__name__}; "
                    "only str and int keys are allowed in a checkpoint"
                )
            _check_plain(item, f"{where}[{key!r}]")
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_plain(item, f"{where}[{i}]")
        return
    raise TypeError(
        f"{where} has type {type(value).__name__}, which torch.load(weights_only=True) "
        "cannot load; store tensors and plain Python values (dict, list, tuple, str, "
        "int, float, bool, None) only"
    )


def config_to_dict(config: Any) -> dict[str, Any]:
    """Turn a configuration dataclass instance into a dictionary of plain values.

    Raises:
        TypeError: if ``config`` is not a dataclass instance or holds non-plain values.
    """
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(
            f"config must be a dataclass instance, got {type(config).__name__}"
        )
    data = dataclasses.asdict(config)
    _check_plain(data, "config")
    return data


def config_from_dict(cls: type[T], data: Mapping[str, Any]) -> T:
    """Rebuild a configuration dataclass from :func:`config_to_dict`'s output.

    Raises:
        TypeError: if ``cls`` is not a dataclass type or ``data`` not a mapping.
        ValueError: if ``data`` has keys that ``cls`` does not define.
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"cls must be a dataclass type, got {cls!r}")
    if not isinstance(data, Mapping):
        raise TypeError(f"data must be a mapping, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(
            f"unknown field(s) {unknown} for {cls.__name__}; "
            f"known fields: {sorted(names)}"
        )
    return cls(**dict(data))


def state_dict_sha256(state_dict: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 of a state dict: names, dtypes, shapes and exact values (bitwise).

    Two models have the same hash iff their state dicts are bitwise identical (up to
    hash collisions). Used to check that data-parallel replicas stay in sync.
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(
            f"state_dict must be a mapping, got {type(state_dict).__name__}"
        )
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name]
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(
                f"state_dict[{name!r}] is {type(tensor).__name__}, not a tensor"
            )
        t = tensor.detach().to("cpu").contiguous()
        digest.update(name.encode())
        digest.update(f"{t.dtype}{tuple(t.shape)}".encode())
        # view as bytes so every dtype (bfloat16 included) hashes its exact bits
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def save_checkpoint(
    path: str | os.PathLike[str],
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    step: int,
    config: Any = None,
    before_replace: Callable[[Path], None] | None = None,
    **extra: Any,
) -> Path:
    """Save model (and optimizer) state, step, config and extra plain values atomically.

    The file is written to a temporary name ``<name>.<random>.tmp`` in the same folder,
    flushed and ``fsync``-ed, renamed over ``path`` with ``os.replace`` (atomic), and
    the folder is ``fsync``-ed so that the rename itself is durable. A save that is
    interrupted, even by SIGKILL or a power cut, leaves the previous ``path`` intact; at
    worst a temporary file remains, which :func:`remove_temp_files` deletes.

    Args:
        path: destination file; parent folders are created.
        model: the model; DDP / compile wrappers are removed (:func:`unwrap_model`).
        optimizer: optional optimizer whose ``state_dict()`` is stored.
        step: number of optimisation steps done (``>= 0``).
        config: a dataclass instance (stored via :func:`config_to_dict`), a mapping, or
            None.
        before_replace: optional callable, given the complete, fsynced temporary file
            just before it replaces ``path`` (used by tests to interrupt a save at its
            most delicate moment).
        **extra: further plain values, e.g. ``tokenizer_chars="abc"``,
            ``best_val_loss=1.2``.

    Returns:
        The path written.

    Raises:
        ValueError: if ``step`` is negative or not an int.
        TypeError: if something cannot be loaded back with ``weights_only=True``.
    """
    check_int("step", step, 0)
    if config is not None and not isinstance(config, Mapping):
        config = config_to_dict(config)
    elif config is not None:
        config = dict(config)
    payload: dict[str, Any] = {
        "format": FORMAT,
        "step": step,
        "model": unwrap_model(model).state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "config": config,
        "extra": dict(extra),
    }
    _check_plain(payload, "checkpoint")
    return atomic_write(path, lambda f: torch.save(payload, f), before_replace)


def atomic_write(
    path: str | os.PathLike[str],
    data: bytes | Callable[[BinaryIO], None],
    before_replace: Callable[[Path], None] | None = None,
) -> Path:
    """Replace ``path`` with ``data`` (bytes, or a function that writes into the open
    binary file) so that a reader sees the old file or the new one, never a mix.

    The data go to a temporary ``<name>.<random>.tmp`` in the same folder, are flushed
    and ``fsync``-ed, renamed over ``path`` with ``os.replace`` (atomic), and the folder
    is ``fsync``-ed so that the rename itself is durable. On any error (even
    ``KeyboardInterrupt``) the temporary file is removed; after SIGKILL one may remain
    (:func:`remove_temp_files`). ``before_replace`` gets the complete temporary file
    just before the rename (tests interrupt a save there).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            data(f) if callable(data) else f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync_dir(path.parent)
    return path


def _fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (POSIX); a no-op where folders cannot be
    opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. Windows
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_temp_files(path: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files that interrupted :func:`save_checkpoint` calls for
    ``path`` left.

    Only files named ``<name of path>.*.tmp`` in its folder are touched. Call it when no
    save to ``path`` is in progress (e.g. when a training run starts). Returns the files
    removed.
    """
    path = Path(path)
    removed = sorted(path.parent.glob(f"{glob.escape(path.name)}.*.tmp"))
    for tmp in removed:
        tmp.unlink()
    return removed


def _torch_load(path: Path, map_location: str | torch.device) -> Any:
    """``torch.load(weights_only=True)``, with a ``ValueError`` naming the file and the
    damage when the file is not a complete checkpoint archive."""
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {str(path)!r}")
    problem = None
    if not zipfile.is_zipfile(path):  # e.g. truncated: no zip directory at the end
        problem = f"not a complete zip archive ({path.stat().st_size} bytes)"
    else:
        try:
            return torch.load(path, map_location=map_location, weights_only=True)
        except (PermissionError, IsADirectoryError):
            raise
        except Exception as error:
            # the unpickler's and zip reader's errors vary with the damage; torch's own
            # message may suggest weights_only=False: not for a damaged or foreign file
            problem = f"torch.load(weights_only=True) raised {type(error).__name__}"
    raise ValueError(
        f"{str(path)!r} is not a readable {FORMAT!r} checkpoint: {problem}; "
        "the file is corrupted, truncated or of another format"
    )


def _check_payload(ckpt: Any, path: Path, needs_optimizer: bool) -> None:
    """Raise ``ValueError`` unless ``ckpt`` is a complete checkpoint of this format
    (with an optimizer state if ``needs_optimizer``)."""
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        found = ckpt.get("format") if isinstance(ckpt, dict) else type(ckpt).__name__
        raise ValueError(
            f"{str(path)!r} is not a {FORMAT!r} checkpoint (found {found!r})"
        )
    missing = [key for key in _KEYS if key not in ckpt]
    if (
        missing
        or not isinstance(ckpt["step"], int)
        or not isinstance(ckpt["model"], Mapping)
    ):
        raise ValueError(
            f"{str(path)!r} is a damaged {FORMAT!r} checkpoint: "
            f"missing keys {missing}, step {ckpt.get('step')!r}, "
            f"model of type {type(ckpt.get('model')).__name__}"
        )
    if needs_optimizer and ckpt["optimizer"] is None:
        raise ValueError(f"checkpoint {str(path)!r} holds no optimizer state")


def load_checkpoint(
    path: str | os.PathLike[str],
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    map_location: str | torch.device = "cpu",
    strict: bool = True,
) -> dict[str, Any]:
    """Load a checkpoint with ``torch.load(weights_only=True)``; optionally restore
    states.

    Args:
        path: file written by :func:`save_checkpoint`.
        model: if given, its state is loaded from the checkpoint (wrappers removed).
        optimizer: if given, its state is loaded; the checkpoint must contain one.
        map_location: where tensors are placed, as in ``torch.load``.
        strict: passed to ``load_state_dict`` of the model.

    Returns:
        The checkpoint dictionary (keys
        ``format, step, model, optimizer, config, extra``).

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: if the file is not a checkpoint of this format, or ``optimizer`` is
            given but the checkpoint holds no optimizer state.
    """
    path = Path(path)
    ckpt = _torch_load(path, map_location)
    _check_payload(ckpt, path, needs_optimizer=optimizer is not None)
    if model is not None:
        unwrap_model(model).load_state_dict(ckpt["model"], strict=strict)
    if optimizer is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
    return ckpt
