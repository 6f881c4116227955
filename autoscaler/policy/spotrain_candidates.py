"""spotrain's per-job planning, steps 1-2: what the job could run on, and what each option is worth.

``job_context`` gathers what every step reads about one job (its options, restart overhead, loss per
preemption, work left); ``candidate_placements`` lists the allocations worth scoring;
``score_candidates`` gives each its expected goodput per dollar (``cost_models.objective``). The
types shared by all the steps (``Candidate``, ``JobPlan``, ``MarketView``) live here too.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from autoscaler.jobs.domain import Outcome
from autoscaler.jobs.scaling import BatchConfig
from cloud_providers.base import ON_DEMAND, SPOT, Offering
from cost_models import hazard as hz
from cost_models import moves as mv
from cost_models import objective
from cost_models.scaling import Scaling

from .base import JobView, MarketHistory, Placement, PolicyInput
from .jobmath import (
    cap_refused,
    gang_batch,
    gang_rate,
    goodput_sizes,
    job_scaling,
    on_demand_allowed,
    remaining_work,
    restart_overhead_s,
    spot_allowed,
)
from .moves import bandwidth_gb_per_s, egress_usd_per_gb_between, gang_location, state_size_gb
from .params import PolicyParams

URGENT, BEHIND, NORMAL = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class MarketView:
    """Per-offering estimates, computed once per decision and shared by all jobs."""

    hazard_per_hour: float
    mean_outage_s: float
    # Share of the watched time the market had room (``cost_models.hazard.available_fraction``).
    available_fraction: float = 1.0


@dataclasses.dataclass(frozen=True)
class Candidate:
    placements: tuple[Placement, ...]
    rate: float
    price_usd_per_hour: float
    score: float
    kind: str
    # The batch configuration the job would train this gang with (jobs valued by goodput; else None).
    batch: BatchConfig | None = None

    @property
    def spot_instances(self) -> Mapping[str, int]:
        return {p.offering_key: p.instances for p in self.placements if p.market == SPOT}

    @property
    def has_spot(self) -> bool:
        return any(p.market == SPOT for p in self.placements)

    @property
    def all_spot(self) -> bool:
        return all(p.market == SPOT for p in self.placements)

    @property
    def all_on_demand(self) -> bool:
        return all(p.market == ON_DEMAND for p in self.placements)


@dataclasses.dataclass(frozen=True)
class JobPlan:
    job_id: str
    urgency: int
    candidates: tuple[Candidate, ...]
    reason: str
    wake_s: float | None = None
    outcome: Outcome | None = None


@dataclasses.dataclass(frozen=True)
class PlanContext:
    """What every step of ``plan_job`` reads about one job at one decision, computed once."""

    job: JobView
    inp: PolicyInput
    params: PolicyParams
    options: Sequence[Offering]
    # ``options`` with the room of recently refused spot markets capped at what the job holds.
    usable: Sequence[Offering]
    by_key: Mapping[str, Offering]
    views: Mapping[str, MarketView]
    hazards: Mapping[str, float]
    lifes_h: Mapping[str, float]
    held: Mapping[tuple[str, str], int]
    # What the job holds now, as placements (empty when idle).
    cur: tuple[Placement, ...]
    scaling: Scaling
    d: float  # restart overhead (s)
    lag: float  # decision interval (s)
    lost_s: float  # work lost by a preemption whose notice is too short to checkpoint (s)
    loss_s: float  # d + lost_s: time a preemption costs (s)
    loss_eff_s: float  # loss_s weighted by the deadline pressure (s), used to rank and score spot
    w_rem: float  # remaining work (reference GPU-seconds)
    # Where the job's state lives (``cloud/region``; None: nothing to carry yet), its size (GB), and
    # how many moves to another region or cloud the job has made (issue 23).
    state_location: str | None = None
    size_gb: float = 0.0
    region_moves: int = 0

    def hazard(self, pl: Sequence[Placement]) -> float:
        """Preemptions per hour of a gang: the sum over its spot placements."""
        return sum(self.hazards.get(p.offering_key, hz.PRIOR_HAZARD_PER_HOUR) for p in pl if p.market == SPOT)

    def switch_s(self, pl: tuple[Placement, ...]) -> float:
        """The restart a move to ``pl`` costs: none to stay on an intact gang."""
        return 0.0 if pl == self.cur and not self.job.restarting else self.d

    def location(self, pl: Sequence[Placement]) -> str | None:
        return gang_location((self.by_key[p.offering_key].cloud, self.by_key[p.offering_key].region,
                              p.instances * self.by_key[p.offering_key].gpus) for p in pl if p.offering_key in self.by_key)

    def move(self, pl: tuple[Placement, ...], price_usd_per_hour: float) -> mv.MoveCost:
        """What a change to ``pl`` costs on top of staying: its restart (none to stay on an intact
        gang) and, when it takes the job's state to another region or cloud, the egress and the
        transfer time; the downtime valued at ``pl``'s price weighted by the deadline pressure (the
        slack it spends is bought back on demand later)."""
        weight = self.loss_eff_s / self.loss_s if self.loss_s > 0 else 1.0
        dst = self.location(pl)
        src = self.state_location
        per_gb = egress_usd_per_gb_between(src, dst) if src is not None and dst is not None else 0.0
        bw = bandwidth_gb_per_s(src, dst) if src is not None and dst is not None else mv.DEFAULT_TRANSFER_GB_PER_S
        restart_s = self.switch_s(pl)
        if restart_s == 0.0 or (pl == self.cur and self.job.restarting):
            # An intact gang where it is: nothing moves. Or the gang the job is starting already (a
            # move decided a moment ago, whose old gang is still checkpointing: the controller sees
            # the new instances as held before the state has moved): the move was priced when it was
            # decided, and pricing it again would send the job straight back.
            per_gb = 0.0
        return mv.move_cost(size_gb=self.size_gb, egress_usd_per_gb=per_gb, restart_s=restart_s,
                            time_usd_per_hour=price_usd_per_hour * weight, bandwidth_gb_per_s=bw)

    def move_hysteresis(self) -> float:
        """How many times its cost a voluntary move must save, given the moves already made."""
        return mv.hysteresis_factor(self.region_moves, per_move=self.params.move_hysteresis)


def age_h(h: MarketHistory | None, now_s: float) -> float | None:
    """Hours the offering's current run of availability has lasted (None: no room now, or unknown)."""
    if h is not None and h.available_since_s is not None:
        return max(0.0, now_s - h.available_since_s) / 3600
    return None


