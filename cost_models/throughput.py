"""Pollux's throughput model and its fit (re-exported by ``cost_models.goodput``; contract: DESIGN.md).

Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for Goodput-Optimized Deep Learning", OSDI'21,
section 3.1, as implemented in AdaptDL (``adaptdl/goodput.py``). Written again here as typed numpy, with
each formula beside its parameters.

One optimizer step with ``accum_steps`` gradient-accumulation steps of ``m`` examples per GPU takes

    T_grad(m)     = alpha_c + beta_c * m                        (forward + backward of one micro-batch)
    T_sync(N, K)  = 0                                           if K == 1 (nothing to reduce)
                  = alpha_r + beta_r * max(K - 2, 0)            if N == 1 (replicas inside one node)
                  = alpha_n + beta_n * max(K - 2, 0)            if N > 1  (the inter-node link)
                    + delta_n * (K / N - 1) / (N - 1)
    T_step        = accum_steps * T_grad + (T_grad^gamma + T_sync^gamma)^(1/gamma)

with ``N`` nodes and ``K`` replicas (GPUs). Ring all-reduce takes a number of rounds that grows with the
replicas, so both network terms retrogress with ``K - 2`` (AdaptDL's ``_predict_network``), whichever
link is the bottleneck. ``gamma`` in [1, 10] is how much the last backward pass overlaps the all-reduce
(1: none, large: perfect). ``delta_n`` (default 0, which is Pollux's model exactly) is one term the
Pollux profiles show and the seven parameters cannot: a few nodes that each hold several GPUs wait
longer than replicas alone predict (2 nodes of 4 GPUs sync about 2x slower than 4 nodes of 2); the
effect fades as the ring spreads over more nodes, hence ``/ (N - 1)``.

The fit (``ThroughputModel.fit``). Pollux's profiles measure ``sync_time`` as the wait *after* the
backward pass ended (the non-overlapped part), so, as AdaptDL's ``fit_perf_params`` does, the compute
model is fitted to ``(step_time - sync_time) / (accum_steps + 1)`` and the whole model to ``step_time``,
both in log space (a 10 % miss weighs the same on a small and a large configuration). Unlike AdaptDL,
the loss is robust (soft L1 with a 5 % scale: a few placements that run 30 % slow for reasons the model
has no term for do not drag the rest) and starts from several overlaps (the loss is not convex in
gamma). Parameters the data cannot identify are pinned to zero, as AdaptDL does: the inter-node terms
without multi-node rows, the intra-node terms without single-node multi-GPU rows, a retrogression
term without its link measured at two replica counts (AdaptDL: without rows of more than two
replicas), ``delta_n`` unless rows with several GPUs on each node were measured at two node counts, one of
them 2 nodes (where the term is largest), and rows of one node with several GPUs exist (the link it is
told apart from): otherwise it would be extrapolated, and the fit is Pollux's seven parameters; with
one per-GPU batch size only, alpha_c is pinned to half the compute time.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

_FloatArray = NDArray[np.float64]
_EPS = 1e-12
_N_PARAMS = 8
# Soft-L1 scale of the log residuals: errors under ~5 % count as squares, larger ones about linearly.
_ROBUST_SCALE = 0.05
_GAMMA_STARTS = (1.0, 1.5, 3.0, 6.0)
_GAMMA_MAX = 10.0


@dataclasses.dataclass(frozen=True)
class ThroughputParams:
    """Pollux's performance parameters (seconds, except the dimensionless ``gamma``).

    ``ThroughputParams(alpha_c, beta_c, alpha_n, beta_n, alpha_r, beta_r, gamma)`` is Pollux's model;
    ``delta_n`` (optional, default 0) adds the few-node contention term (module docstring).
    """

    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float
    delta_n: float = 0.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not np.isfinite(v) or v < 0:
                raise ValueError(f"{f.name} must be finite and >= 0, got {v}")
        if self.gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {self.gamma}")

    def as_array(self) -> _FloatArray:
        return np.array([getattr(self, f.name) for f in dataclasses.fields(self)], dtype=np.float64)


def _grad_time(x: _FloatArray, local_bsz: _FloatArray) -> _FloatArray:
    out: _FloatArray = x[0] + x[1] * local_bsz
    return out


def _sync_time(x: _FloatArray, nodes: _FloatArray, replicas: _FloatArray) -> _FloatArray:
    retro = np.maximum(replicas - 2, 0)
    intra = x[4] + x[5] * retro
    per_node = replicas / np.maximum(nodes, 1) - 1
    inter = x[2] + x[3] * retro + x[7] * per_node / np.maximum(nodes - 1, 1)
    out: _FloatArray = np.where(replicas <= 1, 0.0, np.where(nodes <= 1, intra, inter))
    return out


def _optim_time(grad: _FloatArray, sync: _FloatArray, gamma: float) -> _FloatArray:
    # (T_grad^gamma + T_sync^gamma)^(1/gamma), in log space so that a large gamma cannot overflow.
    g = np.log(np.maximum(grad, _EPS))
    s = np.log(np.maximum(sync, _EPS))
    hi = np.maximum(g, s)
    out: _FloatArray = np.exp(hi + np.log(np.exp(gamma * (g - hi)) + np.exp(gamma * (s - hi))) / gamma)
    return out


def _step_time(x: _FloatArray, n: _FloatArray, k: _FloatArray, m: _FloatArray, a: _FloatArray) -> _FloatArray:
    grad = _grad_time(x, m)
    out: _FloatArray = a * grad + _optim_time(grad, _sync_time(x, n, k), float(x[6]))
    return out


def _scalar_or_array(out: _FloatArray) -> Any:
    return float(out) if out.ndim == 0 else out


@dataclasses.dataclass(frozen=True)
class ThroughputModel:
    """A fitted Pollux throughput model. Build with ``ThroughputModel.fit(...)`` or from params."""

    params: ThroughputParams

    def step_time(self, nodes: ArrayLike, replicas: ArrayLike, local_bsz: ArrayLike, accum_steps: ArrayLike = 0) -> Any:
        """Seconds per optimizer step (scalar in, scalar out; arrays broadcast)."""
        x = self.params.as_array()
        n, k, m, a = (np.asarray(v, dtype=np.float64) for v in (nodes, replicas, local_bsz, accum_steps))
        return _scalar_or_array(_step_time(x, n, k, m, a))

    def grad_time(self, local_bsz: ArrayLike) -> Any:
        """Seconds of forward and backward pass for one micro-batch of ``local_bsz`` examples per GPU."""
        return _scalar_or_array(_grad_time(self.params.as_array(), np.asarray(local_bsz, dtype=np.float64)))

    def sync_time(self, nodes: ArrayLike, replicas: ArrayLike) -> Any:
        """Modelled all-reduce time (the whole of it, overlapped or not)."""
        n = np.asarray(nodes, dtype=np.float64)
        k = np.asarray(replicas, dtype=np.float64)
        return _scalar_or_array(_sync_time(self.params.as_array(), n, k))

    def throughput(self, nodes: ArrayLike, replicas: ArrayLike, local_bsz: ArrayLike, accum_steps: ArrayLike = 0) -> Any:
        """Examples per second: replicas * local_bsz * (accum_steps + 1) / step_time."""
        k = np.asarray(replicas, dtype=np.float64)
        m = np.asarray(local_bsz, dtype=np.float64)
        a = np.asarray(accum_steps, dtype=np.float64)
        out = k * m * (a + 1) / np.asarray(self.step_time(nodes, replicas, local_bsz, accum_steps))
        return _scalar_or_array(out)

    @classmethod
    def fit(
        cls,
        nodes: ArrayLike,
        replicas: ArrayLike,
        local_bsz: ArrayLike,
        step_time: ArrayLike,
        sync_time: ArrayLike | None = None,
        accum_steps: ArrayLike | None = None,
        *,
        contention_term: bool = True,
    ) -> "ThroughputModel":
        """Fit to measured steps (1-d arrays of one length; module docstring for the method).

        ``sync_time`` is the wait after the backward pass (Pollux's and the runtime's profiles); without
        it only whole steps are fitted. ``contention_term=False`` fits Pollux's seven parameters only
        (``delta_n`` = 0). Raises ValueError on malformed input.
        """
        from scipy.optimize import least_squares  # here: scipy costs the controller's start ~0.3 s
        n, k, m, t, a = _check_rows(nodes, replicas, local_bsz, step_time, accum_steps)
        compute = None
        if sync_time is not None:
            s = np.asarray(sync_time, dtype=np.float64)
            if s.shape != t.shape or not np.all(np.isfinite(s)):
                raise ValueError("sync_time must be finite and have the shape of step_time")
            compute = (t - np.maximum(s, 0.0)) / (a + 1)
        free = _identifiable(n, k, m)
        free[7] &= contention_term
        x0 = _initial_guess(n, k, m, t, a, compute)
        fixed = np.zeros(_N_PARAMS)  # what the data cannot identify stays at zero (AdaptDL) ...
        if not free[0]:  # ... except alpha_c with one per-GPU batch size: half the compute time (AdaptDL)
            fixed[0] = x0[0]
        keep = None if compute is None else compute > 0
        logt = np.log(t)
        logc = None if compute is None or keep is None else np.log(compute[keep])

        def residuals(z: _FloatArray) -> _FloatArray:
            x = fixed.copy()
            x[free] = z
            res = np.log(np.maximum(_step_time(x, n, k, m, a), _EPS)) - logt
            if logc is not None and keep is not None:
                res = np.concatenate([res, np.log(np.maximum(_grad_time(x, m[keep]), _EPS)) - logc])
            out: _FloatArray = res
            return out

        lo = np.zeros(_N_PARAMS)
        lo[6] = 1.0
        hi = np.full(_N_PARAMS, np.inf)
        hi[6] = _GAMMA_MAX
        best_x, best_cost = x0, np.inf
        for gamma0 in _GAMMA_STARTS:
            start = x0.copy()
            start[6] = gamma0
            res = least_squares(residuals, start[free], bounds=(lo[free], hi[free]), loss="soft_l1",
                                f_scale=_ROBUST_SCALE, x_scale="jac")
            if res.cost < best_cost:
                best_cost = float(res.cost)
                best_x = fixed.copy()
                best_x[free] = res.x
        best_x = np.clip(best_x, lo, hi)
        return cls(ThroughputParams(*(float(v) for v in best_x)))


def _check_rows(nodes: ArrayLike, replicas: ArrayLike, local_bsz: ArrayLike, step_time: ArrayLike,
                accum_steps: ArrayLike | None) -> tuple[_FloatArray, _FloatArray, _FloatArray, _FloatArray, _FloatArray]:
    n = np.asarray(nodes, dtype=np.float64)
    k = np.asarray(replicas, dtype=np.float64)
    m = np.asarray(local_bsz, dtype=np.float64)
    t = np.asarray(step_time, dtype=np.float64)
    a = np.zeros_like(t) if accum_steps is None else np.asarray(accum_steps, dtype=np.float64)
    if not (n.shape == k.shape == m.shape == t.shape == a.shape) or t.ndim != 1 or t.size == 0:
        raise ValueError("nodes, replicas, local_bsz, step_time (and accum_steps) must be 1-d arrays of one length")
    if not all(np.all(np.isfinite(v)) for v in (n, k, m, t, a)):
        raise ValueError("profile rows must be finite")
    if np.any(t <= 0) or np.any(m <= 0) or np.any(a < 0) or np.any(k < 1) or np.any(n < 1) or np.any(n > k):
        raise ValueError("step_time and local_bsz must be positive, accum_steps >= 0, 1 <= nodes <= replicas")
    return n, k, m, t, a


def _identifiable(n: _FloatArray, k: _FloatArray, m: _FloatArray) -> NDArray[np.bool_]:
    """Which of the eight parameters the rows can identify; the others are pinned (AdaptDL)."""
    free = np.ones(_N_PARAMS, dtype=bool)
    multi, intra = n > 1, (n == 1) & (k > 1)
    if not multi.any():
        free[[2, 3, 7]] = False
    if not intra.any():
        free[[4, 5]] = False
    # A retrogression term needs its link measured at two replica counts (one of them then above 2).
    if np.unique(k[multi]).size < 2:
        free[3] = False
    if np.unique(k[intra]).size < 2:
        free[5] = False
    # delta_n (several GPUs on each of a few nodes) is largest at 2 nodes and fades as 1 / (N - 1), so it is
    # fitted only where it is measured where it is largest (2 nodes, and one other node count) and beside
    # the one-node link it is told apart from (rows of one node with several GPUs). Fitted on 6-16 nodes
    # alone it is extrapolated up to 5x: bert's 1-4-node placements, median 11.3 % off instead of 5.1 %.
    shared = multi & (k > n)
    if np.unique(n[shared]).size < 2 or not np.any(n[shared] == 2) or not intra.any():
        free[7] = False
    if np.unique(m).size < 2:
        free[0] = False
    return free


def _initial_guess(n: _FloatArray, k: _FloatArray, m: _FloatArray, t: _FloatArray, a: _FloatArray,
                   compute: _FloatArray | None) -> _FloatArray:
    """Compute terms from a line through the compute times (or the one-GPU steps), network terms from
    the median wait beyond them."""
    per_micro = t / (a + 1)
    target = compute if compute is not None and np.all(compute > 0) else None
    xs, ys = (m, target) if target is not None else (m[k == 1], per_micro[k == 1])
    if np.unique(xs).size >= 2:
        beta_c, alpha_c = np.polyfit(xs, ys, 1)
    else:
        level = float(np.mean(ys)) if ys.size else float(np.median(per_micro))
        alpha_c, beta_c = level / 2, level / 2 / float(np.mean(m))
    alpha_c, beta_c = max(float(alpha_c), 1e-6), max(float(beta_c), 1e-9)
    wait = np.maximum(per_micro - (alpha_c + beta_c * m), 1e-6)
    x0 = np.zeros(_N_PARAMS)
    x0[0], x0[1], x0[6] = alpha_c, beta_c, 1.0
    for rows, (i, j) in (((n > 1), (2, 3)), (((n == 1) & (k > 1)), (4, 5))):
        level = float(np.median(wait[rows])) if rows.any() else 1e-3
        x0[i], x0[j] = level, level * 0.01
    x0[7] = x0[2] * 0.01
    return x0
