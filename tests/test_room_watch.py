"""Spot room as a real cloud shows it (issue 23, item 2).

AWS and GCP never report how much spot room an offering has; the local cloud and the simulator
now do not either unless their ``oracle`` is on. The policy's input must carry only what launches,
capacity errors and preemptions showed: an offering never tried is unknown (``spot_available`` None,
worth a launch attempt), one whose launch was refused is believed full (no more room than is held)
until the belief fades back to the prior, and a refusal is an observation, not a preemption. With
the oracle on, the policy sees the trace's room as before.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from autoscaler.fleet.market_watch import RoomWatcher
from autoscaler.jobs.spec import JobSpec, spec_from_dict
from autoscaler.policy import CheapestPolicy, get_policy
from autoscaler.policy.base import Allocation, PolicyInput
from autoscaler.simulator import Simulation, make_sim_job
from autoscaler.simulator.executor import SimWorkload
from autoscaler.simulator.world import World, run_job
from cloud_providers.base import SPOT
from cloud_providers.local.market import HEADER, MarketTrace
from cloud_providers.local.provider import LocalProvider
from cost_models.availability import (
    PRIOR_FULL_SPELL_S,
    PRIOR_ROOM_PROBABILITY,
    RoomEvidence,
    believed_full,
    believed_full_until_s,
    memory_s,
    observe,
    room_probability,
)
from cost_models.scaling import LinearScaling
from research.tracegen import MULTI_ZONE, generate_trace

A = "aws/us-east-1a/p3.2xlarge/V100:1"
B = "aws/us-east-1b/p3.2xlarge/V100:1"
# 1a is cheaper but has no spot room; 1b has room for one.
TWO_ZONES = MarketTrace.parse(",".join(HEADER) + "\n"
                              "0,aws,us-east-1,us-east-1a,p3.2xlarge,V100,1,0.9,3.06,0\n"
                              "0,aws,us-east-1,us-east-1b,p3.2xlarge,V100,1,1.0,3.06,1\n", source="two zones")


def _spec(**objective: Any) -> JobSpec:
    return spec_from_dict({
        "name": "room", "run": "python train.py", "resources": {"accelerators": ["V100:1"], "clouds": ["aws"]},
        "objective": objective or {"deadline": "8h"}, "simulate": {"work_gpu_hours": 2.0},
    })


class Recording:
    """A policy that records every input it is given (and decides as ``inner``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", "recording")
        self.inputs: list[PolicyInput] = []

    def decide(self, inp: PolicyInput) -> list[Allocation]:
        self.inputs.append(inp)
        out: list[Allocation] = self.inner.decide(inp)
        return out


def _room(inp: PolicyInput) -> dict[str, int | None]:
    return {o.key: o.spot_available for o in inp.offerings}


# ----- the belief (pure) -----

def test_belief_fades_from_the_last_observation_back_to_the_prior() -> None:
    assert room_probability(RoomEvidence(), 1e6) == PRIOR_ROOM_PROBABILITY
    refused = observe(RoomEvidence(), 100.0, False)
    assert room_probability(refused, 100.0) == 0.0 and believed_full(refused, 100.0)
    until = believed_full_until_s(refused)
    assert until is not None and 100.0 < until < math.inf
    assert believed_full(refused, until - 1.0) and not believed_full(refused, until + 1.0)
    assert room_probability(refused, 1e9) == pytest.approx(PRIOR_ROOM_PROBABILITY)
    seen = observe(RoomEvidence(), 100.0, True)
    assert room_probability(seen, 100.0) == 1.0 and not believed_full(seen, 100.0)
    assert believed_full_until_s(seen) is None


def test_spells_without_room_end_half_way_between_the_last_refusal_and_the_next_success() -> None:
    ev = observe(observe(observe(RoomEvidence(), 0.0, False), 600.0, False), 4200.0, True)
    # The spell began at the first refusal and ended somewhere in (600 s, 4200 s]: half-way.
    assert ev.full_spells_s == (2400.0,) and ev.full_since_s is None
    assert memory_s(ev.full_spells_s) == pytest.approx((PRIOR_FULL_SPELL_S + 2400.0) / 2)
    # A longer remembered spell keeps a refused offering believed full for longer.
    short, long_ = observe(RoomEvidence(), 0.0, False), observe(ev, 5000.0, False)
    assert (believed_full_until_s(long_) or 0) - 5000.0 > (believed_full_until_s(short) or 0) - 0.0
    with pytest.raises(ValueError):
        RoomEvidence(False, 0.0, (-1.0,))


def test_retrying_only_when_worth_it_does_not_stretch_the_memory() -> None:
    """Issue 23 (the flapping market): an offering is retried only once the belief says it is worth
    it, so a spell counted up to the next success always measured at least that long; each one made
    the memory longer and the next retry later (main: a market out for 10 minutes at a time was
    retried 38 minutes after the first refusal and 57 after the eighth, the job idle while it had room). Counted to
    half-way between the last refusal and the success, the memory shrinks towards what the retries
    show."""
    ev, t = RoomEvidence(), 0.0
    waits = []
    for _ in range(8):
        ev = observe(ev, t, False)  # refused (or preempted): the market is out for 10 minutes
        retry = believed_full_until_s(ev)
        assert retry is not None
        waits.append(retry - t)
        t = retry
        ev = observe(ev, t, True)  # the first retry succeeds: room came back long before
        t += 3600.0
    assert waits[-1] < waits[0], waits
    assert memory_s(ev.full_spells_s) < PRIOR_FULL_SPELL_S


def test_watcher_shows_believed_full_offerings_with_only_what_is_held() -> None:
    offers = TWO_ZONES.offerings_at(0.0)
    unknown = [dataclasses.replace(o, spot_available=None) for o in offers]
    w = RoomWatcher()
    assert {o.key: o.spot_available for o in w.believed(unknown, {}, 0.0)} == {A: None, B: None}
    w.saw(A, 0.0, False)
    assert {o.key: o.spot_available for o in w.believed(unknown, {A: 2}, 10.0)} == {A: 2, B: None}
    # A provider that reports room (the oracle) is left as it is.
    assert {o.key: o.spot_available for o in w.believed(offers, {}, 10.0)} == {A: 0, B: 1}
    until = w.next_try_s(10.0)
    assert until is not None and {o.key: o.spot_available for o in w.believed(unknown, {}, until + 1)} == {A: None, B: None}
    # Instances running there are evidence of room, unless room was seen to go at that moment.
    w.saw(B, 50.0, False)
    w.holding(B, 50.0)
    assert believed_full(w.evidence()[B], 50.0)
    w.holding(B, 60.0)
    assert not believed_full(w.evidence()[B], 60.0)


# ----- the local cloud -----

def test_local_cloud_reports_no_room_unless_its_oracle_is_on() -> None:
    plain = LocalProvider(root=None, trace=TWO_ZONES, time_scale=1.0, clock=lambda: 0.0)
    assert all(o.spot_available is None for o in plain.offerings())
    assert all(o.spot_price_usd_per_hour is not None for o in plain.offerings())  # prices are public
    oracle = LocalProvider(root=None, trace=TWO_ZONES, time_scale=1.0, clock=lambda: 0.0, oracle=True)
    assert {o.key: o.spot_available for o in oracle.offerings()} == {A: 0, B: 1}


def test_scenario_oracle_field() -> None:
    from pathlib import Path

    from cloud_providers.local.scenario import ScenarioError, parse_scenario

    assert parse_scenario("oracle: true\n", base_dir=Path(".")).oracle is True
    assert parse_scenario("{}\n", base_dir=Path(".")).oracle is False
    with pytest.raises(ScenarioError, match="oracle: must be true or false"):
        parse_scenario("oracle: yes please\n", base_dir=Path("."))


# ----- the controller on a virtual clock (the simulator) -----

def _world_inputs(oracle: bool) -> tuple[World, str, Recording]:
    rec = Recording(CheapestPolicy())
    w = World(TWO_ZONES, rec, oracle=oracle)
    job_id = w.submit(_spec(), SimWorkload(work_s=7200.0, scaling=LinearScaling(), restart_overhead_s=300.0))
    w.run(horizon_s=86400.0)
    return w, job_id, rec


def test_controller_without_oracle_sees_only_what_its_launches_showed() -> None:
    w, job_id, rec = _world_inputs(oracle=False)
    first = rec.inputs[0]
    # Never tried: unknown, although the trace says 1a has no room and 1b has one.
    assert _room(first) == {A: None, B: None}
    assert first.history.get(A) is None or first.history[A].watched_s == 0.0
    # The cheaper 1a was tried first and refused: believed full from then on...
    refused_at = first.now_s
    after = [i for i in rec.inputs if i.now_s > refused_at]
    assert after and _room(after[0])[A] == 0
    assert after[0].jobs[0].recent_capacity_failures.get(A + "|" + SPOT) == refused_at
    # ...until the belief fades back to the prior (then it is worth a probe again).
    until = believed_full_until_s(observe(RoomEvidence(), refused_at, False))
    assert until is not None
    assert all(_room(i)[A] == 0 for i in after if i.now_s < until - 1e-6)
    # The refusal is not a preemption and does not end the job: it runs on 1b and finishes.
    o = w.outcome(job_id)
    assert o.state == "SUCCEEDED" and o.preemptions == 0 and o.deadline_met
    assert any(k == "capacity" for _, k, _, _ in w.events(job_id))


def test_controller_with_oracle_sees_the_traces_room() -> None:
    w, job_id, rec = _world_inputs(oracle=True)
    assert _room(rec.inputs[0]) == {A: 0, B: 1}
    assert rec.inputs[0].history[B].available_since_s == 0.0
    assert w.outcome(job_id).state == "SUCCEEDED"


def test_running_gang_is_not_broken_by_a_refused_move() -> None:
    """Room the cloud does not report is probed before a running gang is stopped: a job on demand
    whose probes of spot are refused keeps its on-demand gang (one start, no restart per probe)."""
    no_spot = MarketTrace.parse(",".join(HEADER) + "\n0,aws,us-east-1,us-east-1a,p3.2xlarge,V100,1,0.92,3.06,0\n",
                                source="no spot")
    spec = _spec(deadline="24h")
    spec = spec.model_copy(update={"simulate": spec.simulate.model_copy(update={"work_gpu_hours": 20.0})})
    job = make_sim_job(spec, restart_overhead_s=720)
    sim = Simulation(no_spot, spec)
    r = run_job(no_spot, job, get_policy("spotrain"), 0.0, grid_s=sim.grid_s, watch_keys=sim.keys)
    assert r.state == "SUCCEEDED" and r.deadline_met and r.restarts == 1 and r.preemptions == 0
    fast = sim.run(job, get_policy("spotrain"), 0.0)
    assert fast.restarts == 1 and fast.cost_usd == pytest.approx(r.cost_usd, rel=0.005)


# ----- the fast path -----

def test_fast_path_input_carries_only_observed_room() -> None:
    spec = _spec()
    job = make_sim_job(spec, restart_overhead_s=300)
    rec = Recording(CheapestPolicy())
    r = Simulation(TWO_ZONES, spec).run(job, rec, 0.0)
    assert _room(rec.inputs[0]) == {A: None, B: None}
    # The refused launch is news at the next decision (no later than the next tick), as a refusal.
    t0 = rec.inputs[0].now_s
    assert t0 < rec.inputs[1].now_s <= t0 + 300.0
    assert rec.inputs[1].jobs[0].recent_capacity_failures.get(A + "|" + SPOT) == t0
    # Every input shows 1a believed full (0) until the belief says it is worth a probe, then unknown.
    until = believed_full_until_s(observe(RoomEvidence(), t0, False))
    assert until is not None
    assert all(_room(i)[A] == 0 for i in rec.inputs[1:] if i.now_s < until - 1e-6)
    assert any(_room(i)[A] is None for i in rec.inputs[1:] if i.now_s > until + 1e-6)
    assert r.state == "SUCCEEDED" and r.preemptions == 0
    rec_o = Recording(CheapestPolicy())
    Simulation(TWO_ZONES, spec, oracle=True).run(job, rec_o, 0.0)
    assert _room(rec_o.inputs[0]) == {A: 0, B: 1}


@pytest.mark.parametrize("start_h", [0.0, 30.0, 70.0, 110.0])
def test_job_meets_its_deadline_on_a_multi_zone_trace_without_the_oracle(start_h: float) -> None:
    """(c): a job still finishes, with no deadline miss, when the policy must learn room by trying."""
    trace = generate_trace(MULTI_ZONE, hours=144, seed=21)
    spec = spec_from_dict({
        "name": "mz", "run": "x", "resources": {"accelerators": ["V100:1"], "clouds": ["aws", "gcp"]},
        "objective": {"deadline": "12h"}, "simulate": {"work_gpu_hours": 9.0},
    })
    sim = Simulation(trace, spec)
    job = make_sim_job(spec, restart_overhead_s=720)
    r = run_job(trace, job, get_policy("spotrain"), start_h * 3600, grid_s=sim.grid_s, watch_keys=sim.keys)
    assert r.state == "SUCCEEDED" and r.deadline_met, r
    fast = sim.run(job, get_policy("spotrain"), start_h * 3600)
    assert fast.deadline_met and fast.cost_usd == pytest.approx(r.cost_usd, rel=0.005)


@pytest.mark.parametrize("workers", [1, 4])
def test_spotrain_tries_spot_whose_room_is_unknown(workers: int) -> None:
    """A real cloud reports no room: the spotrain policy must still propose a spot gang there (the
    launch is the probe; its homogeneous spot candidates used to read unknown room as none)."""
    from autoscaler.policy import JobView

    spec = spec_from_dict({
        "name": "u", "run": "x", "resources": {"accelerators": ["V100:1"], "clouds": ["aws"]},
        "workers": {"min": workers, "max": workers}, "training": {"logical_workers": 4, "global_batch_size": 256},
        "objective": {"deadline": "48h"}, "simulate": {"work_gpu_hours": 4.0 * workers},
    })
    offers = [dataclasses.replace(o, spot_available=None) for o in TWO_ZONES.offerings_at(0.0)]
    view = JobView(job_id="u", spec=spec, submitted_s=0.0, progress=0.0)
    alloc = get_policy("spotrain").decide(PolicyInput(now_s=0.0, jobs=(view,), offerings=offers))[0]
    assert alloc.placements and all(p.market == SPOT for p in alloc.placements), alloc
    assert sum(p.instances for p in alloc.placements) == workers


def test_spotrain_considers_a_much_cheaper_zone_whose_room_is_unknown() -> None:
    """Holding spot in one zone, the policy may move to a much cheaper one a real cloud says nothing
    about (fails on main: unknown room was read as none there, so only held zones were candidates)."""
    from autoscaler.policy import Held, JobView

    trace = MarketTrace.parse(",".join(HEADER) + "\n"
                              "0,aws,us-east-1,us-east-1b,p3.2xlarge,V100,1,0.9145,3.06,1\n"
                              "0,gcp,us-central1,us-central1-a,n1-standard-8,V100,1,0.30,2.48,1\n", source="cheap")
    spec = spec_from_dict({
        "name": "u", "run": "x", "resources": {"accelerators": ["V100:1"], "clouds": ["aws", "gcp"]},
        "objective": {"deadline": "24h"}, "simulate": {"work_gpu_hours": 14.4},
    })
    offers = [dataclasses.replace(o, spot_available=None) for o in trace.offerings_at(0.0)]
    view = JobView(job_id="u", spec=spec, submitted_s=0.0, progress=0.1, restart_overhead_s=60.0,
                   held=(Held(B, SPOT, 1),))
    alloc = get_policy("spotrain").decide(PolicyInput(now_s=3600.0, jobs=(view,), offerings=offers))[0]
    assert [(p.offering_key.split("/")[0], p.market) for p in alloc.placements] == [("gcp", SPOT)], alloc


# A cheaper zone out of room for 15 minutes, then back for the rest of the day; a dear one always
# has room.
CHEAP_BACK_SOON = MarketTrace.parse(",".join(HEADER) + "\n"
                                    "0,aws,us-east-1,us-east-1a,p3.2xlarge,V100,1,0.9,3.06,0\n"
                                    "0,aws,us-east-1,us-east-1b,p3.2xlarge,V100,1,2.0,3.06,1\n"
                                    "900,aws,us-east-1,us-east-1a,p3.2xlarge,V100,1,0.9,3.06,1\n",
                                    source="cheap zone back after 15 min")


@pytest.mark.parametrize("world", [False, True], ids=["fast-path", "controller"])
def test_a_refused_cheap_zone_is_tried_again_soon_after_its_room_returns(world: bool) -> None:
    """Issue 23 (the volatile and flapping markets): a refused launch costs nothing, so a cheaper
    zone is worth another attempt long before room is more likely than not. With the old threshold
    (p >= 0.5: 1.25 memories, 38 minutes after one refusal) the job idled or ran on the dear zone
    for most of the cheap zone's return (before: first on 1a at 2,555 s, both paths); it is now there
    within two 5-minute ticks of the room coming back at 900 s."""
    spec = _spec(deadline="24h")
    rec = Recording(get_policy("spotrain"))
    if world:
        w = World(CHEAP_BACK_SOON, rec)
        job_id = w.submit(spec, SimWorkload(work_s=7200.0, scaling=LinearScaling(), restart_overhead_s=300.0))
        w.run(horizon_s=86400.0)
        assert w.outcome(job_id).state == "SUCCEEDED" and w.outcome(job_id).deadline_met
    else:
        job = make_sim_job(spec, restart_overhead_s=300)
        r = Simulation(CHEAP_BACK_SOON, spec).run(job, rec, 0.0)
        assert r.state == "SUCCEEDED" and r.deadline_met and r.preemptions == 0
    on_a = [i.now_s for i in rec.inputs if any(h.offering_key == A and h.instances > 0 for h in i.jobs[0].held)]
    assert on_a, "the job never ran on the cheaper zone"
    assert 900.0 < on_a[0] <= 900.0 + 2 * 300.0, on_a[0]
