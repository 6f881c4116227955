"""Spot price spikes under a tight budget: the hard budget is never exceeded, and every dollar is
accounted for.

The real controller on the virtual clock (``autoscaler.simulator.world.World``: real reconcile loop,
budget guard and policy, the local cloud's provider replaying a market trace, simulated workers),
over seeded random markets of three V100 offerings on two clouds whose spot prices spike at random
moments for random lengths (to as much as the on-demand price, as EC2 and GCE cap them, and in a
second set of markets to 10x the usual price, past any cap) while their spot capacity comes and
goes. Each job has a budget drawn between a third of and a little more than what its work costs
at the usual spot price, so that some end FAILED_BUDGET and some succeed.

Two paces: the simulator's, where a market change wakes the controller, and the service's, where it
learns prices only at its own ticks (every 300 s here) and a spike runs unseen until then. At every
tick the job's recorded cost and the cloud's own bill for its instances must be within the budget;
at the end the two must agree.
"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from autoscaler.jobs.spec import spec_from_dict
from autoscaler.policy import CheapestPolicy, get_policy
from autoscaler.simulator import world as world_module
from autoscaler.simulator.executor import SimWorkload
from autoscaler.simulator.world import World
from autoscaler.state import Job
from cloud_providers.base import TAG_JOB
from cloud_providers.local.market import HEADER, MarketTrace
from cost_models.scaling import LinearScaling

from .figures import record

pytestmark = pytest.mark.chaos

MARKETS = 15  # per kind of spike and pace
# (cloud, region, zone, instance type, usual spot $/h, on-demand $/h)
OFFERINGS = [("aws", "us-east-1", "us-east-1a", "p3.2xlarge", 0.90, 3.06),
             ("aws", "us-east-1", "us-east-1b", "p3.2xlarge", 1.00, 3.06),
             ("gcp", "us-central1", "us-central1-a", "n1-standard-8", 0.74, 2.48)]
HOURS = 48
# Budgets: LOW to HIGH times what the work costs at the cheapest usual spot price ($/s).
USUAL_USD_PER_S = min(o[4] for o in OFFERINGS) / 3600.0
LOW, HIGH = 0.6, 1.8


def spiky_market(rng: random.Random, *, cap_at_on_demand: bool) -> tuple[MarketTrace, dict[str, float]]:
    """A trace whose spot prices wander +-20 % and spike (30 % of the changes) for 30 s to 15 min."""
    rows, worst = [], {"spikes": 0.0, "max_multiple": 0.0}
    for cloud, region, zone, itype, usual, od in OFFERINGS:
        t = 0.0
        while t < HOURS * 3600:
            spike = rng.random() < 0.3
            multiple = rng.uniform(1.5, od / usual if cap_at_on_demand else 10.0) if spike else rng.uniform(0.8, 1.2)
            worst["spikes"] += spike
            worst["max_multiple"] = max(worst["max_multiple"], multiple)
            capacity = rng.choice([0, 1, 2]) if rng.random() < 0.2 else 4
            rows.append(f"{t:.0f},{cloud},{region},{zone},{itype},V100,1,{usual * multiple:.4f},{od},{capacity}")
            t += rng.uniform(30, 900) if spike else rng.uniform(60, 3600)
    return MarketTrace.parse(",".join(HEADER) + "\n" + "\n".join(rows) + "\n", source="spiky"), worst


def one_job(seed: int, *, cap_at_on_demand: bool, service_pace: bool, enforce: bool = True) -> dict[str, Any]:
    """Run one job; with ``enforce``, fail at the first tick past the budget (else only measure)."""
    rng = random.Random(seed)
    trace, market = spiky_market(rng, cap_at_on_demand=cap_at_on_demand)
    work_s = rng.uniform(1800.0, 4 * 3600.0)
    budget = round(rng.uniform(LOW, HIGH) * USUAL_USD_PER_S * (work_s + 300.0), 4)
    # Odd seeds: the cheapest-offering policy, which plans nothing about the budget, so that the
    # guard alone holds the cap; even seeds: spotrain's policy, which also stops a job it can no
    # longer finish within the budget.
    policy = CheapestPolicy() if seed % 2 else get_policy()
    world = World(trace, policy, watch_keys=[] if service_pace else None)
    spec = spec_from_dict({"name": "spiky", "run": "python train.py",
                           "resources": {"accelerators": ["V100:1"], "clouds": ["aws", "gcp"]},
                           "workers": {"min": 1, "max": 1}, "objective": {"budget_usd": budget},
                           "simulate": {"work_gpu_hours": work_s / 3600.0}})
    job = world.submit(spec, SimWorkload(work_s=work_s, scaling=LinearScaling(), restart_overhead_s=300.0,
                                         checkpoint_save_s=30.0, checkpoint_interval_s=600.0))
    seen = {"ticks": 0, "max_cost": 0.0, "max_billed": 0.0}
    tick = world.controller.tick

    def billed() -> float:
        return sum(world.provider.billing(i).cost_usd for i in world.provider.list_instances({TAG_JOB: job}))

    def watched() -> None:
        tick()
        with world.store.session() as s:
            row = s.get(Job, job)
            assert row is not None
            cost = row.cost_usd
        bill = billed()
        seen["ticks"] += 1
        seen["max_cost"], seen["max_billed"] = max(seen["max_cost"], cost), max(seen["max_billed"], bill)
        if enforce:
            assert cost <= budget + 1e-9 and bill <= budget + 1e-9, (seed, world.provider.now_s(), cost, bill, budget)

    world.controller.tick = watched  # type: ignore[method-assign]
    world.run(horizon_s=10 * 86400.0)
    out = world.outcome(job)
    assert out.state in ("SUCCEEDED", "FAILED_BUDGET"), (seed, out.state, out.reason)
    if out.state == "FAILED_BUDGET":
        assert "budget" in out.reason, out.reason
    assert out.cost_usd == pytest.approx(billed(), abs=1e-9), (seed, out.cost_usd, billed())  # every dollar accounted
    assert all(not i.alive for i in world.provider.list_instances({TAG_JOB: job}))
    if enforce:
        assert out.cost_usd <= budget
    return {"state": out.state, "budget": budget, "guard_only": bool(seed % 2), "cost": out.cost_usd, "ticks": seen["ticks"],
            "max_fraction": max(seen["max_cost"], seen["max_billed"]) / budget, **market}


def test_price_spikes_never_push_a_job_past_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator's pace (a market change wakes the controller), whatever the spike, even past the
    on-demand price; the service's pace (prices seen at its ticks), for spikes up to the on-demand
    price, spot's cap, which the guard reserves spot at between two ticks."""
    t0 = time.perf_counter()
    results: dict[str, list[dict[str, Any]]] = {}
    for service_pace, capped in ((False, True), (False, False), (True, True)):
        if service_pace:  # the service wakes at least every tick; the market no longer wakes it
            monkeypatch.setattr(world_module, "MAX_DECISION_GAP_S", world_module.GRID_S)
        key = f"{'service' if service_pace else 'simulator'} pace, spikes {'to on-demand' if capped else 'to 10x'}"
        results[key] = [one_job(1000 * service_pace + 100 * capped + i, cap_at_on_demand=capped,
                                service_pace=service_pace) for i in range(MARKETS)]
    jobs = [r for rs in results.values() for r in rs]
    stopped = sum(r["state"] == "FAILED_BUDGET" for r in jobs)
    succeeded = len(jobs) - stopped
    # Tight budgets: the guard had to act, and not every budget was too small.
    assert stopped >= len(jobs) // 4 and succeeded >= len(jobs) // 8, (stopped, succeeded)
    closest = max(r["max_fraction"] for r in jobs)
    spikes = int(sum(r["spikes"] for r in jobs))
    elapsed = time.perf_counter() - t0
    record("price_spikes",
           tried=f"{len(jobs)} jobs with tight budgets on random markets with {spikes:,} spot price spikes (to the "
                 "on-demand price; to 10x where market changes wake the controller, or at its 300 s ticks); virtual clock",
           held=f"budget never exceeded at any of {sum(r['ticks'] for r in jobs):,} ticks (closest: "
                f"{closest:.1%} of it); {stopped} ended FAILED_BUDGET (policy or guard), {succeeded} succeeded; recorded cost = "
                "the cloud's bill for every job",
           jobs=len(jobs), spikes=spikes, ticks=sum(r["ticks"] for r in jobs), budget_stopped=stopped,
           succeeded=succeeded, closest_to_budget=round(closest, 4),
           max_spike_multiple=round(max(r["max_multiple"] for r in jobs), 2), by_setting=_by_setting(results),
           exceeded=0, elapsed_s=round(elapsed, 2))


