"""The job's scaling model from its spec (``simulate.scaling``), for the policy and the simulator; and
``GoodputScaling``, the scaling of a job by Pollux goodput at the batch configuration it would train with.

``linear`` and ``{serial_fraction: f}`` are closed forms; ``{profile: PATH}`` is a measured Pollux
profile (relative paths are resolved against the spec's folder when it is loaded). Profiles are read
once per file version, not on every controller tick.

``GoodputScaling`` (issue 11, docs/goodput.md "controller") is a ``Scaling`` whose speedup of an
allocation is its goodput, at the batch configuration the runtime would choose for it, relative to one
GPU at the initial batch size (the unit of ``simulate.work_gpu_hours``). With a fixed batch (``batch_policy:
fixed``, or no gradient statistics yet) the total batch stays the initial one, split over the GPUs
with the fewest accumulation steps that fit the per-GPU limit; with ``batch_policy: adaptive`` and
gradient statistics it is ``GoodputFunction.optimize`` (Pollux section 3.2) within the spec's limits.
Every allocation size of one node shape is valued in one vectorized call, then cached.

A job with ``logical_workers`` K (every spec has them) is valued as the runtime trains it, not as the
free Pollux optimizer would split it: a total batch B is K micro-batches of B/K (each split into
chunks within the per-GPU limit), and a GPU of k runs ceil(K/k) of them in turn: the layout contract of
``cost_models.batching`` (``plan_grid``), which the runtime trains by too. The candidates are multiples
of K between the initial batch and the cap (``batching.candidates``; the cap: ``batching.batch_cap``). Valuing a split the runtime
cannot train made the controller restart a gang to gain goodput that the gang, restarted, could not
have: the runtime reported the split it could train, and the next tick asked again.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

import numpy as np

from autoscaler.errors import SpecError
from autoscaler.jobs.spec import JobSpec, SerialFraction
from cloud_providers.safe_files import read_text_file
from cost_models import batching
from cost_models.goodput import GoodputFunction, ThroughputModel, efficiency
from cost_models.scaling import MAX_PROFILE_BYTES, AmdahlScaling, LinearScaling, ProfileScaling, Scaling, parse_profile_csv


@functools.lru_cache(maxsize=64)
def _profile(path: str, mtime_ns: int, batch: int) -> ProfileScaling:
    try:  # a bounded regular file (issue 21, finding 12): a FIFO or /dev/zero is refused at once
        model = parse_profile_csv(read_text_file(path, max_bytes=MAX_PROFILE_BYTES, what=""), source=path)
    except ValueError as exc:
        raise SpecError(f"spec error: simulate.scaling.profile: {exc}") from None
    return ProfileScaling(model, batch)


def spec_scaling(spec: JobSpec, spec_dir: Path | None = None) -> Scaling:
    """The job's scaling model from its ``simulate.scaling`` (profile paths relative to ``spec_dir``)."""
    s = spec.simulate.scaling
    if s == "linear":
        return LinearScaling()
    if isinstance(s, SerialFraction):
        return AmdahlScaling(float(s.serial_fraction))
    path = Path(s.profile)
    if not path.is_absolute() and spec_dir is not None:
        path = spec_dir / path
    try:
        mtime = path.stat().st_mtime_ns
    except OSError as exc:
        raise SpecError(f"spec error: simulate.scaling.profile: cannot read {path} ({exc.strerror})") from None
    return _profile(str(path), mtime, spec.training.global_batch_size)


def measured_scaling(spec: JobSpec) -> Scaling | None:
    """The profile's model for a job whose spec names one (None otherwise, or when it cannot be read:
    the policy then falls back to its prior)."""
    if getattr(spec.simulate.scaling, "profile", None) is None:
        return None
    try:
        return spec_scaling(spec)
    except SpecError:
        return None


@dataclasses.dataclass(frozen=True)
class BatchConfig:
    """A batch configuration: ``batch_size`` examples per optimizer step = GPUs x ``local_bsz`` x
    (``accum_steps`` + 1). What the controller tells a gang to train with (``SPOTRAIN_BATCH_JSON``)."""

    batch_size: int
    local_bsz: int
    accum_steps: int = 0

    def to_json(self) -> dict[str, int]:
        return {"batch_size": self.batch_size, "local_bsz": self.local_bsz, "accum_steps": self.accum_steps}

    def describe(self, gpus: int | None = None) -> str:
        per = f"{self.local_bsz} per GPU" + (f" x {gpus} GPU(s)" if gpus else "")
        acc = f", {self.accum_steps} accumulation step(s)" if self.accum_steps else ""
        return f"batch {self.batch_size} ({per}{acc})"


def batch_limits(spec: JobSpec) -> tuple[int, int, int | None]:
    """(initial batch M0, the adaptive cap, the per-GPU limit) from the spec: the cap is
    ``batching.batch_cap`` (``training.max_batch_size``, else M0 x ``logical_workers``, the one default
    the runtime shares); the per-GPU limit is ``training.max_local_batch_size`` when the spec has it."""
    t = spec.training
    cap = batching.batch_cap(t.global_batch_size, t.logical_workers, t.max_batch_size)
    local = getattr(t, "max_local_batch_size", None)
    return t.global_batch_size, cap, int(local) if local else None


