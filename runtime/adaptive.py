"""Measuring goodput and adapting the batch (issue 11, items 3-4; docs/runtime.md "Adaptive batch").

**Profile.** Per configuration ``(nodes, replicas, local_bsz, accum_steps)`` the trainer adds each
step's wall time and its synchronisation wait (the time from the end of the step's last backward
pass until the reduced gradient is there: Pollux's ``sync_time``, the non-overlapped part); the
profile keeps their means, is checkpointed (JSON inside the trainer's state and in the manifest,
never pickle) and is what rank 0 reports (``profile`` in the progress file, worker protocol). The
first step of a gang and the first after a batch change are not measured (lazy allocation, caches).

**Batch plan.** The runtime has ``K`` fixed logical workers; rank ``r`` runs a contiguous share of
them one after the other, each on its micro-batch of ``B / K`` samples. In Pollux's terms a
configuration of ``W`` GPUs therefore trains with ``ceil(K / W) * chunks`` micro-batches per GPU per
step (``accum_steps`` = that minus one) of ``local_bsz = ceil(B / (K * chunks))`` samples, where
``chunks`` splits a logical worker's micro-batch when it is over the per-GPU limit
(``training.max_local_batch_size``): gradients of the chunks accumulate, weighted by their share, so
the logical worker still contributes the mean gradient over its samples (the arithmetic does not
depend on ``W``: bitwise mode stays bitwise for a given batch).

**Choice** (``batch_policy: adaptive``, at every start of a gang, i.e. every change of instances): the
controller's directive ``SPOTRAIN_BATCH_JSON`` when there is one (the allocation it chose came with
its batch), rounded to a multiple of ``K`` within ``[M0, max_batch_size]`` (and no more than the
dataset holds); otherwise the goodput optimizer on the throughput model fitted to the runtime's own
profile and its gradient statistics (:func:`choose_batch`; nothing before both exist: the batch
stays). A gang without a directive (``python train.py``, ``torchrun``) also re-optimizes every
``rebatch_every_steps`` steps and changes its batch at that boundary when the predicted goodput
improves by more than 5 %; a gang with one keeps it (the controller re-batches by restarting, so a
schedule of allocations and their batches fixes the run).

**Scale-invariant progress** (AdaScale, Johnson et al. ICML'20; Pollux section 3): a step at batch
``B = S * M0`` is worth ``r = (var + sqr) / (var / S + sqr)`` iterations at ``M0`` (the AdaScale gain,
= ``S * EFFICIENCY(B)``; 1 while the statistics are unknown, exactly 1 at ``M0``). With ``batch_policy:
adaptive`` the trainer's epochs, ``max_steps``, the end of training and the user's LR scheduler count
these iterations, so an epoch-based schedule stays right whatever the batch does.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

if TYPE_CHECKING:
    from cost_models.goodput import ThroughputModel

MAX_PROFILE_ROWS = 64

_Key = tuple[int, int, int, int]  # nodes, replicas, local_bsz, accum_steps


@dataclass(frozen=True)
class BatchPlan:
    """How a global batch runs on ``world_size`` GPUs (module docstring)."""

    batch_size: int  # samples per optimizer step
    chunks: int  # micro-steps per logical worker (1: its whole micro-batch at once)
    local_bsz: int  # samples per GPU per micro-batch (the largest chunk)
    accum_steps: int  # extra micro-batches per step on the busiest GPU

    def to_json(self) -> dict[str, int]:
        return {"batch_size": self.batch_size, "local_bsz": self.local_bsz, "accum_steps": self.accum_steps}


def plan_batch(batch_size: int, *, world_size: int, logical_workers: int,
               max_local_bsz: int | None = None) -> BatchPlan:
    if batch_size < 1 or batch_size % logical_workers:
        raise ValueError(f"batch size {batch_size} is not a positive multiple of logical_workers ({logical_workers})")
    micro = batch_size // logical_workers
    chunks = -(-micro // max_local_bsz) if max_local_bsz else 1
    local = -(-micro // chunks)
    per_gpu = -(-logical_workers // world_size)
    return BatchPlan(batch_size=batch_size, chunks=chunks, local_bsz=local, accum_steps=per_gpu * chunks - 1)


def round_batch(target: float, *, logical_workers: int, init_batch_size: int, max_batch_size: int) -> int:
    """``target`` as a multiple of ``K`` within ``[M0, max_batch_size]`` (M0 is a multiple of K)."""
    k = logical_workers
    hi = max(init_batch_size, (max_batch_size // k) * k)
    b = int(math.floor(target / k + 0.5)) * k
    return min(max(b, init_batch_size), hi)


def parse_batch_json(text: str | None) -> int | None:
    """The total batch of a ``SPOTRAIN_BATCH_JSON`` directive, or None when absent or unusable (a
    malformed directive is ignored with the spec's batch, never an error that fails the job)."""
    if not text:
        return None
    try:
        data = json.loads(text)
        b = data["batch_size"]
    except (ValueError, KeyError, TypeError):
        return None
    if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or b < 1:
        return None
    return int(b)


class Profile:
    """Mean step and sync time per configuration; ``state_dict`` is plain JSON."""

    def __init__(self) -> None:
        self._rows: dict[_Key, list[float]] = {}  # key -> [count, step_s sum, sync_s sum]

    def add(self, key: _Key, step_time_s: float, sync_time_s: float) -> None:
        row = self._rows.get(key)
        if row is None:
            if len(self._rows) >= MAX_PROFILE_ROWS:
                return
            row = self._rows[key] = [0.0, 0.0, 0.0]
        row[0] += 1
        row[1] += step_time_s
        row[2] += min(sync_time_s, step_time_s)

    def __len__(self) -> int:
        return len(self._rows)

    def rows(self) -> list[dict[str, float | int]]:
        """The worker protocol's ``profile`` rows, in configuration order."""
        out: list[dict[str, float | int]] = []
        for (n, k, m, a), (c, t, s) in sorted(self._rows.items()):
            out.append({"nodes": n, "replicas": k, "local_bsz": m, "accum_steps": a,
                        "step_time_s": t / c, "sync_time_s": s / c})
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"rows": [[*key, *row] for key, row in sorted(self._rows.items())]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._rows = {}
        for r in state.get("rows", [])[:MAX_PROFILE_ROWS]:
            n, k, m, a, c, t, s = r
            if c > 0:
                self._rows[(int(n), int(k), int(m), int(a))] = [float(c), float(t), float(s)]

    def fit(self) -> "ThroughputModel | None":
        """The throughput model of these rows (``ThroughputModel.fit``), or None when it cannot be fitted."""
        rows = self.rows()
        if not rows:
            return None
        from cost_models.goodput import ThroughputModel  # scipy: only when a batch is chosen, not at import

        cols = {f: np.array([r[f] for r in rows], dtype=np.float64)
                for f in ("nodes", "replicas", "local_bsz", "accum_steps", "step_time_s", "sync_time_s")}
        try:
            return ThroughputModel.fit(cols["nodes"], cols["replicas"], cols["local_bsz"], cols["step_time_s"],
                                       cols["sync_time_s"], cols["accum_steps"])
        except (ValueError, ArithmeticError, np.linalg.LinAlgError):
            return None


def choose_batch(profile: Profile, *, grad_sqr: float | None, grad_var: float | None, nodes: int, replicas: int,
                 logical_workers: int, init_batch_size: int, max_batch_size: int, max_local_bsz: int | None,
                 current: int | None = None, min_gain: float = 0.0, candidates: int = 48) -> int | None:
    """The total batch of the highest goodput on ``(nodes, replicas)``, from the runtime's own profile
    and statistics, among the batches this runtime can train with (multiples of ``K`` within
    ``[M0, max_batch_size]``, each valued at its own plan: the busiest GPU's micro-batches and chunks);
    the candidates are ``GoodputFunction.optimize``'s pick and a geometric grid. With ``current``,
    None unless the best beats it by more than ``min_gain`` (Pollux re-optimizes at 5 %). None as
    well without a profile or statistics, or when the model cannot be fitted."""
    if grad_sqr is None or grad_var is None or not len(profile):
        return None
    model = profile.fit()
    if model is None:
        return None
    from cost_models.goodput import GoodputFunction

    k, m0 = logical_workers, init_batch_size
    cap = max(m0, (max_batch_size // k) * k)
    try:
        fn = GoodputFunction(model, grad_sqr=grad_sqr, grad_var=grad_var, init_batch_size=m0)
        pick = fn.optimize(nodes, replicas, max_batch_size=cap, max_local_bsz=max_local_bsz).batch_size
    except ValueError:
        return None
    grid = m0 * np.exp(np.linspace(0.0, np.log(cap / m0), candidates)) if cap > m0 else np.array([float(m0)])
    sizes = sorted({round_batch(b, logical_workers=k, init_batch_size=m0, max_batch_size=cap)
                    for b in [*grid, float(pick), *([current] if current else [])]})
    plans = [plan_batch(b, world_size=replicas, logical_workers=k, max_local_bsz=max_local_bsz) for b in sizes]
    batch = np.array(sizes, dtype=np.float64)
    step_s = np.asarray(model.step_time(nodes, replicas, [p.local_bsz for p in plans], [p.accum_steps for p in plans]),
                        dtype=np.float64)
    good = np.where(step_s > 0, batch / step_s * np.asarray(fn.efficiency(batch), dtype=np.float64), 0.0)
    if not np.all(np.isfinite(good)) or good.max() <= 0:
        return None
    best = int(np.argmax(good))
    if current is not None:
        here = good[sizes.index(current)] if current in sizes else 0.0
        if sizes[best] == current or good[best] <= (1.0 + min_gain) * here:
            return None
    return sizes[best]


@dataclass
class ScaleInvariantProgress:
    """Iterations at the initial batch done so far (``iterations``) and the LR scheduler steps taken
    for them (``scheduler_steps`` = floor(iterations) once caught up); checkpointed."""

    iterations: float = 0.0
    scheduler_steps: int = 0

    def advance(self, gain: float) -> int:
        """Add one step worth ``gain`` iterations; returns how many scheduler steps are now due."""
        self.iterations += gain
        due = int(math.floor(self.iterations + 1e-9)) - self.scheduler_steps
        self.scheduler_steps += max(due, 0)
        return max(due, 0)

    def state_dict(self) -> dict[str, float | int]:
        return {"iterations": self.iterations, "scheduler_steps": self.scheduler_steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.iterations = float(state.get("iterations", 0.0))
        self.scheduler_steps = int(state.get("scheduler_steps", 0))


def nodes_of(world_size: int, local_world_size: int) -> int:
    return -(-world_size // max(1, min(local_world_size, world_size)))
