"""Issue 23, the "volatile cheap + stable dear" market without the oracle: cheap spot zones whose runs
and outages last about an hour next to a dear zone that is up for days. A job with slack should wait
for (and return to) the cheap zones; main sat on the dear one for hours because of what it believed
about the cheap ones' outages:

- Where nobody watches the market (a real cloud), the policy's mean outage was the prior (6 h)
  whatever the launches had measured, so a job with 10 h of slack stopped waiting for a cheap zone
  and started on the dear one.
- With a large checkpoint, the patience test compared against cheap zones in another region whose
  move was then dropped as dearer than waiting: the job took the dear zone at home instead.
"""

from __future__ import annotations

import dataclasses

from conftest import make_spec

from autoscaler.fleet.market_watch import RoomWatcher
from autoscaler.policy import JobView, MarketHistory, PolicyInput
from autoscaler.policy.spotrain import SpotrainPolicy, market_view
from cloud_providers.base import Offering

H = 3600.0
LAG = 600.0
CHEAP = Offering("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "V100", 1, 3.06, 0.78, spot_available=None)
DEAR = Offering("aws", "us-east-1", "us-east-1c", "p3.2xlarge", "V100", 1, 3.06, 2.14, spot_available=None)
AWAY = Offering("aws", "us-west-2", "us-west-2a", "p3.2xlarge", "V100", 1, 3.06, 0.76, spot_available=None)


def _job(work_h: float, deadline_h: float, **over: object) -> JobView:
    spec = make_spec(resources={"accelerators": ["V100:1"], "clouds": ["aws"]}, objective={"deadline": f"{deadline_h}h"},
                     simulate={"work_gpu_hours": work_h})
    return dataclasses.replace(JobView("j", spec, submitted_s=0.0, progress=0.0, restart_overhead_s=720.0), **over)


def _decide(job: JobView, offers: list[Offering], history: dict[str, MarketHistory], now_s: float) -> list[str]:
    a = SpotrainPolicy().decide(PolicyInput(now_s=now_s, jobs=[job], offerings=offers, history=history,
                                            decision_interval_s=LAG))[0]
    return [p.offering_key for p in a.placements]


def test_waits_for_the_cheap_zone_whose_measured_outages_are_short() -> None:
    """No oracle: the cheap zone's launches measured outages of about 40 minutes, and it was refused
    10 minutes ago; the dear zone is untried. With 10 h of slack on 14 h of work the job waits for
    the cheap zone. Without the measured spells (the prior's 6 h outage) it starts on the dear one."""
    rooms = RoomWatcher()
    t = 0.0
    for _ in range(4):  # four spells of ~40 minutes, probed every 10 minutes
        for k in range(4):
            rooms.saw(CHEAP.key, t + k * LAG, False)
        rooms.saw(CHEAP.key, t + 4 * LAG, True)
        t += 3 * H
    now = t + LAG
    rooms.saw(CHEAP.key, now - LAG, False)
    offers = rooms.believed([CHEAP, DEAR], {}, now)
    assert {o.key: o.spot_available for o in offers} == {CHEAP.key: 0, DEAR.key: None}
    history = rooms.merge({})
    spell_s = history[CHEAP.key].full_spell_mean_s
    assert spell_s is not None and spell_s < H
    assert market_view(CHEAP, history[CHEAP.key]).mean_outage_s == spell_s
    job = _job(14.0, 24.0, submitted_s=now)
    assert _decide(job, offers, history, now) == []
    assert _decide(job, offers, {}, now) == [DEAR.key]


def test_a_large_checkpoint_waits_at_home_rather_than_take_the_dear_zone() -> None:
    """4,000 GB of state in us-east-1; the cheap zone there is out (mean outage 40 min, watched), the
    dear zone has room, and a cheap zone in us-west-2 is untried but a move there ($80 of egress and
    over an hour of transfer) is dearer than waiting at home. The job waits for the cheap zone at
    home; main weighed waiting against the cheap zone away, saw nothing cheaper, and then, the move
    dropped, started on the dear zone."""
    watched = 100 * H
    history = {CHEAP.key: MarketHistory(CHEAP.key, watched_s=watched, available_s_at_least=(0.5 * watched,), drops=75)}
    offers = [dataclasses.replace(CHEAP, spot_available=0), DEAR, AWAY]
    job = _job(14.0, 24.0, state_location="aws/us-east-1", checkpoint_size_gb=4000.0, progress=0.3)
    assert market_view(CHEAP, history[CHEAP.key]).mean_outage_s < H
    assert _decide(job, offers, history, 2 * H) == []
    # Without state to carry, the cheap zone away is the best option: the job goes there.
    light = dataclasses.replace(job, checkpoint_size_gb=0.0, state_location=None)
    assert _decide(light, offers, history, 2 * H) == [AWAY.key]
