"""The simulator is the controller: one ``Controller`` on a virtual clock over a market trace.

``World`` wires the real parts together — the controller (budget guard, minimum bills, back-off,
settle/grace, recovery, market watching), the local cloud's provider replaying the trace in market
time, a real SQLite database in memory — with the one simulated part, the executor's workers
(``executor.py``). Its loop calls ``Controller.tick()`` at every moment something can happen and
jumps the clock between them: a change of an offering in the trace, a worker event (an exit, the
first step after a restart), a notice that runs out, a wake-up the policy asked for, a submission,
and at least every ``MAX_DECISION_GAP_S``. Nothing the controller does is re-implemented here.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

from sqlalchemy import select

from autoscaler.jobs.domain import JobState
from autoscaler.jobs.spec import JobSpec
from cloud_providers.base import ON_DEMAND, SPOT, Offering
from cloud_providers.clock import VirtualClock
from cloud_providers.local.market import MarketTrace
from cloud_providers.local.provider import LocalProvider
from cost_models.scaling import Scaling

from ..controller import Controller, Hooks, Timings
from ..controller.budget import guard_due_s
from ..policy import Policy
from ..state import InstanceRow, Job, Store
from .engine import SimJob, SimResult
from .executor import SimulatedExecutor, SimWorkload
from .market_watch import MarketWatch

GRID_S = 300.0
# The simulator wakes the controller at least this often even when nothing asks for it.
MAX_DECISION_GAP_S = 1800.0
# Times closer than this are one moment (a wake-up computed a rounding error before a market change).
SAME_MOMENT_S = 0.05
SIM_STORE = "file:///simulated/checkpoints"


@dataclasses.dataclass(frozen=True)
class JobOutcome:
    """How one job ended in a world (times in the market clock)."""

    job_id: str
    state: str
    reason: str
    submitted_s: float
    finished_s: float | None
    cost_usd: float
    on_demand_cost_usd: float
    preemptions: int
    attempts: int
    spot_hours: float
    on_demand_hours: float
    deadline_s: float | None
    egress_usd: float = 0.0
    region_moves: int = 0

    @property
    def deadline_met(self) -> bool:
        if self.state != JobState.SUCCEEDED.value or self.finished_s is None:
            return False
        return self.deadline_s is None or self.finished_s - self.submitted_s <= self.deadline_s + 1e-6


class World:
    def __init__(self, trace: MarketTrace, policy: Policy, *, start_s: float = 0.0, grid_s: float = GRID_S,
                 min_billed_s: float = 0.0, timings: Timings | None = None, watch_keys: Iterable[str] | None = None,
                 market_watch: MarketWatch | None = None, oracle: bool = False) -> None:
        """``watch_keys``: the offerings whose changes wake the controller (default: all of the trace).
        ``oracle``: the local cloud reports the trace's spot room (no real cloud does), and the
        controller starts from ``market_watch``, what watching that room since the trace's start
        showed (default: computed here), as a running service would. Off (the default), the
        controller learns room only from its launches, capacity errors and preemptions."""
        if grid_s <= 0:
            raise ValueError("grid_s must be positive")
        self.trace = trace
        # The controller's clock is the market's: virtual seconds are trace seconds.
        self.clock = VirtualClock(start_s)
        self.executor = SimulatedExecutor(self.clock, offering_of=self._offering_of, launched_at_s=self._launched_at_s,
                                          now_s=self._now_s)
        self.provider = LocalProvider(root=None, trace=trace, time_scale=1.0, start_offset_s=start_s,
                                      min_notice_real_s=0.0, clock=self.clock.now, on_terminate=self.executor.stop,
                                      min_billed_s=min_billed_s, oracle=oracle)
        self.store = Store("sqlite://")
        self._scaling: dict[str, Scaling] = {}
        keys = list(watch_keys) if watch_keys is not None else None
        self._change_times = _change_times(trace, keys)
        seed = None
        if oracle:
            seed = (market_watch or MarketWatch(trace, keys if keys is not None else trace.keys)).watches_at(start_s)
        hooks = Hooks(logs_dir=lambda job_id: Path("simulated") / job_id,
                      scaling_of=lambda job_id, spec: self._scaling.get(job_id),
                      prices_seen_on_change=frozenset(keys if keys is not None else trace.keys),  # each change wakes it
                      market_seed=seed)
        self.controller = Controller(store=self.store, provider=self.provider, executor=self.executor, policy=policy,
                                     controller_id="sim", tick_s=grid_s, clock_rate=1.0, clock=self.clock,
                                     timings=timings, strict=True, hooks=hooks)
        self._finished: dict[str, float] = {}
        self._live: set[str] = set()

    # ----- wiring -----
    def _now_s(self) -> float:
        return self.provider.now_s()

    def _launched_at_s(self, instance_id: str) -> float | None:
        inst = self.provider.get(instance_id)
        return None if inst is None else inst.launched_at_s

    def _offering_of(self, instance_id: str) -> Offering | None:
        inst = self.provider.get(instance_id)
        return None if inst is None else self.trace.offering_at(inst.offering_key, self.provider.now_s())

    # ----- jobs -----
    def submit(self, spec: JobSpec, workload: SimWorkload) -> str:
        """Submit a job whose simulated workers do ``workload``; the controller starts from its restart
        overhead as if it had measured it."""
        if spec.checkpoint.store is None:
            spec = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"store": SIM_STORE})})
        job_id = str(self.controller.submit(spec, Path("."))["job_id"])
        self.executor.add_job(job_id, workload)
        self._scaling[job_id] = workload.scaling
        with self.store.session() as s:
            job = s.get(Job, job_id)
            assert job is not None
            job.restart_overhead_s = workload.restart_overhead_s
        self._live.add(job_id)
        return job_id

    def outcome(self, job_id: str) -> JobOutcome:
        with self.store.session() as s:
            job = s.get(Job, job_id)
            assert job is not None
            rows = list(s.scalars(select(InstanceRow).where(InstanceRow.job_id == job_id)))
            spec = self.controller.ctx.spec(job)
            state = job.state if JobState(job.state).terminal else "UNFINISHED"
            return JobOutcome(
                job_id=job_id, state=state, reason=job.reason if state != "UNFINISHED" else "simulation horizon reached",
                submitted_s=job.submitted_clock_s, finished_s=self._finished.get(job_id), cost_usd=job.cost_usd,
                on_demand_cost_usd=job.on_demand_cost_usd, preemptions=job.preemptions, attempts=job.attempt,
                spot_hours=sum(r.billed_seconds for r in rows if r.market == SPOT) / 3600.0,
                on_demand_hours=sum(r.billed_seconds for r in rows if r.market == ON_DEMAND) / 3600.0,
                deadline_s=spec.objective.deadline_s, egress_usd=job.egress_usd or 0.0, region_moves=job.region_moves or 0,
            )

    def events(self, job_id: str) -> list[tuple[float, str, str, str]]:
        """The job's event history: (controller-clock time, kind, to_state, reason)."""
        with self.store.session() as s:
            return [(e.ts, e.kind, e.to_state, e.reason) for e in self.store.events(s, job_id)]

    # ----- the loop -----
    def _next_time(self, now: float, horizon_s: float, submits: Sequence[float]) -> float:
        i = bisect.bisect_right(self._change_times, now + 1e-9)
        cands = [horizon_s, now + MAX_DECISION_GAP_S, self.executor.next_event_s(), self.provider.next_event_s()]
        if i < len(self._change_times):
            cands.append(self._change_times[i])
        wake = self.controller.ctx.next_wake_s
        if wake is not None and i < len(self._change_times) and 0 < self._change_times[i] - wake < SAME_MOMENT_S:
            wake = self._change_times[i]  # a wake-up a hair before a market change is that change
        if wake is not None:
            # Exactly when asked; a wake-up due now means "decide again at once" (the service would
            # at its next tick).
            cands.append(max(wake, now + 1e-6))
        cands.extend(t for t in submits if t > now + 1e-9)
        if any(t >= now - 1e-9 for f in self.controller.ctx.capacity_failures.values() for t in f.values()):
            # A launch was refused just now: the service would decide again at its next tick (and
            # fail over), not wait for the market to change.
            cands.append(now + self.controller.ctx.tick_s)
        retry = None if self.provider.oracle else self.controller.ctx.rooms.next_try_s(now)
        if retry is not None:
            # An offering believed full becomes worth a launch attempt: the service's next tick would
            # see it then (the simulator must not wait for the market's next change, which the
            # controller cannot know of).
            cands.append(retry)
        with self.store.session() as s:
            for job_id in self._live:
                job = s.get(Job, job_id)
                due = None if job is None else guard_due_s(self.controller.ctx, s, job)
                if due is not None:
                    # The guard must see the spend before it could cross the budget (the service
                    # ticks every few seconds; this loop only when something happens).
                    cands.append(max(due, now + 1.0))
        return min(c for c in cands if c > now + 1e-9)

    def _note_finished(self) -> None:
        if not self._live:
            return
        with self.store.session() as s:
            ended = [j for j, st in s.execute(select(Job.job_id, Job.state).where(Job.job_id.in_(self._live)))
                     if JobState(st).terminal]
        for j in ended:
            self._finished[j] = self.provider.now_s()
            self._live.discard(j)

    def run(self, *, horizon_s: float, arrivals: Sequence[tuple[float, JobSpec, SimWorkload]] = ()) -> dict[str, str]:
        """Tick until every job has ended (or the market clock reaches ``horizon_s``). ``arrivals``:
        jobs to submit at market times. Returns each arrival's index -> job id."""
        pending = sorted(range(len(arrivals)), key=lambda k: arrivals[k][0])
        ids: dict[str, str] = {}
        while True:
            now = self.provider.now_s()
            while pending and arrivals[pending[0]][0] <= now + 1e-9:
                k = pending.pop(0)
                ids[str(k)] = self.submit(arrivals[k][1], arrivals[k][2])
            self.controller.tick()
            self._note_finished()
            if (not self._live and not pending) or now >= horizon_s - 1e-9:
                return ids
            t = self._next_time(now, horizon_s, [arrivals[k][0] for k in pending])
            if t == math.inf:
                t = horizon_s
            self.clock.advance_to(t)