def _by_setting(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {k: {"jobs": len(v), "budget_stopped": sum(r["state"] == "FAILED_BUDGET" for r in v),
                "closest_to_budget": round(max(r["max_fraction"] for r in v), 4)} for k, v in results.items()}


def sawtooth_market(*, low_s: float, phase_s: float) -> MarketTrace:
    """One offering whose spot price is 0.306 $/h (a 90 % discount) but for 300 - ``low_s`` seconds of
    every 300, where it is at its on-demand cap (3.06 $/h, 10x), the spikes starting at ``phase_s``."""
    row = "{:.0f},aws,us-east-1,us-east-1a,p3.2xlarge,V100,1,{},3.06,4"
    rows, t = [row.format(0.0, 0.306)], phase_s
    while t < 86400.0:
        rows += [row.format(t, 3.06), row.format(t + 300.0 - low_s, 0.306)]
        t += 300.0
    return MarketTrace.parse(",".join(HEADER) + "\n" + "\n".join(rows) + "\n", source="sawtooth")


def guard_alone(trace: MarketTrace, budget: float) -> float:
    """The most the cloud billed a long job (the cheapest-offering policy: the guard alone holds its
    budget) at any tick, as a fraction of the budget."""
    world = World(trace, CheapestPolicy(), watch_keys=[])
    spec = spec_from_dict({"name": "gap", "run": "python train.py", "objective": {"budget_usd": budget},
                           "resources": {"accelerators": ["V100:1"], "clouds": ["aws"]}})
    job = world.submit(spec, SimWorkload(work_s=20 * 3600.0, scaling=LinearScaling(), restart_overhead_s=300.0,
                                         checkpoint_save_s=30.0, checkpoint_interval_s=600.0))
    worst, tick = [0.0], world.controller.tick

    def watched() -> None:
        tick()
        worst[0] = max(worst[0], sum(world.provider.billing(i).cost_usd
                                     for i in world.provider.list_instances({TAG_JOB: job})))

    world.controller.tick = watched  # type: ignore[method-assign]
    world.run(horizon_s=86400.0)
    assert world.outcome(job).state == "FAILED_BUDGET"
    return worst[0] / budget


def test_a_rise_past_four_times_the_last_price_between_ticks_is_covered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by this suite (issue 14): the guard reserved 3 ticks at the last price seen, so a spot
    price at a 90 % discount back at its on-demand cap (10x) between two ticks was billed past the
    budget (4 of these 8 jobs, by up to 7.7 %). It now reserves spot at its cap where a change may go
    unseen between ticks. The service's pace (prices seen only at 300 s ticks, no market watch):
    measured, then held to the budget."""
    monkeypatch.setattr(world_module, "MAX_DECISION_GAP_S", world_module.GRID_S)
    runs = [guard_alone(sawtooth_market(low_s=100.0, phase_s=phase), budget)
            for phase in (0.0, 50.0, 150.0, 250.0) for budget in (0.5, 1.0)]
    over = [f for f in runs if f > 1.0 + 1e-9]
    record("price_spikes_gap",
           tried=f"{len(runs)} jobs, the guard alone, spot at a 90 % discount back at its on-demand cap (10x) for "
                 "200 s of every 300 s tick; controller seeing prices only at its ticks",
           held=f"{len(runs) - len(over)} of {len(runs)} jobs within their budget (closest: {max(runs):.1%} of it): the "
                "guard reserves spot at its cap between ticks (before the fix: 4 of 8 past it, by up to 7.7 %)",
           jobs=len(runs), over_budget=len(over), worst_fraction_of_budget=round(max(runs), 4))
    assert not over, [round(f, 4) for f in runs]
