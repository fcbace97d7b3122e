"""Processes and devices: torchrun's environment, the process group, rank-0 logging."""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.distributed as dist
from torch import Tensor

import transformer_course as tc

from .config import UsageError


@dataclasses.dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @classmethod
    def from_env(cls) -> DistInfo:
        """Read torchrun's environment (a single process without it)."""
        env = os.environ
        return cls(
            int(env.get("RANK", 0)),
            int(env.get("LOCAL_RANK", 0)),
            int(env.get("WORLD_SIZE", 1)),
        )

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def pick_device(name: str, info: DistInfo) -> torch.device:
    """The device ``--device NAME`` asks for (``auto``: CUDA, then MPS, then CPU; with
    several processes only CUDA or CPU); an accelerator that is not there is a
    :class:`UsageError`, before anything is written."""
    try:
        device = tc.get_device(name)
    except ValueError:
        raise UsageError(
            f"--device {name}：这台机器上的 torch 找不到 {name.upper()}；"
            "请用 --device cpu 或 auto"
        ) from None
    if info.enabled and device.type == "mps":
        if name == "mps":
            raise UsageError(
                "--device mps：多进程训练只支持 cpu（gloo）或 cuda（nccl）"
            )
        return torch.device("cpu")
    return device


def setup(info: DistInfo, device: torch.device) -> torch.device:
    """Start the process group on ``device`` (from :func:`pick_device`): gloo on CPU,
    nccl on GPU (one GPU per process)."""
    if not info.enabled:
        return device
    if device.type == "cuda":
        torch.cuda.set_device(info.local_rank)
        device = torch.device("cuda", info.local_rank)
        dist.init_process_group("nccl", device_id=device)
        return device
    dist.init_process_group("gloo")
    return device


def teardown(info: DistInfo) -> None:
    if info.enabled:
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def mean_over_ranks(loss: Tensor, info: DistInfo) -> float:
    if info.enabled:
        loss = loss.clone()
        dist.all_reduce(loss)  # gloo has no AVG: sum, then divide
        loss = loss / info.world_size
    return float(loss)


def log(info: DistInfo, message: str) -> None:
    if info.is_main:
        print(message, flush=True)
