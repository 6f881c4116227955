"""The simulator: the controller's policy, run against a market trace in virtual time.

``simulate(trace, job, policy, start_s)`` replays one job. At each decision point it shows the policy
exactly what the controller would (a ``PolicyInput`` with the offerings of the moment, the job's held
instances, progress, spend, measured restart overhead, and the market history observed so far), then
applies the returned allocation the way the controller and the cloud would:

- Decisions happen on a grid (``grid_s``, 5 minutes by default: market traces change on it) at the
  market's change points and whenever the policy asked to be woken (``Allocation.next_decision_s``).
- A spot market whose ``spot_available`` drops below the instances held preempts the surplus, with the
  cloud's notice. The runtime checkpoints on the notice, so no work is lost when the notice is at least
  the checkpoint's save time; otherwise the work since the last periodic checkpoint is lost.
- Any change of the running gang (a worker added, removed or lost) restarts it: ``restart_overhead_s``
  of billed time without progress (the job's measured checkpoint + restart time).
- Billing is per second at the price of the moment; progress is the job's scaling model times the
  accelerator's speed (``cost_models.scaling``).
- The hard budget is enforced as the cloud bill would: a run that reaches it stops (a policy bug if it
  ever happens; the policy is meant to stop the job first with FAILED_BUDGET).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Any

from cloud_providers.base import SPOT, Offering
from cloud_providers.local.market import MarketTrace

from ..policy.base import Held, JobView, Policy, PolicyInput, eligible_offerings
from ..policy.jobmath import gang_rate
from ..spec import JobSpec
from .market_watch import MarketWatch

from cost_models.scaling import Scaling

GRID_S = 300.0
# The controller decides every few seconds; the simulator decides at least this often even when
# neither the market nor the policy's wake-up asks for it.
MAX_DECISION_GAP_S = 1800.0
MAX_SIM_S = 60 * 86400.0


@dataclasses.dataclass(frozen=True)
class SimJob:
    """A job as the simulator runs it."""

    spec: JobSpec
    scaling: Scaling
    restart_overhead_s: float
    # Seconds the runtime needs to write a checkpoint once notified (work is lost beyond the notice).
    checkpoint_save_s: float = 30.0
    job_id: str = "sim"

    def __post_init__(self) -> None:
        if self.restart_overhead_s < 0 or self.checkpoint_save_s < 0:
            raise ValueError("restart_overhead_s and checkpoint_save_s must be >= 0")

    @property
    def work(self) -> float:
        return self.spec.simulate.work_gpu_hours * 3600.0


@dataclasses.dataclass(frozen=True)
class SimResult:
    policy: str
    start_hours: float
    cost_usd: float
    finish_hours: float | None
    deadline_met: bool
    preemptions: int
    spot_hours: float
    on_demand_hours: float
    restarts: int
    state: str
    reason: str
    on_demand_cost_usd: float = 0.0

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in ("cost_usd", "spot_hours", "on_demand_hours", "start_hours", "on_demand_cost_usd"):
            d[k] = round(d[k], 6)
        if d["finish_hours"] is not None:
            d["finish_hours"] = round(d["finish_hours"], 6)
        return d


class Simulation:
    """Holds the per-trace precomputation (market watch, change points) for many runs."""

    def __init__(self, trace: MarketTrace, spec: JobSpec, *, grid_s: float = GRID_S) -> None:
        if grid_s <= 0:
            raise ValueError("grid_s must be positive")
        self.trace = trace
        self.grid_s = grid_s
        self.keys = [o.key for o in eligible_offerings(spec, trace.offerings_at(0.0))]
        self.watch = MarketWatch(trace, self.keys)
        times: set[float] = set()
        for k in self.keys:
            prev: Offering | None = None
            for t in trace.change_times():
                o = trace.offering_at(k, t)
                if o != prev:
                    times.add(t)
                prev = o
        self.change_times = sorted(times)

    def offerings_at(self, t: float) -> list[Offering]:
        return [self.trace.offering_at(k, t) for k in self.keys]

    def next_change(self, t: float) -> float:
        i = bisect.bisect_right(self.change_times, t)
        return self.change_times[i] if i < len(self.change_times) else math.inf

    def align(self, t: float) -> float:
        return math.ceil(t / self.grid_s - 1e-9) * self.grid_s

    def run(self, job: SimJob, policy: Policy, start_s: float, *, max_s: float = MAX_SIM_S) -> SimResult:
        return _run(self, job, policy, self.align(start_s), max_s)


def simulate(trace: MarketTrace, job: SimJob, policy: Policy, start_s: float = 0.0, *, grid_s: float = GRID_S) -> SimResult:
    return Simulation(trace, job.spec, grid_s=grid_s).run(job, policy, start_s)


def _run(sim: Simulation, job: SimJob, policy: Policy, start: float, max_s: float) -> SimResult:
    spec = job.spec
    work = job.work
    deadline = None if spec.objective.deadline_s is None else start + spec.objective.deadline_s
    budget = spec.objective.budget_usd
    holdings: dict[tuple[str, str], int] = {}
    progress = 0.0
    overhead_left = 0.0
    run_since_ckpt = 0.0
    cost = od_equiv = 0.0
    spot_h = od_h = 0.0
    preemptions = restarts = 0
    failures: dict[str, float] = {}
    t = start
    wake = start
    end = start + max_s
    state, reason = "RUNNING", ""
    finish: float | None = None
    while True:
        offers = {o.key: o for o in sim.offerings_at(t)}
        # 1. The market: preempt spot surplus (the notice was given; checkpoint if it is long enough).
        broken = False
        short_notice = False
        # The gang's rate before this event: the work since the last checkpoint was made at it.
        rate_before = gang_rate(job.scaling, ((offers[kk], nn) for (kk, _), nn in holdings.items())) if holdings else 0.0
        for (k, m), n in list(holdings.items()):
            if m != SPOT:
                continue
            room = offers[k].spot_available or 0
            if n > room:
                lost = n - room
                preemptions += lost
                broken = True
                if room:
                    holdings[(k, m)] = room
                else:
                    del holdings[(k, m)]
                if offers[k].notice_seconds < job.checkpoint_save_s and job.checkpoint_save_s > 0:
                    short_notice = True
        if short_notice:
            # A notice shorter than the checkpoint's save time: the gang restarts from the last
            # periodic checkpoint, losing what it did since (once per event, for the whole gang).
            progress = max(0.0, progress - rate_before * (run_since_ckpt % spec.checkpoint.interval_s))
        # 2. The policy (every loop iteration is an event: a market change, a wake-up or the start).
        view = JobView(
            job_id=job.job_id,
            spec=spec,
            submitted_s=start,
            progress=min(1.0, progress / work),
            held=tuple(Held(k, m, n, offers[k].gpus) for (k, m), n in sorted(holdings.items()) if n > 0),
            cost_so_far_usd=cost,
            restart_overhead_s=job.restart_overhead_s,
            recent_capacity_failures=dict(failures),
            scaling=job.scaling,
            since_checkpoint_s=run_since_ckpt % spec.checkpoint.interval_s,
            restarting=broken,
        )
        inp = PolicyInput(now_s=t, jobs=(view,), offerings=tuple(offers.values()), history=sim.watch.history_at(t), decision_interval_s=sim.grid_s)
        alloc = policy.decide(inp)[0]
        if alloc.outcome is not None:
            state, reason = alloc.outcome.state.value, alloc.reason
            break
        target: dict[tuple[str, str], int] = {}
        for p in alloc.placements:
            if p.instances <= 0 or p.offering_key not in offers:
                continue
            n = p.instances
            if p.market == SPOT:
                room = (offers[p.offering_key].spot_available or 0)
                if n > room:
                    failures[p.offering_key + "|" + SPOT] = t
                    n = room
            if n > 0:
                target[(p.offering_key, p.market)] = target.get((p.offering_key, p.market), 0) + n
        if target != holdings:
            holdings = target
            broken = True
        wake = t + MAX_DECISION_GAP_S
        if alloc.next_decision_s is not None:
            wake = min(wake, max(alloc.next_decision_s, math.nextafter(t, math.inf)))
        if broken and holdings:
            overhead_left = job.restart_overhead_s
            run_since_ckpt = 0.0
            restarts += 1
        # 3. Advance to the next event.
        parts = [(offers[k], n) for (k, _), n in holdings.items()]
        rate = gang_rate(job.scaling, parts)
        price_s = sum(offers[k].price_usd_per_hour(m) * n for (k, m), n in holdings.items()) / 3600.0
        od_price_s = sum(offers[k].on_demand_price_usd_per_hour * n for (k, m), n in holdings.items()) / 3600.0
        spot_n = sum(n for (k, m), n in holdings.items() if m == SPOT)
        od_n = sum(n for (k, m), n in holdings.items() if m != SPOT)
        t_next = min(sim.next_change(t), wake, end)
        if t_next == math.inf:
            t_next = end
        dt = t_next - t
        done_in = overhead_left + (work - progress) / rate if rate > 0 else math.inf
        if done_in <= dt:
            dt = done_in
        if budget is not None and price_s > 0 and cost + price_s * dt > budget + 1e-9:
            dt = max(0.0, (budget - cost) / price_s)
            state, reason = "FAILED_BUDGET", "hard budget reached by the bill (the policy should have stopped earlier)"
        cost += price_s * dt
        od_equiv += od_price_s * dt
        spot_h += spot_n * dt / 3600.0
        od_h += od_n * dt / 3600.0
        useful = max(0.0, dt - overhead_left)
        progress += rate * useful
        run_since_ckpt += useful
        overhead_left = max(0.0, overhead_left - dt)
        t += dt
        if state == "FAILED_BUDGET":
            break
        if rate > 0 and progress >= work - 1e-6:
            finish, state, reason = t, "SUCCEEDED", "work done"
            break
        if t >= end:
            state, reason = "UNFINISHED", "simulation horizon reached"
            break
    met = finish is not None and (deadline is None or finish <= deadline + 1e-6)
    return SimResult(
        policy=getattr(policy, "name", type(policy).__name__),
        start_hours=start / 3600.0,
        cost_usd=cost,
        finish_hours=None if finish is None else (finish - start) / 3600.0,
        deadline_met=met,
        preemptions=preemptions,
        spot_hours=spot_h,
        on_demand_hours=od_h,
        restarts=restarts,
        state=state,
        reason=reason,
        on_demand_cost_usd=od_equiv,
    )

