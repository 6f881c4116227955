"""What the real-cloud providers (AWS, GCP) share: the record of what they saw, the poll that reports
changes against it, billing from that record, launch tags, the default boot config and the catalog cache.

A cloud API answers "what is there now"; the controller's contract (``base.Provider.poll``) is "what
changed since last time", so each provider keeps the instances it last reported (``_seen``) and when
each one's bill ended (``_ended_at_s``: our terminate, or the end the cloud reported). What differs
between the clouds is how they list their instances (``_listed_now``) and what an instance that is no
longer listed has become (``_vanished``): EC2 lists a terminated instance for about an hour, Compute
forgets a deleted VM at once. Both bill per second with a one-minute minimum (``min_billed_s``), at the
price recorded on the instance at launch (``TAG_PRICE``) capped at on-demand.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from .base import (
    MARKETS,
    SPOT,
    TAG_CONTROLLER,
    TAG_DECISION,
    TAG_JOB,
    TAG_MARKET,
    TAG_PRICE,
    Billing,
    Instance,
    LaunchRequest,
    Offering,
)
from .errors import InvalidRequest
from .retry import RetryPolicy, Where

T = TypeVar("T")

# The agent config a launch carries when the controller gives none (``boot_config_for``).
BootConfigFor = Callable[[LaunchRequest], Mapping[str, Any]]


def billing(instance: Instance, *, end_s: float, min_billed_s: float, on_demand_usd_per_hour: float,
            spot_price_usd_per_hour: Callable[[], float | None]) -> Billing:
    """The bill of ``instance`` from its launch to ``end_s``: at least ``min_billed_s``, at on-demand, or
    for spot at the price tagged at launch (else ``spot_price_usd_per_hour()``, asked only then) capped
    at on-demand."""
    billed_s = max(max(0.0, end_s - instance.launched_at_s), min_billed_s)
    price = on_demand_usd_per_hour
    if instance.market == SPOT:
        try:
            spot: float | None = float(instance.tags[TAG_PRICE])
        except (KeyError, ValueError):
            spot = spot_price_usd_per_hour()
        price = min(spot, on_demand_usd_per_hour) if spot is not None else on_demand_usd_per_hour
    return Billing(billed_seconds=billed_s, cost_usd=billed_s * price / 3600.0,
                   on_demand_cost_usd=billed_s * on_demand_usd_per_hour / 3600.0)


def _changed(prev: Instance, now: Instance) -> bool:
    return (prev.state, prev.interruption, prev.notice_deadline_s) != (
        now.state, now.interruption, now.notice_deadline_s)


class CloudProviderBase:
    """The shared half of ``AwsProvider`` and ``GcpProvider`` (a subclass sets ``name`` and
    ``min_billed_s`` and fills in the hooks below)."""

    name: str
    min_billed_s: float

    def __init__(self, *, controller_id: str, retry: RetryPolicy | None, clock: Callable[[], float],
                 catalog_ttl_s: float, boot_config_for: BootConfigFor | None) -> None:
        self.controller_id = controller_id
        self._retry = retry or RetryPolicy()
        self._clock = clock
        self._catalog_ttl_s = catalog_ttl_s
        self._boot_config_for = boot_config_for
        self._lock = threading.Lock()
        self._catalog: dict[str, tuple[float, Sequence[Any]]] = {}
        # When each instance's bill ended (our terminate, or the end the cloud reported).
        self._ended_at_s: dict[str, float] = {}
        # What ``poll`` last reported of each instance, to report only changes.
        self._seen: dict[str, Instance] = {}

    # -- hooks ---------------------------------------------------------------------------------
    def _listed_now(self) -> dict[str, Instance]:
        """This controller's instances as the cloud lists them now (instance id -> instance)."""
        raise NotImplementedError

    def _vanished(self, current: Mapping[str, Instance]) -> list[Instance]:
        """The ends to report of instances in ``_seen`` that ``current`` no longer lists (and drop from
        ``_seen`` those nothing more will be reported of)."""
        raise NotImplementedError

    def _offering_problem(self, offering: Offering) -> str | None:
        """Why this provider cannot launch ``offering`` (another cloud, region, zone or type), if it cannot."""
        raise NotImplementedError

    def _decision_problem(self, decision_id: str) -> str | None:
        """Why the cloud would not take ``decision_id`` as an idempotency token, if it would not."""
        raise NotImplementedError

    def _on_demand_price(self, instance: Instance) -> float:
        """The on-demand price of the instance's type (InvalidRequest when it is not in the catalog)."""
        raise NotImplementedError

    def _spot_price(self, instance: Instance) -> float | None:
        """The spot price of an instance that carries none from its launch, if known."""
        raise NotImplementedError

    # -- clock and catalog ---------------------------------------------------------------------
    def now_s(self) -> float:
        return self._clock()

    def _cached_catalog(self, key: str, discover: Callable[[], Sequence[T]]) -> Sequence[T]:
        """What ``discover()`` found for ``key`` (a region or zone), asked again after ``catalog_ttl_s``."""
        now = self._clock()
        with self._lock:
            cached = self._catalog.get(key)
        if cached is not None and now - cached[0] < self._catalog_ttl_s:
            return cached[1]
        found = discover()
        with self._lock:
            self._catalog[key] = (now, found)
        return found

    # -- launch --------------------------------------------------------------------------------
    def _check(self, request: LaunchRequest) -> Where:
        """Where ``request`` would launch; InvalidRequest naming the first thing wrong with it."""
        o = request.offering
        problem = self._offering_problem(o)
        if problem is None and request.market not in MARKETS:
            problem = f"market {request.market!r} must be one of {list(MARKETS)}"
        problem = problem or self._decision_problem(request.decision_id)
        if problem is None and request.tags.get(TAG_CONTROLLER, self.controller_id) != self.controller_id:
            problem = (f"tag {TAG_CONTROLLER}={request.tags[TAG_CONTROLLER]!r} is not this controller "
                       f"({self.controller_id!r})")
        if problem is not None:
            raise InvalidRequest(problem, cloud=self.name, region=o.region, zone=o.zone, instance_type=o.instance_type)
        return Where(region=o.region, zone=o.zone, instance_type=o.instance_type)

    def _launch_tags(self, request: LaunchRequest, price_usd_per_hour: float) -> dict[str, str]:
        """The request's tags with this controller, the market, the decision and the launch price."""
        tags = dict(request.tags)
        tags.setdefault(TAG_CONTROLLER, self.controller_id)
        tags.setdefault(TAG_MARKET, request.market)
        tags.setdefault(TAG_DECISION, request.decision_id)
        tags[TAG_PRICE] = f"{price_usd_per_hour:.6f}"
        return tags

    def _boot_config(self, request: LaunchRequest) -> dict[str, Any]:
        """The agent config of a launch: the controller's (``boot_config_for``), else who launched it for what."""
        if self._boot_config_for is not None:
            return dict(self._boot_config_for(request))
        return {"job_id": request.tags.get(TAG_JOB, ""), "decision_id": request.decision_id,
                "controller_id": self.controller_id}

    # -- poll and billing ----------------------------------------------------------------------
    def poll(self) -> Sequence[Instance]:
        current = self._listed_now()
        changed = self._vanished(current)
        with self._lock:
            for instance_id, inst in current.items():
                prev = self._seen.get(instance_id)
                if prev is None or _changed(prev, inst):
                    changed.append(inst)
                self._seen[instance_id] = inst
        return changed

    def billing(self, instance: Instance) -> Billing:
        with self._lock:
            ended = instance.terminated_at_s or self._ended_at_s.get(instance.instance_id)
        end_s = ended if ended is not None else self._clock()
        return billing(instance, end_s=end_s, min_billed_s=self.min_billed_s,
                       on_demand_usd_per_hour=self._on_demand_price(instance),
                       spot_price_usd_per_hour=lambda: self._spot_price(instance))


__all__ = ["BootConfigFor", "CloudProviderBase", "billing"]
