"""The model-based rule tried for issue 15 (research/planner.py): online, safe, and a saving."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from research_support import make_spec

from autoscaler.simulator import Simulation, make_sim_job, run_named
from cloud_providers.local.market import MarketTrace, write_trace
from research.planner import MarketPast, PlannerPolicy
from research.tracegen import MULTI_ZONE, generate_rows, generate_trace


def test_the_market_model_reads_only_the_past() -> None:
    rows = generate_rows(MULTI_ZONE[:1], hours=96, seed=5)
    cut_s = 48 * 3600.0
    # The same first two days, then a market that never has room again.
    changed = [r if r[0] < cut_s else r[:9] + (0,) for r in rows]
    a, b = (MarketTrace.parse(write_trace(x)) for x in (rows, changed))
    key = a.keys[0]
    pa, pb = MarketPast(a, key), MarketPast(b, key)
    assert pa.model_at(cut_s) == pb.model_at(cut_s)
    assert pa.state_at(cut_s - 1) == pb.state_at(cut_s - 1)
    m = pa.model_at(cut_s)
    assert m.mean_up_h > 0 and m.mean_down_h > 0 and 0 < m.spot_usd_per_hour < 3.06
    assert pa.model_at(cut_s) != pa.model_at(90 * 3600.0)


def test_replay_meets_every_deadline_below_on_demand() -> None:
    trace = generate_trace(MULTI_ZONE, hours=120, seed=4)
    spec = make_spec(objective={"deadline": "6h"}, simulate={"work_gpu_hours": 6 * 0.85})
    sim = Simulation(trace, spec)
    offers = sim.offerings_at(0.0)
    keys = [o.key for o in offers]
    od = min(offers, key=lambda o: o.on_demand_price_usd_per_hour)
    job = make_sim_job(spec, restart_overhead_s=720)
    cache: OrderedDict = OrderedDict()
    pasts = {k: MarketPast(trace, k) for k in keys}
    ours, theirs = [], []
    for s in np.random.default_rng(3).uniform(24 * 3600, 110 * 3600, 8):
        p = PlannerPolicy(trace, keys, od.key, od.on_demand_price_usd_per_hour, 720.0, cache=cache, pasts=pasts,
                          horizon_ticks=72, slack_cap_min=60, refresh_s=12 * 3600)
        r = sim.run(job, p, sim.align(float(s)))
        assert r.deadline_met and r.state == "SUCCEEDED", r
        assert r.cost_usd <= r.on_demand_cost_usd + 1e-6
        ours.append(r.cost_usd)
        theirs.append(run_named(sim, job, "on-demand", float(s)).cost_usd)
        assert run_named(sim, job, "omniscient", float(s)).cost_usd <= r.cost_usd + 1e-6
    assert np.mean(ours) < 0.6 * np.mean(theirs)
    assert len(cache) <= 2  # programs are shared between starts, and only the latest kept
