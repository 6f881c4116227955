"""Omniscient: the offline optimum with the whole trace known (Can't Be Late, NSDI'24, section 5.3).

The paper states it as an ILP over discretised time; we solve the same problem exactly by dynamic
programming over the trace's own change points (``omniscient_dp.py`` says how and why not on a grid).
A fixed-size gang of ``workers.max`` GPUs is, at any moment, idle or running one *homogeneous
configuration* (all on-demand on one offering, or all spot on one offering with room for the whole
gang: Can't Be Late's homogeneous clusters and Polarization Rule). Every start of a configuration costs
the restart overhead ``d`` (billed, no progress); leaving one bills what the simulator bills (a
preempted gang's notice, a stopped gang's checkpoint save), and with ``MoveCosts`` every change of
region bills the checkpoint's egress (size x price per GB), so omniscient stays the lower bound when
moves are priced.

The plan is replayed through the simulator by ``PlanPolicy``, so omniscient's reported figures come
from the same accounting as every other policy (the replay asks to be woken at each of the plan's
switches, which may fall between market changes). The plan is exact, a true lower bound for every
policy that runs homogeneous gangs on the same start, when the configurations run at one speed and
the trace's change points, the start and ``d`` are whole multiples of a common step (whole seconds:
any generated or recorded trace); otherwise progress is rounded down, which keeps the plan feasible
(its replay costs at most what it planned).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Mapping

from autoscaler.jobs.domain import Outcome
from cloud_providers.base import ON_DEMAND, SPOT, Offering

from ..errors import SpotrainError
from ..policy.base import Allocation, JobView, Placement, PolicyInput
from ..policy.jobmath import gang_rate, on_demand_allowed, spot_allowed
from .engine import SimJob, Simulation
from .omniscient_dp import Cfg, Problem, Solution, Solver

# Bound on the DP (points x modes x work units).
MAX_DP_CELLS = 2e8


class PlanTooLarge(SpotrainError, ValueError):
    """The offline problem is beyond ``MAX_DP_CELLS`` (a very long deadline or a lot of work)."""


def region_of(o: Offering) -> str:
    """The region a checkpoint written by a gang on ``o`` lives in (egress is billed between these)."""
    return f"{o.cloud}/{o.region}"


@dataclasses.dataclass(frozen=True)
class MoveCosts:
    """What moving the checkpoint between regions costs: ``checkpoint_size_gb`` times the egress price
    per GB from the old region to the new one (``egress_usd_per_gb_between[(from, to)]`` with regions
    as ``region_of`` names them, else ``egress_usd_per_gb``). The first launch moves nothing; a gang
    started in another region than the last one that ran (right away or after waiting) moves it."""

    checkpoint_size_gb: float = 0.0
    egress_usd_per_gb: float = 0.0
    egress_usd_per_gb_between: Mapping[tuple[str, str], float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.checkpoint_size_gb < 0 or self.egress_usd_per_gb < 0 or any(
                v < 0 for v in self.egress_usd_per_gb_between.values()):
            raise ValueError("checkpoint_size_gb and egress prices must be >= 0")

    def usd(self, from_region: str, to_region: str) -> float:
        if from_region == to_region:
            return 0.0
        per_gb = self.egress_usd_per_gb_between.get((from_region, to_region), self.egress_usd_per_gb)
        return self.checkpoint_size_gb * per_gb


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to hold from each switch on: ``switches`` is ((time, placement or None), ...) in time
    order; the last placement is held until the job finishes. ``moves``: changes of region."""

    start_s: float
    switches: tuple[tuple[float, Placement | None], ...]
    cost_usd: float
    feasible: bool
    egress_usd: float = 0.0
    moves: int = 0
    exact: bool = True

    def at(self, t: float) -> tuple[Placement | None, float | None]:
        times = [x for x, _ in self.switches]
        i = bisect.bisect_right(times, t + 1e-6) - 1
        cur = self.switches[i][1] if i >= 0 else None
        nxt = times[i + 1] if i + 1 < len(times) else None
        return cur, nxt


class PlanPolicy:
    """Replays an omniscient plan through the policy interface."""

    name = "omniscient"

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def decide(self, inp: PolicyInput) -> list[Allocation]:
        out = []
        for job in inp.jobs:
            if not self.plan.feasible:
                out.append(Allocation(job.job_id, (), reason="omniscient: no plan meets the deadline",
                                      outcome=Outcome.NO_RESOURCE))
                continue
            p, nxt = self.plan.at(inp.now_s)
            out.append(Allocation(job.job_id, () if p is None else (p,), reason="omniscient plan", next_decision_s=nxt))
        return out


