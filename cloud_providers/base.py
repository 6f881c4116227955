"""The provider contract: what every cloud (local, AWS, GCP) offers the controller.

A provider is deliberately narrow (SkyPilot's lesson): list offerings, launch a tagged instance
idempotently, terminate, list instances by tag, report interruptions, and account billed seconds.
Running the job's worker processes on an instance is the *executor's* job (``executor.py``), so that the
same local executor can run workers for local instances, moto-backed AWS instances and the GCP fake.

Time: each provider has a clock (``now_s``). Real clouds use wall time; the local cloud runs a
time-compressed market, and prices, notices, billing, deadlines and hazards all live in its clock.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

SPOT = "spot"
ON_DEMAND = "on-demand"
MARKETS = (SPOT, ON_DEMAND)

# Tags every instance carries (contract with recovery: list_instances by these finds what is ours).
TAG_JOB = "spotrain-job"
TAG_CONTROLLER = "spotrain-controller"
TAG_MARKET = "spotrain-market"
TAG_DECISION = "spotrain-decision"
# The price an instance was bought at (real clouds record it at launch, so billing survives a restart).
TAG_PRICE = "spotrain-price-usd-per-hour"


def offering_key(cloud: str, zone: str, instance_type: str, accelerator: str, gpus: int) -> str:
    return f"{cloud}/{zone}/{instance_type}/{accelerator}:{gpus}"


@dataclasses.dataclass(frozen=True)
class Offering:
    """One thing that can be bought: an instance type in a zone, with its prices now.

    ``spot_available`` is how many spot instances of this offering can be held at once, when the
    provider knows it (the local market does; real clouds do not, so it is None there).
    """

    cloud: str
    region: str
    zone: str
    instance_type: str
    accelerator: str
    gpus: int
    on_demand_price_usd_per_hour: float
    spot_price_usd_per_hour: float | None
    spot_available: int | None = None
    notice_seconds: float = 120.0

    @property
    def key(self) -> str:
        """Unique name of the offering. GCP attaches GPUs to machine types, so the accelerator is part
        of it."""
        return offering_key(self.cloud, self.zone, self.instance_type, self.accelerator, self.gpus)

    def price_usd_per_hour(self, market: str) -> float:
        if market == SPOT:
            if self.spot_price_usd_per_hour is None:
                raise ValueError(f"{self.key} has no spot market")
            return self.spot_price_usd_per_hour
        return self.on_demand_price_usd_per_hour


class InstanceState(str, enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    # A preemption notice was given; the instance will be terminated at ``notice_deadline_s``.
    NOTICE = "notice"
    TERMINATED = "terminated"


@dataclasses.dataclass(frozen=True)
class LaunchRequest:
    """What the controller asks for. ``decision_id`` makes the launch idempotent: launching twice with
    the same id returns the same instance (AWS ClientToken; the local cloud keeps a table)."""

    offering: Offering
    market: str
    decision_id: str
    tags: Mapping[str, str]


@dataclasses.dataclass(frozen=True)
class Instance:
    instance_id: str
    cloud: str
    region: str
    zone: str
    instance_type: str
    market: str
    state: InstanceState
    tags: Mapping[str, str]
    launched_at_s: float
    terminated_at_s: float | None = None
    # Set once the cloud has said it will take the instance back (spot interruption).
    interruption: str | None = None
    notice_deadline_s: float | None = None

    offering_key: str = ""
    # The private network address the instance's workers rendezvous on, when the cloud reports one.
    address: str | None = None

    @property
    def alive(self) -> bool:
        return self.state is not InstanceState.TERMINATED


@dataclasses.dataclass(frozen=True)
class Billing:
    """Billed time and money of one instance so far, in the provider's clock."""

    billed_seconds: float
    cost_usd: float
    # What the same seconds would have cost on the on-demand market of the same offering.
    on_demand_cost_usd: float


# A provider may declare the least it bills a launched instance, in seconds (EC2: 60 for Linux) as a
# class attribute ``min_billed_s``; absent means none. The controller's hard-budget check counts it.
MIN_BILLED_S_ATTR = "min_billed_s"


@runtime_checkable
class Provider(Protocol):
    name: str

    def now_s(self) -> float:
        """The provider's clock, in seconds (market time for the local cloud, wall time otherwise)."""
        ...

    def offerings(self) -> Sequence[Offering]:
        """Everything that can be launched now, with current prices and (when known) availability."""
        ...

    def launch(self, request: LaunchRequest) -> Instance:
        """Launch one tagged instance. Idempotent on ``request.decision_id``. Raises ProviderError."""
        ...

    def terminate(self, instance_id: str) -> None:
        """Terminate. Idempotent: terminating a terminated or unknown instance is not an error."""
        ...

    def list_instances(self, tags: Mapping[str, str]) -> Sequence[Instance]:
        """Instances (any state the cloud still reports) whose tags include all of ``tags``."""
        ...

    def poll(self) -> Sequence[Instance]:
        """Advance what the cloud does on its own (notices, preemptions) and return the instances
        whose state changed since the last poll."""
        ...

    def billing(self, instance: Instance) -> Billing:
        """Billed seconds and cost of the instance up to now (or its termination)."""
        ...
