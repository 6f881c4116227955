"""Baseline policies, implemented from their sources, for ``spotrain simulate`` and the benchmarks.

All three run a fixed-size gang of ``workers.max`` GPUs and obey Can't Be Late's Polarization Rule
for multi-instance jobs (Wu et al., "Can't Be Late: Optimizing Spot Instance Savings under
Deadlines", NSDI '24, section 5.5): at any time the job holds either nothing or the whole gang, and
the gang is homogeneous (all spot on one offering, or all on-demand); "spot available" means an
offering has room for the whole gang. With that mapping the single-instance rules apply unchanged.

- ``on-demand``: the cheapest on-demand gang, always.
- ``greedy-spot``: SkyPilot managed jobs (``sky jobs launch --use-spot``) with the default recovery
  strategy EAGER_NEXT_REGION, plus Can't Be Late's greedy Safety Net; see ``GreedySpotPolicy``.
- ``uniform-progress``: Can't Be Late, section 5.2.2, the rules as published:
  1. Uniform Progress: when idle and cp(t) < ep(t), switch to on-demand and stay on it to catch up;
  2. Taking Risks: switch to spot whenever available; stay on it until preempted (Exploitation);
  3. Hysteresis: when on on-demand, stay on it until cp(t) >= ep(t + 2d);
  4. Safety Net: when idle and R(t) <= C(t) + 2d, switch to on-demand and stay until the end,
  with ep(t) = C(0) * (t - t0) / (deadline - t0) the expected progress and cp(t) the progress made.
  The state machine (the paper's Figure 10) leaves on-demand only for spot: once the hysteresis is
  met and no spot has room, the job stays on on-demand (it does not go idle, which would pay a
  changeover each time it falls behind again).

``d`` is the job's restart overhead; every rule's margin also includes one decision interval, the
lag between a change and the next decision.
"""

from __future__ import annotations

from autoscaler.jobs.domain import Outcome
from cloud_providers.base import ON_DEMAND, SPOT

from .base import Allocation, JobView, PolicyInput
from .jobmath import (
    Config,
    gang_rate,
    homogeneous_configs,
    job_options,
    job_scaling,
    remaining_work,
    restart_overhead_s,
    total_work,
)


class _GangBaseline:
    name = "baseline"

    def decide(self, inp: PolicyInput) -> list[Allocation]:
        return [self._one(job, inp) for job in inp.jobs]

    # ---- helpers shared by the baselines ----
    def _setup(self, job: JobView, inp: PolicyInput) -> tuple[list[Config], Config | None, Config | None]:
        options = job_options(job, inp)
        configs = homogeneous_configs(job, options, job.spec.workers.max, job_scaling(job))
        od = next((c for c in configs if c.market == ON_DEMAND), None)
        return configs, od, _held_config(job, inp)

    def _alloc(self, job: JobView, cfg: Config | None, reason: str, wake: float | None = None) -> Allocation:
        if cfg is None:
            return Allocation(job.job_id, (), reason=reason, next_decision_s=wake)
        return Allocation(job.job_id, (cfg.placement(),), reason=reason, next_decision_s=wake)

    def _one(self, job: JobView, inp: PolicyInput) -> Allocation:
        raise NotImplementedError


def _held_config(job: JobView, inp: PolicyInput) -> Config | None:
    """The full gang the job holds (None: nothing, or a broken gang). Built from ``held`` rather
    than from the market's room, which reads 0 while the room is ours."""
    if len(job.held) != 1:
        return None
    h = job.held[0]
    if h.instances <= 0:
        return None
    by_key = {o.key: o for o in inp.offerings}
    o = by_key.get(h.offering_key)
    if o is None or h.instances * o.gpus != job.spec.workers.max:
        return None
    return Config(o, h.market, h.instances, gang_rate(job_scaling(job), ((o, h.instances),)))


class OnDemandPolicy(_GangBaseline):
    name = "on-demand"

    def _one(self, job: JobView, inp: PolicyInput) -> Allocation:
        configs, od, cur = self._setup(job, inp)
        if cur is not None and cur.market == ON_DEMAND:
            return self._alloc(job, cur, "on-demand (kept)")
        if od is None:
            return Allocation(job.job_id, (), reason="no on-demand offering fits the job", outcome=Outcome.NO_RESOURCE)
        return self._alloc(job, od, "on-demand")