def _change_times(trace: MarketTrace, keys: Iterable[str] | None) -> list[float]:
    if keys is None:
        return sorted(set(trace.change_times()))
    times: set[float] = set()
    for k in keys:
        prev: Offering | None = None
        for t in trace.change_times():
            o = trace.offering_at(k, t)
            if o != prev:
                times.add(t)
            prev = o
    return sorted(times)


def run_job(trace: MarketTrace, job: SimJob, policy: Policy, start_s: float, *, grid_s: float = GRID_S,
            watch_keys: Iterable[str] | None = None, max_s: float = 60 * 86400.0, min_billed_s: float = 0.0,
            market_watch: MarketWatch | None = None, oracle: bool = False) -> SimResult:
    """One job from ``start_s`` (aligned to the decision grid, as the market's changes are) through
    the controller; the result in the simulator's contract form."""
    start = math.ceil(start_s / grid_s - 1e-9) * grid_s
    world = World(trace, policy, start_s=start, grid_s=grid_s, watch_keys=watch_keys, min_billed_s=min_billed_s,
                  market_watch=market_watch, oracle=oracle)
    workload = SimWorkload(work_s=job.work, scaling=job.scaling, restart_overhead_s=job.restart_overhead_s,
                           checkpoint_save_s=job.checkpoint_save_s, checkpoint_interval_s=job.spec.checkpoint.interval_s)
    job_id = world.submit(job.spec, workload)
    world.run(horizon_s=start + max_s)
    o = world.outcome(job_id)
    done = o.state == JobState.SUCCEEDED.value and o.finished_s is not None
    return SimResult(
        policy=getattr(policy, "name", type(policy).__name__), start_hours=start / 3600.0, cost_usd=o.cost_usd,
        finish_hours=(o.finished_s - start) / 3600.0 if done and o.finished_s is not None else None,
        deadline_met=o.deadline_met, preemptions=o.preemptions, spot_hours=o.spot_hours,
        on_demand_hours=o.on_demand_hours, restarts=o.attempts, state=o.state, reason=o.reason,
        on_demand_cost_usd=o.on_demand_cost_usd, egress_usd=o.egress_usd, region_moves=o.region_moves,
    )
