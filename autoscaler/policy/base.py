"""The policy interface: plain data in, allocations out, no I/O (AdaptDL's lesson).

The controller and the simulator (``spotrain simulate``) call the very same ``Policy.decide``. The
controller turns the returned allocations into launches and releases; the simulator applies them in
virtual time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol

from autoscaler.jobs.domain import Outcome
from autoscaler.jobs.scaling import BatchConfig
from autoscaler.jobs.spec import JobSpec
from cloud_providers.base import Offering
from cost_models.scaling import Scaling


@dataclasses.dataclass(frozen=True)
class Held:
    """Instances a job holds now, grouped by offering and market."""

    offering_key: str
    market: str
    instances: int
    gpus_per_instance: int = 1


@dataclasses.dataclass(frozen=True)
class JobView:
    """What the policy knows about one job at decision time (all times in the provider's clock)."""

    job_id: str
    spec: JobSpec
    submitted_s: float
    # Fraction of the job's work done, 0..1 (None when unknown, e.g. before the first report).
    progress: float | None
    held: tuple[Held, ...] = ()
    cost_so_far_usd: float = 0.0
    # Seconds a restart costs this job (checkpoint + exit + start + restore), measured when known.
    restart_overhead_s: float | None = None
    # Offerings that refused capacity recently (key -> provider clock time of the refusal).
    recent_capacity_failures: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # The job's throughput model when known (a ``cost_models.scaling.Scaling``: the controller's
    # ``GoodputScaling`` fitted to the job's reported profile and gradient statistics, a spec's
    # profile, or the simulator's model). None: the policy uses the spec's ``simulate.scaling`` when
    # it is linear or a serial fraction, and a prior otherwise.
    scaling: Scaling | None = None
    # Seconds since the last checkpoint (work lost if preempted without time to checkpoint); None: unknown.
    since_checkpoint_s: float | None = None
    # True while the gang is restarting anyway (a worker was just lost or added): a change of
    # allocation now costs no extra restart (controller: RECOVERING / RESCALING).
    restarting: bool = False
    # Where the job's state (its last checkpoint) lives, as ``cloud/region`` (None: no checkpoint yet,
    # so a first start carries nothing), how large it is (GB: the runtime's measured size once it has
    # checkpointed, else the spec's ``checkpoint.size_gb``; None: unknown, taken as 0), and how many
    # times the job's state has already moved to another region or cloud (issue 23).
    state_location: str | None = None
    checkpoint_size_gb: float | None = None
    region_moves: int = 0

    @property
    def deadline_s(self) -> float | None:
        d = self.spec.objective.deadline_s
        return None if d is None else self.submitted_s + d


@dataclasses.dataclass(frozen=True)
class Placement:
    offering_key: str
    market: str
    instances: int


@dataclasses.dataclass(frozen=True)
class Allocation:
    """The desired holding of one job. An empty ``placements`` means "hold nothing" (wait)."""

    job_id: str
    placements: tuple[Placement, ...]
    reason: str = ""
    # Set when the job cannot run at all under its constraints (e.g. budget): the controller ends it
    # in ``outcome.state``.
    outcome: Outcome | None = None
    # Provider-clock time by which the policy wants to be asked again even if nothing changes (e.g.
    # when a deadline's safety net will trip). The simulator uses it to skip idle time; a controller
    # that decides every few seconds may ignore it.
    next_decision_s: float | None = None
    # The batch configuration the job should train this allocation with (the goodput optimizer's pick,
    # when the job's scaling is a ``GoodputScaling``); None: the runtime's own (the spec's batch).
    batch: BatchConfig | None = None

    def workers(self, offerings: Mapping[str, Offering]) -> int:
        return sum(p.instances * offerings[p.offering_key].gpus for p in self.placements if p.offering_key in offerings)


@dataclasses.dataclass(frozen=True)
class MarketHistory:
    """What the controller has observed of one spot offering (for hazard estimation)."""

    offering_key: str
    # Instance-seconds held on the spot market, and the preemptions seen over them.
    spot_seconds_held: float = 0.0
    preemptions: int = 0
    # Market watching (optional, when the provider reports ``spot_available``): seconds watched,
    # seconds with room for at least k instances (index k-1), how often room vanished, and since when
    # (provider clock) the market has had room without a break (None: no room now, or unknown).
    watched_s: float = 0.0
    available_s_at_least: tuple[float, ...] = ()
    drops: int = 0
    available_since_s: float | None = None


@dataclasses.dataclass(frozen=True)
class PolicyInput:
    now_s: float
    jobs: Sequence[JobView]
    offerings: Sequence[Offering]
    history: Mapping[str, MarketHistory] = dataclasses.field(default_factory=dict)
    # How often the caller decides (seconds): deadline safety margins include one interval of lag.
    decision_interval_s: float = 60.0
    # Joint limits across jobs (optional): instances per region, and total spend rate in USD/hour.
    region_quota_instances: Mapping[str, int] = dataclasses.field(default_factory=dict)
    max_spend_usd_per_hour: float | None = None


class Policy(Protocol):
    name: str

    def decide(self, inp: PolicyInput) -> list[Allocation]:
        """Return one allocation per job in ``inp.jobs``."""
        ...


def eligible_offerings(spec: JobSpec, offerings: Sequence[Offering]) -> list[Offering]:
    """Offerings that satisfy the job's resources (accelerators or instance types, clouds, regions)."""
    res = spec.resources
    out = []
    for o in offerings:
        if "local" not in res.clouds and o.cloud not in res.clouds:
            continue
        if res.regions and o.region not in res.regions:
            continue
        ok = False
        for a in res.accelerators:
            if o.accelerator == a.name and o.gpus == a.count:
                ok = True
        if o.instance_type in res.instance_types:
            ok = True
        if ok:
            out.append(o)
    return out
