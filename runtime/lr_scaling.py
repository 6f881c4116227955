"""Learning-rate scaling when the global batch size changes (pure functions).

``scale = B / B0`` is the batch size relative to the one the learning rate was tuned for.

- ``none``: 1
- ``linear``: scale (Goyal et al., 2017)
- ``sqrt``: sqrt(scale) (Krizhevsky, 2014; Hoffer et al., 2017)
- ``adascale``: the AdaScale gain (var + sqr) / (var/scale + sqr) (Johnson et al., ICML'20), with
  ``var`` the gradient variance at B0 and ``sqr`` the squared gradient norm; 1 until both are known.
"""

from __future__ import annotations

import math


def lr_factor(rule: str, *, batch_size: int, init_batch_size: int,
              grad_sqr: float | None = None, grad_var: float | None = None) -> float:
    if batch_size < 1 or init_batch_size < 1:
        raise ValueError(f"batch sizes must be positive, got {batch_size} and {init_batch_size}")
    scale = batch_size / init_batch_size
    if rule == "none" or scale == 1.0:
        return 1.0
    if rule == "linear":
        return scale
    if rule == "sqrt":
        return math.sqrt(scale)
    if rule == "adascale":
        if grad_sqr is None or grad_var is None or grad_var + grad_sqr <= 0:
            return 1.0
        return (grad_var + grad_sqr) / (grad_var / scale + grad_sqr)
    raise ValueError(f"lr_scaling: unknown rule {rule!r} (adascale, sqrt, linear, none)")
