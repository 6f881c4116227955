"""Omniscient: the offline optimum with the whole trace known (Can't Be Late, NSDI'24, section 5.3).

The paper states it as an ILP over discretised time; we solve the same problem exactly by dynamic
programming, which is faster and needs no solver. Time runs on the simulator's decision grid (ticks
of ``grid_s``); in each tick a fixed-size gang of ``workers.max`` GPUs is either idle, or runs one
*homogeneous configuration* (all on-demand on one offering, or all spot on one offering with room for
the whole gang during the tick: Can't Be Late's homogeneous clusters and Polarization Rule). Every start
of a configuration costs the restart overhead ``d`` (billed, no progress). Work is counted in units of
one minute of the first configuration's rate.

    state   (tick k, mode m, work units w)       mode = idle | (config c, ticks since its start)
    value   the least cost of reaching it
    moves   idle                                 cost 0, progress 0
            start c (from any state)             cost price_c(k), progress floor(r_c * (grid - d)+)
            continue c                           cost price_c(k), progress r_c * (grid - overhead left)+
            (a spot configuration only while its market has room for the gang in tick k)

The finishing tick is billed pro rata, as the simulator bills it. The plan is then replayed through the
simulator by ``PlanPolicy``, so omniscient's reported figures come from the same accounting as every
other policy. It is exact (a true lower bound for all the homogeneous policies on the same grid) when
``d`` is a whole number of minutes, the configurations run at equal speed and the trace changes on
the grid (the generator's traces do); progress is rounded down otherwise, and spot room counts only
for a tick it lasts through, which keeps the plan feasible (its replay costs what it planned) but
lets an online policy that uses a partial tick of room beat it on such a trace.
"""

from __future__ import annotations

import bisect
import dataclasses
import math

import numpy as np

from autoscaler.jobs.domain import Outcome
from cloud_providers.base import ON_DEMAND, SPOT, Offering

from ..errors import SpotrainError
from ..policy.base import Allocation, JobView, Placement, PolicyInput
from ..policy.jobmath import gang_rate, on_demand_allowed, spot_allowed
from .engine import SimJob, Simulation

UNIT_S = 60.0
# Bound on the DP (ticks x modes x work units): the benchmark's 24 h jobs need about 3e6 per start.
MAX_DP_CELLS = 2e8


class PlanTooLarge(SpotrainError, ValueError):
    """The offline problem is beyond ``MAX_DP_CELLS`` (a very long deadline or a lot of work)."""