def held_map(job: JobView) -> dict[tuple[str, str], int]:
    return {(h.offering_key, h.market): h.instances for h in job.held if h.instances > 0}


def job_context(job: JobView, inp: PolicyInput, options: Sequence[Offering], views: Mapping[str, MarketView],
                hazards: Mapping[str, float], lifes_h: Mapping[str, float] | None, params: PolicyParams) -> PlanContext:
    """The job's derived terms. A market that refused capacity keeps what the job holds there but is
    not asked for more until the back-off passes (else every decision retries the launch that just
    failed). A notice shorter than ``short_notice_s`` may not leave time to save, so a preemption
    then also loses the work since the last checkpoint."""
    held = held_map(job)
    usable = cap_refused(job, options, inp.now_s, backoff_s=params.capacity_backoff_s)
    scaling = job_scaling(job)
    d = restart_overhead_s(job, default_s=params.default_restart_overhead_s)
    notice_short = any(o.notice_seconds < params.short_notice_s for o in usable)
    lost_s = (job.since_checkpoint_s or 0.0) if notice_short else 0.0
    loss_s = d + lost_s
    w_rem = remaining_work(job)
    # Under a deadline a preemption also spends slack, which later has to be bought back on demand:
    # weight its loss by the on-demand/spot price ratio times the deadline pressure (the share of
    # the time left that the remaining work needs on the fallback).
    loss_eff_s = loss_s * pressure_weight(job, usable, scaling, w_rem, inp.now_s)
    return PlanContext(job=job, inp=inp, params=params, options=options, usable=usable, by_key={o.key: o for o in options},
                       views=views, hazards=hazards, lifes_h=lifes_h or {}, held=held,
                       cur=tuple(Placement(k, m, n) for (k, m), n in sorted(held.items())), scaling=scaling, d=d,
                       lag=inp.decision_interval_s, lost_s=lost_s, loss_s=loss_s, loss_eff_s=loss_eff_s, w_rem=w_rem,
                       state_location=job.state_location, size_gb=state_size_gb(job), region_moves=job.region_moves)