class _DeadlineBaseline(_GangBaseline):
    def _deadline_terms(self, job: JobView, inp: PolicyInput, od: Config | None) -> tuple[float, float, float, float]:
        """(R, C, d + lag margin unit, remaining work)."""
        d = restart_overhead_s(job)
        rem = remaining_work(job)
        deadline = job.deadline_s
        R = float("inf") if deadline is None else deadline - inp.now_s
        C = rem / od.rate if od is not None and od.rate > 0 else float("inf")
        return R, C, d, rem

    def _trip_at(self, job: JobView, inp: PolicyInput, od: Config) -> float:
        """When the Safety Net trips: R(t) = C(t) + 2d + lag, i.e. t = deadline - C - 2d - lag."""
        assert job.deadline_s is not None
        _, C, d, _ = self._deadline_terms(job, inp, od)
        return job.deadline_s - C - (2.0 * d + inp.decision_interval_s)

    def _safety_net(self, job: JobView, inp: PolicyInput, od: Config | None) -> tuple[bool, float | None]:
        """(trip now?, when it will trip if the job stays idle). It trips at R <= C + margin, equality
        included: a net that waits at equality leaves the job less than the fallback needs at the
        next decision (issue 10). Trip and wake-up are read from the same number, so a wake-up at
        ``trip_at`` always trips, and one that does not trip is strictly later than now."""
        if job.deadline_s is None or od is None:
            return False, None
        trip_at = self._trip_at(job, inp, od)
        return trip_at <= inp.now_s, trip_at

    def _on_demand_locked(self, job: JobView, inp: PolicyInput, od: Config | None, cur: Config | None) -> bool:
        """Safety Net's 'stay until the end': once on on-demand with the net tripped (equality
        included), stay."""
        if cur is None or cur.market != ON_DEMAND or job.deadline_s is None or od is None:
            return False
        return self._trip_at(job, inp, od) <= inp.now_s


class GreedySpotPolicy(_DeadlineBaseline):
    """SkyPilot managed jobs with ``--use-spot`` and the default recovery strategy, EAGER_NEXT_REGION
    (skypilot-org/skypilot, ``sky/jobs/recovery_strategy.py``, ``EagerFailoverStrategyExecutor``,
    registered ``default=True``), plus Can't Be Late's Safety Net (section 3.2's greedy policy).

    - Launch: the cheapest spot offering with room for the gang (SkyPilot's optimizer by price; a
      zone that refused capacity is skipped for ``CAPACITY_BACKOFF_S``, SkyPilot's failover).
    - Running: stay on it until preempted; never move to a cheaper offering, never to on-demand.
    - Preempted (the offering's preemption count grew since the launch): relaunch first in a region
      other than the preempted one, cheapest first (``R1Z1 (preempted) -> R2 -> R3``); if no other
      region has room, anywhere, the preempted region included (``-> R1Z2``); while nothing has room,
      wait and retry (SkyPilot retries until up).
    - SkyPilot itself knows no deadline. The Safety Net is the one addition: when idle and
      ``R(t) <= C(t) + 2d`` switch to on-demand and stay until the end, so that the baseline is
      comparable at zero misses (without it, it misses whenever spot is scarce near the deadline).

    The policy remembers, per job and submission, its last spot launch and that offering's
    preemption count then (``PolicyInput.history``, the controller's instance history), which is how
    it tells a preemption from a launch still under way. Deviation, so that repeated decisions while
    the job is down agree: the other-region preference holds for every relaunch decision until the
    job runs again (SkyPilot tries the other regions once, then retries without the constraint); the
    two differ only when, after a wait, the preempted region and another get room at the same
    decision. The memory is lost when the controller restarts: that relaunch is a plain failover.
    """

    name = "greedy-spot"

    def __init__(self) -> None:
        # Per (job, submission): the offering of the last spot launch and its preemption count then;
        # the region a preemption was last seen in, until the job runs again.
        self._launched: dict[tuple[str, float], tuple[str, int]] = {}
        self._avoid: dict[tuple[str, float], tuple[str, str] | None] = {}

    def _one(self, job: JobView, inp: PolicyInput) -> Allocation:
        configs, od, cur = self._setup(job, inp)
        mem = (job.job_id, job.submitted_s)
        if cur is not None and cur.market == SPOT:
            if mem not in self._launched or self._launched[mem][0] != cur.offering.key:
                self._launched[mem] = (cur.offering.key, _preemptions(inp, cur.offering.key))
            self._avoid.pop(mem, None)
            return self._alloc(job, cur, "greedy: stay on spot until preempted")
        if cur is not None and cur.market == ON_DEMAND:
            return self._alloc(job, cur, "greedy: safety net, on-demand until the end")
        trip, trip_at = self._safety_net(job, inp, od)
        if trip:
            return self._alloc(job, od, "greedy: safety net")
        spots = [c for c in configs if c.market == SPOT]
        if not spots:
            return self._alloc(job, None, "greedy: no spot room, waiting", wake=trip_at)
        pick, reason = spots[0], "greedy: cheapest spot with room"
        last = self._launched.get(mem)
        if last is not None and _preemptions(inp, last[0]) > last[1]:
            self._avoid[mem] = _region(last[0], inp)
        if mem in self._avoid:
            elsewhere = [c for c in spots if (c.offering.cloud, c.offering.region) != self._avoid[mem]]
            if elsewhere:
                pick, reason = elsewhere[0], "greedy: preempted, relaunch in the next region"
            else:
                reason = "greedy: preempted, no other region has room, relaunch anywhere"
        self._launched[mem] = (pick.offering.key, _preemptions(inp, pick.offering.key))
        return self._alloc(job, pick, reason)


