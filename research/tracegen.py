"""Synthetic market traces for the simulator and the benchmarks (format: DESIGN.md "Market trace").

Each offering's spot market alternates *runs* of availability and unavailability:

- Run lengths are heavy-tailed: Lomax (Pareto II) with shape 1.5 for available runs and 2.0 for
  outages, scaled to each zone's mean. Can't Be Late (NSDI'24, section 2.2, figures 2-3) measured
  spot lifetimes and waiting times on AWS p3/p2 over two months: many short runs, a long tail of
  runs lasting a day or more, mean lifetimes of a few hours, and zones that differ by 2-5x in
  availability. A Lomax with shape 1.5 has that shape (infinite variance, finite mean, a decreasing
  hazard); outages are somewhat less heavy-tailed (shape 2).
- During an available run the market has room for ``capacity`` instances, drawn once per run from
  1..max_capacity (several-instance gangs need runs with enough room).
- Zones differ: each zone's mean available run (2-8 h) and mean outage (0.5-4 h) are drawn per zone,
  giving availability fractions from about 0.3 to 0.9.
- Prices: on-demand is the catalog's public list price; spot is a zone-specific discount of 62-72 %
  off (AWS's p3/g4dn/g5 spot prices in 2023-24 sat at roughly 0.28-0.38 of on-demand), redrawn within
  +-5 % at the start of each available run (AWS's smoothed spot pricing changes rarely).

Times are multiples of ``grid_s`` (5 minutes), the simulator's decision grid. Seeded and deterministic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from cloud_providers import catalog
from cloud_providers.local.market import MarketTrace, write_trace


@dataclasses.dataclass(frozen=True)
class ZoneSpec:
    cloud: str
    region: str
    zone: str
    instance_type: str
    accelerator: str
    mean_up_h: float | None = None
    mean_down_h: float | None = None
    max_capacity: int = 1
    # Spot price as a fraction of on demand (None: drawn per zone from 0.28-0.38).
    spot_fraction: float | None = None

    def __post_init__(self) -> None:
        if self.max_capacity < 1:
            raise ValueError("max_capacity must be >= 1")
        if self.spot_fraction is not None and not 0 < self.spot_fraction <= 1:
            raise ValueError("spot_fraction must be in (0, 1]")


def _lomax(rng: np.random.Generator, mean: float, shape: float) -> float:
    scale = mean * (shape - 1.0)
    return float(scale * rng.pareto(shape))


def generate_rows(zones: Sequence[ZoneSpec], *, hours: float, seed: int, grid_s: float = 300.0) -> list[tuple[object, ...]]:
    rng = np.random.default_rng(seed)
    end_s = hours * 3600.0
    rows: list[tuple[float, tuple[object, ...]]] = []
    for z in zones:
        it = catalog.find(z.cloud, z.instance_type, z.accelerator)
        if it is None:
            raise ValueError(f"{z.cloud} {z.instance_type} {z.accelerator} is not in the catalog")
        od = it.on_demand_price_usd_per_hour
        up_h = z.mean_up_h if z.mean_up_h is not None else float(rng.uniform(2.0, 8.0))
        down_h = z.mean_down_h if z.mean_down_h is not None else float(rng.uniform(0.5, 4.0))
        discount = float(rng.uniform(0.28, 0.38))  # drawn always: a fixed fraction keeps the other draws
        if z.spot_fraction is not None:
            discount = z.spot_fraction
        t = 0.0
        available = bool(rng.random() < up_h / (up_h + down_h))
        while t < end_s:
            mean = up_h if available else down_h
            length = max(grid_s, round(_lomax(rng, mean * 3600.0, 1.5 if available else 2.0) / grid_s) * grid_s)
            cap = int(rng.integers(1, z.max_capacity + 1)) if available else 0
            spot = round(od * discount * float(rng.uniform(0.95, 1.05)), 4)
            rows.append((t, (int(t), z.cloud, z.region, z.zone, z.instance_type, z.accelerator, it.gpus, spot, od, cap)))
            t += length
            available = not available
    rows.sort(key=lambda r: (r[0], r[1][1], r[1][3], r[1][4]))
    return [r for _, r in rows]


def generate_trace_text(zones: Sequence[ZoneSpec], *, hours: float, seed: int, grid_s: float = 300.0) -> str:
    return write_trace(generate_rows(zones, hours=hours, seed=seed, grid_s=grid_s))


def generate_trace(zones: Sequence[ZoneSpec], *, hours: float, seed: int, grid_s: float = 300.0) -> MarketTrace:
    return MarketTrace.parse(generate_trace_text(zones, hours=hours, seed=seed, grid_s=grid_s), source=f"generated(seed={seed})")


# Benchmark scenarios: V100 (p3.2xlarge, Can't Be Late's main instance type) in one zone, in four
# zones across two clouds, and markets with room for 4- and 16-instance gangs.
SINGLE_ZONE = (ZoneSpec("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "V100", mean_up_h=3.0, mean_down_h=2.0),)
MULTI_ZONE = (
    ZoneSpec("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "V100", 3.0, 2.0, max_capacity=4),
    ZoneSpec("aws", "us-east-1", "us-east-1b", "p3.2xlarge", "V100", 5.0, 1.5, max_capacity=4),
    ZoneSpec("aws", "us-west-2", "us-west-2b", "p3.2xlarge", "V100", 2.0, 3.0, max_capacity=4),
    ZoneSpec("gcp", "us-central1", "us-central1-a", "n1-standard-8", "V100", 4.0, 1.0, max_capacity=4),
)
MULTI_NODE = (ZoneSpec("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "V100", 4.0, 1.5, max_capacity=6),)
# The same market for 16-instance gangs: room for 1.5x the gang at most, as MULTI_NODE has for 4.
MULTI_NODE_16 = (ZoneSpec("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "V100", 4.0, 1.5, max_capacity=24),)


# Multi-region markets (issue 23: several regions with several zones each, where a move between
# regions bills the checkpoint's egress), for 8 x H100 gangs (p5.48xlarge, $98.32/h on demand) with
# 10-minute steps like GCP's H100 availability data. MULTI_REGION: three regions, three zones each,
# zones drawn as above.
MULTI_REGION = tuple(
    ZoneSpec("aws", region, f"{region}{z}", "p5.48xlarge", "H100", max_capacity=2)
    for region in ("us-east-1", "us-east-2", "us-west-2") for z in ("a", "b", "c"))
# Volatile cheap zones and one stable dear zone per region (the expensive safe zone a policy can
# freeze on while cheaper zones come back): volatile runs of ~1 h at 25-27 % of on demand, the stable
# zone up for ~2 days at a time at 70 % ($69/h, like the never-preempted zone in issue 23).
VOLATILE_STABLE = tuple(
    ZoneSpec("aws", region, f"{region}{z}", "p5.48xlarge", "H100", up, down, max_capacity=2, spot_fraction=frac)
    for region in ("us-east-1", "us-west-2")
    for z, up, down, frac in (("a", 1.0, 1.0, 0.25), ("b", 1.0, 1.5, 0.27), ("c", 48.0, 0.5, 0.7)))
# A small flapping set: four zones in two regions, short runs (the set a policy can thrash on).
FLAPPING_4 = tuple(
    ZoneSpec("aws", region, f"{region}{z}", "p5.48xlarge", "H100", 0.75, 0.5, max_capacity=2)
    for region in ("us-east-1", "us-west-2") for z in ("a", "b"))
