"""Pollux's goodput: system throughput times statistical efficiency, and the batch optimizer (contract:
DESIGN.md, docs/goodput.md).

Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for Goodput-Optimized Deep Learning", OSDI'21,
sections 3.1-3.2, as implemented in AdaptDL (``adaptdl/goodput.py``, ``GoodputFunction``). The
throughput model and its fit live in ``cost_models.throughput`` and are re-exported here.

Statistical efficiency (Pollux eq. 4, after McCandlish et al.'s gradient noise scale): training at total
batch ``M`` makes ``EFFICIENCY(M)`` as much progress per example as at the initial batch ``M0``:

    phi        = grad_var / grad_sqr * M0          (the gradient noise scale, in examples)
    EFFICIENCY = (phi + M0) / (phi + M)            (1 when grad_sqr == 0: phi is infinite)

``grad_sqr`` and ``grad_var`` are |G|^2 and tr(Sigma) measured at, and normalised to, ``M0``.

Goodput of ``N`` nodes and ``K`` replicas at total batch ``M`` with ``s`` accumulation steps:

    local_bsz = M / (K * (s + 1))                                  (examples per GPU per micro-batch)
    GOODPUT   = THROUGHPUT(N, K, local_bsz, s) * EFFICIENCY(M)     (examples/s, worth as many at M0)

The optimizer (Pollux section 3.2) values each allocation at its best batch configuration: candidate
total batches spaced geometrically from ``max(M0, K * min_local_bsz)`` to ``max_batch_size``; for each,
the fewest accumulation steps that keep the per-GPU batch within ``max_local_bsz``; plus two corners
(the cap itself, and the largest batch without accumulation); the candidate with the highest goodput
wins. All of it is numpy over (candidates x allocations), so a policy values many
allocations in one call.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .throughput import ThroughputModel, ThroughputParams

__all__ = ["BatchChoice", "GoodputFunction", "ThroughputModel", "ThroughputParams", "efficiency"]

_FloatArray = NDArray[np.float64]
_TOL = 1e-8  # slack for floor/ceil of ratios that are integers up to rounding
DEFAULT_CANDIDATES = 50


def _check_grad_stats(init_batch_size: float, grad_sqr: float, grad_var: float) -> None:
    if not init_batch_size > 0:
        raise ValueError(f"init_batch_size must be positive, got {init_batch_size}")
    if not (np.isfinite(grad_sqr) and np.isfinite(grad_var)) or grad_sqr < 0 or grad_var < 0:
        raise ValueError(f"grad_sqr and grad_var must be finite and >= 0, got {grad_sqr}, {grad_var}")


def _efficiency(m: _FloatArray, init_batch_size: float, grad_sqr: float, grad_var: float) -> _FloatArray:
    if grad_sqr == 0:  # no signal measured (or pure noise): every example counts, as in AdaptDL
        return np.ones_like(m)
    phi = grad_var / grad_sqr * init_batch_size
    out: _FloatArray = (phi + init_batch_size) / (phi + m)
    return out


def efficiency(batch_size: ArrayLike, init_batch_size: float, grad_sqr: float, grad_var: float) -> Any:
    """Statistical efficiency of training at ``batch_size`` relative to ``init_batch_size`` (0..1 for
    batches at least the initial one; 1 when ``grad_sqr`` is 0). Scalar in, scalar out."""
    _check_grad_stats(init_batch_size, grad_sqr, grad_var)
    out = _efficiency(np.asarray(batch_size, dtype=np.float64), init_batch_size, grad_sqr, grad_var)
    return float(out) if out.ndim == 0 else out


@dataclasses.dataclass(frozen=True)
class BatchChoice:
    """The optimizer's pick per allocation (arrays of the allocations' broadcast shape, or scalars).

    Where no configuration fits (``replicas * min_local_bsz > max_batch_size``) goodput is 0 and the
    batch fields are 0.
    """

    goodput: Any  # examples per second, each worth one at the initial batch size
    batch_size: Any  # total examples per optimizer step = replicas * local_bsz * (accum_steps + 1)
    local_bsz: Any  # examples per GPU per micro-batch
    accum_steps: Any  # extra micro-batches per optimizer step (0: none)


@dataclasses.dataclass(frozen=True)
class GoodputFunction:
    """Goodput of a job: its throughput model and gradient statistics (measured at ``init_batch_size``)."""

    model: ThroughputModel
    grad_sqr: float
    grad_var: float
    init_batch_size: float

    def __post_init__(self) -> None:
        _check_grad_stats(self.init_batch_size, self.grad_sqr, self.grad_var)

    def efficiency(self, batch_size: ArrayLike) -> Any:
        return efficiency(batch_size, self.init_batch_size, self.grad_sqr, self.grad_var)

    def __call__(self, nodes: ArrayLike, replicas: ArrayLike, batch_size: ArrayLike, accum_steps: ArrayLike = 0) -> Any:
        """Goodput at total batch ``batch_size`` split over ``replicas`` GPUs and ``accum_steps + 1``
        micro-batches (the per-GPU batch may be fractional here; the optimizer picks whole ones)."""
        k = np.asarray(replicas, dtype=np.float64)
        m = np.asarray(batch_size, dtype=np.float64)
        a = np.asarray(accum_steps, dtype=np.float64)
        return self.evaluate(nodes, replicas, m / (k * (a + 1)), a)

    def evaluate(self, nodes: ArrayLike, replicas: ArrayLike, local_bsz: ArrayLike, accum_steps: ArrayLike = 0) -> Any:
        """Goodput at ``local_bsz`` examples per GPU and ``accum_steps`` (AdaptDL's ``evaluate``)."""
        k = np.asarray(replicas, dtype=np.float64)
        m = np.asarray(local_bsz, dtype=np.float64)
        a = np.asarray(accum_steps, dtype=np.float64)
        tput = np.asarray(self.model.throughput(nodes, k, m, a))
        out = tput * _efficiency(k * m * (a + 1), self.init_batch_size, self.grad_sqr, self.grad_var)
        return float(out) if out.ndim == 0 else out

    def optimize(
        self,
        nodes: ArrayLike,
        replicas: ArrayLike,
        *,
        max_batch_size: float,
        max_local_bsz: float | None = None,
        min_local_bsz: float = 1,
        accumulation: bool = True,
        candidates: int = DEFAULT_CANDIDATES,
    ) -> BatchChoice:
        """Best (batch_size, local_bsz, accum_steps) per allocation (module docstring; Pollux 3.2).

        ``max_local_bsz`` is the per-GPU limit (memory); without it, ``max_batch_size``. With
        ``accumulation=False`` a batch that needs more than ``max_local_bsz`` per GPU is not a candidate.
        """
        if max_batch_size < self.init_batch_size:
            raise ValueError(f"max_batch_size {max_batch_size} is below the initial batch size {self.init_batch_size}")
        hi_local = float(max_batch_size if max_local_bsz is None else max_local_bsz)
        if not 1 <= min_local_bsz <= hi_local or candidates < 1:
            raise ValueError(f"need 1 <= min_local_bsz ({min_local_bsz}) <= max_local_bsz ({hi_local}), candidates >= 1")
        n_in, k_in = np.asarray(nodes, dtype=np.float64), np.asarray(replicas, dtype=np.float64)
        shape = np.broadcast(n_in, k_in).shape
        n = np.broadcast_to(n_in, shape).ravel()
        k = np.broadcast_to(k_in, shape).ravel()
        if np.any(n < 1) or np.any(k < n):
            raise ValueError("need 1 <= nodes <= replicas")
        lo_total = np.maximum(self.init_batch_size, k * min_local_bsz)
        # (candidates, allocations): geometric from the smallest useful batch up to the cap.
        frac = np.linspace(0.0, 1.0, candidates)[:, None] if candidates > 1 else np.zeros((1, 1))
        span = np.log(np.maximum(max_batch_size / lo_total, 1.0))
        total = lo_total * np.exp(frac * span)
        # Two corners where the best batch often lies: the cap, and the most one micro-batch holds.
        corners = np.stack([np.full_like(k, float(max_batch_size)), np.clip(k * hi_local, lo_total, max_batch_size)])
        total = np.concatenate([total, corners])
        local = total / k
        accum = np.maximum(np.ceil(local / hi_local - _TOL) - 1, 0) if accumulation else np.zeros_like(local)
        micro = np.ceil(local / (accum + 1) - _TOL)
        # Rounding up may overshoot the cap: round down there instead.
        over = k * micro * (accum + 1) > max_batch_size + _TOL
        micro = np.where(over, np.floor(local / (accum + 1) + _TOL), micro)
        ok = (micro >= min_local_bsz) & (micro <= hi_local) & (lo_total <= max_batch_size)
        good = np.where(ok, self.evaluate(n, k, np.maximum(micro, 1.0), accum), 0.0)
        best = np.argmax(good, axis=0)
        cols = np.arange(good.shape[1])
        found = ok[best, cols]
        g = np.where(found, good[best, cols], 0.0)
        m = np.where(found, micro[best, cols], 0.0)
        s = np.where(found, accum[best, cols], 0.0)
        fields = (g, k * m * (s + 1), m, s)
        if shape == ():
            return BatchChoice(float(g[0]), int(fields[1][0]), int(m[0]), int(s[0]))
        g_out, b_out, m_out, s_out = (f.reshape(shape) for f in fields)
        return BatchChoice(g_out, b_out.astype(np.int64), m_out.astype(np.int64), s_out.astype(np.int64))
