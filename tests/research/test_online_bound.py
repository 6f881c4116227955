"""The online bound (research/online_bound.py): its market model, its program and its replay."""

from __future__ import annotations

import numpy as np
import pytest
from research_support import make_spec

from autoscaler.simulator import Simulation, make_sim_job, run_named
from research.online_bound import AGE_EDGES, OnlineDP, OnlineDPPolicy, age_bucket, trace_history, zone_transitions
from research.tracegen import MULTI_ZONE, generate_trace


def test_zone_model_is_a_markov_chain_with_a_falling_hazard() -> None:
    P = zone_transitions(4.0, 1.0)
    nb = len(AGE_EDGES)
    assert P.shape == (2 * nb, 2 * nb)
    np.testing.assert_allclose(P.sum(axis=1), 1.0)
    end = P[:nb, nb]  # an available run ending at the next tick, by age bucket
    assert all(a > b for a, b in zip(end, end[1:]))  # Lomax: the older the run, the safer
    # At age 0 the chance of a one-tick run is P(X < 1.5 ticks) for a Lomax of mean 48 ticks, shape 1.5.
    assert end[0] == pytest.approx(1 - (1 + 1.5 / 24) ** -1.5)
    assert [age_bucket(a) for a in (0, 1, 2, 3, 11, 12, 47, 48, 500)] == [0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_program_prices_the_extremes() -> None:
    work, slack, d = 240, 60, 12
    # A market that is practically always up: the job restarts once and runs on spot.
    dp = OnlineDP([(1.0, 10_000.0, 0.01)], 3.0, work, slack, d)
    fresh_up = (slack, 0, 0)  # slack, waiting, the zone up with a run of age 0
    assert dp.value[fresh_up] == pytest.approx(1.0 * (work + d) / 60, rel=1e-3)
    # Any market: never worse than going on demand now, never better than spot without restarts.
    dp = OnlineDP([(1.0, 0.5, 3.0), (1.2, 1.0, 1.0)], 3.0, work, slack, d)
    v = dp.value[slack, 0]
    assert np.all(v <= 3.0 * (work + d) / 60 + 1e-9)
    assert np.all(v >= 1.0 * work / 60)
    # With no slack for a restart, only a job already on demand can finish.
    tight = OnlineDP([(1.0, 4.0, 1.0)], 3.0, work, 10, d)
    assert np.all(tight.value[10, 0] >= 0.99e9)
    assert np.all(tight.value[10, tight.on_demand] == pytest.approx(3.0 * work / 60))
    with pytest.raises(ValueError, match="ticks"):
        OnlineDP([(1.0, 4.0, 1.0)], 3.0, work, 11, d)


@pytest.mark.parametrize("fraction", [0.6, 0.9])
def test_replay_meets_deadlines_and_omniscient_stays_below(fraction: float) -> None:
    zones = (MULTI_ZONE[3], MULTI_ZONE[1])  # the cheap GCP zone and the longest-lived AWS one
    trace = generate_trace(zones, hours=96, seed=4)
    spec = make_spec(objective={"deadline": "6h"}, simulate={"work_gpu_hours": 6 * fraction})
    sim = Simulation(trace, spec)
    offers = {o.zone: o for o in sim.offerings_at(0.0)}
    keys = [offers[z.zone].key for z in zones]
    od = min(offers.values(), key=lambda o: o.on_demand_price_usd_per_hour)
    work_min = round(360 * fraction)
    markets = [(float(offers[z.zone].spot_price_usd_per_hour or 0), float(z.mean_up_h or 0), float(z.mean_down_h or 0))
               for z in zones]
    dp = OnlineDP(markets, od.on_demand_price_usd_per_hour, work_min, 360 - work_min, 12)
    job = make_sim_job(spec, restart_overhead_s=720)
    past = trace_history(trace, keys)
    costs = []
    for s in np.random.default_rng(3).uniform(0, 88 * 3600, 10):
        r = sim.run(job, OnlineDPPolicy(dp, keys, od.key, past, 720.0), sim.align(float(s)))
        assert r.deadline_met and r.state == "SUCCEEDED", r
        assert r.cost_usd <= r.on_demand_cost_usd + 1e-6
        omni = run_named(sim, job, "omniscient", float(s))
        assert omni.cost_usd <= r.cost_usd + 1e-6
        costs.append((r.cost_usd, run_named(sim, job, "on-demand", float(s)).cost_usd))
    assert np.mean([c for c, _ in costs]) < np.mean([o for _, o in costs])


def test_history_is_what_a_market_watch_sees() -> None:
    trace = generate_trace((MULTI_ZONE[0],), hours=48, seed=9)
    key = trace.keys[0]
    times, rooms = trace_history(trace, [key])[key]
    assert times[0] == 0.0
    for t, room, nxt in zip(times, rooms, times[1:] + [trace.duration_s]):
        # Between two recorded changes the market stays on the same side of "has room".
        for u in np.linspace(t, nxt, 7)[:-1]:
            assert ((trace.offering_at(key, float(u)).spot_available or 0) > 0) == (room > 0)


def test_replay_realises_what_the_program_expects() -> None:
    """With exact ages and constant prices the program's model is the generator's: over many starts,
    the replay's mean bill matches the program's expected bill at the start states (a replay that
    misreads the state, say the ticks left by one, is 5 % off)."""
    from cloud_providers.local.market import MarketTrace, write_trace
    from research.tracegen import generate_rows

    zone = MULTI_ZONE[3]
    rows = [r[:7] + (0.8, r[8], r[9]) for r in generate_rows((zone,), hours=3000, seed=11)]
    trace = MarketTrace.parse(write_trace(rows))
    spec = make_spec(resources={"accelerators": ["V100:1"], "clouds": ["gcp"]}, objective={"deadline": "6h"},
                     simulate={"work_gpu_hours": 5.4})
    sim = Simulation(trace, spec)
    o = sim.offerings_at(0.0)[0]
    edges = tuple(range(80))
    dp = OnlineDP([(0.8, float(zone.mean_up_h or 0), float(zone.mean_down_h or 0))], o.on_demand_price_usd_per_hour, 324, 36, 12,
                  edges)
    job = make_sim_job(spec, restart_overhead_s=720)
    past = trace_history(trace, [o.key])
    times, rooms = past[o.key]
    realised, expected = [], []
    for s in np.random.default_rng(5).uniform(0, 2990 * 3600, 1000):
        start = sim.align(float(s))
        r = sim.run(job, OnlineDPPolicy(dp, [o.key], o.key, past, 720.0), start)
        assert r.deadline_met
        realised.append(r.cost_usd)
        j = int(np.searchsorted(times, start, side="right")) - 1
        b = age_bucket(int(round((start - times[j]) / 300)), edges)
        expected.append(dp.value[36, 0, b if rooms[j] > 0 else len(edges) + b])
    assert np.mean(realised) == pytest.approx(np.mean(expected), rel=0.02)  # 0.1 % off; the misread: +4.8 %


def test_ticks_of_the_trace_grid_and_a_deadline_off_it() -> None:
    # A deadline 2 minutes past the last 10-minute tick: a job always up pays its work and one restart.
    dp = OnlineDP([(1.0, 10_000.0, 0.01)], 3.0, 240, 62, 12, tick_min=10, tail_min=2)
    assert dp.value[62, 0, 0] == pytest.approx(1.0 * (240 + 12) / 60, rel=1e-3)
    # 12 minutes of slack: one restart onto on demand still fits, nothing more.
    tight = OnlineDP([(1.0, 4.0, 1.0)], 3.0, 240, 12, 12, tick_min=10, tail_min=2)
    assert np.all(tight.value[12, 0] == pytest.approx(3.0 * 252 / 60))
    assert np.all(tight.value[12, tight.on_demand] <= 3.0 * 240 / 60 + 1e-9)
    with pytest.raises(ValueError, match="tail"):
        OnlineDP([(1.0, 4.0, 1.0)], 3.0, 240, 12, 12, tick_min=10, tail_min=12)


def test_grid_mode_replay_on_a_10_minute_trace_meets_off_grid_deadlines() -> None:
    zones = (MULTI_ZONE[3], MULTI_ZONE[0])
    trace = generate_trace(zones, hours=96, seed=5, grid_s=600.0)
    spec = make_spec(objective={"deadline": f"{382 * 60}s"}, simulate={"work_gpu_hours": 5.0})
    sim = Simulation(trace, spec)
    offers = {o.zone: o for o in sim.offerings_at(0.0)}
    keys = [offers[z.zone].key for z in zones]
    od = min(offers.values(), key=lambda o: o.on_demand_price_usd_per_hour)
    markets = [(float(offers[z.zone].spot_price_usd_per_hour or 0), float(z.mean_up_h or 0), float(z.mean_down_h or 0))
               for z in zones]
    job = make_sim_job(spec, restart_overhead_s=720)
    past = trace_history(trace, keys)
    starts = [sim.align(float(s)) for s in np.random.default_rng(5).uniform(0, 88 * 3600, 8)]
    assert {s % 600 for s in starts} == {0.0, 300.0}  # starts on the grid and between grid points
    for s in starts:
        # The deadline's minutes past the grid, and ticks from the grid point at or before the start.
        end = s + 382 * 60
        tail = int(end % 600) // 60
        ticks = int((end - end % 600 - (s - s % 600)) // 600)
        dp = OnlineDP(markets, od.on_demand_price_usd_per_hour, 10 * ticks + tail - 82, 82, 12, tick_min=10, tail_min=tail)
        r = sim.run(job, OnlineDPPolicy(dp, keys, od.key, past, 720.0, grid_origin_s=0.0), s)
        assert r.deadline_met and r.state == "SUCCEEDED", r
        assert r.cost_usd <= r.on_demand_cost_usd + 1e-6
        assert run_named(sim, job, "omniscient", s).cost_usd <= r.cost_usd + 1e-6
