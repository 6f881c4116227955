"""Pollux's goodput model: system throughput times statistical efficiency (contract: DESIGN.md).

Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for Goodput-Optimized Deep Learning", OSDI'21,
section 3, as implemented in AdaptDL (``adaptdl/goodput.py``). Written again here as typed numpy, with
each formula beside its parameters.

Throughput. One optimizer step with ``accum_steps`` gradient-accumulation steps of ``m`` examples per
GPU takes

    T_grad(m)      = alpha_c + beta_c * m                               (forward + backward, per GPU)
    T_sync(N, K)   = 0                                   if K == 1      (one replica: nothing to reduce)
                   = alpha_r + beta_r * max(K - 2, 0)    if N == 1      (replicas inside one node)
                   = alpha_n + beta_n * max(N - 2, 0)    if N > 1       (the slowest, inter-node link)
    T_step         = accum_steps * T_grad + (T_grad^gamma + T_sync^gamma)^(1/gamma)

where ``N`` is the number of nodes, ``K`` the number of replicas (GPUs) and ``gamma >= 1`` models how
much the last backward pass overlaps the gradient all-reduce (gamma = 1: no overlap, gamma -> inf:
perfect overlap).

Statistical efficiency (Pollux eq. 4, after McCandlish et al.'s gradient noise scale): training at total
batch ``M`` makes ``EFFICIENCY(M)`` as much progress per example as at the initial batch ``M0``:

    phi        = grad_var / grad_sqr * M0          (the gradient noise scale, in examples)
    EFFICIENCY = (phi + M0) / (phi + M)

``grad_sqr`` and ``grad_var`` are |G|^2 and tr(Sigma) measured at, and normalised to, ``M0``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import minimize

_FloatArray = NDArray[np.float64]
_EPS = 1e-8


def efficiency(batch_size: ArrayLike, init_batch_size: float, grad_sqr: float, grad_var: float) -> Any:
    """Statistical efficiency of training at ``batch_size`` relative to ``init_batch_size`` (0..1]."""
    if init_batch_size <= 0:
        raise ValueError(f"init_batch_size must be positive, got {init_batch_size}")
    if grad_sqr <= 0 or grad_var < 0:
        raise ValueError(f"grad_sqr must be > 0 and grad_var >= 0, got {grad_sqr}, {grad_var}")
    m = np.asarray(batch_size, dtype=np.float64)
    phi = grad_var / grad_sqr * init_batch_size
    out = (phi + init_batch_size) / (phi + m)
    return float(out) if out.ndim == 0 else out


@dataclasses.dataclass(frozen=True)
class ThroughputParams:
    """Pollux's seven performance parameters (seconds, except the dimensionless ``gamma``)."""

    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 0:
                raise ValueError(f"{f.name} must be >= 0, got {getattr(self, f.name)}")
        if self.gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {self.gamma}")


def _grad_time(p: ThroughputParams | _FloatArray, local_bsz: _FloatArray) -> _FloatArray:
    alpha_c, beta_c = (p.alpha_c, p.beta_c) if isinstance(p, ThroughputParams) else (p[0], p[1])
    return alpha_c + beta_c * local_bsz


def _sync_time(p: ThroughputParams | _FloatArray, nodes: _FloatArray, replicas: _FloatArray) -> _FloatArray:
    if isinstance(p, ThroughputParams):
        a_n, b_n, a_r, b_r = p.alpha_n, p.beta_n, p.alpha_r, p.beta_r
    else:
        a_n, b_n, a_r, b_r = p[2], p[3], p[4], p[5]
    intra = a_r + b_r * np.maximum(replicas - 2, 0)
    inter = a_n + b_n * np.maximum(nodes - 2, 0)
    return np.where(replicas <= 1, 0.0, np.where(nodes <= 1, intra, inter))


def _optim_time(grad: _FloatArray, sync: _FloatArray, gamma: float) -> _FloatArray:
    # (T_grad^gamma + T_sync^gamma)^(1/gamma), computed in log space for large gamma.
    g = np.log(np.maximum(grad, _EPS))
    s = np.log(np.maximum(sync, _EPS))
    hi = np.maximum(g, s)
    out: _FloatArray = np.exp(hi + np.log(np.exp(gamma * (g - hi)) + np.exp(gamma * (s - hi))) / gamma)
    return out


