"""Gradient-noise statistics from the K logical-worker gradients (Pollux / AdaScale).

With per-logical-worker gradients ``g_k`` (each the mean over its micro-batch of ``b = B/K``
samples) and their mean ``g``:

    local_sqr = mean_k |g_k|^2        total_sqr = |g|^2
    grad_sqr  = (K * total_sqr - local_sqr) / (K - 1)          unbiased estimate of |E g|^2
    var_b     = (local_sqr - total_sqr) * K / (K - 1)          gradient variance at batch b
    grad_var  = var_b * b / M0                                 ... expressed at the initial batch M0

as in AdaptDL's ``GradientNoiseScale`` (Qiao et al., "Pollux", OSDI'21; Johnson et al.,
"AdaScale SGD", ICML'20), smoothed by a bias-corrected EMA with factor ``smoothing ** (B/M0)``.
The EMA averages the raw estimates and clamps only what it reports (``grad_sqr`` >= 0), as AdaptDL does:
one step's ``grad_sqr`` is the difference of two large numbers and is often negative when the noise
scale is large next to the batch; clamping each step at 0 before averaging biased |G|^2 upwards and the
noise scale downwards (a true 50,000 at batch 64 read as ~2,300; tests/runtime/test_noise_scale.py).
``grad_var`` is at the initial batch size so that ``cost_models.goodput.efficiency`` reads
``(var/sqr*M0 + M0) / (var/sqr*M0 + M)`` = (phi + M0)/(phi + M) with phi the noise scale in samples.
``estimate`` needs K >= 2 (it returns None for K = 1). With one logical worker, ``ConsecutiveSteps``
estimates the same statistics as AdaptDL does, from two consecutive steps' gradients taken as the two
samples (``estimate_consecutive``): unbiased while the expected gradient barely moves between steps,
biased towards more variance when it moves fast, so prefer K >= 2 where there is a choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def estimate(*, local_sqr: float, total_sqr: float, logical_workers: int, global_batch_size: int,
             init_batch_size: int) -> tuple[float, float] | None:
    """One step's raw (grad_sqr, grad_var) estimate, or None when K = 1. ``grad_sqr`` may be negative: it is
    unbiased only unclamped, so average it first (``GradientNoiseStats``) and clamp after."""
    k = logical_workers
    if k < 2:
        return None
    micro = global_batch_size / k
    grad_sqr = (k * total_sqr - local_sqr) / (k - 1)
    var_micro = (local_sqr - total_sqr) * k / (k - 1)
    grad_var = var_micro * micro / init_batch_size
    return grad_sqr, grad_var


def estimate_consecutive(*, prev_sqr: float, cur_sqr: float, mean_sqr: float, batch_size: int,
                         init_batch_size: int) -> tuple[float, float]:
    """(grad_sqr, grad_var) from two consecutive steps at one batch size (AdaptDL's differenced estimator).

    ``prev_sqr`` = |g_prev|^2, ``cur_sqr`` = |g_cur|^2, ``mean_sqr`` = |(g_prev + g_cur) / 2|^2, each
    gradient the mean over ``batch_size`` examples: the K = 2 estimate over a batch of 2 * batch_size.
    """
    est = estimate(local_sqr=(prev_sqr + cur_sqr) / 2, total_sqr=mean_sqr, logical_workers=2,
                   global_batch_size=2 * batch_size, init_batch_size=init_batch_size)
    assert est is not None
    return est


def _norm_sqr(grads: Sequence[Any]) -> float:
    total = 0.0
    for g in grads:
        if hasattr(g, "detach"):  # a torch tensor: sum its squares in float64, on its device
            total += float(g.detach().double().pow(2).sum())
        else:
            total += float(np.sum(np.square(np.asarray(g, dtype=np.float64))))
    return total


class ConsecutiveSteps:
    """One logical worker's gradient statistics from consecutive steps (AdaptDL's ``_prev_grads``).

    ``update(grads, ...)`` takes the step's averaged gradients (torch tensors or numpy arrays, one per
    parameter, already unscaled); it keeps a copy and returns the estimate from it and the previous
    step's, or None on the first step and whenever the batch size changed in between (the two samples
    must share one batch). The copy is not checkpointed: after a restore the first step yields nothing.
    """

    def __init__(self) -> None:
        self._prev: list[Any] | None = None
        self._prev_batch: int | None = None

    def reset(self) -> None:
        self._prev, self._prev_batch = None, None

    def update(self, grads: Sequence[Any], *, batch_size: int, init_batch_size: int) -> tuple[float, float] | None:
        cur = [g.detach().clone() if hasattr(g, "detach") else np.array(g, dtype=np.float64) for g in grads]
        prev, prev_batch = self._prev, self._prev_batch
        self._prev, self._prev_batch = cur, batch_size
        if prev is None or prev_batch != batch_size or len(prev) != len(cur):
            return None
        mean = [(a + b) / 2 for a, b in zip(prev, cur)]
        return estimate_consecutive(prev_sqr=_norm_sqr(prev), cur_sqr=_norm_sqr(cur), mean_sqr=_norm_sqr(mean),
                                    batch_size=batch_size, init_batch_size=init_batch_size)


@dataclass
class GradientNoiseStats:
    """Bias-corrected EMA of raw per-step estimates; ``grad_sqr`` / ``grad_var`` clamp the averages.

    The state (``state_dict``) is the one it always was; a checkpoint written before the estimates were
    averaged raw holds an average of clamped ones, which loads as it is and is diluted by new steps.
    """

    smoothing: float = 0.999
    sqr_biased: float = 0.0
    var_biased: float = 0.0
    unbias: float = 0.0

    def update(self, sqr: float, var: float, batch_scale: float) -> None:
        """Add one raw estimate that stands for ``batch_scale`` steps at the initial batch. A non-finite
        one (a mixed-precision overflow) is skipped, as AdaptDL skips it, so it cannot poison the average."""
        if not (np.isfinite(sqr) and np.isfinite(var) and np.isfinite(batch_scale)):
            return
        theta = self.smoothing ** batch_scale
        self.sqr_biased = theta * self.sqr_biased + (1 - theta) * sqr
        self.var_biased = theta * self.var_biased + (1 - theta) * var
        self.unbias = theta * self.unbias + (1 - theta)

    @property
    def grad_sqr(self) -> float | None:
        return max(self.sqr_biased / self.unbias, 0.0) if self.unbias > 0 else None

    @property
    def grad_var(self) -> float | None:
        return max(self.var_biased / self.unbias, 1e-12) if self.unbias > 0 else None

    def state_dict(self) -> dict[str, Any]:
        return {"smoothing": self.smoothing, "sqr_biased": self.sqr_biased,
                "var_biased": self.var_biased, "unbias": self.unbias}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("smoothing", "sqr_biased", "var_biased", "unbias"):
            setattr(self, key, float(state[key]))
