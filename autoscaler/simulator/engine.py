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
  accelerator's speed (``cost_models.scaling``). A new gang in another region or cloud than the one
  that wrote the job's state carries it: egress at the catalog's price for ``checkpoint.size_gb``,
  billed into the cost (``policy.moves.carry_state``, the controller's rule), and counted
  (``SimResult.egress_usd``, ``region_moves``).
- The policy sees what a real cloud shows (``oracle=False``, the default): prices, and spot room only
  as its launches, capacity refusals and preemptions revealed it (``fleet.market_watch.RoomWatcher``,
  the controller's own bookkeeping); a refused launch wakes it a decision interval later, as the
  controller's next tick. ``oracle=True`` shows it the trace's room and the market history watched
  since the trace began (research: no real cloud reports either).
- The hard budget is the controller's own (``controller/budget.py``): the guard first at every event
  (spend plus the burn rate until its next check, at the controller's horizon for a ``grid_s`` tick),
  a wake-up when it would stop the job, and the launch check before instances are added. The policy
  sees its job through the controller's ``held_from_counts`` and ``progress_of`` and the burn rate is
  ``accounting``'s, so what ``spotrain tune`` optimizes here is what the controller runs
  (``tests/policy/test_fast_path.py`` compares them start by start, with and without a budget).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
from typing import Any

from autoscaler.fleet.accounting import holdings_burn_rate_usd_per_hour
from autoscaler.fleet.market_watch import RoomWatcher
from autoscaler.jobs.spec import JobSpec
from cloud_providers.base import SPOT, Offering
from cloud_providers.local.market import MarketTrace
from cost_models.scaling import Scaling

from ..controller.budget import guard_left_s, guard_reason, horizon_s, launch_reason, price_caps
from ..controller.views import held_from_counts, progress_of
from ..policy.base import Allocation, JobView, MarketHistory, Policy, PolicyInput, eligible_offerings
from ..policy.jobmath import gang_rate
from ..policy.moves import carry_state, gang_location
from .executor import STEP_EPS, STEPS_PER_S
from .market_watch import MarketWatch

GRID_S = 300.0
# The controller decides every few seconds; the simulator decides at least this often even when
# neither the market nor the policy's wake-up asks for it.
MAX_DECISION_GAP_S = 1800.0
MAX_SIM_S = 60 * 86400.0
# Times closer than this are one moment (a wake-up computed a rounding error before a market change).
SAME_MOMENT_S = 0.05


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
    # Money for carrying the job's state to another region or cloud (included in ``cost_usd``), and
    # how many such moves it made (issue 23).
    egress_usd: float = 0.0
    region_moves: int = 0

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in ("cost_usd", "spot_hours", "on_demand_hours", "start_hours", "on_demand_cost_usd", "egress_usd"):
            d[k] = round(d[k], 6)
        if d["finish_hours"] is not None:
            d["finish_hours"] = round(d["finish_hours"], 6)
        return d


class Simulation:
    """Holds the per-trace precomputation (market watch, change points) for many runs."""

    def __init__(self, trace: MarketTrace, spec: JobSpec, *, grid_s: float = GRID_S, oracle: bool = False) -> None:
        """``oracle``: the policy sees the trace's spot room (research; no real cloud reports it)."""
        if grid_s <= 0:
            raise ValueError("grid_s must be positive")
        self.trace = trace
        self.grid_s = grid_s
        self.oracle = oracle
        self.keys = [o.key for o in eligible_offerings(spec, trace.offerings_at(0.0))]
        times: set[float] = set()
        for k in self.keys:
            prev: Offering | None = None
            for t in trace.change_times():
                o = trace.offering_at(k, t)
                if o != prev:
                    times.add(t)
                prev = o
        self.change_times = sorted(times)

    @functools.cached_property
    def watch(self) -> MarketWatch:
        """What watching the trace's room showed (the oracle's market history)."""
        return MarketWatch(self.trace, self.keys)

    def offerings_at(self, t: float) -> list[Offering]:
        return [self.trace.offering_at(k, t) for k in self.keys]

    def next_change(self, t: float) -> float:
        i = bisect.bisect_right(self.change_times, t)
        return self.change_times[i] if i < len(self.change_times) else math.inf

    def align(self, t: float) -> float:
        return math.ceil(t / self.grid_s - 1e-9) * self.grid_s

    def run(self, job: SimJob, policy: Policy, start_s: float, *, max_s: float = MAX_SIM_S) -> SimResult:
        return _run(self, job, policy, self.align(start_s), max_s)


def simulate(trace: MarketTrace, job: SimJob, policy: Policy, start_s: float = 0.0, *, grid_s: float = GRID_S,
             oracle: bool = False) -> SimResult:
    return Simulation(trace, job.spec, grid_s=grid_s, oracle=oracle).run(job, policy, start_s)


@dataclasses.dataclass
class _Run:
    """One run's state between events (the fast path's stand-in for the controller's database)."""

    t: float
    holdings: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    progress: float = 0.0
    overhead_left: float = 0.0
    run_since_ckpt: float = 0.0
    cost: float = 0.0
    od_equiv: float = 0.0
    spot_h: float = 0.0
    od_h: float = 0.0
    preemptions: int = 0
    restarts: int = 0
    failures: dict[str, float] = dataclasses.field(default_factory=dict)
    state: str = "RUNNING"
    reason: str = ""
    finish: float | None = None
    # Moments the controller would decide again although the market did not change: a stopped gang
    # exits, a preempted instance is taken back, a restarted gang makes its first step.
    events: list[float] = dataclasses.field(default_factory=list)
    # When the current gang's training moves again after its restart (None: no restart pending).
    resume_at: float | None = None
    # Until when the last gang is still checkpointing and exiting (the controller's RESCALING or
    # RECOVERING: a change of allocation then costs no extra restart).
    stopping_until: float = -math.inf
    # What the controller's instance history says of each spot offering: seconds held, preemptions.
    spot_held_s: dict[str, float] = dataclasses.field(default_factory=dict)
    preempted: dict[str, int] = dataclasses.field(default_factory=dict)
    # Instances gone from the allocation that still bill until a moment (a notice running out, a gang
    # checkpointing before release): (offering key, market, count, until). Billed up front; the
    # budget guard counts them in the burn rate while they last, as the controller's rows do.
    leaving: list[tuple[str, str, int, float]] = dataclasses.field(default_factory=list)
    # Where the job's state lives (``cloud/region``), the egress billed for moving it, and the moves.
    location: str | None = None
    egress_usd: float = 0.0
    region_moves: int = 0
    # Spot room as the run's launches, refusals and preemptions showed it (without the oracle).
    rooms: RoomWatcher = dataclasses.field(default_factory=RoomWatcher)


def _preempt(job: SimJob, r: _Run, offers: dict[str, Offering]) -> bool:
    """The market: preempt spot surplus (the notice was given; checkpoint if it is long enough).
    Returns whether the gang broke."""
    broken = short_notice = False
    # The gang's rate before this event: the work since the last checkpoint was made at it.
    rate_before = gang_rate(job.scaling, ((offers[kk], nn) for (kk, _), nn in r.holdings.items())) if r.holdings else 0.0
    for (k, m), n in list(r.holdings.items()):
        if m != SPOT:
            continue
        room = offers[k].spot_available or 0
        if n > room:
            r.preemptions += n - room
            r.preempted[k] = r.preempted.get(k, 0) + n - room
            r.rooms.saw(k, r.t, False)
            broken = True
            r.events += [r.t + job.checkpoint_save_s, r.t + offers[k].notice_seconds]
            r.stopping_until = r.t + job.checkpoint_save_s
            # The cloud bills a preempted instance until its notice runs out (the controller keeps
            # it until the cloud takes it back).
            _bill(r, offers[k], m, (n - room) * offers[k].notice_seconds)
            r.leaving.append((k, m, n - room, r.t + offers[k].notice_seconds))
            if room:
                r.holdings[(k, m)] = room
            else:
                del r.holdings[(k, m)]
            if offers[k].notice_seconds < job.checkpoint_save_s and job.checkpoint_save_s > 0:
                short_notice = True
    if short_notice:
        # A notice shorter than the checkpoint's save time: the gang restarts from the last
        # periodic checkpoint, losing what it did since (once per event, for the whole gang).
        r.progress = max(0.0, r.progress - rate_before * (r.run_since_ckpt % job.spec.checkpoint.interval_s))
    if broken:
        # Checkpointed on the notice, or back at the last checkpoint: nothing is at risk now.
        r.run_since_ckpt = 0.0
    return broken


def _bill(r: _Run, o: Offering, market: str, instance_s: float) -> None:
    """Instance-seconds billed outside the run's intervals (a notice, a checkpoint before release)."""
    h = instance_s / 3600.0
    if market == SPOT:
        r.spot_held_s[o.key] = r.spot_held_s.get(o.key, 0.0) + instance_s
    r.cost += h * o.price_usd_per_hour(market)
    r.od_equiv += h * o.on_demand_price_usd_per_hour
    if market == SPOT:
        r.spot_h += h
    else:
        r.od_h += h


def _billed_so_far(r: _Run, offers: dict[str, Offering]) -> float:
    """The bill up to now, as the controller reads it from the cloud: the run's cost less what its
    leaving instances will still bill (``_bill`` charges them up front)."""
    ahead = sum(n * offers[k].price_usd_per_hour(m) * (until - r.t) / 3600.0 for k, m, n, until in r.leaving if until > r.t)
    return r.cost - ahead


def _end(r: _Run, offers: dict[str, Offering]) -> None:
    """The job ended: the controller terminates every instance, so those still leaving bill no more."""
    for k, m, n, until in r.leaving:
        if until > r.t:
            _bill(r, offers[k], m, -n * (until - r.t))
    r.leaving = []


def _decide(sim: Simulation, job: SimJob, policy: Policy, r: _Run, offers: dict[str, Offering], start: float,
            broken: bool) -> Allocation:
    view = JobView(
        job_id=job.job_id,
        spec=job.spec,
        submitted_s=start,
        progress=_reported_progress(r.progress, job.work),
        held=held_from_counts(r.holdings, offers),
        cost_so_far_usd=_billed_so_far(r, offers),
        restart_overhead_s=job.restart_overhead_s,
        recent_capacity_failures=dict(r.failures),
        scaling=job.scaling,
        since_checkpoint_s=r.run_since_ckpt % job.spec.checkpoint.interval_s if r.holdings else 0.0,
        # Holding nothing, just broken, or too few instances for a gang (the cloud refused part of
        # it, so none started): a change of allocation costs no extra restart.
        restarting=broken or not r.holdings or r.t <= r.stopping_until + 1e-9 or _short(job, r, offers),
        state_location=r.location if r.progress > 0 else None,
        region_moves=r.region_moves,
    )
    if sim.oracle:
        history = sim.watch.history_at(r.t)
        shown = tuple(offers.values())
    else:
        # What a real cloud shows: prices, and room only as the run's own launches revealed it.
        history = {}
        held_spot = {k: n for (k, m), n in r.holdings.items() if m == SPOT and n > 0}
        for k in held_spot:
            r.rooms.holding(k, r.t)
        shown = tuple(r.rooms.believed((o if o.spot_available is None else dataclasses.replace(o, spot_available=None)
                                        for o in offers.values()), held_spot, r.t))
    for k in set(r.spot_held_s) | set(r.preempted):
        base = MarketHistory(k, r.spot_held_s.get(k, 0.0), r.preempted.get(k, 0))
        w = history.get(k)
        history[k] = base if w is None else dataclasses.replace(w, spot_seconds_held=base.spot_seconds_held,
                                                                preemptions=base.preemptions)
    inp = PolicyInput(now_s=r.t, jobs=(view,), offerings=shown, history=history,
                      decision_interval_s=sim.grid_s)
    return policy.decide(inp)[0]


def _carry(job: SimJob, r: _Run, offers: dict[str, Offering]) -> None:
    """A new gang starts: the state it restores comes along (``policy.moves.carry_state``, the
    controller's rule), its egress billed into the run's cost (and so the budget guard)."""
    loc = gang_location((offers[k].cloud, offers[k].region, n * offers[k].gpus) for (k, _), n in r.holdings.items())
    size_gb = job.spec.checkpoint.size_gb or 0.0
    r.location, egress, moved = carry_state(r.location, loc, has_state=r.progress > 0, size_gb=size_gb)
    r.cost += egress
    r.egress_usd += egress
    r.region_moves += int(moved)


def _reported_progress(done: float, work: float) -> float:
    """The fraction of work done as the controller reads it from the simulated workers' reports
    (whole steps of ``executor.STEPS_PER_S`` per reference GPU-second)."""
    total = max(1, int(math.ceil(work * STEPS_PER_S - 1e-9)))
    progress = progress_of(int(math.floor(done * STEPS_PER_S + STEP_EPS)), total)
    assert progress is not None
    return progress


def _short(job: SimJob, r: _Run, offers: dict[str, Offering]) -> bool:
    """Whether what is held is too few GPUs for the job's gang (the cloud refused part of it): the
    controller starts no gang on them (``allocate._gang_allowed``), so nothing runs or checkpoints."""
    return sum(offers[k].gpus * n for (k, _), n in r.holdings.items()) < job.spec.workers.min


def _target(alloc: Allocation, r: _Run, offers: dict[str, Offering]) -> tuple[dict[tuple[str, str], int], bool]:
    """What the allocation holds once the cloud has refused spot beyond its room, and whether it refused."""
    target: dict[tuple[str, str], int] = {}
    refused = False
    for p in alloc.placements:
        if p.instances <= 0 or p.offering_key not in offers:
            continue
        n = p.instances
        if p.market == SPOT:
            room = (offers[p.offering_key].spot_available or 0)
            held = r.holdings.get((p.offering_key, SPOT), 0)
            if n > held and room > held:
                r.rooms.saw(p.offering_key, r.t, True)  # launches succeeded (the first ones, at least)
            if n > room:
                r.failures[p.offering_key + "|" + SPOT] = r.t
                r.rooms.saw(p.offering_key, r.t, False)  # a refused launch: an observation, not a preemption
                n = room
                refused = True
        if n > 0:
            target[(p.offering_key, p.market)] = target.get((p.offering_key, p.market), 0) + n
    return target, refused


def _advance(sim: Simulation, job: SimJob, r: _Run, offers: dict[str, Offering], wake: float, end: float) -> bool:
    """Bill and progress to the next event; True when the run has ended."""
    h = r.holdings
    rate = gang_rate(job.scaling, [(offers[k], n) for (k, _), n in h.items()])
    if _short(job, r, offers):
        # Fewer GPUs than the job needs (a gang the cloud refused in part): the controller starts no
        # gang on them (``allocate._gang_allowed``); they bill until the next decision lets them go.
        rate = 0.0
    price_s = sum(offers[k].price_usd_per_hour(m) * n for (k, m), n in h.items()) / 3600.0
    od_price_s = sum(offers[k].on_demand_price_usd_per_hour * n for (k, m), n in h.items()) / 3600.0
    spot_n = sum(n for (k, m), n in h.items() if m == SPOT)
    od_n = sum(n for (k, m), n in h.items() if m != SPOT)
    nc = sim.next_change(r.t)
    if 0 < nc - wake < SAME_MOMENT_S:
        wake = nc  # a wake-up a hair before a market change is that change
    t_next = min(nc, wake, end)
    if t_next == math.inf:
        t_next = end
    dt = t_next - r.t
    done_in = r.overhead_left + (job.work - r.progress) / rate if rate > 0 else math.inf
    if done_in <= dt:
        dt = done_in
    r.cost += price_s * dt
    r.od_equiv += od_price_s * dt
    r.spot_h += spot_n * dt / 3600.0
    for (k, m), n in h.items():
        if m == SPOT:
            r.spot_held_s[k] = r.spot_held_s.get(k, 0.0) + n * dt
    r.od_h += od_n * dt / 3600.0
    useful = max(0.0, dt - r.overhead_left)
    r.progress += rate * useful
    r.run_since_ckpt += useful
    r.overhead_left = max(0.0, r.overhead_left - dt)
    r.t += dt
    if rate > 0 and r.progress >= job.work - 1e-6:
        r.finish, r.state, r.reason = r.t, "SUCCEEDED", "work done"
        return True
    if r.t >= end:
        r.state, r.reason = "UNFINISHED", "simulation horizon reached"
        return True
    return False


class _Budget:
    """The controller's hard budget (``controller/budget.py``) over the fast path's holdings: its tick is
    the decision grid, every watched offering's change wakes it (so the last price seen holds until
    the next event), and the local cloud bills no minimum."""

    def __init__(self, sim: Simulation, job: SimJob) -> None:
        self.budget_usd = job.spec.objective.budget_usd
        self.horizon_s = horizon_s(sim.grid_s, 0.0, 1.0)
        self.seen = frozenset(sim.keys)

    def _rate(self, r: _Run, offers: dict[str, Offering]) -> float:
        prices = {k: (o.on_demand_price_usd_per_hour, o.spot_price_usd_per_hour) for k, o in offers.items()}
        r.leaving = [x for x in r.leaving if x[3] > r.t + 1e-9]
        alive = dict(r.holdings)
        for k, m, n, _ in r.leaving:
            alive[(k, m)] = alive.get((k, m), 0) + n
        return holdings_burn_rate_usd_per_hour(alive, price_caps(prices, self.seen))

    def guard(self, r: _Run, offers: dict[str, Offering]) -> str | None:
        if self.budget_usd is None:
            return None
        return guard_reason(_billed_so_far(r, offers), self.budget_usd, self._rate(r, offers), self.horizon_s)

    def launch(self, r: _Run, target: dict[tuple[str, str], int], offers: dict[str, Offering]) -> str | None:
        if self.budget_usd is None:
            return None
        prices = [offers[k].price_usd_per_hour(m) for (k, m), n in target.items() for _ in range(n - r.holdings.get((k, m), 0))]
        if not prices:
            return None
        billed_usd = _billed_so_far(r, offers)
        return launch_reason(billed_usd, self.budget_usd, self._rate(r, offers), self.horizon_s, prices, self.horizon_s)

    def due_s(self, r: _Run, offers: dict[str, Offering]) -> float | None:
        if self.budget_usd is None:
            return None
        left = guard_left_s(_billed_so_far(r, offers), self.budget_usd, self._rate(r, offers), self.horizon_s)
        return None if left is None else r.t + max(left, 1.0)


def _run(sim: Simulation, job: SimJob, policy: Policy, start: float, max_s: float) -> SimResult:
    r = _Run(t=start)
    end = start + max_s
    budget = _Budget(sim, job)
    while True:
        offers = {o.key: o for o in sim.offerings_at(r.t)}
        # The controller's tick: the budget guard first, then the cloud's news, then the policy.
        if (why := budget.guard(r, offers)) is not None:
            r.state, r.reason = "FAILED_BUDGET", why
            break
        broken = _preempt(job, r, offers)
        # The policy (every loop iteration is an event: a market change, a wake-up or the start).
        alloc = _decide(sim, job, policy, r, offers, start, broken)
        if alloc.outcome is not None:
            r.state, r.reason = alloc.outcome.state.value, alloc.reason
            break
        target, refused = _target(alloc, r, offers)
        if refused and not sim.oracle and not broken and r.holdings and r.t > r.stopping_until + 1e-9:
            # The controller launches a running gang's move first where the cloud reports no room: a
            # refusal leaves the gang running and what did launch goes back at once.
            target = r.holdings
        if target != r.holdings and (why := budget.launch(r, target, offers)) is not None:
            # The controller's launch check: a running gang that was only to grow keeps running as it
            # is; anything else ends the job.
            running = not broken and bool(r.holdings) and r.t > r.stopping_until + 1e-9
            growing = running and all(target.get(km, 0) >= n for km, n in r.holdings.items())
            if not growing:
                r.state, r.reason = "FAILED_BUDGET", why
                break
            target = r.holdings
        if target != r.holdings:
            # A gang runs on what is held unless the last one is still exiting (the new one starts
            # only then) or too few instances were granted for one to start: a running gang
            # checkpoints and exits before its instances go.
            running = not broken and bool(r.holdings) and r.t > r.stopping_until + 1e-9 and not _short(job, r, offers)
            if running:
                r.events.append(r.t + job.checkpoint_save_s)
                r.stopping_until = r.t + job.checkpoint_save_s
                # The running gang is told to stop: what it leaves bills on while it checkpoints and
                # exits (the controller releases it once it has).
                for (k, m), n in r.holdings.items():
                    if n > target.get((k, m), 0):
                        _bill(r, offers[k], m, (n - target.get((k, m), 0)) * job.checkpoint_save_s)
                        r.leaving.append((k, m, n - target.get((k, m), 0), r.t + job.checkpoint_save_s))
            r.holdings = target
            _carry(job, r, offers)
            r.resume_at = None  # the gang that was restarting never runs
            broken = True
        wake = r.t + MAX_DECISION_GAP_S
        if alloc.next_decision_s is not None:
            wake = min(wake, max(alloc.next_decision_s, math.nextafter(r.t, math.inf)))
        if not sim.oracle:
            if any(t >= r.t for t in r.failures.values()):
                wake = min(wake, r.t + sim.grid_s)  # refused: the controller's next tick decides again
            if (retry := r.rooms.next_try_s(r.t)) is not None:
                wake = min(wake, retry)  # an offering believed full is worth trying again
        if broken and r.holdings:
            r.overhead_left = job.restart_overhead_s
            r.run_since_ckpt = 0.0
            r.restarts += 1
            r.resume_at = r.t + job.restart_overhead_s
        r.events = [x for x in r.events if x > r.t]
        pending = r.events + ([r.resume_at] if r.resume_at is not None and r.resume_at > r.t else [])
        if pending:
            wake = min(wake, min(pending))
        if (due := budget.due_s(r, offers)) is not None:
            wake = min(wake, due)  # the guard must see the spend before it could cross the budget
        if _advance(sim, job, r, offers, wake, end):
            break
    _end(r, {o.key: o for o in sim.offerings_at(r.t)})
    deadline = None if job.spec.objective.deadline_s is None else start + job.spec.objective.deadline_s
    met = r.finish is not None and (deadline is None or r.finish <= deadline + 1e-6)
    return SimResult(
        policy=getattr(policy, "name", type(policy).__name__), start_hours=start / 3600.0, cost_usd=r.cost,
        finish_hours=None if r.finish is None else (r.finish - start) / 3600.0, deadline_met=met,
        preemptions=r.preemptions, spot_hours=r.spot_h, on_demand_hours=r.od_h, restarts=r.restarts,
        state=r.state, reason=r.reason, on_demand_cost_usd=r.od_equiv, egress_usd=r.egress_usd,
        region_moves=r.region_moves,
    )
