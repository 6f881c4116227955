"""spotrain's policy: the allocation with the best expected goodput per dollar, that still meets the
deadline and the budget, chosen jointly for all jobs.

Per job (``plan_job``):

1. Candidates. Allocations of ``workers.min..max`` GPUs: the current one; spot-only fills (held spot
   first, then spot offerings by risk-adjusted price per unit of work); spot topped up with on-demand
   (a heterogeneous gang, Can't Be Late section 5.5); and all-on-demand gangs.
2. Score. ``cost_models.objective.goodput_per_usd``: the job's scaling model (or a prior) and the
   accelerator's speed give the rate; each spot offering's hazard comes from what the controller saw
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
     with several; d is the job's measured restart overhead). Above the reserve the job only takes
     spot and otherwise waits (waiting costs slack, nothing else: greedy's strength), and waits for a
     clearly cheaper offering when its expected outage fits in the slack to spare. At the reserve it
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
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence

from cloud_providers.base import ON_DEMAND, SPOT, Offering, offering_key
from cost_models import hazard as hz
from cost_models import objective
from cost_models.scaling import Scaling

from ..domain import Outcome
from .base import Allocation, JobView, MarketHistory, Placement, PolicyInput, eligible_offerings
from .jobmath import cap_refused, gang_rate, job_scaling, on_demand_allowed, remaining_work, restart_overhead_s, spot_allowed

# Planning horizon for goodput per dollar when the job has no nearer end (seconds).
HORIZON_S = 6 * 3600.0
URGENT, BEHIND, NORMAL = 0, 1, 2
# Candidates within this share of the best goodput per dollar count as ties, broken by speed
# (Pollux's lesson: take the speedup while it costs little efficiency).
FASTER_TOLERANCE = 0.2
# How many single-offering spot gangs to consider per size (bounds the work per job).
SPOT_CANDIDATES = 4
OD_CANDIDATES = 2
# With slack to spare, wait for a spot offering this much cheaper (per unit of work) than the best
# one with room now.
WAIT_PREMIUM = 0.05
# ... and only when its mean outage, this many times over (outages are heavy-tailed), still leaves the
# slack above the reserve.
OUTAGE_MARGIN = 2.0
# On-demand is left for spot with less slack than a full cycle only for a run at least this old (hours).
ESTABLISHED_RUN_H = 2.0
# A running spot gang moves to a cheaper spot offering only when the expected saving pays this many
# restarts.
SWITCH_MARGIN = 3.0
# ... and only while the slack after that restart stays this many restart cycles (d + lag) above the
# reserve: a move is a restart the job would not otherwise take, and under a tight deadline the
# slack it spends is what later keeps the job off on-demand.
SWITCH_CUSHION_CYCLES = 4.0
# ... except for a saving that pays this many restarts: then one cycle above the reserve is cushion
# enough (a running gang on a dear zone next to a long run of one 20 % cheaper, hours from the end).
BIG_SWITCH_MARGIN = 8.0
BIG_CUSHION_CYCLES = 1.0
# A job on demand with no spot room gives its gang up to wait only with this many restart cycles
# (2d + lag) of slack above the reserve.
OD_RELEASE_CYCLES = 1.0
# Float tolerance (seconds) on the slack: a gang that entered spot with exactly the Safety Net's
# slack must not be moved off it by rounding.
SLACK_TOLERANCE_S = 1.0


@dataclasses.dataclass(frozen=True)
class MarketView:
    """Per-offering estimates, computed once per decision and shared by all jobs."""

    hazard_per_hour: float
    mean_outage_s: float


@dataclasses.dataclass(frozen=True)
class Candidate:
    placements: tuple[Placement, ...]
    rate: float
    price_usd_per_hour: float
    score: float
    kind: str

    @property
    def spot_instances(self) -> Mapping[str, int]:
        return {p.offering_key: p.instances for p in self.placements if p.market == SPOT}


@dataclasses.dataclass(frozen=True)
class JobPlan:
    job_id: str
    urgency: int
    candidates: tuple[Candidate, ...]
    reason: str
    wake_s: float | None = None
    outcome: Outcome | None = None


def market_view(o: Offering, h: MarketHistory | None) -> MarketView:
    if h is None:
        ev = hz.HazardEvidence()
    else:
        avail = h.available_s_at_least[0] if h.available_s_at_least else 0.0
        ev = hz.HazardEvidence(held_hours=h.spot_seconds_held / 3600, preemptions=h.preemptions,
                               watched_hours=h.watched_s / 3600, available_hours=avail / 3600, drops=h.drops)
    return MarketView(hz.hazard_per_hour(ev), hz.mean_outage_hours(ev) * 3600)


def _age_h(h: MarketHistory | None, now_s: float) -> float | None:
    if h is not None and h.available_since_s is not None:
        return max(0.0, now_s - h.available_since_s) / 3600
    return None


class _KeyedOffering(Offering):
    """An offering whose key is computed once (the policy looks it up a few million times for a
    thousand jobs)."""

    @functools.cached_property
    def key(self) -> str:  # type: ignore[override]
        return offering_key(self.cloud, self.zone, self.instance_type, self.accelerator, self.gpus)


_OFFERING_FIELDS = tuple(f.name for f in dataclasses.fields(Offering))


def _keyed(o: Offering) -> Offering:
    return _KeyedOffering(*(getattr(o, f) for f in _OFFERING_FIELDS))


class SpotrainPolicy:
    name = "spotrain"

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
                lifes_h[o.key] = hz.expected_remaining_life_hours(v.hazard_per_hour, _age_h(h, inp.now_s))
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
                hit = memo[mk] = plan_job(job, inp, elig_cache[ck], views, hazards, lifes_h, shared)
            plans.append(hit if hit.job_id == job.job_id else dataclasses.replace(hit, job_id=job.job_id))
        return allocate_jointly(plans, inp, by_key)


def _scaling_key(scaling: Scaling) -> object:
    try:
        hash(scaling)
    except TypeError:
        return id(scaling)
    return scaling


def _memo_key(job: JobView, eligibility: tuple[object, ...]) -> tuple[object, ...]:
    """Everything ``plan_job`` reads from a job, except its id (the spec by identity: a copy of an
    equal spec only misses the cache)."""
    return (id(job.spec), eligibility, job.submitted_s, job.progress, job.held, job.cost_so_far_usd, job.restart_overhead_s,
            tuple(sorted(job.recent_capacity_failures.items())), id(job.scaling), job.since_checkpoint_s, job.restarting)


def allocate_jointly(plans: Sequence[JobPlan], inp: PolicyInput, by_key: Mapping[str, Offering]) -> list[Allocation]:
    """Greedy by urgency then score, under spot room, region quotas and the global spend rate."""
    room = {k: (o.spot_available if o.spot_available is not None else 10**9) for k, o in by_key.items()}
    region_used: dict[str, int] = {}
    spend = 0.0
    order = sorted(range(len(plans)), key=lambda i: (plans[i].urgency, -(plans[i].candidates[0].score if plans[i].candidates else 0.0), plans[i].job_id))
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
            if any(reg in inp.region_quota_instances and region_used.get(reg, 0) + n > inp.region_quota_instances[reg] for reg, n in use.items()):
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
            out[i] = Allocation(p.job_id, chosen.placements, reason=f"{chosen.kind}: {p.reason}", next_decision_s=p.wake_s)
    return [out[i] for i in range(len(plans))]


# ------------------------------------------------------------------------------------------------
# One job


def _held_map(job: JobView) -> dict[tuple[str, str], int]:
    return {(h.offering_key, h.market): h.instances for h in job.held if h.instances > 0}


def _fills(
    job: JobView,
    options: Sequence[Offering],
    hazards: Mapping[str, float],
    n_target: int,
    *,
    with_on_demand: bool,
    d: float,
) -> tuple[Placement, ...] | None:
    """Fill ``n_target`` GPUs: held spot first, then spot by risk-adjusted price per GPU, then
    (optionally) on-demand by price per GPU. None when it cannot reach ``workers.min``."""
    held = _held_map(job)
    left = n_target
    out: dict[tuple[str, str], int] = {}
    spot_ok = spot_allowed(job)
    room: dict[str, int] = {}
    for o in options:
        if spot_ok and o.spot_price_usd_per_hour is not None:
            mine = held.get((o.key, SPOT), 0)
            room[o.key] = max(mine, o.spot_available if o.spot_available is not None else n_target)
    if spot_ok:
        keyed = []
        for o in options:
            if o.key in room and room[o.key] > 0:
                eff = o.spot_price_usd_per_hour / o.gpus * (1.0 + hazards.get(o.key, hz.PRIOR_HAZARD_PER_HOUR) * d / 3600)  # type: ignore[operator]
                keyed.append((0 if (o.key, SPOT) in held else 1, eff, o.key, o))
        keyed.sort(key=lambda x: x[:3])
        for _, _, _, o in keyed:
            if left < o.gpus:
                continue
            n = min(room[o.key], left // o.gpus)
            if n > 0:
                out[(o.key, SPOT)] = n
                left -= n * o.gpus
    if with_on_demand and on_demand_allowed(job) and left > 0:
        ods = sorted(options, key=lambda o: (0 if (o.key, ON_DEMAND) in held else 1, o.on_demand_price_usd_per_hour / o.gpus, o.key))
        for o in ods:
            if left < o.gpus:
                continue
            n = left // o.gpus
            out[(o.key, ON_DEMAND)] = out.get((o.key, ON_DEMAND), 0) + n
            left -= n * o.gpus
            if left == 0:
                break
    got = n_target - left
    if got < job.spec.workers.min or got == 0:
        return None
    return tuple(Placement(k, m, n) for (k, m), n in sorted(out.items()))


def _on_demand_gangs(job: JobView, options: Sequence[Offering], scaling: Scaling, n: int) -> list[tuple[Placement, ...]]:
    """The cheapest on-demand gangs of ``n`` GPUs per unit of work (a few: on demand never runs out)."""
    fits = [o for o in options if n % o.gpus == 0]
    fits.sort(key=lambda o: (o.on_demand_price_usd_per_hour * (n // o.gpus) / max(1e-12, gang_rate(scaling, ((o, n // o.gpus),))), o.key))
    return [(Placement(o.key, ON_DEMAND, n // o.gpus),) for o in fits[:OD_CANDIDATES]]


def plan_job(
    job: JobView,
    inp: PolicyInput,
    options: Sequence[Offering],
    views: Mapping[str, MarketView],
    hazards_all: Mapping[str, float],
    lifes_h: Mapping[str, float] | None = None,
    shared: dict[tuple[object, ...], object] | None = None,
) -> JobPlan:
    spec = job.spec
    if not options:
        return JobPlan(job.job_id, URGENT, (), "no offering matches the job's resources", outcome=Outcome.NO_RESOURCE)
    by_key = {o.key: o for o in options}
    # Avoid offerings that refused capacity recently (except what the job already holds there).
    held = _held_map(job)
    # A market that refused capacity keeps what the job holds there but is not asked for more until
    # the back-off passes (else every decision retries the launch that just failed).
    usable = cap_refused(job, options, inp.now_s)
    scaling = job_scaling(job)
    d = restart_overhead_s(job)
    lag = inp.decision_interval_s
    notice_short = any(o.notice_seconds < 30.0 for o in usable)  # GCP's 30 s may be too short to save
    lost_s = (job.since_checkpoint_s or 0.0) if notice_short else 0.0
    loss_s = d + lost_s
    w_rem = remaining_work(job)
    nmax, nmin = spec.workers.max, spec.workers.min
    # Under a deadline a preemption also spends slack, which later has to be bought back on demand:
    # weight its loss by the on-demand/spot price ratio times the deadline pressure (the share of
    # the time left that the remaining work needs on the fallback).
    loss_eff_s = loss_s * _pressure_weight(job, usable, scaling, w_rem, inp.now_s)

    # ---- candidates ----
    raw: list[tuple[tuple[Placement, ...], str]] = []
    cur = tuple(Placement(k, m, n) for (k, m), n in sorted(held.items()))
    if cur and all(k in by_key for (k, _) in held):
        raw.append((cur, "keep"))
    sizes = sorted({nmax, nmin, sum(h.instances * h.gpus_per_instance for h in job.held) or nmax})
    for n in sizes:
        if n < nmin or n > nmax:
            continue
        for with_od in (False, True):
            f = _fills(job, usable, hazards_all, n, with_on_demand=with_od, d=loss_eff_s)
            if f is not None:
                raw.append((f, "spot+on-demand" if with_od and any(p.market == ON_DEMAND for p in f) else "spot"))
        if on_demand_allowed(job):
            # The same for every job with these options and scaling: computed once per decision.
            gk = ("od", id(options) if len(usable) == len(options) else tuple(o.key for o in usable), _scaling_key(scaling), n)
            gangs = shared.get(gk) if shared is not None else None
            if gangs is None:
                gangs = _on_demand_gangs(job, usable, scaling, n)
                if shared is not None:
                    shared[gk] = gangs
            for g in gangs:  # type: ignore[attr-defined]
                raw.append((g, "on-demand"))
        # Single-offering spot gangs on the few least risky offerings (lifetimes differ by zone).
        if spot_allowed(job):
            ranked = sorted(
                (o for o in usable if o.spot_price_usd_per_hour is not None and n % o.gpus == 0
                 and max(o.spot_available or 0, held.get((o.key, SPOT), 0)) >= n // o.gpus),
                key=lambda o: (o.spot_price_usd_per_hour / o.gpus * (1 + hazards_all.get(o.key, hz.PRIOR_HAZARD_PER_HOUR) * loss_eff_s / 3600), o.key),  # type: ignore[operator]
            )
            for o in ranked[:SPOT_CANDIDATES]:
                raw.append(((Placement(o.key, SPOT, n // o.gpus),), "spot"))
    # Deduplicate.
    seen: set[tuple[Placement, ...]] = set()
    cands_raw = []
    for pl, kind in raw:
        if pl and pl not in seen:
            seen.add(pl)
            cands_raw.append((pl, kind))

    # ---- the fallback (fastest on-demand gang) and deadline terms ----
    od_rates = [(gang_rate(scaling, ((by_key[p.offering_key], p.instances) for p in pl)), pl) for pl, _ in cands_raw if all(p.market == ON_DEMAND for p in pl)]
    fallback_rate = max((r for r, _ in od_rates), default=0.0)
    deadline = job.deadline_s
    now = inp.now_s
    safety = 2.0 * d + lag + lost_s
    urgency = NORMAL
    wake: float | None = None
    mode = "free"
    slack_now = reserve_now = math.inf
    if deadline is not None and fallback_rate > 0:
        R = deadline - now
        C = w_rem / fallback_rate
        slack = R - C
        reserve = _reserve_s(usable, views, C, d, lag, safety)
        slack_now, reserve_now = slack, reserve
        if slack < safety:
            urgency, mode = URGENT, "safety-net"
        elif slack <= reserve:
            urgency, mode = BEHIND, "behind"
        else:
            mode = "ahead"
            # Waiting spends slack one for one: wake when it reaches the reserve.
            wake = max(now + lag, now + slack - reserve)
    # ---- score ----
    scored: list[Candidate] = []
    horizon_cap = HORIZON_S
    for pl, kind in cands_raw:
        parts = [(by_key[p.offering_key], p.instances) for p in pl]
        rate = gang_rate(scaling, parts)
        if rate <= 0:
            continue
        price = sum(o.price_usd_per_hour(p.market) * p.instances for o, p in zip((by_key[p.offering_key] for p in pl), pl))
        lam = sum(hazards_all.get(p.offering_key, hz.PRIOR_HAZARD_PER_HOUR) for p in pl if p.market == SPOT)
        switch_s = 0.0 if pl == cur and not job.restarting else d
        horizon = min(horizon_cap, w_rem / rate / objective.productive_fraction(lam, loss_s) + switch_s) if w_rem > 0 else lag
        score = objective.goodput_per_usd(rate, price, horizon_s=max(horizon, lag), hazard_per_hour=lam, loss_s=loss_eff_s, switch_s=switch_s)
        scored.append(Candidate(pl, rate, price, score, kind))

    # ---- deadline filter ----
    def is_spot(c: Candidate) -> bool:
        return any(p.market == SPOT for p in c.placements)

    def all_od(c: Candidate) -> bool:
        return all(p.market == ON_DEMAND for p in c.placements)

    allowed = scored
    reason = "best goodput per dollar"
    if mode == "safety-net":
        slack_now = (deadline - now) - w_rem / fallback_rate  # type: ignore[operator]
        keep_spot = [c for c in scored if c.placements == cur and not job.restarting and c.rate >= fallback_rate - 1e-12 and slack_now >= d + lag + lost_s - SLACK_TOLERANCE_S]
        allowed = keep_spot or [c for c in scored if all_od(c) and c.rate >= fallback_rate - 1e-12]
        reason = "safety net: slack below 2 x restart overhead"
    elif mode == "behind":
        slack_left = (deadline - now) - w_rem / fallback_rate  # type: ignore[operator]
        fast = [c for c in scored if c.rate >= fallback_rate - 1e-12]
        on_od = bool(held) and all(m == ON_DEMAND for (_, m) in held)
        k = _price_ratio(scored)
        # Leaving on-demand for spot costs a restart now and one more when preempted: only while the
        # slack still covers that cycle beyond the Safety Net, and the spot life is worth it (5.4).
        cycle_ok = slack_left >= safety + 2.0 * d + lag
        # ... or, with less slack, while it covers one more restart beyond the Safety Net, for a spot
        # run that has lasted ESTABLISHED_RUN_H already (Lindy: an old run is the one likely to
        # outlast the restarts; on-demand keeps the slack, so sitting there to the end wastes it).
        last_try_ok = slack_left >= safety + lag

        def established(c: Candidate) -> bool:
            ages = [_age_h(inp.history.get(p.offering_key), now) for p in c.placements if p.market == SPOT]
            return all(a is not None and a >= ESTABLISHED_RUN_H for a in ages)

        spot_fast = [c for c in fast if is_spot(c) and (not on_od or (
            (cycle_ok or (last_try_ok and established(c))) and _life_ok(c, hazards_all, d, k, from_od=True)))]
        allowed = spot_fast + [c for c in fast if not is_spot(c)] if spot_fast else [c for c in fast if not is_spot(c)] or fast
        reason = "slack at the reserve: progress now (spot if any)"
    elif mode == "ahead":
        on_od = bool(held) and all(m == ON_DEMAND for (_, m) in held)
        k = _price_ratio(scored)
        allowed = [c for c in scored if all(p.market == SPOT for p in c.placements) and _life_ok(c, hazards_all, d, k, from_od=on_od)]
        reason = "slack above the reserve: spot only, else wait"
        soonest_s = min((views[o.key].mean_outage_s for o in usable if o.key in views), default=math.inf)
        if not allowed and on_od and not job.restarting and slack_now <= reserve_now + max(OD_RELEASE_CYCLES * (2.0 * d + lag), soonest_s):
            # Hysteresis: the reserve shrinks with the work left while the slack on demand does not,
            # so a job put on demand at the reserve soon sits just above it. Releasing the gang to
            # wait for spot and taking it back a decision later would pay a restart each time: it
            # lets go only with slack for a restart cycle and for the spot market expected back first.
            allowed = [c for c in scored if c.placements == cur]
            reason = "slack just above the reserve: stays on demand until spot has room"
        if allowed and (not cur or job.restarting):
            # Slack to spare: rather than start on a dear spot offering, wait for a cheaper one to
            # have room, as long as its expected outage leaves the slack above the reserve.
            best_now = min(c.price_usd_per_hour / c.rate for c in allowed)
            cheaper = [(views[o.key].mean_outage_s, o) for o in usable if o.key in views and o.spot_price_usd_per_hour is not None
                       and _spot_price_per_work(o, scaling) < best_now / (1.0 + WAIT_PREMIUM)]
            wait_s = min((w for w, _ in cheaper), default=math.inf)
            if slack_now - OUTAGE_MARGIN * wait_s > reserve_now + 2.0 * d + lag:
                allowed = []
                reason = "slack above the reserve: waiting for a cheaper spot offering"
                wake = min(wake if wake is not None else math.inf, now + max(lag, wait_s))
    elif deadline is None:
        reason = "no deadline: best goodput per dollar"

    # ---- budget ----
    budget = spec.objective.budget_usd
    if budget is not None:
        left = budget - job.cost_so_far_usd
        # A candidate fits when finishing on it without further preemptions (and one decision
        # interval at its price) fits the money left; it fits comfortably when its expected cost,
        # preemptions priced in, does too. The job fails only when no way of finishing could fit,
        # spot offerings without room at the moment included: those may come back.
        fits, comfy = [], []
        for c in scored:
            switch = 0.0 if c.placements == cur and not job.restarting else d
            nominal = c.price_usd_per_hour * (w_rem / c.rate + switch) / 3600
            lam = sum(hazards_all.get(p.offering_key, hz.PRIOR_HAZARD_PER_HOUR) for p in c.placements if p.market == SPOT)
            expected = c.price_usd_per_hour * (w_rem / c.rate / objective.productive_fraction(lam, loss_s) + switch) / 3600
            if nominal <= left and c.price_usd_per_hour * lag / 3600 <= left:
                fits.append(c)
                if expected <= left:
                    comfy.append(c)
        # Over every eligible offering, those that refused capacity a moment ago included.
        cheapest_finish = _cheapest_finish_usd(job, options, scaling, scored, cur, w_rem, d)
        if w_rem > 0 and math.isfinite(cheapest_finish) and cheapest_finish > left:
            return JobPlan(job.job_id, urgency, (), (f"budget: finishing needs at least ${cheapest_finish:.2f} more, "
                                                     f"${max(left, 0):.2f} of ${budget:.2f} left"), outcome=Outcome.BUDGET)
        fit_set = set(id(c) for c in fits)
        comfy_set = set(id(c) for c in comfy)
        allowed = [c for c in allowed if id(c) in comfy_set] or [c for c in allowed if id(c) in fit_set]
        if not allowed and mode in ("safety-net", "behind"):
            allowed = [c for c in comfy if c.rate > 0] or [c for c in fits if c.rate > 0]
        if not allowed and not fits and scored:
            return JobPlan(job.job_id, urgency, (), (f"budget: only spot fits the ${max(left, 0):.2f} left "
                                                     f"(at least ${cheapest_finish:.2f}); waiting for spot room"),
                           wake_s=now + lag)
    # Best goodput per dollar first; among candidates within FASTER_TOLERANCE of the best, the faster
    # one wins (a job that finishes sooner is exposed to fewer preemptions and frees its quota).
    best = max((c.score for c in allowed), default=0.0)
    cut = best * (1 - FASTER_TOLERANCE)
    allowed.sort(key=lambda c: ((0, -round(c.rate, 12), -c.score) if c.score >= cut else (1, 0.0, -c.score),
                                [(p.offering_key, p.market, p.instances) for p in c.placements]))
    # No thrashing: the current allocation stays unless something else beats it by its restart cost
    # (already charged in the score); ties keep the current one.
    keep = [c for c in allowed if c.placements == cur]
    if keep and not job.restarting and all(p.market == SPOT for p in cur):
        # Exploitation (Can't Be Late, section 5.2): an intact spot gang runs until preempted. A move
        # to another spot offering at the same speed trades a certain restart for a guessed lifetime.
        # Only a faster gang, or a much cheaper spot offering whose saving over its expected life
        # pays for two restarts (this one and the risk of its fresh run), may replace it.
        k0 = keep[0]
        # The restart spends slack: only while it stays well above the reserve (SWITCH_CUSHION_CYCLES).
        room_ok = deadline is None or (mode == "ahead" and slack_now - d - lag > reserve_now + SWITCH_CUSHION_CYCLES * (d + lag))
        big_ok = deadline is None or (mode == "ahead" and slack_now - d - lag > reserve_now + BIG_CUSHION_CYCLES * (d + lag))

        def worth(c: Candidate) -> bool:
            saving = _switch_saving_usd(k0, c, w_rem, lifes_h or {}, d)
            unit = d / 3600 * c.price_usd_per_hour
            return (room_ok and saving > SWITCH_MARGIN * unit) or (big_ok and saving > BIG_SWITCH_MARGIN * unit)

        movers = [c for c in allowed if c is not k0 and (
            (c.rate > k0.rate * (1 + 1e-9) and c.score > k0.score)
            or (all(p.market == SPOT for p in c.placements) and c.rate >= k0.rate * (1 - 1e-9) and worth(c)))]
        allowed = movers + keep
    elif keep and not job.restarting and keep[0].score >= allowed[0].score * (1 - 1e-9):
        allowed = keep + [c for c in allowed if c is not keep[0]]
    if not allowed:
        why = "waiting for spot room" if mode == "ahead" else "no allocation fits the constraints; waiting"
        return JobPlan(job.job_id, urgency, (), f"{why} ({reason})", wake_s=wake)
    return JobPlan(job.job_id, urgency, tuple(allowed), reason, wake_s=wake)


def _cheapest_finish_usd(job: JobView, options: Sequence[Offering], scaling: Scaling, scored: Sequence[Candidate],
                         cur: tuple[Placement, ...], w_rem: float, d: float) -> float:
    """A lower bound on the money needed to finish: the cheapest candidate now without preemptions,
    or a homogeneous gang of ``workers.min`` GPUs on any eligible offering, spot ones without room
    at the moment included (their room may come back), after one restart."""
    best = math.inf
    for c in scored:
        switch = 0.0 if c.placements == cur and not job.restarting else d
        best = min(best, c.price_usd_per_hour * (w_rem / c.rate + switch) / 3600)
    n = job.spec.workers.min
    for o in options:
        if n % o.gpus:
            continue
        k = n // o.gpus
        rate = gang_rate(scaling, ((o, k),))
        if rate <= 0:
            continue
        prices = []
        if spot_allowed(job) and o.spot_price_usd_per_hour is not None:
            prices.append(o.spot_price_usd_per_hour)
        if on_demand_allowed(job):
            prices.append(o.on_demand_price_usd_per_hour)
        for p in prices:
            best = min(best, p * k * (w_rem / rate + d) / 3600)
    return best


def _pressure_weight(job: JobView, options: Sequence[Offering], scaling: Scaling, w_rem: float, now_s: float) -> float:
    """1 + (k - 1) * pressure, k = on-demand / spot price (per GPU, best of each), pressure in [0, 1]."""
    if job.deadline_s is None or not options:
        return 1.0
    od = min(o.on_demand_price_usd_per_hour / o.gpus for o in options)
    spots = [o.spot_price_usd_per_hour / o.gpus for o in options if o.spot_price_usd_per_hour]
    if not spots:
        return 1.0
    k = od / min(spots)
    n = job.spec.workers.max
    rate = max((gang_rate(scaling, ((o, n // o.gpus),)) for o in options if n % o.gpus == 0), default=0.0)
    left = job.deadline_s - now_s
    if rate <= 0 or left <= 0:
        return k
    pressure = min(1.0, w_rem / rate / left)
    return 1.0 + (k - 1.0) * pressure


def _price_ratio(scored: Sequence[Candidate]) -> float:
    """k = on-demand / spot price per unit of work (best of each)."""
    od = min((c.price_usd_per_hour / c.rate for c in scored if all(p.market == ON_DEMAND for p in c.placements)), default=math.inf)
    sp = min((c.price_usd_per_hour / c.rate for c in scored if any(p.market == SPOT for p in c.placements)), default=math.inf)
    if not math.isfinite(od) or not math.isfinite(sp) or sp <= 0:
        return math.inf
    return od / sp


def _life_ok(c: Candidate, hazards: Mapping[str, float], d: float, k: float, *, from_od: bool) -> bool:
    lam = sum(hazards.get(p.offering_key, hz.PRIOR_HAZARD_PER_HOUR) for p in c.placements if p.market == SPOT)
    if lam <= 0:
        return True
    if not math.isfinite(k):
        return True
    return objective.spot_worth_switching(3600.0 / lam, d, k, from_on_demand=from_od)


def _reserve_s(options: Sequence[Offering], views: Mapping[str, MarketView], fallback_s: float, d: float, lag: float, safety: float) -> float:
    """Slack to keep before the job stops waiting for spot: the Safety Net plus one spot cycle
    (restart on spot, preemption, restart on the fallback: 2d + lag) per preemption expected over the
    rest of the work, at the least hazardous eligible offering's mean hazard. Above it, waiting for
    spot costs nothing but slack (greedy, SkyPilot's lesson); at it, the job progresses on on-demand
    through outages and still takes spot when the slack covers one more cycle."""
    hazards = [views[o.key].hazard_per_hour for o in options if o.key in views]
    if not hazards:
        return safety
    preemptions = min(hazards) * fallback_s / 3600.0
    # With several spot offerings a preempted job usually fails over to another one's room (one
    # restart); with one, it goes through on-demand (two).
    cycle = (d + lag) if len(hazards) > 1 else (2.0 * d + lag)
    return safety + preemptions * cycle


def _spot_price_per_work(o: Offering, scaling: Scaling) -> float:
    """Spot USD per hour per unit of rate of one instance (the unit ``Candidate.price / rate`` uses)."""
    rate = gang_rate(scaling, ((o, 1),))
    return o.spot_price_usd_per_hour / rate if rate > 0 and o.spot_price_usd_per_hour is not None else math.inf


def _switch_saving_usd(cur: Candidate, new: Candidate, w_rem: float, lifes_h: Mapping[str, float], d: float) -> float:
    """Expected saving of moving a running spot gang to ``new``: the difference of the prices with
    each offering's restarts priced in (one per expected remaining run), over the shorter of the time
    left to finish and the new offering's expected remaining run."""
    def life(c: Candidate) -> float:
        return min((lifes_h.get(p.offering_key, 0.0) for p in c.placements if p.market == SPOT), default=math.inf)

    def eff(c: Candidate) -> float:
        return c.price_usd_per_hour / c.rate * (1.0 + d / 3600.0 / max(life(c), 1e-9))

    hours = min(w_rem / new.rate / 3600.0, life(new))
    return max(0.0, eff(cur) - eff(new)) * new.rate * hours
