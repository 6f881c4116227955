"""The training layout contract: total batch, per-GPU batch, accumulation steps, the candidate grid,
the default cap and the re-batch test (issue 20, item 1). One home, pure and typed: the spec checks
a layout with it, the policy values allocations with it, the controller's re-batch check, the
simulated executor and the runtime all call it, so what the controller values is what the workers
train.

**Logical workers.** A job has ``K`` fixed logical workers; a total batch ``B`` is ``K`` micro-batches
of ``B / K`` samples (``B`` a multiple of ``K``). A micro-batch over the per-GPU limit
(``max_local_bsz``) is split into ``chunks`` whose gradients accumulate, weighted by their share. On
``W`` GPUs a GPU runs ``ceil(K / W)`` logical workers in turn, so in Pollux's terms (section 3.2):

    chunks      = ceil((B / K) / max_local_bsz)        (1 without a limit)
    local_bsz   = ceil((B / K) / chunks)               (samples per GPU per micro-batch: the largest chunk)
    accum_steps = ceil(K / W) * chunks - 1             (extra micro-batches on the busiest GPU)

The arithmetic does not depend on ``W`` beyond ``accum_steps``: bitwise mode stays bitwise for a
given batch. ``plan`` is one layout; ``plan_grid`` is the same arithmetic over numpy arrays (the
policy values many allocations in one call); ``plan`` calls ``plan_grid``.

**Without logical workers** (a model valued as Pollux's optimizer would split it: the simulator's
true workloads) ``split`` takes the fewest accumulation steps that keep ``B / (W * (s + 1))`` within
the per-GPU limit.

**The cap.** ``training.max_batch_size`` when the spec gives one; otherwise ``default_cap`` =
``M0 * K`` (each logical worker's micro-batch may grow to the whole initial batch). One rule for the
controller and the runtime: the runtime sees only the spec's ``training`` section, so a rule that
needs ``workers.max`` (the controller's former ``M0 * workers.max``) could not be its rule too. The cap
is rounded down to a multiple of ``K``, never below ``M0``, and (in the runtime) never above the
dataset.

**Re-batch test.** A running gang restarts only to change its batch when the goodput it gains is
more than ``RebatchRule.min_gain`` (Pollux re-optimises at 5 %) and the time that saves over the
job's remaining work pays ``RebatchRule.payback_restarts`` restarts (``rebatch_pays``). The
thresholds are the policy's (``autoscaler.policy.params.PolicyParams``), passed in as a ``RebatchRule``;
the runtime's own re-optimisation (only without a controller) uses ``min_gain`` alone.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "DEFAULT_CANDIDATES",
    "DEFAULT_REBATCH",
    "Layout",
    "RebatchRule",
    "batch_cap",
    "candidates",
    "check_layout",
    "default_cap",
    "gains",
    "local_of",
    "plan",
    "plan_grid",
    "rebatch_pays",
    "round_batch",
    "split",
]

_FloatArray = NDArray[np.float64]
_TOL = 1e-9  # slack for ceil of ratios that are integers up to rounding
DEFAULT_CANDIDATES = 40


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a total batch runs on ``world_size`` GPUs (module docstring)."""

    batch_size: int  # samples per optimizer step
    chunks: int  # micro-steps per logical worker (1: its whole micro-batch at once)
    local_bsz: int  # samples per GPU per micro-batch (the largest chunk)
    accum_steps: int  # extra micro-batches per step on the busiest GPU

    def to_json(self) -> dict[str, int]:
        return {"batch_size": self.batch_size, "local_bsz": self.local_bsz, "accum_steps": self.accum_steps}


def check_layout(global_batch_size: int, logical_workers: int, max_batch_size: int | None = None) -> str | None:
    """What is wrong with a spec's layout, in one line naming the fields (None: nothing)."""
    if global_batch_size % logical_workers:
        return f"global_batch_size ({global_batch_size}) must be a multiple of logical_workers ({logical_workers})"
    if max_batch_size is not None and max_batch_size < global_batch_size:
        return f"max_batch_size ({max_batch_size}) is below global_batch_size ({global_batch_size})"
    return None


def plan_grid(batch_size: ArrayLike, world_size: ArrayLike, logical_workers: int,
              max_local_bsz: int | None = None) -> tuple[_FloatArray, _FloatArray, _FloatArray]:
    """(chunks, local_bsz, accum_steps) for total batches ``batch_size`` (multiples of ``K``) on
    ``world_size`` GPUs; the arrays broadcast (module docstring)."""
    micro = np.asarray(batch_size, dtype=np.float64) / logical_workers
    chunks = np.ceil(micro / max_local_bsz - _TOL) if max_local_bsz else np.ones_like(micro)
    local = np.ceil(micro / chunks - _TOL)
    per_gpu = np.ceil(logical_workers / np.asarray(world_size, dtype=np.float64) - _TOL)
    accum = per_gpu * chunks - 1
    return np.broadcast_to(chunks, accum.shape), np.broadcast_to(local, accum.shape), accum


