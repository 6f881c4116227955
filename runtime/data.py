"""Data order that does not depend on the number of physical workers.

One global permutation per epoch, drawn from ``(seed, epoch)``; global batch ``t`` of an epoch is the
fixed slice ``perm[t*B:(t+1)*B]`` (the ragged tail is dropped) and logical worker ``k`` takes the fixed
sub-slice ``[k*b:(k+1)*b]`` with ``b = B/K``. The position is kept in *samples* consumed in the epoch,
not in steps, so that a later change of the global batch size (Pollux-style adaptive batching) still
resumes exactly: no sample skipped or repeated within an epoch.

Logical workers are placed on physical workers in contiguous blocks; when ``K`` does not divide the
world size the first ``K % W`` ranks carry one more. Placement decides only *where* a logical worker
runs, never *what* it computes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset, default_collate

from .seeding import derive_seed


def logical_workers_of(rank: int, world_size: int, logical_workers: int) -> range:
    """The contiguous block of logical-worker ids that physical worker ``rank`` runs."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world of size {world_size}")
    if world_size > logical_workers:
        raise ValueError(
            f"world size {world_size} exceeds logical_workers ({logical_workers}): "
            "each physical worker must run at least one logical worker"
        )
    base, extra = divmod(logical_workers, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


def epoch_permutation(seed: int, epoch: int, num_samples: int) -> np.ndarray:
    """The global sample order of ``epoch``: a pure function of (seed, epoch)."""
    rng = np.random.Generator(np.random.PCG64(derive_seed(seed, "epoch", epoch)))
    return rng.permutation(num_samples)


@dataclass
class DataPosition:
    """Where training stands in the data: epoch, samples consumed in it, optimizer steps done."""

    epoch: int = 0
    samples_in_epoch: int = 0
    step: int = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "samples_in_epoch": self.samples_in_epoch, "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.samples_in_epoch = int(state["samples_in_epoch"])
        self.step = int(state["step"])


class DataOrder:
    """Global batches of a map-style dataset, per epoch and per logical worker."""

    def __init__(self, *, num_samples: int, seed: int) -> None:
        if num_samples < 1:
            raise ValueError("dataset is empty")
        self.num_samples = num_samples
        self.seed = seed
        self._cached: tuple[int, np.ndarray] | None = None

    def permutation(self, epoch: int) -> np.ndarray:
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, epoch_permutation(self.seed, epoch, self.num_samples))
        return self._cached[1]

    def steps_in_epoch(self, global_batch_size: int) -> int:
        return self.num_samples // global_batch_size

    def has_batch(self, pos: DataPosition, global_batch_size: int) -> bool:
        return pos.samples_in_epoch + global_batch_size <= self.num_samples

    def logical_indices(
        self, pos: DataPosition, *, global_batch_size: int, logical_workers: int, logical_rank: int
    ) -> np.ndarray:
        """Sample ids of logical worker ``logical_rank``'s micro-batch at ``pos``."""
        if not self.has_batch(pos, global_batch_size):
            raise ValueError(f"no full global batch left in epoch {pos.epoch} at sample {pos.samples_in_epoch}")
        micro = global_batch_size // logical_workers
        start = pos.samples_in_epoch + logical_rank * micro
        return self.permutation(pos.epoch)[start : start + micro]

    def advance(self, pos: DataPosition, global_batch_size: int) -> bool:
        """Move ``pos`` past one global batch; returns True when that ended the epoch."""
        pos.samples_in_epoch += global_batch_size
        pos.step += 1
        if not self.has_batch(pos, global_batch_size):
            pos.epoch += 1
            pos.samples_in_epoch = 0
            return True
        return False


def fetch(dataset: Dataset[Any], indices: Sequence[int] | np.ndarray) -> Any:
    """Collate the samples ``indices`` of ``dataset``; a TensorDataset is sliced in one go."""
    if isinstance(dataset, TensorDataset):
        idx = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        return tuple(t.index_select(0, idx) for t in dataset.tensors)  # t[idx], without indexing's overhead
    return default_collate([dataset[int(i)] for i in indices])