def _preemptions(inp: PolicyInput, key: str) -> int:
    h = inp.history.get(key)
    return 0 if h is None else h.preemptions


def _region(key: str, inp: PolicyInput) -> tuple[str, str] | None:
    o = next((o for o in inp.offerings if o.key == key), None)
    return None if o is None else (o.cloud, o.region)


class UniformProgressPolicy(_DeadlineBaseline):
    name = "uniform-progress"

    def _expected_progress(self, job: JobView, t: float) -> float:
        if job.deadline_s is None:
            return 0.0
        span = job.deadline_s - job.submitted_s
        return total_work(job) * min(1.0, max(0.0, (t - job.submitted_s) / span))

    def _one(self, job: JobView, inp: PolicyInput) -> Allocation:
        configs, od, cur = self._setup(job, inp)
        d = restart_overhead_s(job)
        cp = total_work(job) - remaining_work(job)
        spot = next((c for c in configs if c.market == SPOT), None)
        if cur is not None and cur.market == SPOT:
            return self._alloc(job, cur, "UP: exploitation, stay on spot until preempted")
        if self._on_demand_locked(job, inp, od, cur):
            return self._alloc(job, cur, "UP: safety net, on-demand until the end")
        if cur is not None and cur.market == ON_DEMAND:
            target = self._expected_progress(job, inp.now_s + 2.0 * d)
            if cp < target:
                # Wake when progress on on-demand should have caught up with ep(t + 2d).
                slope = total_work(job) / max(1.0, (job.deadline_s or inp.now_s + 1) - job.submitted_s)
                gain = max(1e-9, cur.rate - slope)
                return self._alloc(job, cur, "UP: hysteresis", wake=inp.now_s + (target - cp) / gain)
            if spot is not None:
                return self._alloc(job, spot, "UP: caught up, back to spot")
            # No transition from on-demand to idle in the paper's state machine (Figure 10): with no
            # spot to go to, the job stays on on-demand (and keeps getting ahead) until spot returns.
            return self._alloc(job, cur, "UP: caught up, no spot, staying on on-demand")
        trip, trip_at = self._safety_net(job, inp, od)
        if trip:
            return self._alloc(job, od, "UP: safety net")
        if spot is not None:
            return self._alloc(job, spot, "UP: taking risks on spot")
        if cp < self._expected_progress(job, inp.now_s):
            return self._alloc(job, od, "UP: behind uniform progress, on-demand")
        return self._alloc(job, None, "UP: ahead, waiting for spot", wake=self._idle_wake(job, inp, od, cp))

    def _idle_wake(self, job: JobView, inp: PolicyInput, od: Config | None, cp: float) -> float | None:
        """While idle: when cp(t) < ep(t) will hold, or the Safety Net will trip, whichever is first."""
        _, wake = self._safety_net(job, inp, od)
        if job.deadline_s is not None:
            span = job.deadline_s - job.submitted_s
            behind_at = job.submitted_s + cp / total_work(job) * span
            wake = behind_at if wake is None else min(wake, behind_at)
        return wake