def plan(batch_size: int, *, world_size: int, logical_workers: int, max_local_bsz: int | None = None) -> Layout:
    """The layout of total batch ``batch_size`` on ``world_size`` GPUs. Raises ValueError for a batch
    that is not a positive multiple of ``logical_workers``."""
    if batch_size < 1 or batch_size % logical_workers:
        raise ValueError(f"batch size {batch_size} is not a positive multiple of logical_workers ({logical_workers})")
    if world_size < 1:
        raise ValueError(f"world size must be positive, got {world_size}")
    chunks, local, accum = plan_grid(batch_size, world_size, logical_workers, max_local_bsz)
    return Layout(batch_size=batch_size, chunks=int(chunks), local_bsz=int(local), accum_steps=int(accum))


def split(batch_size: ArrayLike, world_size: ArrayLike, max_local_bsz: float | None = None) -> tuple[Any, Any]:
    """(local_bsz, accum_steps) of Pollux's split of ``batch_size`` over ``world_size`` GPUs without
    logical workers: the fewest accumulation steps within the per-GPU limit (local_bsz may be
    fractional). Arrays broadcast; scalars in, floats out."""
    b = np.asarray(batch_size, dtype=np.float64)
    k = np.asarray(world_size, dtype=np.float64)
    accum = np.maximum(np.ceil(b / (k * max_local_bsz) - _TOL) - 1, 0) if max_local_bsz else np.zeros(np.broadcast(b, k).shape)
    local = b / (k * (accum + 1))
    if local.ndim == 0:
        return float(local), float(accum)
    return local, accum


def local_of(batch_size: float, world_size: float, accum_steps: float) -> float:
    """Samples per GPU per micro-batch of a total batch on ``world_size`` GPUs with ``accum_steps``
    (Pollux's ``local_bsz``: ``B / (W * (s + 1))``, fractional where the split is uneven)."""
    return batch_size / (world_size * (accum_steps + 1))


def default_cap(init_batch_size: int, logical_workers: int) -> int:
    """The adaptive cap when the spec gives none: ``M0 * K`` (module docstring)."""
    return init_batch_size * logical_workers


def batch_cap(init_batch_size: int, logical_workers: int, max_batch_size: int | None = None,
              num_samples: int | None = None) -> int:
    """The largest batch adaptive training may use: the spec's ``max_batch_size`` (else
    ``default_cap``), within the dataset, rounded down to a multiple of ``K`` and never below ``M0``."""
    cap = max_batch_size if max_batch_size is not None else default_cap(init_batch_size, logical_workers)
    if num_samples is not None:
        cap = min(cap, num_samples)
    k = logical_workers
    return max(init_batch_size, (cap // k) * k)


def round_batch(target: float, *, logical_workers: int, init_batch_size: int, max_batch_size: int) -> int:
    """``target`` as the nearest multiple of ``K`` within ``[M0, cap]`` (M0 is a multiple of K; the
    cap is rounded down to one)."""
    k = logical_workers
    hi = max(init_batch_size, (max_batch_size // k) * k)
    b = int(math.floor(target / k + 0.5)) * k
    return min(max(b, init_batch_size), hi)


def candidates(init_batch_size: int, max_batch_size: int, logical_workers: int,
               count: int = DEFAULT_CANDIDATES, extra: ArrayLike = ()) -> _FloatArray:
    """The batches a job with ``K`` logical workers may train at: multiples of ``K`` from ``M0`` to
    the cap, spaced geometrically (``count`` points, both ends included), plus ``extra`` (e.g. the
    free optimizer's pick, the current batch) rounded the same way; sorted, unique."""
    k = logical_workers
    hi = max(init_batch_size, (max_batch_size // k) * k)
    grid = np.geomspace(init_batch_size, hi, max(count, 2))
    pts = np.concatenate([[init_batch_size, hi], grid, np.asarray(extra, dtype=np.float64).ravel()])
    out: _FloatArray = np.unique(np.clip(np.floor(pts / k + 0.5) * k, init_batch_size, hi))
    return out


@dataclasses.dataclass(frozen=True)
class RebatchRule:
    """When a running gang restarts only to change its batch: more than ``min_gain`` (share) of
    goodput, and the time saved over the remaining work pays ``payback_restarts`` restarts."""

    min_gain: float = 0.05
    payback_restarts: float = 3.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.min_gain) and self.min_gain >= 0):
            raise ValueError(f"rebatch min_gain must be finite and >= 0, got {self.min_gain!r}")
        if not (math.isfinite(self.payback_restarts) and self.payback_restarts >= 0):
            raise ValueError(f"rebatch payback_restarts must be finite and >= 0, got {self.payback_restarts!r}")


DEFAULT_REBATCH = RebatchRule()


def gains(old_goodput: float, new_goodput: float, rule: RebatchRule = DEFAULT_REBATCH) -> bool:
    """Whether ``new_goodput`` beats ``old_goodput`` by more than the rule's share."""
    return old_goodput > 0 and new_goodput > old_goodput * (1.0 + rule.min_gain)


def rebatch_pays(old_goodput: float, new_goodput: float, *, remaining_s: float, restart_s: float,
                 rule: RebatchRule = DEFAULT_REBATCH) -> bool:
    """Whether restarting at the new batch pays: the gain passes ``min_gain`` and the time it saves
    over ``remaining_s`` (the remaining work's duration at the old goodput, measured) is more than
    ``payback_restarts`` restarts of ``restart_s``."""
    if not gains(old_goodput, new_goodput, rule) or not remaining_s > 0:
        return False
    saved_s = remaining_s * (1.0 - old_goodput / new_goodput)
    return saved_s > rule.payback_restarts * max(restart_s, 0.0)