@dataclasses.dataclass(frozen=True)
class ThroughputModel:
    """A fitted Pollux throughput model. Build with ``ThroughputModel.fit(...)`` or from params."""

    params: ThroughputParams

    def step_time(self, nodes: ArrayLike, replicas: ArrayLike, local_bsz: ArrayLike, accum_steps: ArrayLike = 0) -> Any:
        """Seconds per optimizer step (scalar in, scalar out; arrays broadcast)."""
        n = np.asarray(nodes, dtype=np.float64)
        k = np.asarray(replicas, dtype=np.float64)
        m = np.asarray(local_bsz, dtype=np.float64)
        a = np.asarray(accum_steps, dtype=np.float64)
        grad = _grad_time(self.params, m)
        out = a * grad + _optim_time(grad, _sync_time(self.params, n, k), self.params.gamma)
        return float(out) if out.ndim == 0 else out

    def sync_time(self, nodes: ArrayLike, replicas: ArrayLike) -> Any:
        n = np.asarray(nodes, dtype=np.float64)
        k = np.asarray(replicas, dtype=np.float64)
        out = _sync_time(self.params, n, k)
        return float(out) if out.ndim == 0 else out

    def throughput(self, nodes: ArrayLike, replicas: ArrayLike, local_bsz: ArrayLike, accum_steps: ArrayLike = 0) -> Any:
        """Examples per second: replicas * local_bsz * (accum_steps + 1) / step_time."""
        k = np.asarray(replicas, dtype=np.float64)
        m = np.asarray(local_bsz, dtype=np.float64)
        a = np.asarray(accum_steps, dtype=np.float64)
        out = k * m * (a + 1) / np.asarray(self.step_time(nodes, replicas, local_bsz, accum_steps))
        return float(out) if out.ndim == 0 else out

    @classmethod
    def fit(
        cls,
        nodes: ArrayLike,
        replicas: ArrayLike,
        local_bsz: ArrayLike,
        step_time: ArrayLike,
        sync_time: ArrayLike | None = None,
        accum_steps: ArrayLike | None = None,
    ) -> "ThroughputModel":
        """Least squares on log step time (and log sync time where measured), as AdaptDL does.

        Log-space errors weight a 10 % miss on a small and a large configuration alike. Parameters are
        bounded to be non-negative and ``gamma`` to [1, 10]; a small penalty keeps the unidentified
        network parameters near zero when the data never exercises them (e.g. a single node).
        """
        n = np.asarray(nodes, dtype=np.float64)
        k = np.asarray(replicas, dtype=np.float64)
        m = np.asarray(local_bsz, dtype=np.float64)
        t = np.asarray(step_time, dtype=np.float64)
        a = np.zeros_like(t) if accum_steps is None else np.asarray(accum_steps, dtype=np.float64)
        if not (n.shape == k.shape == m.shape == t.shape == a.shape) or t.ndim != 1 or t.size == 0:
            raise ValueError("nodes, replicas, local_bsz, step_time (and accum_steps) must be 1-d arrays of one length")
        if np.any(t <= 0) or np.any(m <= 0) or np.any(k < 1) or np.any(n < 1) or np.any(n > k):
            raise ValueError("step_time and local_bsz must be positive, 1 <= nodes <= replicas")
        s = None if sync_time is None else np.asarray(sync_time, dtype=np.float64)
        if s is not None and s.shape != t.shape:
            raise ValueError("sync_time must have the shape of step_time")
        sync_mask = np.zeros_like(t, dtype=bool) if s is None else (k > 1) & (s > 0)

        # Initial guess: compute from single-replica rows, network from the mean sync time.
        single = k == 1
        if single.sum() >= 2:
            beta_c, alpha_c = np.polyfit(m[single], t[single] / (a[single] + 1), 1)
        else:
            beta_c, alpha_c = float(np.median(t / (m * (a + 1)))), 0.0
        alpha_c, beta_c = max(alpha_c, 1e-4), max(beta_c, 1e-6)
        net0 = float(np.median(s[sync_mask])) if s is not None and sync_mask.any() else 0.01
        x0 = np.array([alpha_c, beta_c, net0, net0 * 0.05, net0, net0 * 0.05, 1.5])
        lo = np.array([1e-8] * 6 + [1.0])
        hi = np.array([np.inf] * 6 + [10.0])
        logt = np.log(t)
        logs = np.log(s[sync_mask]) if s is not None and sync_mask.any() else None

        def loss(x: _FloatArray) -> float:
            grad = _grad_time(x, m)
            sync = _sync_time(x, n, k)
            pred = a * grad + _optim_time(grad, sync, float(x[6]))
            err = float(np.mean((np.log(pred) - logt) ** 2))
            if logs is not None:
                err += float(np.mean((np.log(np.maximum(sync[sync_mask], _EPS)) - logs) ** 2))
            # Weak ridge on the network parameters (relative to compute) for identifiability.
            err += 1e-5 * float(np.sum((x[2:6] / (x[0] + x[1] * np.mean(m))) ** 2))
            return err

        # A few starting overlaps: the loss is not convex in gamma.
        best = None
        for gamma0 in (1.2, 2.5, 6.0):
            x0[6] = gamma0
            res = minimize(loss, x0, method="L-BFGS-B", bounds=list(zip(lo, hi)))
            if best is None or res.fun < best.fun:
                best = res
        assert best is not None
        x = np.clip(best.x, lo, hi)
        return cls(ThroughputParams(*(float(v) for v in x)))