def pressure_weight(job: JobView, options: Sequence[Offering], scaling: Scaling, w_rem: float, now_s: float) -> float:
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


def scaling_key(scaling: Scaling) -> object:
    try:
        hash(scaling)
    except TypeError:
        return id(scaling)
    return scaling


# ------------------------------------------------------------------------------------------------
# Step 1: candidates


def candidate_placements(ctx: PlanContext,
                         shared: dict[tuple[object, ...], object] | None) -> list[tuple[tuple[Placement, ...], str]]:
    """Allocations worth scoring, each once, with what kind they are: the current one; for each gang
    size (max, min, and what the job holds) a spot fill, a spot fill topped up with on-demand (Can't Be
    Late's heterogeneous gang, section 5.5), the cheapest on-demand gangs, and single-offering spot
    gangs on the least risky offerings (lifetimes differ by zone); for a job valued by goodput, the
    powers of two between min and max as well (``goodput_sizes``). Bounded by ``spot_candidates`` and
    ``od_candidates`` so that a decision over a thousand jobs stays fast."""
    job, usable, params = ctx.job, ctx.usable, ctx.params
    nmax, nmin = job.spec.workers.max, job.spec.workers.min
    raw: list[tuple[tuple[Placement, ...], str]] = []
    if ctx.cur and all(k in ctx.by_key for (k, _) in ctx.held) and nmin <= _gpus(ctx, ctx.cur) <= nmax:
        # What the job holds, if it is still a gang the spec allows: after a preemption it can be
        # fewer than workers.min GPUs, which must be filled again, never trained on.
        raw.append((ctx.cur, "keep"))
    sizes = sorted({nmax, nmin, sum(h.instances * h.gpus_per_instance for h in job.held) or nmax}
                   | goodput_sizes(ctx.scaling, nmin, nmax))
    for n in sizes:
        if n < nmin or n > nmax:
            continue
        for with_od in (False, True):
            f = _fills(job, usable, ctx.hazards, n, with_on_demand=with_od, d=ctx.loss_eff_s)
            if f is not None:
                raw.append((f, "spot+on-demand" if with_od and any(p.market == ON_DEMAND for p in f) else "spot"))
        if on_demand_allowed(job):
            # The same for every job with these options and scaling: computed once per decision.
            options_key = id(ctx.options) if len(usable) == len(ctx.options) else tuple(o.key for o in usable)
            gk = ("od", options_key, scaling_key(ctx.scaling), n)
            gangs = shared.get(gk) if shared is not None else None
            if gangs is None:
                gangs = _on_demand_gangs(usable, ctx.scaling, n, params.od_candidates)
                if shared is not None:
                    shared[gk] = gangs
            for g in gangs:  # type: ignore[attr-defined]
                raw.append((g, "on-demand"))
        if spot_allowed(job):
            ranked = sorted(
                (o for o in usable if o.spot_price_usd_per_hour is not None and n % o.gpus == 0
                 and (o.spot_available is None  # room unknown (a real cloud): a launch attempt is the probe
                      or max(o.spot_available, ctx.held.get((o.key, SPOT), 0)) >= n // o.gpus)),
                key=lambda o: (_spot_usd_per_gpu_hour_at_risk(o, ctx.hazards, ctx.loss_eff_s), o.key),
            )
            for o in ranked[:params.spot_candidates]:
                raw.append(((Placement(o.key, SPOT, n // o.gpus),), "spot"))
    seen: set[tuple[Placement, ...]] = set()
    out = []
    for pl, kind in raw:
        if pl and pl not in seen:
            seen.add(pl)
            out.append((pl, kind))
    return out


def _spot_usd_per_gpu_hour_at_risk(o: Offering, hazards: Mapping[str, float], loss_s: float) -> float:
    """``o``'s spot price per GPU-hour, raised by the share of time its preemptions are expected to
    lose (hazard per hour times ``loss_s``): how the spot fills rank offerings."""
    price = o.spot_price_usd_per_hour
    if price is None:  # callers rank only offerings with a spot price
        return math.inf
    return price / o.gpus * (1.0 + hazards.get(o.key, hz.PRIOR_HAZARD_PER_HOUR) * loss_s / 3600)


def _gpus(ctx: PlanContext, placements: tuple[Placement, ...]) -> int:
    return sum(p.instances * ctx.by_key[p.offering_key].gpus for p in placements)


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
    held = held_map(job)
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
                eff = _spot_usd_per_gpu_hour_at_risk(o, hazards, d)
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
        ods = sorted(options, key=lambda o: (0 if (o.key, ON_DEMAND) in held else 1,
                                             o.on_demand_price_usd_per_hour / o.gpus, o.key))
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


def _on_demand_gangs(options: Sequence[Offering], scaling: Scaling, n: int,
                     count: int) -> list[tuple[Placement, ...]]:
    """The ``count`` cheapest on-demand gangs of ``n`` GPUs per unit of work (a few: on demand never
    runs out)."""
    fits = [o for o in options if n % o.gpus == 0]

    def usd_per_work(o: Offering) -> float:
        instances = n // o.gpus
        return o.on_demand_price_usd_per_hour * instances / max(1e-12, gang_rate(scaling, ((o, instances),)))

    fits.sort(key=lambda o: (usd_per_work(o), o.key))
    return [(Placement(o.key, ON_DEMAND, n // o.gpus),) for o in fits[:count]]


def fallback_rate(ctx: PlanContext, cands: Sequence[tuple[tuple[Placement, ...], str]]) -> float:
    """Work per second of the fastest all-on-demand candidate: Can't Be Late's guaranteed fallback
    (0 when the job may not run on demand)."""
    rates = [gang_rate(ctx.scaling, ((ctx.by_key[p.offering_key], p.instances) for p in pl))
             for pl, _ in cands if all(p.market == ON_DEMAND for p in pl)]
    return max(rates, default=0.0)


# ------------------------------------------------------------------------------------------------
# Step 2: scoring


def score_candidates(ctx: PlanContext, cands: Sequence[tuple[tuple[Placement, ...], str]]) -> list[Candidate]:
    """Expected goodput per dollar of each candidate (``cost_models.objective.goodput_per_usd``) over
    the time it needs to finish, capped at ``horizon_s``. Each preemption loses ``loss_eff_s``; a move
    pays one restart up front, which is what keeps the job from thrashing: a new allocation wins only
    when its rate or price pays back the restart. Gangs that make no progress are dropped."""
    scored: list[Candidate] = []
    horizon_cap = ctx.params.horizon_s
    w_rem, lag = ctx.w_rem, ctx.lag
    for pl, kind in cands:
        parts = [(ctx.by_key[p.offering_key], p.instances) for p in pl]
        rate = gang_rate(ctx.scaling, parts)
        if rate <= 0:
            continue
        price = sum(ctx.by_key[p.offering_key].price_usd_per_hour(p.market) * p.instances for p in pl)
        lam = ctx.hazard(pl)
        # A move to another region or cloud also waits for the state to cross and pays its egress
        # (issue 23), the more so the more the job has moved already (hysteresis).
        move = ctx.move(pl, price)
        h = ctx.move_hysteresis() if move.egress_usd > 0 else 1.0
        switch_s = ctx.switch_s(pl) + move.transfer_s * h
        if w_rem > 0:
            horizon = min(horizon_cap, w_rem / rate / objective.productive_fraction(lam, ctx.loss_s) + switch_s)
        else:
            horizon = lag
        score = objective.goodput_per_usd(rate, price, horizon_s=max(horizon, lag), hazard_per_hour=lam,
                                          loss_s=ctx.loss_eff_s, switch_s=switch_s, extra_usd=move.egress_usd * h)
        scored.append(Candidate(pl, rate, price, score, kind, gang_batch(ctx.scaling, parts)))
    return scored