@dataclasses.dataclass(frozen=True)
class _Cfg:
    key: str
    market: str
    instances: int
    rate: float


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to hold in each tick from ``start_s`` on (None: nothing)."""

    start_s: float
    grid_s: float
    ticks: tuple[Placement | None, ...]
    cost_usd: float
    feasible: bool

    def at(self, t: float) -> tuple[Placement | None, float | None]:
        k = int(math.floor((t - self.start_s) / self.grid_s + 1e-9))
        if k < 0 or k >= len(self.ticks):
            return None, None
        cur = self.ticks[k]
        j = k + 1
        while j < len(self.ticks) and self.ticks[j] == cur:
            j += 1
        nxt = self.start_s + j * self.grid_s if j < len(self.ticks) else None
        return cur, nxt


class PlanPolicy:
    """Replays an omniscient plan through the policy interface."""

    name = "omniscient"

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def decide(self, inp: PolicyInput) -> list[Allocation]:
        out = []
        for job in inp.jobs:
            p, nxt = self.plan.at(inp.now_s)
            if p is None and (nxt is None and inp.now_s >= self.plan.start_s + len(self.plan.ticks) * self.plan.grid_s):
                out.append(Allocation(job.job_id, (), reason="omniscient plan exhausted", outcome=Outcome.NO_RESOURCE))
                continue
            out.append(Allocation(job.job_id, () if p is None else (p,), reason="omniscient plan", next_decision_s=nxt))
        return out


def _configs(sim: Simulation, job: SimJob, view: JobView) -> list[_Cfg]:
    n_workers = job.spec.workers.max
    out: list[_Cfg] = []
    seen_od: set[tuple[float, float]] = set()
    offers: list[Offering] = sim.offerings_at(0.0)
    for o in offers:
        if n_workers % o.gpus:
            continue
        n = n_workers // o.gpus
        rate = gang_rate(job.scaling, ((o, n),))
        if spot_allowed(view) and o.spot_price_usd_per_hour is not None:
            out.append(_Cfg(o.key, SPOT, n, rate))
        if on_demand_allowed(view):
            sig = (o.on_demand_price_usd_per_hour * n, rate)
            if sig not in seen_od:
                seen_od.add(sig)
                out.append(_Cfg(o.key, ON_DEMAND, n, rate))
    # On demand is always available: keep only the Pareto front of (rate up, price down).
    od = [c for c in out if c.market == ON_DEMAND]
    price = {c: next(o for o in offers if o.key == c.key).on_demand_price_usd_per_hour * c.instances for c in od}
    dominated = {c for c in od for e in od
                 if e != c and e.rate >= c.rate and price[e] <= price[c]
                 and (e.rate > c.rate or price[e] < price[c] or e.key < c.key)}
    return [c for c in out if c not in dominated]


@dataclasses.dataclass(frozen=True)
class _Dp:
    """The dynamic programme's dimensions: ticks, modes (idle, or a configuration and its sub-state
    0..n_sub, n_sub meaning steady) and work units, and per configuration and sub-state the progress
    units made in a tick (``prog``) and the overhead seconds spent in it (``busy``)."""

    start: float
    grid: float
    cfgs: list[_Cfg]
    n_ticks: int
    unit: float
    w_goal: float
    n_w: int
    n_sub: int
    prog: np.ndarray
    busy: np.ndarray
    save_s: float = 0.0

    @property
    def n_modes(self) -> int:
        return 1 + len(self.cfgs) * (self.n_sub + 1)

    def mode(self, i: int, s: int) -> int:
        return 1 + i * (self.n_sub + 1) + s


# The best way found to finish: (tick, config, source sub-state or -1 for a start, work units before).
_Finish = tuple[int, int, int, int]


def _horizon(sim: Simulation, job: SimJob, cfgs: list[_Cfg], start: float, horizon_s: float | None) -> float:
    if job.spec.objective.deadline_s is not None:
        return job.spec.objective.deadline_s
    slowest_od = min((c.rate for c in cfgs if c.market == ON_DEMAND), default=min(c.rate for c in cfgs))
    return horizon_s or max(sim.trace.duration_s - start, 0.0) + job.work / slowest_od + 2 * job.restart_overhead_s


def _dp(sim: Simulation, job: SimJob, cfgs: list[_Cfg], start: float, horizon: float) -> _Dp:
    """Size the programme and tabulate each tick's progress; ``PlanTooLarge`` past ``MAX_DP_CELLS``."""
    grid = sim.grid_s
    n_ticks = int(math.floor(horizon / grid + 1e-9))
    unit = max(c.rate for c in cfgs) * UNIT_S
    w_goal = job.work / unit
    n_w = int(math.ceil(w_goal - 1e-9))
    d = job.restart_overhead_s
    n_sub = int(math.ceil(d / grid)) if d > 0 else 0  # ticks still (partly) in overhead after a start
    prog = np.zeros((len(cfgs), n_sub + 1), dtype=np.int64)
    busy = np.zeros((len(cfgs), n_sub + 1))
    for i, c in enumerate(cfgs):
        for s in range(n_sub + 1):
            left = max(0.0, d - s * grid)
            busy[i, s] = min(grid, left)
            prog[i, s] = int(math.floor(c.rate * max(0.0, grid - left) / unit + 1e-9))
    dp = _Dp(start, grid, cfgs, n_ticks, unit, w_goal, n_w, n_sub, prog, busy, job.checkpoint_save_s)
    size = n_ticks * dp.n_modes * max(n_w, 1)
    if size > MAX_DP_CELLS:
        raise PlanTooLarge(f"omniscient: {n_ticks} ticks x {dp.n_modes} modes x {n_w} work units is too large to plan "
                         f"(at most {MAX_DP_CELLS:.0e}); shorten the deadline or the work")
    return dp


def _spot_room(sim: Simulation, t: float, offers: dict[str, Offering]) -> dict[str, int]:
    """Spot room per offering that lasts the whole tick from ``t``: a trace may change between grid points."""
    inside = sim.change_times[bisect.bisect_right(sim.change_times, t): bisect.bisect_left(sim.change_times, t + sim.grid_s)]
    if not inside:
        return {key: o.spot_available or 0 for key, o in offers.items()}
    return {key: min([o.spot_available or 0] + [sim.trace.offering_at(key, x).spot_available or 0 for x in inside])
            for key, o in offers.items()}


def _exit_usd(dp: _Dp, offers: dict[str, Offering]) -> np.ndarray:
    """Per mode, what leaving it at this tick's start bills (as the controller does): a spot
    configuration whose room is gone now is preempted and bills its notice; any other running one
    checkpoints and exits first (``save_s``)."""
    out = np.zeros(dp.n_modes)
    for i, c in enumerate(dp.cfgs):
        o = offers[c.key]
        gone = c.market == SPOT and (o.spot_available or 0) < c.instances
        if c.market == SPOT and o.spot_price_usd_per_hour is None:
            continue
        seconds = o.notice_seconds if gone else dp.save_s
        out[dp.mode(i, 0): dp.mode(i, dp.n_sub) + 1] = o.price_usd_per_hour(c.market) * c.instances * seconds / 3600.0
    return out