class GoodputScaling:
    """Speedup of an allocation = goodput at its batch configuration / goodput of one GPU at M0.

    ``grad`` = (grad_sqr, grad_var) measured at M0; with ``adaptive`` and ``grad`` the batch is
    optimized, otherwise it stays M0. Hashes by identity (a new measurement makes a new object).
    Raises ValueError for a model that gives one GPU no finite, positive throughput."""

    def __init__(self, model: ThroughputModel, *, init_batch_size: int, max_batch_size: int,
                 max_local_bsz: int | None = None, grad: tuple[float, float] | None = None,
                 adaptive: bool = False, logical_workers: int | None = None) -> None:
        self.model = model
        self.logical_workers = logical_workers
        self.init_batch_size = int(init_batch_size)
        self.max_batch_size = max(int(max_batch_size), self.init_batch_size)
        self.max_local_bsz = max_local_bsz
        self.grad = grad
        self.fn: GoodputFunction | None = None
        if adaptive and grad is not None:
            self.fn = GoodputFunction(model, grad_sqr=grad[0], grad_var=grad[1], init_batch_size=self.init_batch_size)
        self._base = float(self._fixed(np.ones(1), np.ones(1))[0][0])
        if not (math.isfinite(self._base) and self._base > 0):
            raise ValueError(f"the throughput model gives one GPU a throughput of {self._base}")
        self._tables: dict[int, tuple[np.ndarray, list[BatchConfig | None]]] = {}

    @property
    def adaptive(self) -> bool:
        return self.fn is not None

    def _fixed(self, n: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Throughput (examples/s) at the initial batch split over ``k`` GPUs: (goodput, local, accum)."""
        m0 = float(self.init_batch_size)
        if self.logical_workers:
            _, local, accum = batching.plan_grid(np.full_like(k, m0), k, self.logical_workers, self.max_local_bsz)
            return m0 / np.asarray(self.model.step_time(n, k, local, accum), dtype=np.float64), local, accum
        local, accum = batching.split(np.full_like(k, m0), k, self.max_local_bsz)
        return np.asarray(self.model.throughput(n, k, local, accum), dtype=np.float64), local, accum

    def _table(self, per_node: int, upto: int) -> tuple[np.ndarray, list[BatchConfig | None]]:
        hit = self._tables.get(per_node)
        if hit is not None and len(hit[1]) > upto:
            return hit
        size = max(upto + 1, 2 * len(hit[1]) if hit else 17)
        k = np.arange(1, size, dtype=np.float64)
        n = np.ceil(k / per_node)
        if self.fn is not None and self.logical_workers:
            good, batches = self._runtime_best(n, k)
        elif self.fn is not None:
            c = self.fn.optimize(n, k, max_batch_size=self.max_batch_size, max_local_bsz=self.max_local_bsz)
            good = np.asarray(c.goodput, dtype=np.float64)
            batches = [BatchConfig(int(b), int(m), int(s)) if g > 0 else None
                       for g, b, m, s in zip(good, c.batch_size, c.local_bsz, c.accum_steps)]
        else:
            good, local, accum = self._fixed(n, k)
            batches = [BatchConfig(self.init_batch_size, max(1, int(math.ceil(m - 1e-9))), int(s))
                       for m, s in zip(local, accum)]
        speedups = np.where(np.isfinite(good) & (good > 0), good / self._base, 0.0)
        table = (np.concatenate([[0.0], speedups]), [None, *batches])
        self._tables[per_node] = table
        return table

    def _runtime_best(self, n: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, list[BatchConfig | None]]:
        """The best goodput of each allocation over the batches the runtime can train (module doc)."""
        assert self.fn is not None and self.logical_workers
        b = batching.candidates(self.init_batch_size, self.max_batch_size, self.logical_workers)[:, None]
        _, local, accum = batching.plan_grid(b, k[None, :], self.logical_workers, self.max_local_bsz)
        step_s = np.asarray(self.model.step_time(n[None, :], k[None, :], local, accum), dtype=np.float64)
        good = b / step_s * np.asarray(self.fn.efficiency(b), dtype=np.float64)
        good = np.where(np.isfinite(good) & (good > 0), good, 0.0)
        best = np.argmax(good, axis=0)
        cols = np.arange(k.size)
        batches = [BatchConfig(int(b[i, 0]), int(local[i, j]), int(accum[i, j])) if good[i, j] > 0 else None
                   for j, i in zip(cols, best)]
        return good[best, cols], batches

    def speedup(self, workers: int, gpus_per_node: int = 1) -> float:
        if workers <= 0:
            return 0.0
        return float(self._table(max(1, gpus_per_node), workers)[0][workers])

    def batch(self, workers: int, gpus_per_node: int = 1) -> BatchConfig | None:
        """The batch configuration the runtime would train ``workers`` GPUs with (None: none fits)."""
        if workers <= 0:
            return None
        return self._table(max(1, gpus_per_node), workers)[1][workers]

    def speedup_at(self, workers: int, gpus_per_node: int, batch: BatchConfig, grad: tuple[float, float] | None = None) -> float:
        """Speedup of ``workers`` GPUs training at ``batch`` (the simulated workers' true rate), with
        the statistical efficiency of ``grad`` (default: this model's; none: 1)."""
        if workers <= 0:
            return 0.0
        n = math.ceil(workers / max(1, gpus_per_node))
        if self.logical_workers:  # the runtime's split: B examples a step, the busiest GPU's time
            tput = batch.batch_size / float(self.model.step_time(n, workers, batch.local_bsz, batch.accum_steps))
        else:
            local = batching.local_of(batch.batch_size, workers, batch.accum_steps)
            tput = float(self.model.throughput(n, workers, local, batch.accum_steps))
        g = grad if grad is not None else self.grad
        eff = 1.0 if g is None else float(efficiency(batch.batch_size, self.init_batch_size, g[0], g[1]))
        return tput * eff / self._base
