"""spotrain's policy: the allocation with the best expected goodput per dollar, that still meets the
deadline and the budget, chosen jointly for all jobs.

Per job (``plan_job``):

1. Candidates. Allocations of ``workers.min..max`` GPUs: the current one; spot-only fills (held spot
   first, then spot offerings by risk-adjusted price per unit of work); spot topped up with on-demand
   (a heterogeneous gang, Can't Be Late section 5.5); and all-on-demand gangs.
2. Score. ``cost_models.objective.goodput_per_usd``: the job's scaling model (or a prior) and the
   accelerator's speed give the rate (for a job the controller fits by goodput, a ``GoodputScaling``:
   goodput at the batch configuration the runtime would choose, which the allocation carries); each
   spot offering's hazard comes from what the controller saw
   (preemptions per held hour, room vanishing per watched hour, a Gamma prior for unseen offerings),
   decreasing with the age of the current run of availability (heavy-tailed lifetimes); each
   preemption loses the restart overhead (measured when known) plus the work since the last
   checkpoint when the notice is too short to checkpoint. Any change pays one restart up front, so a
   new allocation must beat its restart cost (no thrashing).
3. Deadline: Can't Be Late's rules (NSDI'24) with a slack reserve in place of the uniform line. With
   R the time to the deadline, C the time the remaining work needs on the fastest on-demand gang (the
   fallback) and slack = R - C:
   - Safety Net: when slack < 2d + lag, run the fallback (or keep an intact spot gang while
     slack >= d + lag + lost work: a preemption then still leaves time for the fallback).
   - Reserve = Safety-Net margin + one restart cycle per expected preemption over the rest of the work
     (a cycle is 2d + lag through on-demand with one spot offering, d + lag failing over to another
     with several; d is the job's measured restart overhead; with several markets and cheap restarts,
     plus slack for the time none has room). Above the reserve the job only takes
     spot and otherwise waits (waiting costs slack, nothing else: greedy's strength), and waits for a
     clearly cheaper offering when its expected outage fits in the slack to spare and the saving beats
     what that slack is worth. At the reserve it
     progresses now: spot when any has room, else on-demand, and leaves on-demand for spot only while
     the slack still covers one more cycle and the expected spot life passes the paper's lifetime
     test (section 5.4). The reserve shrinks with d and with the work left, so cheap restarts mean
     little on-demand time.
   - Exploitation: an intact spot gang runs until preempted; it moves only to a faster gang, or, while
     the slack stays above the reserve, to a spot offering whose saving over its expected remaining
     run (Lomax, so older runs last longer) pays three restarts.
4. Budget: a candidate must be able to finish within the hard budget without further preemptions,
   and one decision interval at its price must fit; those whose expected cost fits come first. When
   no way to finish could fit (spot offerings without room now included: their room may come back),
   the job ends FAILED_BUDGET now, with the numbers in the reason; when only such spot fits, it waits.

Jointly (``SpotrainPolicy.decide``): jobs are served in order of urgency (Safety Net, then behind,
then the rest, each by best score); each takes its best candidate that fits the spot room left on each
offering, the per-region instance quotas and the global spend rate, or waits. This is the greedy for a
knapsack with one binding resource, whose value is at least OPT minus the value of one job's
allocation (the classic bound for ratio-ordered greedy); it runs in O(jobs x candidates).

Every tuned number (how many candidates, the horizon, the margins of waiting and switching, the
Safety Net's restarts, ...) is a field of one ``PolicyParams`` (``params.py``), passed in as
``SpotrainPolicy(params)``. The steps live in ``spotrain_candidates.py`` (1-2),
``spotrain_deadline.py`` (3) and ``spotrain_choice.py`` (4 and the final order).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence

from autoscaler.jobs.domain import Outcome
from cloud_providers.base import Offering, offering_key
from cost_models import hazard as hz

from .base import Allocation, JobView, MarketHistory, PolicyInput, eligible_offerings
from .params import DEFAULT_PARAMS, PolicyParams
from .spotrain_candidates import (
    URGENT,
    Candidate,
    JobPlan,
    MarketView,
    age_h,
    candidate_placements,
    fallback_rate,
    job_context,
    score_candidates,
)
from .spotrain_choice import budget_filter, drop_dear_moves, rank, stick_or_switch
from .spotrain_deadline import deadline_filter, deadline_state

__all__ = ["Candidate", "JobPlan", "MarketView", "PolicyParams", "SpotrainPolicy", "allocate_jointly", "market_view", "plan_job"]


def market_view(o: Offering, h: MarketHistory | None) -> MarketView:
    if h is None:
        ev = hz.HazardEvidence()
    else:
        avail = h.available_s_at_least[0] if h.available_s_at_least else 0.0
        ev = hz.HazardEvidence(held_hours=h.spot_seconds_held / 3600, preemptions=h.preemptions,
                               watched_hours=h.watched_s / 3600, available_hours=avail / 3600, drops=h.drops)
    return MarketView(hz.hazard_per_hour(ev), hz.mean_outage_hours(ev) * 3600, hz.available_fraction(ev))


class _KeyedOffering(Offering):
    """An offering whose key is computed once (the policy looks it up a few million times for a
    thousand jobs)."""

    @functools.cached_property
    def key(self) -> str:
        return offering_key(self.cloud, self.zone, self.instance_type, self.accelerator, self.gpus)


_OFFERING_FIELDS = tuple(f.name for f in dataclasses.fields(Offering))


def _keyed(o: Offering) -> Offering:
    return _KeyedOffering(*(getattr(o, f) for f in _OFFERING_FIELDS))


class SpotrainPolicy:
    name = "spotrain"

    def __init__(self, params: PolicyParams = DEFAULT_PARAMS) -> None:
        if not isinstance(params, PolicyParams):
            raise TypeError(f"params must be a PolicyParams, got {type(params).__name__}")
        self.params = params

    def decide(self, inp: PolicyInput) -> list[Allocation]:
        inp = dataclasses.replace(inp, offerings=tuple(_keyed(o) for o in inp.offerings))
        by_key = {o.key: o for o in inp.offerings}
        views: dict[str, MarketView] = {}
        hazards: dict[str, float] = {}
        lifes_h: dict[str, float] = {}
        for o in inp.offerings:
            if o.spot_price_usd_per_hour is not None:
                h = inp.history.get(o.key)
                v = market_view(o, h)
                views[o.key] = v
                # The rate over the expected rest of the current run (not the instantaneous Lomax
                # hazard, which overstates the risk of a fresh run over a horizon of hours).
                lifes_h[o.key] = hz.expected_remaining_life_hours(v.hazard_per_hour, age_h(h, inp.now_s))
                hazards[o.key] = 1.0 / lifes_h[o.key] if lifes_h[o.key] > 0 else v.hazard_per_hour
        elig_cache: dict[tuple[object, ...], list[Offering]] = {}
        memo: dict[tuple[object, ...], JobPlan] = {}
        shared: dict[tuple[object, ...], object] = {}
        plans = []
        for job in inp.jobs:
            r = job.spec.resources
            ck = (tuple(map(str, r.accelerators)), tuple(r.instance_types), tuple(r.clouds), tuple(r.regions))
            if ck not in elig_cache:
                elig_cache[ck] = eligible_offerings(job.spec, inp.offerings)
            # Jobs in the same state (a sweep of identical jobs, say) get the same plan: computed once.
            mk = _memo_key(job, ck)
            hit = memo.get(mk)
            if hit is None:
                hit = memo[mk] = plan_job(job, inp, elig_cache[ck], views, hazards, lifes_h, shared, params=self.params)
            plans.append(hit if hit.job_id == job.job_id else dataclasses.replace(hit, job_id=job.job_id))
        return allocate_jointly(plans, inp, by_key)


def _memo_key(job: JobView, eligibility: tuple[object, ...]) -> tuple[object, ...]:
    """Everything ``plan_job`` reads from a job, except its id (the spec by identity: a copy of an
    equal spec only misses the cache)."""
    return (id(job.spec), eligibility, job.submitted_s, job.progress, job.held, job.cost_so_far_usd, job.restart_overhead_s,
            tuple(sorted(job.recent_capacity_failures.items())), id(job.scaling), job.since_checkpoint_s, job.restarting,
            job.state_location, job.checkpoint_size_gb, job.region_moves)


def allocate_jointly(plans: Sequence[JobPlan], inp: PolicyInput, by_key: Mapping[str, Offering]) -> list[Allocation]:
    """Greedy by urgency then score, under spot room, region quotas and the global spend rate."""
    room = {k: (o.spot_available if o.spot_available is not None else 10**9) for k, o in by_key.items()}
    region_used: dict[str, int] = {}
    spend = 0.0
    def best_score(plan: JobPlan) -> float:
        return plan.candidates[0].score if plan.candidates else 0.0

    order = sorted(range(len(plans)), key=lambda i: (plans[i].urgency, -best_score(plans[i]), plans[i].job_id))
    out: dict[int, Allocation] = {}
    for i in order:
        p = plans[i]
        if p.outcome is not None:
            out[i] = Allocation(p.job_id, (), reason=p.reason, outcome=p.outcome)
            continue
        chosen = None
        for c in p.candidates:
            if any(room.get(k, 0) < n for k, n in c.spot_instances.items()):
                continue
            if inp.max_spend_usd_per_hour is not None and spend + c.price_usd_per_hour > inp.max_spend_usd_per_hour + 1e-9:
                continue
            use: dict[str, int] = {}
            for pl in c.placements:
                reg = by_key[pl.offering_key].region
                use[reg] = use.get(reg, 0) + pl.instances
            quota = inp.region_quota_instances
            if any(reg in quota and region_used.get(reg, 0) + n > quota[reg] for reg, n in use.items()):
                continue
            chosen = c
            for k, n in c.spot_instances.items():
                room[k] = room.get(k, 0) - n
            for reg, n in use.items():
                region_used[reg] = region_used.get(reg, 0) + n
            spend += c.price_usd_per_hour
            break
        if chosen is None:
            why = p.reason if not p.candidates else "waiting: quotas, spend limit or spot room taken by other jobs"
            out[i] = Allocation(p.job_id, (), reason=why, next_decision_s=p.wake_s)
        else:
            out[i] = Allocation(p.job_id, chosen.placements, reason=f"{chosen.kind}: {p.reason}", next_decision_s=p.wake_s,
                                batch=chosen.batch)
    return [out[i] for i in range(len(plans))]


# ------------------------------------------------------------------------------------------------
# One job


def plan_job(
    job: JobView,
    inp: PolicyInput,
    options: Sequence[Offering],
    views: Mapping[str, MarketView],
    hazards_all: Mapping[str, float],
    lifes_h: Mapping[str, float] | None = None,
    shared: dict[tuple[object, ...], object] | None = None,
    *,
    params: PolicyParams = DEFAULT_PARAMS,
) -> JobPlan:
    """The job's candidates in order of preference (best first), or why it waits or ends: the steps
    of the module docstring in turn. ``shared`` caches what is the same for every job of a decision."""
    if not options:
        return JobPlan(job.job_id, URGENT, (), "no offering matches the job's resources", outcome=Outcome.NO_RESOURCE)
    ctx = job_context(job, inp, options, views, hazards_all, lifes_h, params)
    cands = candidate_placements(ctx, shared)
    st = deadline_state(ctx, fallback_rate(ctx, cands))
    scored = score_candidates(ctx, cands)
    # Ahead, the moves dropped below as dearer than waiting are no option either for the patience
    # test (waiting for a cheaper offering is weighed against what the job would really take).
    options_now = drop_dear_moves(ctx, scored, scored, can_wait=True) if st.mode == "ahead" else scored
    allowed, reason, wake = deadline_filter(ctx, options_now, st)
    if st.mode in ("ahead", "free"):
        # With slack above the reserve (or no deadline), waiting for spot where the state is costs
        # nothing but slack: a move must beat that too.
        allowed = drop_dear_moves(ctx, scored, allowed, can_wait=True)
    elif st.mode == "behind":
        # The job must progress now: a dear move goes only when nothing at home is allowed.
        allowed = drop_dear_moves(ctx, scored, allowed) or allowed
    budgeted = budget_filter(ctx, scored, allowed, st)
    if isinstance(budgeted, JobPlan):
        return budgeted
    allowed = stick_or_switch(ctx, rank(ctx, budgeted), st)
    if not allowed:
        why = "waiting for spot room" if st.mode == "ahead" else "no allocation fits the constraints; waiting"
        return JobPlan(job.job_id, st.urgency, (), f"{why} ({reason})", wake_s=wake)
    return JobPlan(job.job_id, st.urgency, tuple(allowed), reason, wake_s=wake)
