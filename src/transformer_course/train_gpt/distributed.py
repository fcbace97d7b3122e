"""Processes and devices: torchrun's environment, the process group, rank-0 logging."""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.distributed as dist
from torch import Tensor

import transformer_course as tc


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


def setup(info: DistInfo, device_name: str) -> torch.device:
    """Pick the device and start the process group (gloo on CPU, nccl on GPU)."""
    if device_name == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "--device cuda was given but torch.cuda.is_available() is False"
        )
    use_cuda = torch.cuda.is_available() and device_name in ("auto", "cuda")
    if not info.enabled:
        return torch.device("cuda") if use_cuda else tc.get_device(device_name)
    if use_cuda:
        torch.cuda.set_device(info.local_rank)
        device = torch.device("cuda", info.local_rank)
        dist.init_process_group("nccl", device_id=device)
        return device
    if device_name == "mps":
        raise ValueError(
            "multi-process training supports cpu (gloo) or cuda (nccl), not mps"
        )
    dist.init_process_group("gloo")
    return torch.device("cpu")


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
