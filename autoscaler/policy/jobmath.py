"""What every policy needs to know about a job: its work, its speed on an allocation, its deadline.

Shared by the baselines and the spotrain policy so that they compare like with like. Pure functions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from autoscaler.jobs.scaling import BatchConfig, GoodputScaling
from cloud_providers.base import ON_DEMAND, SPOT, Offering
from cost_models.scaling import AmdahlScaling, LinearScaling, Scaling, accelerator_speed

from .base import JobView, Placement, PolicyInput, eligible_offerings

# A market that refused capacity is avoided for this long (seconds).
CAPACITY_BACKOFF_S = 600.0
# Restart overhead assumed until the job's own checkpoint + restart times are measured (seconds).
DEFAULT_RESTART_OVERHEAD_S = 360.0
# Scaling assumed for a job whose throughput model is unknown (a profile the policy may not read):
# Amdahl with 5 % serial time, between linear and the Pollux profiles' measured curves.
PRIOR_SCALING: Scaling = AmdahlScaling(0.05)


def job_scaling(job: JobView) -> Scaling:
    if job.scaling is not None:
        return job.scaling
    s = job.spec.simulate.scaling
    if s == "linear":
        return LinearScaling()
    serial = getattr(s, "serial_fraction", None)
    if serial is not None:
        return AmdahlScaling(float(serial))
    return PRIOR_SCALING


def total_work(job: JobView) -> float:
    """Reference GPU-seconds of the whole job (the spec's estimate)."""
    return job.spec.simulate.work_gpu_hours * 3600.0


def remaining_work(job: JobView) -> float:
    p = 0.0 if job.progress is None else min(max(job.progress, 0.0), 1.0)
    return total_work(job) * (1.0 - p)


def restart_overhead_s(job: JobView, *, default_s: float = DEFAULT_RESTART_OVERHEAD_S) -> float:
    """The job's measured restart overhead, or ``default_s`` until it is measured."""
    return default_s if job.restart_overhead_s is None else max(0.0, job.restart_overhead_s)


def gang_rate(scaling: Scaling, parts: Iterable[tuple[Offering, int]]) -> float:
    """Work per second of a gang (offering, instances): the slowest GPU sets the pace (synchronous
    data parallelism), the scaling curve the speedup."""
    workers = 0
    speed = float("inf")
    per_node = 1
    for o, n in parts:
        if n <= 0:
            continue
        workers += n * o.gpus
        speed = min(speed, accelerator_speed(o.accelerator))
        per_node = max(per_node, o.gpus)
    if workers == 0:
        return 0.0
    return speed * scaling.speedup(workers, per_node)


def gang_shape(parts: Iterable[tuple[Offering, int]]) -> tuple[int, int]:
    """(GPUs, GPUs per node) of a gang, as ``gang_rate`` counts them."""
    workers, per_node = 0, 1
    for o, n in parts:
        if n > 0:
            workers += n * o.gpus
            per_node = max(per_node, o.gpus)
    return workers, per_node


def gang_batch(scaling: Scaling, parts: Iterable[tuple[Offering, int]]) -> BatchConfig | None:
    """The batch configuration a gang would train with: the goodput optimizer's pick for a job with a
    ``GoodputScaling`` (None otherwise: the runtime keeps the spec's batch)."""
    if not isinstance(scaling, GoodputScaling):
        return None
    workers, per_node = gang_shape(parts)
    return scaling.batch(workers, per_node)


def goodput_sizes(scaling: Scaling, nmin: int, nmax: int) -> set[int]:
    """Gang sizes worth valuing besides ``workers.min`` / ``max``: for a job valued by goodput, the
    powers of two in between (a job that scales poorly may be worth most on a few GPUs)."""
    if not isinstance(scaling, GoodputScaling):
        return set()
    out, n = set(), 1
    while n < nmax:
        if n > nmin:
            out.add(n)
        n *= 2
    return out


@dataclasses.dataclass(frozen=True)
class Config:
    """A homogeneous gang: ``instances`` of one offering on one market."""

    offering: Offering
    market: str
    instances: int
    rate: float

    @property
    def key(self) -> tuple[str, str]:
        return (self.offering.key, self.market)

    @property
    def workers(self) -> int:
        return self.instances * self.offering.gpus

    @property
    def price_usd_per_hour(self) -> float:
        return self.instances * self.offering.price_usd_per_hour(self.market)

    @property
    def usd_per_work(self) -> float:
        return self.price_usd_per_hour / 3600.0 / self.rate if self.rate > 0 else float("inf")

    def placement(self) -> Placement:
        return Placement(self.offering.key, self.market, self.instances)


def spot_allowed(job: JobView) -> bool:
    return job.spec.resources.spot in ("auto", "always")


def on_demand_allowed(job: JobView) -> bool:
    return job.spec.resources.spot in ("auto", "never")


def homogeneous_configs(job: JobView, options: Sequence[Offering], workers: int, scaling: Scaling) -> list[Config]:
    """Every way to run exactly ``workers`` GPUs on one offering and market (spot only where the
    market has room now). Sorted cheapest per unit of work first."""
    out: list[Config] = []
    for o in options:
        if workers % o.gpus:
            continue
        n = workers // o.gpus
        rate = gang_rate(scaling, ((o, n),))
        if on_demand_allowed(job):
            out.append(Config(o, ON_DEMAND, n, rate))
        if spot_allowed(job) and o.spot_price_usd_per_hour is not None:
            room = o.spot_available if o.spot_available is not None else n
            if room >= n:
                out.append(Config(o, SPOT, n, rate))
    out.sort(key=lambda c: (c.usd_per_work, c.market != SPOT, c.offering.key))
    return out


def cap_refused(job: JobView, offerings: Sequence[Offering], now_s: float, *,
                backoff_s: float = CAPACITY_BACKOFF_S) -> list[Offering]:
    """A spot market that refused the job capacity in the last ``backoff_s`` offers no more room
    than the job already holds there (SkyPilot's failover moves on to the next zone; retrying at
    once would fail again). Its on-demand side is untouched."""
    held: dict[str, int] = {}
    for h in job.held:
        if h.market == SPOT and h.instances > 0:
            held[h.offering_key] = held.get(h.offering_key, 0) + h.instances
    out = []
    for o in offerings:
        refused_s = job.recent_capacity_failures.get(o.key + "|" + SPOT)
        if refused_s is not None and now_s - refused_s < backoff_s:
            o = dataclasses.replace(o, spot_available=held.get(o.key, 0))
        out.append(o)
    return out


def job_options(job: JobView, inp: PolicyInput) -> list[Offering]:
    """Eligible offerings, with room capped where spot capacity was refused (``cap_refused``)."""
    return cap_refused(job, eligible_offerings(job.spec, inp.offerings), inp.now_s)
