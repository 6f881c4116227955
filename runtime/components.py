"""The trainer's small parts: what a step returns, the checkpointed batch state, and helpers that
move, copy and pin tensors (torchtitan's ``components/`` split; ``runtime.trainer`` composes them).

Every stateful part has ``state_dict()`` / ``load_state_dict()``: the trainer's checkpoint is the
composition of those (``ElasticTrainer.state_dict``), so the keys here are the checkpoint format and
must not change.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from .config import TrainerConfig


class Stateful(Protocol):
    """Anything the trainer checkpoints with itself (``ElasticTrainer.register_state``)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


@dataclass(frozen=True)
class StepResult:
    step: int  # optimizer steps done, this one included
    total_steps: int
    epoch: int  # epoch this step belonged to
    epoch_end: bool
    loss: float
    step_time_s: float
    batch_size: int = 0  # the global batch this step trained with


@dataclass
class BatchState:
    """Batch-size state that a Pollux-style policy may change between restarts; checkpointed."""

    global_batch_size: int
    init_batch_size: int
    accum_steps: int = 1

    def state_dict(self) -> dict[str, int]:
        return {"global_batch_size": self.global_batch_size, "init_batch_size": self.init_batch_size,
                "accum_steps": self.accum_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.global_batch_size = int(state["global_batch_size"])
        self.init_batch_size = int(state["init_batch_size"])
        self.accum_steps = int(state["accum_steps"])


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` (a tensor, or lists, tuples and dicts of them) on ``device``; unchanged on the CPU."""
    if device.type == "cpu":
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def clone_tensors(obj: Any) -> Any:
    """A copy of ``obj`` with every tensor cloned (a loaded checkpoint's tensors are views into its
    read buffers: cloning lets those buffers go)."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: clone_tensors(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(clone_tensors(v) for v in obj)
    return obj


def configure_determinism(config: TrainerConfig) -> None:
    """Pin threads and, in bitwise mode, deterministic kernels (must precede the first CUDA use)."""
    torch.set_num_threads(config.num_threads)
    if config.training.determinism == "bitwise":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
