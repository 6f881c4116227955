"""Spot prices from ``describe_spot_price_history``, cached per region with a TTL.

AWS changes spot prices slowly (since the 2017 pricing change, prices follow long-term supply and
demand rather than bids), so refreshing every few minutes is plenty and keeps the controller far
below EC2's API rate limits. We ask for the history starting *now*: EC2 then returns, per zone and
type, the price in effect now (and nothing older), paginated.

``overrides`` replace live prices (moto's are fake, 0.00001): keys are ``"zone/instance_type"`` or
just ``"instance_type"`` (every zone). Spot is never billed above the on-demand price (that is the
default maximum price), so prices are capped at on-demand by the caller that bills.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..retry import RetryPolicy, Where
from .errors import call

PRODUCT = "Linux/UNIX"


def override_for(overrides: Mapping[str, float], zone: str, instance_type: str) -> float | None:
    price = overrides.get(f"{zone}/{instance_type}")
    if price is None:
        price = overrides.get(instance_type)
    return price


def latest_prices(entries: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], float]:
    """Newest price per (zone, instance_type) among spot price history entries.

    A VPC product ("Linux/UNIX (Amazon VPC)") and the plain one are the same market today; both are
    accepted, the newer entry wins.
    """
    newest: dict[tuple[str, str], tuple[dt.datetime, float]] = {}
    for e in entries:
        if not str(e.get("ProductDescription", PRODUCT)).startswith(PRODUCT):
            continue
        key = (str(e["AvailabilityZone"]), str(e["InstanceType"]))
        stamp = e.get("Timestamp") or dt.datetime.min.replace(tzinfo=dt.timezone.utc)
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=dt.timezone.utc)
        price = float(e["SpotPrice"])
        if key not in newest or stamp >= newest[key][0]:
            newest[key] = (stamp, price)
    return {k: v[1] for k, v in newest.items()}


class SpotPriceCache:
    """``price(region, zone, type)``: the current spot price, refreshed per region every ``ttl_s``."""

    def __init__(
        self,
        *,
        client_for: Callable[[str], Any],
        retry: RetryPolicy,
        clock: Callable[[], float],
        ttl_s: float = 300.0,
        overrides: Mapping[str, float] | None = None,
    ) -> None:
        if ttl_s < 0:
            raise ValueError(f"spot price ttl_s must be >= 0, got {ttl_s}")
        for key, value in (overrides or {}).items():
            if not value > 0:
                raise ValueError(f"spot price override {key}={value} must be > 0")
        self._client_for = client_for
        self._retry = retry
        self._clock = clock
        self._ttl_s = ttl_s
        self._overrides = dict(overrides or {})
        self._lock = threading.Lock()
        self._prices: dict[str, tuple[float, dict[tuple[str, str], float]]] = {}

    def region_prices(self, region: str, instance_types: Iterable[str]) -> dict[tuple[str, str], float]:
        types = sorted(set(instance_types))
        now = self._clock()
        with self._lock:
            cached = self._prices.get(region)
            if cached is not None and now - cached[0] < self._ttl_s:
                return cached[1]
        prices = self._fetch(region, types) if types else {}
        with self._lock:
            self._prices[region] = (now, prices)
        return prices

    def price(
        self, region: str, zone: str, instance_type: str, instance_types: Callable[[], Iterable[str]]
    ) -> float | None:
        """``instance_types`` lists the region's types to fetch, called only on a cache miss without an
        override (discovering them costs API calls)."""
        forced = override_for(self._overrides, zone, instance_type)
        if forced is not None:
            return forced
        return self.region_prices(region, instance_types()).get((zone, instance_type))

    def _fetch(self, region: str, types: list[str]) -> dict[tuple[str, str], float]:
        client = self._client_for(region)
        start = dt.datetime.fromtimestamp(self._clock(), tz=dt.timezone.utc)
        entries: list[Mapping[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {
                "InstanceTypes": types,
                "ProductDescriptions": [PRODUCT],
                "StartTime": start,
                "MaxResults": 1000,
            }
            if token:
                kwargs["NextToken"] = token
            page = call(
                client.describe_spot_price_history,
                operation="DescribeSpotPriceHistory",
                where=Where(region=region),
                retry=self._retry,
                **kwargs,
            )
            entries.extend(page.get("SpotPriceHistory", []))
            token = page.get("NextToken") or None
            if not token:
                return latest_prices(entries)
