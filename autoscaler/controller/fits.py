"""The controller's per-job goodput fits and the fit budget of each tick (``goodput.scaling_for`` fills
them; ``Context.goodput`` holds them). Apart from ``goodput`` so that ``context`` can hold them without
importing ``goodput``, which takes a ``Context``: no import cycle."""

from __future__ import annotations

import dataclasses

from cost_models.goodput import ThroughputModel
from cost_models.scaling import Scaling

# Throughput fits per tick over all jobs.
MAX_FITS_PER_TICK = 2


@dataclasses.dataclass
class JobFit:
    """What the controller fitted for one job, and from what."""

    key: tuple[str, float | None, float | None]  # (profile_json, grad_sqr, grad_var) it was built from
    profile_json: str
    configs: int
    at: float  # controller clock
    model: ThroughputModel | None
    scaling: Scaling | None


@dataclasses.dataclass
class Fits:
    """Per-job fits, and the fit budget of the current tick."""

    jobs: dict[str, JobFit] = dataclasses.field(default_factory=dict)
    tick: int = -1
    used: int = 0

    def pop(self, job_id: str, default: object = None) -> object:
        return self.jobs.pop(job_id, default)

    def take(self, tick: int) -> bool:
        if tick != self.tick:
            self.tick, self.used = tick, 0
        if self.used >= MAX_FITS_PER_TICK:
            return False
        self.used += 1
        return True
