"""Baselines as the controller would call them: SkyPilot-style failover away from refused capacity."""

from __future__ import annotations

from conftest import make_spec

from autoscaler.policy import JobView, PolicyInput, get_policy
from autoscaler.policy.jobmath import CAPACITY_BACKOFF_S
from cloud_providers.base import SPOT, Offering


def test_greedy_spot_fails_over_from_a_zone_that_refused_capacity() -> None:
    cheap = Offering("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "V100", 1, 3.06, 0.90, spot_available=2)
    other = Offering("aws", "us-east-1", "us-east-1b", "p3.2xlarge", "V100", 1, 3.06, 0.95, spot_available=2)
    spec = make_spec(resources={"accelerators": ["V100:1"], "clouds": ["aws"]})
    now = 10_000.0
    job = JobView("g", spec, submitted_s=0, progress=0.0, recent_capacity_failures={cheap.key + "|" + SPOT: now - 60})
    pol = get_policy("greedy-spot")

    def where(t: float) -> list[tuple[str, str]]:
        a = pol.decide(PolicyInput(now_s=t, jobs=[job], offerings=[cheap, other]))[0]
        return [(p.offering_key, p.market) for p in a.placements]

    assert where(now) == [(other.key, SPOT)]
    assert where(now - 60 + CAPACITY_BACKOFF_S + 1) == [(cheap.key, SPOT)]
