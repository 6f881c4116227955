"""Learning-rate scaling when the global batch size changes (pure functions).

``scale = B / B0`` is the batch size relative to the one the learning rate was tuned for.

- ``none``: 1
- ``linear``: scale (Goyal et al., 2017)
- ``sqrt``: sqrt(scale) (Krizhevsky, 2014; Hoffer et al., 2017)
- ``adascale``: the AdaScale gain (var + sqr) / (var/scale + sqr) (Johnson et al., ICML'20), with
  ``var`` the gradient variance at B0 and ``sqr`` the squared gradient norm; 1 until both are known.

Adam-family optimizers (``adaptive_optimizer=True``: Adam, AdamW, Adamax, NAdam, RAdam, RMSprop,
Adagrad, Adadelta — see :func:`is_adaptive_optimizer`): AdaScale's gain is derived for SGD, whose
step is proportional to the gradient; an adaptive optimizer divides by the gradient's running second
moment, which at a batch ``scale`` times larger shrinks by up to ``scale``, so its step already
grows with the batch. ``adascale`` then uses the square root of the gain, as AdaptDL's ``AdamScale``
does; ``sqrt`` and ``linear`` apply as asked (the user chose them). The scale-invariant progress of a
step (:func:`adascale_gain`) is the gain itself for every optimizer: it measures statistical
progress, not the step size.
"""

from __future__ import annotations

import math
from typing import Any

_ADAPTIVE_OPTIMIZERS = ("Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta",
                        "SparseAdam")


def is_adaptive_optimizer(optimizer: Any) -> bool:
    """True for torch's Adam-family optimizers (and subclasses of them)."""
    import torch

    kinds = tuple(getattr(torch.optim, n) for n in _ADAPTIVE_OPTIMIZERS if hasattr(torch.optim, n))
    return isinstance(optimizer, kinds)


def adascale_gain(*, batch_size: int, init_batch_size: int, grad_sqr: float | None = None,
                  grad_var: float | None = None) -> float:
    """Iterations at ``init_batch_size`` one step at ``batch_size`` is worth: (var + sqr) / (var/S + sqr),
    1 while the statistics are unknown, exactly 1 at S = 1; between 1 and S."""
    if batch_size < 1 or init_batch_size < 1:
        raise ValueError(f"batch sizes must be positive, got {batch_size} and {init_batch_size}")
    scale = batch_size / init_batch_size
    if scale == 1.0 or grad_sqr is None or grad_var is None or grad_var + grad_sqr <= 0:
        return 1.0
    return (grad_var + grad_sqr) / (grad_var / scale + grad_sqr)


def lr_factor(rule: str, *, batch_size: int, init_batch_size: int,
              grad_sqr: float | None = None, grad_var: float | None = None,
              adaptive_optimizer: bool = False) -> float:
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
        gain = adascale_gain(batch_size=batch_size, init_batch_size=init_batch_size, grad_sqr=grad_sqr,
                             grad_var=grad_var)
        return math.sqrt(gain) if adaptive_optimizer else gain
    raise ValueError(f"lr_scaling: unknown rule {rule!r} (adascale, sqrt, linear, none)")