def _configs(sim: Simulation, job: SimJob, view: JobView) -> list[Cfg]:
    """Homogeneous gangs: spot on each offering, and on demand per region (the cheapest, fastest ones:
    on demand always has room, so within a region only its Pareto front of rate up, price down counts;
    regions are kept apart because a move between them is billed)."""
    n_workers = job.spec.workers.max
    out: list[Cfg] = []
    od: dict[tuple[str, float, float], tuple[Cfg, float]] = {}
    for o in sim.offerings_at(0.0):
        if n_workers % o.gpus:
            continue
        n = n_workers // o.gpus
        rate = gang_rate(job.scaling, ((o, n),))
        if spot_allowed(view) and o.spot_price_usd_per_hour is not None:
            out.append(Cfg(o.key, SPOT, n, rate, region_of(o)))
        if on_demand_allowed(view):
            sig = (region_of(o), o.on_demand_price_usd_per_hour * n, rate)
            if sig not in od or o.key < od[sig][0].key:
                od[sig] = (Cfg(o.key, ON_DEMAND, n, rate, region_of(o)), sig[1])
    front = [c for c, price in od.values()
             if not any(e.region == c.region and e.rate >= c.rate and pe <= price and (e.rate > c.rate or pe < price)
                        for e, pe in od.values())]
    return out + sorted(front, key=lambda c: c.key)


def _horizon(sim: Simulation, job: SimJob, cfgs: list[Cfg], start: float, horizon_s: float | None) -> float:
    if job.spec.objective.deadline_s is not None:
        return job.spec.objective.deadline_s
    slowest_od = min((c.rate for c in cfgs if c.market == ON_DEMAND), default=min(c.rate for c in cfgs))
    return horizon_s or max(sim.trace.duration_s - start, 0.0) + job.work / slowest_od + 2 * job.restart_overhead_s


def _problem(sim: Simulation, job: SimJob, cfgs: list[Cfg], start: float, end: float, moves: MoveCosts) -> Problem:
    times = sim.change_times
    inside = times[bisect.bisect_right(times, start + 1e-9): bisect.bisect_left(times, end - 1e-9)]
    points = [start] + list(inside) + [end]
    offers = [{o.key: o for o in sim.offerings_at(t)} for t in points[:-1]]
    regions = sorted({c.region for c in cfgs})
    return Problem(points, offers, cfgs, regions, job.work, job.restart_overhead_s, job.checkpoint_save_s, moves.usd,
                   sim.grid_s)


def _plan(start: float, sol: Solution, cfgs: list[Cfg]) -> list[tuple[float, Placement | None]]:
    out: list[tuple[float, Placement | None]] = []
    for r in sol.runs:
        c = cfgs[r.cfg]
        if out and out[-1][0] >= r.start_s - 1e-9:
            out.pop()  # a switch at the moment the last run stops
        out.append((r.start_s, Placement(c.key, c.market, c.instances)))
        if not math.isnan(r.end_s):
            out.append((r.end_s, None))
    if not out or out[0][0] > start + 1e-9:
        out.insert(0, (start, None))
    return out


def plan_omniscient(sim: Simulation, job: SimJob, start_s: float, *, horizon_s: float | None = None,
                    moves: MoveCosts | None = None) -> Plan:
    """The least-cost plan for ``job`` from ``start_s`` (grid-aligned, as the simulator starts jobs)
    to its deadline; ``moves`` prices a change of region (default: free)."""
    start = sim.align(start_s)
    moves = moves or MoveCosts()
    view = JobView(job_id=job.job_id, spec=job.spec, submitted_s=start, progress=0.0)
    cfgs = _configs(sim, job, view)
    if not cfgs:
        return Plan(start, (), 0.0, False)
    pb = _problem(sim, job, cfgs, start, start + _horizon(sim, job, cfgs, start, horizon_s), moves)
    solver = Solver(pb)
    size = (solver.K + 1) * solver.n_modes * solver.n_w
    if size > MAX_DP_CELLS:
        raise PlanTooLarge(f"omniscient: {solver.K + 1} points x {solver.n_modes} modes x {solver.n_w} work units is too "
                           f"large to plan (at most {MAX_DP_CELLS:.0e}); shorten the deadline or the work")
    sol = solver.solve()
    if sol is None:
        return Plan(start, (), math.inf, False)
    regions = [cfgs[r.cfg].region for r in sol.runs]
    n_moves = sum(1 for a, b in zip(regions, regions[1:]) if a != b)
    return Plan(start, tuple(_plan(start, sol, cfgs)), sol.cost_usd, True, sol.egress_usd, n_moves, sol.exact)
