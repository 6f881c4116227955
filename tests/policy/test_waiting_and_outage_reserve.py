"""Issue 15, item 1: two refinements of spotrain's waiting under a deadline.

- ``outage_reserve``: with several spot markets, slack is kept for the time none has room (the
  fallback time x the chance that all are out at once, from the market watch), tapered to nothing as
  the restart overhead reaches two decision intervals.
- ``wait_slack_value``: waiting for a cheaper market spends slack, which is dear when little of it
  is left per hour of work; the job then starts on the market with room now instead.
"""

from __future__ import annotations

import dataclasses

from conftest import make_spec

from autoscaler.policy import JobView, MarketHistory, PolicyInput
from autoscaler.policy.params import DEFAULT_PARAMS, PolicyParams
from autoscaler.policy.spotrain import SpotrainPolicy
from cloud_providers.base import ON_DEMAND, SPOT, Offering

LAG = 300.0
WATCHED = 100 * 3600.0


def _hist(o: Offering, available_share: float, drops: int) -> MarketHistory:
    return MarketHistory(o.key, watched_s=WATCHED, available_s_at_least=(available_share * WATCHED,), drops=drops)


def _zones() -> tuple[Offering, Offering]:
    a = Offering("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "V100", 1, 3.06, 1.00, spot_available=2)
    b = Offering("gcp", "us-central1", "us-central1-a", "n1-standard-8", "V100", 1, 2.86, 0.85, spot_available=2)
    return a, b


def _decide(params: PolicyParams, job: JobView, offers: list[Offering], hist: dict[str, MarketHistory]) -> list[tuple[str, str]]:
    a = SpotrainPolicy(params).decide(PolicyInput(now_s=0.0, jobs=[job], offerings=offers, history=hist,
                                                  decision_interval_s=LAG))[0]
    return [(p.offering_key, p.market) for p in a.placements]


def test_outage_reserve_rides_an_all_zone_outage_on_demand_when_restarts_are_cheap() -> None:
    """Both zones out, each half the time: with 3 h of slack on 21 h of work and 1-minute restarts
    the job runs on demand (the outage reserve is 0.7 x 0.9 x 0.25 x 21 h = 3.3 h); without the
    outage reserve, or with 12-minute restarts (tapered to nothing), it waits for spot."""
    a, b = _zones()
    offers = [dataclasses.replace(o, spot_available=0) for o in (a, b)]
    hist = {a.key: _hist(a, 0.5, 10), b.key: _hist(b, 0.5, 10)}
    spec = make_spec(objective={"deadline": "24h"}, simulate={"work_gpu_hours": 21.0})
    cheap = JobView("j", spec, submitted_s=0, progress=0.0, restart_overhead_s=60)
    slow = dataclasses.replace(cheap, restart_overhead_s=720)
    assert DEFAULT_PARAMS.outage_reserve > 0
    on_demand = _decide(DEFAULT_PARAMS, cheap, offers, hist)
    assert on_demand and all(m == ON_DEMAND for _, m in on_demand)
    assert _decide(dataclasses.replace(DEFAULT_PARAMS, outage_reserve=0.0), cheap, offers, hist) == []
    assert _decide(DEFAULT_PARAMS, slow, offers, hist) == []


def test_outage_reserve_needs_several_markets() -> None:
    """With one spot market the reserve's own cycles (through on demand) already cover its outages:
    no outage reserve, so the job waits with the same slack."""
    a, _ = _zones()
    offers = [dataclasses.replace(a, spot_available=0)]
    spec = make_spec(resources={"accelerators": ["V100:1"], "clouds": ["aws"]}, objective={"deadline": "24h"},
                     simulate={"work_gpu_hours": 21.0})
    job = JobView("j", spec, submitted_s=0, progress=0.0, restart_overhead_s=60)
    assert _decide(DEFAULT_PARAMS, job, offers, {a.key: _hist(a, 0.8, 10)}) == []


def test_waits_for_the_cheaper_market_only_while_slack_is_cheap() -> None:
    """The zone 15 % cheaper is out (mean outage about 1.2 h): with 12 h of slack on 12 h of work
    the job waits for it; with 3 h on 21 h it starts on the dearer zone with room now (it can move
    when the cheaper one is back) - unless the slack is valued at nothing, the old rule."""
    a, b = _zones()
    offers = [a, dataclasses.replace(b, spot_available=0)]
    hist = {a.key: _hist(a, 0.9, 10), b.key: _hist(b, 0.8, 20)}
    roomy = JobView("j", make_spec(objective={"deadline": "24h"}, simulate={"work_gpu_hours": 12.0}), submitted_s=0,
                    progress=0.0, restart_overhead_s=180)
    tight = dataclasses.replace(roomy, spec=make_spec(objective={"deadline": "24h"}, simulate={"work_gpu_hours": 21.0}))
    assert _decide(DEFAULT_PARAMS, roomy, offers, hist) == []
    assert _decide(DEFAULT_PARAMS, tight, offers, hist) == [(a.key, SPOT)]
    assert _decide(dataclasses.replace(DEFAULT_PARAMS, wait_slack_value=0.0), tight, offers, hist) == []
