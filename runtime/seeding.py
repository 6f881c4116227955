"""Random streams that depend on (seed, step, logical worker), never on placement.

Before a logical worker computes its micro-batch, the global generators of torch, numpy and
``random`` are seeded from ``derive_seed(seed, "logical", step, k)``. Dropout, augmentation in
``Dataset.__getitem__`` and any other draw made by user code inside the step therefore see the same
stream whether logical worker ``k`` runs alone on a machine or after three others in one process.
Because the streams are derived rather than carried, a resume needs no RNG state to be exact; the
states are still checkpointed (DESIGN.md) for code that draws outside the step.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as np
import torch


def derive_seed(seed: int, *parts: object) -> int:
    """A 63-bit seed that is a pure function of ``seed`` and ``parts`` (stable across processes)."""
    text = repr((int(seed),) + tuple(parts)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


def _cuda_in_use() -> bool:
    """Whether CUDA's generators exist to seed or capture (never initialises CUDA itself)."""
    # torch leaves torch.cuda.is_initialized unannotated (2.13), so strict mypy calls it untyped.
    return torch.cuda.is_available() and bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


def seed_logical_worker(seed: int, step: int, logical_rank: int) -> None:
    """Seed every global generator for logical worker ``logical_rank`` at optimizer step ``step``."""
    s = derive_seed(seed, "logical", step, logical_rank)
    # torch.manual_seed also queues lazy seeding of every accelerator backend, capturing a stack
    # trace each time (~0.5 ms per call on CPU); seed the generators in use directly instead.
    torch.default_generator.manual_seed(s)
    if _cuda_in_use():
        torch.cuda.manual_seed_all(s)
    np.random.seed(s % (2**32))
    random.seed(s)


def seed_between_steps(seed: int, step: int) -> None:
    """Seed every global generator for the code that runs between optimizer steps (the loop body,
    evaluation): the same on every rank and for every number of workers. Left as the last logical
    worker's stream, it would depend on which logical workers a rank ran, and the state rank 0
    checkpoints would not be every rank's."""
    s = derive_seed(seed, "between", step)
    torch.default_generator.manual_seed(s)
    if _cuda_in_use():
        torch.cuda.manual_seed_all(s)
    np.random.seed(s % (2**32))
    random.seed(s)


def capture_rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, json-able) describing every global generator, for the checkpoint manifest."""
    tensors = {"torch_cpu": torch.get_rng_state()}
    if _cuda_in_use():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = state
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    meta = {
        "numpy": {"kind": kind, "keys": [int(k) for k in keys], "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": {"version": py_version, "state": list(py_state), "gauss": py_gauss},
    }
    return tensors, meta


def restore_rng_state(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("torch_cuda_"))]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    n = meta["numpy"]
    np.random.set_state((n["kind"], np.asarray(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = meta["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