def _tick(dp: _Dp, sim: Simulation, k: int, cost: np.ndarray, best: tuple[float, _Finish | None]
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[float, _Finish | None]]:
    """One step of the programme: the costs at the end of tick ``k`` from those at its start, with
    the back-pointers (argmin mode of the "any state" minimum, and per (mode, w) how it was reached:
    -1 by a start, otherwise the sub-state it continued from) and the best finish so far."""
    best_fin, fin = best
    n_w, grid = dp.n_w, dp.grid
    ws = np.arange(n_w)
    t = dp.start + k * grid
    offers = {o.key: o for o in sim.offerings_at(t)}
    room = _spot_room(sim, t, offers)
    leave = cost + _exit_usd(dp, offers)[:, None]
    am = np.argmin(leave, axis=0)
    m_any = leave[am, ws]
    new = np.full((dp.n_modes, n_w), np.inf)
    code = np.zeros((dp.n_modes, n_w), dtype=np.int8)
    new[0] = m_any
    for i, c in enumerate(dp.cfgs):
        o = offers[c.key]
        if c.market == SPOT and (o.spot_price_usd_per_hour is None or room[c.key] < c.instances):
            continue
        price_s = o.price_usd_per_hour(c.market) * c.instances / 3600.0
        moves = [(-1, m_any, 0)] + [(s_src, cost[dp.mode(i, s_src)], s_src) for s_src in range(min(1, dp.n_sub), dp.n_sub + 1)]
        for tag, src, s_src in moves:
            g = int(dp.prog[i, s_src])
            dst = dp.mode(i, min(s_src + 1, dp.n_sub))
            if g < n_w:
                cand = src[: n_w - g] + price_s * grid
                cur = new[dst, g:]
                better = cand < cur
                if better.any():
                    cur[better] = cand[better]
                    code[dst, g:][better] = tag
            # Finishing inside this tick: w + g >= goal, billed until the finish.
            lo = max(0, n_w - g) if g > 0 else n_w
            if lo < n_w:
                w_fin = ws[lo:]
                need_s = (dp.w_goal - w_fin) * dp.unit / c.rate
                fc = src[lo:] + price_s * (dp.busy[i, s_src] + need_s)
                j = int(np.argmin(fc))
                if fc[j] < best_fin - 1e-12:
                    best_fin, fin = float(fc[j]), (k, i, tag, int(w_fin[j]))
    return new, code, am, (best_fin, fin)


def _backtrack(dp: _Dp, fin: _Finish, arg_any: list[np.ndarray], src_code: list[np.ndarray]) -> list[Placement | None]:
    """What to hold in each tick up to the finishing one, walking the back-pointers from the finish."""
    k_fin, i_fin, tag, w = fin
    ticks: list[Placement | None] = [None] * (k_fin + 1)
    c = dp.cfgs[i_fin]
    ticks[k_fin] = Placement(c.key, c.market, c.instances)
    m = int(arg_any[k_fin][w]) if tag == -1 else dp.mode(i_fin, tag)
    for k in range(k_fin - 1, -1, -1):
        # (m, w): the state at the end of tick k. Walk back to the state before it.
        if m == 0:
            m = int(arg_any[k][w])
            continue
        i, _ = divmod(m - 1, dp.n_sub + 1)
        c = dp.cfgs[i]
        ticks[k] = Placement(c.key, c.market, c.instances)
        tag = int(src_code[k][m, w])
        s_src = 0 if tag == -1 else tag
        w -= int(dp.prog[i, s_src])
        m = int(arg_any[k][w]) if tag == -1 else dp.mode(i, s_src)
    return ticks


def plan_omniscient(sim: Simulation, job: SimJob, start_s: float, *, horizon_s: float | None = None) -> Plan:
    """The least-cost plan for ``job`` from ``start_s`` (grid-aligned) to its deadline."""
    start = sim.align(start_s)
    grid = sim.grid_s
    view = JobView(job_id=job.job_id, spec=job.spec, submitted_s=start, progress=0.0)
    cfgs = _configs(sim, job, view)
    if not cfgs:
        return Plan(start, grid, (), 0.0, False)
    dp = _dp(sim, job, cfgs, start, _horizon(sim, job, cfgs, start, horizon_s))
    cost = np.full((dp.n_modes, dp.n_w), np.inf)
    cost[0, 0] = 0.0
    arg_any: list[np.ndarray] = []
    src_code: list[np.ndarray] = []
    best: tuple[float, _Finish | None] = (np.inf, None)
    for k in range(dp.n_ticks):
        cost, code, am, best = _tick(dp, sim, k, cost, best)
        arg_any.append(am)
        src_code.append(code)
    best_fin, fin = best
    if fin is None:
        return Plan(start, grid, (), np.inf, False)
    return Plan(start, grid, tuple(_backtrack(dp, fin, arg_any, src_code)), best_fin, True)
