"""The simulator and its baselines: omniscient is a lower bound, deadline-aware policies never miss."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_spec

from autoscaler.simulator import Simulation, make_sim_job, run_named
from autoscaler.simulator.omniscient import plan_omniscient
from research.tracegen import MULTI_NODE, MULTI_ZONE, SINGLE_ZONE, generate_trace

TRACE_HOURS = 24 * 8


@pytest.fixture(scope="module")
def single() -> Simulation:
    return Simulation(generate_trace(SINGLE_ZONE, hours=TRACE_HOURS, seed=7), make_spec())


@pytest.fixture(scope="module")
def multinode() -> Simulation:
    spec = make_spec(workers={"min": 4, "max": 4}, training={"logical_workers": 4, "global_batch_size": 256})
    return Simulation(generate_trace(MULTI_NODE, hours=TRACE_HOURS, seed=9), spec)


@pytest.fixture(scope="module")
def multi() -> Simulation:
    return Simulation(generate_trace(MULTI_ZONE, hours=TRACE_HOURS, seed=8), make_spec())


@pytest.mark.parametrize("which,fraction,overhead_min", [("single", 0.8, 12), ("single", 0.9, 6), ("single", 0.6, 1),
                                                         ("multi", 0.9, 12), ("multi", 0.6, 3), ("multinode", 0.8, 12)])
def test_omniscient_is_a_lower_bound_and_nobody_misses(request: pytest.FixtureRequest, which: str, fraction: float,
                                                       overhead_min: int) -> None:
    sim: Simulation = request.getfixturevalue(which)
    n = 4 if which == "multinode" else 1
    spec = make_spec(simulate={"work_gpu_hours": 24 * fraction * n}, workers={"min": n, "max": n},
                     training={"logical_workers": 4, "global_batch_size": 256})
    job = make_sim_job(spec, restart_overhead_s=overhead_min * 60.0)
    starts = np.random.default_rng(1).uniform(0, (TRACE_HOURS - 25) * 3600, 12)
    for s in starts:
        res = {p: run_named(sim, job, p, s) for p in ("on-demand", "greedy-spot", "uniform-progress", "omniscient", "spotrain")}
        om = res["omniscient"].cost_usd
        for p in ("on-demand", "greedy-spot", "uniform-progress"):
            assert om <= res[p].cost_usd + 1e-6, (s, p, om, res[p].cost_usd)
        for p in ("uniform-progress", "omniscient", "spotrain", "on-demand"):
            assert res[p].deadline_met, (s, p, res[p])
            assert res[p].state == "SUCCEEDED"
        # Accounting: cost is at most on-demand's price for the same hours, hours match the work.
        for r in res.values():
            assert r.cost_usd <= r.on_demand_cost_usd + 1e-6
            assert r.spot_hours + r.on_demand_hours >= 24 * fraction * n - 1e-6


def test_dp_plan_cost_matches_its_replay(single: Simulation) -> None:
    job = make_sim_job(make_spec(simulate={"work_gpu_hours": 16}), restart_overhead_s=600)
    for s in (0.0, 3600 * 30, 3600 * 77):
        plan = plan_omniscient(single, job, s)
        assert plan.feasible
        replay = run_named(single, job, "omniscient", s)
        # The replay can only do better than planned (a restart of the same gang is not repeated).
        assert replay.cost_usd <= plan.cost_usd + 1e-6
        assert replay.cost_usd >= plan.cost_usd * 0.97


def test_preemptions_cost_restart_overhead_and_notice_loss(single: Simulation) -> None:
    # The oracle's view: the same market schedule must preempt both jobs alike. Without it, when a
    # job probes a zone again depends on its restart overhead, and so do its preemptions.
    single = Simulation(single.trace, make_spec(), oracle=True)
    spec = make_spec(simulate={"work_gpu_hours": 10}, objective={})
    fast = make_sim_job(spec, restart_overhead_s=60)
    slow = make_sim_job(spec, restart_overhead_s=1800)
    a = run_named(single, fast, "greedy-spot", 0)
    b = run_named(single, slow, "greedy-spot", 0)
    assert a.preemptions == b.preemptions > 0
    assert b.finish_hours > a.finish_hours and b.cost_usd > a.cost_usd
    # A checkpoint slower than the notice loses work since the last periodic checkpoint.
    lossy = make_sim_job(spec, restart_overhead_s=60, checkpoint_save_s=300)
    c = run_named(single, lossy, "greedy-spot", 0)
    assert c.preemptions == a.preemptions and c.finish_hours > a.finish_hours and c.cost_usd > a.cost_usd


def test_budget_is_never_exceeded(single: Simulation) -> None:
    spec = make_spec(objective={"budget_usd": 20.0}, simulate={"work_gpu_hours": 30})
    job = make_sim_job(spec, restart_overhead_s=600)
    r = run_named(single, job, "spotrain", 0)
    assert r.state == "FAILED_BUDGET" and "budget" in r.reason
    assert r.cost_usd <= 20.0
    ok = run_named(single, make_sim_job(make_spec(objective={"budget_usd": 60.0}, simulate={"work_gpu_hours": 10}),
                                        restart_overhead_s=600), "spotrain", 0)
    assert ok.state == "SUCCEEDED" and ok.cost_usd <= 60.0


def test_elastic_job_meets_deadline_on_spot(multi: Simulation) -> None:
    spec = make_spec(workers={"min": 1, "max": 4}, training={"logical_workers": 4, "global_batch_size": 256},
                     simulate={"work_gpu_hours": 40, "scaling": {"serial_fraction": 0.02}})
    job = make_sim_job(spec, restart_overhead_s=300)
    od = run_named(multi, job, "on-demand", 3600 * 10)
    ours = run_named(multi, job, "spotrain", 3600 * 10)
    assert ours.deadline_met and od.deadline_met
    assert ours.spot_hours > 0 and ours.cost_usd < 0.7 * od.cost_usd


def test_no_spot_ever_costs_what_on_demand_costs() -> None:
    """Hysteresis on demand: the reserve shrinks as the work does while the slack on demand stays,
    so the job soon sits just above the reserve; it must not give up its on-demand gang to wait for
    spot that is not coming and take it back a decision later (a restart each time)."""
    from cloud_providers.local.market import MarketTrace

    header = "time_s,cloud,region,zone,instance_type,accelerator,gpus,spot_price,on_demand_price,spot_available\n"
    trace = MarketTrace.parse(header + "0,aws,us-east-1,us-east-1a,p3.2xlarge,V100,1,0.92,3.06,0\n", source="no-spot")
    for work_h, deadline in ((20, "24h"), (30, "48h")):
        spec = make_spec(resources={"accelerators": ["V100:1"], "clouds": ["aws"]}, objective={"deadline": deadline},
                         simulate={"work_gpu_hours": work_h})
        sim = Simulation(trace, spec)
        job = make_sim_job(spec, restart_overhead_s=720)
        od, ours = run_named(sim, job, "on-demand", 0), run_named(sim, job, "spotrain", 0)
        assert ours.deadline_met and ours.restarts == 1
        assert ours.cost_usd == pytest.approx(od.cost_usd)


def test_omniscient_plans_only_room_that_lasts_the_tick() -> None:
    """Spot room that vanishes between grid points (10,900 s): the plan must not count on it for
    that tick, so the plan is feasible and its replay costs what the plan says."""
    from cloud_providers.local.market import MarketTrace

    header = "time_s,cloud,region,zone,instance_type,accelerator,gpus,spot_price,on_demand_price,spot_available\n"
    rows = [(0, 1), (10900, 0), (40000, 0)]
    trace = MarketTrace.parse(header + "".join(f"{t},aws,us-east-1,us-east-1a,p3.2xlarge,V100,1,1.0,3.06,{a}\n" for t, a in rows))
    spec = make_spec(resources={"accelerators": ["V100:1"], "clouds": ["aws"]}, objective={"deadline": "5h"},
                     simulate={"work_gpu_hours": 4})
    sim = Simulation(trace, spec)
    job = make_sim_job(spec, restart_overhead_s=600)
    plan = plan_omniscient(sim, job, 0.0)
    replay = run_named(sim, job, "omniscient", 0.0)
    assert plan.feasible and replay.deadline_met
    assert replay.cost_usd == pytest.approx(plan.cost_usd, rel=1e-9)
    with pytest.raises(ValueError, match="fixed-size"):
        elastic = make_spec(workers={"min": 1, "max": 2}, training={"logical_workers": 2, "global_batch_size": 64})
        run_named(sim, make_sim_job(elastic, restart_overhead_s=60), "omniscient", 0.0)
