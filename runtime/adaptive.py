"""Measuring goodput and adapting the batch (issue 11, items 3-4; docs/runtime.md "Adaptive batch").

**Profile.** Per configuration ``(nodes, replicas, local_bsz, accum_steps)`` the trainer adds each
step's wall time and its synchronisation wait (the time from the end of the step's last backward
pass until the reduced gradient is there: Pollux's ``sync_time``, the non-overlapped part); the
profile keeps their means, is checkpointed (JSON inside the trainer's state and in the manifest,
never pickle) and is what rank 0 reports (``profile`` in the progress file, worker protocol). The
first step of a gang and the first after a batch change are not measured (lazy allocation, caches).

**Batch plan.** The layout contract (``K`` logical workers, their micro-batches of ``B / K``, chunks
within the per-GPU limit, ``ceil(K / W)`` of them per GPU in turn, the cap, the rounding) is
``cost_models.batching``'s, shared with the controller: what the policy values is what the runtime
trains.

**Choice** (``batch_policy: adaptive``, at every start of a gang, i.e. every change of instances). When
a controller runs the job it gives every adaptive gang a directive, ``SPOTRAIN_BATCH_JSON`` (the
batch its allocation was valued at; the spec's batch until the policy has a model), and the **policy
is the only decider**: the runtime trains at the directive (rounded to a multiple of ``K`` within
``[M0, cap]``) and never changes it on its own; the controller re-batches by restarting the gang.
Without a controller (``python train.py``, ``torchrun``: no directive) the runtime chooses: the goodput
optimizer on the throughput model fitted to its own profile and gradient statistics
(:func:`choose_batch`; nothing before both exist: the batch stays), re-optimized every
``rebatch_every_steps`` steps, changing at that boundary when the predicted goodput improves by more
than 5 %; it says so when it starts, and its progress reports carry ``batch_source: runtime``.

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

from cost_models import batching

if TYPE_CHECKING:
    from cost_models.goodput import ThroughputModel

MAX_PROFILE_ROWS = 64

_Key = tuple[int, int, int, int]  # nodes, replicas, local_bsz, accum_steps


# The layout contract lives in ``cost_models.batching`` (issue 20): one home for the controller and
# the runtime. The names the trainer and its tests know are kept.
BatchPlan = batching.Layout
plan_batch = batching.plan
round_batch = batching.round_batch


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
                 current: int | None = None, min_gain: float = 0.0,
                 candidates: int = batching.DEFAULT_CANDIDATES) -> int | None:
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
    cap = batching.batch_cap(m0, k, max_batch_size)
    try:
        fn = GoodputFunction(model, grad_sqr=grad_sqr, grad_var=grad_var, init_batch_size=m0)
        pick = fn.optimize(nodes, replicas, max_batch_size=cap, max_local_bsz=max_local_bsz).batch_size
    except ValueError:
        return None
    batch = batching.candidates(m0, cap, k, count=candidates, extra=[float(pick), *([current] if current else [])])
    sizes = [int(b) for b in batch]
    _, local, accum = batching.plan_grid(batch, replicas, k, max_local_bsz)
    step_s = np.asarray(model.step_time(nodes, replicas, local, accum), dtype=np.float64)
    good = np.where(step_s > 0, batch / step_s * np.asarray(fn.efficiency(batch), dtype=np.float64), 0.0)
    if not np.all(np.isfinite(good)) or good.max() <= 0:
        return None
    best = int(np.argmax(good))
    if current is not None:
        here = float(good[sizes.index(current)]) if current in sizes else 0.0
        rule = batching.RebatchRule(min_gain=min_gain)
        if sizes[best] == current or (here > 0 and not batching.gains(here, float(good[best]), rule)):
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
