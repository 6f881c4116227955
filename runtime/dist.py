"""The physical workers: a thin shell over torch.distributed that also works with one process.

Started the torchrun way (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT...); with no WORLD_SIZE, or a
world of one, no process group is created and every collective is the identity, so ``python
train.py`` needs no rendezvous. ``auto`` picks nccl when CUDA is available, gloo otherwise.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owns_group: bool = False

    @classmethod
    def from_env(cls, backend: str = "auto", timeout_s: float = 600.0) -> "DistContext":
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        use_cuda = torch.cuda.is_available() if backend == "auto" else backend == "nccl"
        device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
        if use_cuda:
            torch.cuda.set_device(device)
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size(), local_rank, device)
        if world <= 1:
            return cls(0, 1, 0, device)
        dist.init_process_group(
            backend="nccl" if use_cuda else "gloo", rank=rank, world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        return cls(rank, world, local_rank, device, owns_group=True)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def all_reduce_sum_(self, t: torch.Tensor) -> torch.Tensor:
        if self.distributed:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """Stack of every rank's ``t`` (same shape everywhere), shape ``[world, *t.shape]``."""
        if not self.distributed:
            return t.unsqueeze(0)
        out = torch.empty(self.world_size * t.numel(), dtype=t.dtype, device=t.device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(out, t.contiguous().reshape(-1))
        return out.view(self.world_size, *t.shape)

    def broadcast_(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        if self.distributed:
            dist.broadcast(t, src=src)
        return t

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self.owns_group = False
