"""Gradient-noise statistics from the K logical-worker gradients (Pollux / AdaScale).

With per-logical-worker gradients ``g_k`` (each the mean over its micro-batch of ``b = B/K``
samples) and their mean ``g``:

    local_sqr = mean_k |g_k|^2        total_sqr = |g|^2
    grad_sqr  = (K * total_sqr - local_sqr) / (K - 1)          unbiased estimate of |E g|^2
    var_b     = (local_sqr - total_sqr) * K / (K - 1)          gradient variance at batch b
    grad_var  = var_b * b / M0                                 ... expressed at the initial batch M0

as in AdaptDL's ``GradientNoiseScale`` (Qiao et al., "Pollux", OSDI'21; Johnson et al.,
"AdaScale SGD", ICML'20), smoothed by a bias-corrected EMA with factor ``smoothing ** (B/M0)``.
``grad_var`` is at the initial batch size so that ``cost_models.goodput.efficiency`` reads
``(var/sqr*M0 + M0) / (var/sqr*M0 + M)`` = (phi + M0)/(phi + M) with phi the noise scale in samples.
Nothing can be estimated from one logical worker, so K = 1 reports no statistics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def estimate(*, local_sqr: float, total_sqr: float, logical_workers: int, global_batch_size: int,
             init_batch_size: int) -> tuple[float, float] | None:
    """One step's (grad_sqr, grad_var) estimate, or None when K = 1."""
    k = logical_workers
    if k < 2:
        return None
    micro = global_batch_size / k
    grad_sqr = (k * total_sqr - local_sqr) / (k - 1)
    var_micro = (local_sqr - total_sqr) * k / (k - 1)
    grad_var = var_micro * micro / init_batch_size
    return max(grad_sqr, 0.0), max(grad_var, 1e-12)


@dataclass
class GradientNoiseStats:
    smoothing: float = 0.999
    sqr_biased: float = 0.0
    var_biased: float = 0.0
    unbias: float = 0.0

    def update(self, sqr: float, var: float, batch_scale: float) -> None:
        theta = self.smoothing ** batch_scale
        self.sqr_biased = theta * self.sqr_biased + (1 - theta) * sqr
        self.var_biased = theta * self.var_biased + (1 - theta) * var
        self.unbias = theta * self.unbias + (1 - theta)

    @property
    def grad_sqr(self) -> float | None:
        return self.sqr_biased / self.unbias if self.unbias > 0 else None

    @property
    def grad_var(self) -> float | None:
        return self.var_biased / self.unbias if self.unbias > 0 else None

    def state_dict(self) -> dict[str, Any]:
        return {"smoothing": self.smoothing, "sqr_biased": self.sqr_biased,
                "var_biased": self.var_biased, "unbias": self.unbias}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("smoothing", "sqr_biased", "var_biased", "unbias"):
            setattr(self, key, float(state[key]))
