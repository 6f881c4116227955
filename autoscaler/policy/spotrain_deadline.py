"""spotrain's per-job planning, step 3: the deadline (Can't Be Late, NSDI'24, with a slack reserve).

With R the time to the deadline, C the time the remaining work needs on the fastest on-demand gang
(the fallback) and slack = R - C (``cost_models.objective.slack_s``), ``deadline_state`` puts the job
in one of four modes, and ``deadline_filter`` keeps the candidates that mode allows:

- ``safety-net`` (slack below the Safety Net's margin): run the fallback, or keep an intact spot gang
  while a preemption would still leave time for the fallback.
- ``behind`` (slack at or below the reserve): progress now, spot when any has room, else on demand;
  leave on-demand for spot only while the slack covers one more cycle (section 5.4's lifetime test).
- ``ahead`` (slack above the reserve): spot only, otherwise wait (waiting only spends slack); wait
  for a clearly cheaper offering when its expected outage fits in the slack to spare.
- ``free``: no deadline, or no on-demand fallback to measure it by.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from cloud_providers.base import ON_DEMAND, SPOT, Offering
from cost_models import objective
from cost_models.scaling import Scaling

from .base import Placement
from .jobmath import gang_rate
from .spotrain_candidates import (
    BEHIND,
    NORMAL,
    URGENT,
    Candidate,
    MarketView,
    PlanContext,
    age_h,
)


@dataclasses.dataclass(frozen=True)
class DeadlineState:
    """Where the job stands against its deadline at this decision."""

    mode: str  # "safety-net" | "behind" | "ahead" | "free"
    urgency: int  # URGENT, BEHIND or NORMAL: the order in which the joint allocation serves jobs
    fallback_rate: float  # work per second of the fastest on-demand gang (0: none)
    safety_s: float  # the Safety Net's margin: safety_net_restarts x d + lag + work a short notice loses
    slack_s: float = math.inf  # R - C (inf without a deadline)
    reserve_s: float = math.inf  # slack to keep before the job stops waiting for spot
    wake_s: float | None = None  # when to decide again if nothing else happens


def deadline_state(ctx: PlanContext, fallback_rate: float) -> DeadlineState:
    """The job's mode. Waiting spends slack one for one, so a job ahead asks to be woken when its
    slack will have reached the reserve."""
    deadline, now = ctx.job.deadline_s, ctx.inp.now_s
    safety = ctx.params.safety_net_restarts * ctx.d + ctx.lag + ctx.lost_s
    if deadline is None or fallback_rate <= 0:
        return DeadlineState("free", NORMAL, fallback_rate, safety)
    slack = objective.slack_s(now, deadline, ctx.w_rem, fallback_rate)
    reserve = reserve_s(ctx.usable, ctx.views, objective.fallback_time_s(ctx.w_rem, fallback_rate), ctx.d, ctx.lag, safety)
    reserve += outage_reserve_s(ctx, objective.fallback_time_s(ctx.w_rem, fallback_rate))
    if slack < safety:
        return DeadlineState("safety-net", URGENT, fallback_rate, safety, slack, reserve)
    if slack <= reserve + ctx.params.slack_tolerance_s:
        # At the reserve, within the rounding tolerance: the wake-up asked for below lands here and
        # must trip, whatever the last bits of the arithmetic say.
        return DeadlineState("behind", BEHIND, fallback_rate, safety, slack, reserve)
    return DeadlineState("ahead", NORMAL, fallback_rate, safety, slack, reserve, wake_s=max(now + ctx.lag, now + slack - reserve))


def reserve_s(options: Sequence[Offering], views: Mapping[str, MarketView], fallback_s: float, d: float, lag: float,
              safety: float) -> float:
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


def outage_reserve_s(ctx: PlanContext, fallback_s: float) -> float:
    """Slack for the outages of every eligible spot market at once, when there are several: the
    fallback time times the chance that none has room (the market watch's availability), times
    ``outage_reserve``, tapered to nothing as the restart overhead reaches two decision intervals.
    Waiting through such an outage spends slack; once the slack is down to the Safety Net the job
    cannot afford the restarts back to spot and sits on demand to the end, so a job with cheap
    restarts is better off riding such outages out on demand (two restarts) while it still has slack
    to come back."""
    fracs = [ctx.views[o.key].available_fraction for o in ctx.usable if o.key in ctx.views]
    taper = max(0.0, 1.0 - ctx.d / (2.0 * ctx.lag)) if ctx.lag > 0 else 0.0
    if len(fracs) < 2 or taper <= 0 or ctx.params.outage_reserve <= 0:
        return 0.0
    return ctx.params.outage_reserve * taper * math.prod(1.0 - f for f in fracs) * fallback_s


def deadline_filter(ctx: PlanContext, scored: list[Candidate], st: DeadlineState) -> tuple[list[Candidate], str, float | None]:
    """(the candidates the mode allows, why, when to wake)."""
    if st.mode == "safety-net":
        return _safety_net(ctx, scored, st), "safety net: slack below 2 x restart overhead", st.wake_s
    if st.mode == "behind":
        return _behind(ctx, scored, st), "slack at the reserve: progress now (spot if any)", st.wake_s
    if st.mode == "ahead":
        return _ahead(ctx, scored, st)
    if ctx.job.deadline_s is None:
        return scored, "no deadline: best goodput per dollar", st.wake_s
    return scored, "best goodput per dollar", st.wake_s


def _safety_net(ctx: PlanContext, scored: list[Candidate], st: DeadlineState) -> list[Candidate]:
    """The fallback at least as fast as the fastest on-demand gang; an intact spot gang that fast is
    kept while the slack still covers a preemption (its restart, a decision interval and the work a
    short notice loses), so a job that entered spot at the net is not moved off it by rounding."""
    d, lag, tol = ctx.d, ctx.lag, ctx.params.slack_tolerance_s
    keep_spot = [c for c in scored if c.placements == ctx.cur and not ctx.job.restarting and c.rate >= st.fallback_rate - 1e-12
                 and st.slack_s >= d + lag + ctx.lost_s - tol]
    return keep_spot or [c for c in scored if c.all_on_demand and c.rate >= st.fallback_rate - 1e-12]


def _behind(ctx: PlanContext, scored: list[Candidate], st: DeadlineState) -> list[Candidate]:
    """Progress now on a gang at least as fast as the fallback: spot first when any has room.
    Leaving on-demand for spot costs a restart now and one more when preempted: only while the slack
    still covers that cycle beyond the Safety Net and the spot life is worth it (section 5.4) - or,
    with less slack, while it covers one more restart beyond the Safety Net, for a spot run that has
    lasted ``established_run_h`` already (Lindy: an old run is the one likely to outlast the
    restarts; on-demand keeps the slack, so sitting there to the end wastes it)."""
    d, lag, now = ctx.d, ctx.lag, ctx.inp.now_s
    fast = [c for c in scored if c.rate >= st.fallback_rate - 1e-12]
    on_od = bool(ctx.held) and all(m == ON_DEMAND for (_, m) in ctx.held)
    k = price_ratio(scored)
    cycle_ok = st.slack_s >= st.safety_s + 2.0 * d + lag
    last_try_ok = st.slack_s >= st.safety_s + lag

    def established(c: Candidate) -> bool:
        ages = [age_h(ctx.inp.history.get(p.offering_key), now) for p in c.placements if p.market == SPOT]
        return all(a is not None and a >= ctx.params.established_run_h for a in ages)

    spot_fast = [c for c in fast if c.has_spot and (not on_od or (
        (cycle_ok or (last_try_ok and established(c))) and life_ok(c, ctx, k, from_od=True)))]
    if spot_fast:
        return spot_fast + [c for c in fast if not c.has_spot]
    return [c for c in fast if not c.has_spot] or fast


def _ahead(ctx: PlanContext, scored: list[Candidate], st: DeadlineState) -> tuple[list[Candidate], str, float | None]:
    """Spot only (with the lifetime test when leaving on-demand), else wait. Two refinements:
    hysteresis - the reserve shrinks with the work left while the slack on demand does not, so a job
    put on demand at the reserve soon sits just above it; releasing the gang to wait and taking it
    back a decision later would pay a restart each time, so it lets go only with slack for
    ``od_release_cycles`` restart cycles and for the spot market expected back first. And patience -
    rather than start on a dear spot offering, wait for one ``wait_premium`` cheaper to have room, as
    long as ``outage_margin`` times its mean outage leaves the slack above the reserve."""
    d, lag, now, p = ctx.d, ctx.lag, ctx.inp.now_s, ctx.params
    wake = st.wake_s
    on_od = bool(ctx.held) and all(m == ON_DEMAND for (_, m) in ctx.held)
    k = price_ratio(scored)
    allowed = [c for c in scored if c.all_spot and life_ok(c, ctx, k, from_od=on_od)]
    reason = "slack above the reserve: spot only, else wait"
    soonest_s = min((ctx.views[o.key].mean_outage_s for o in ctx.usable if o.key in ctx.views), default=math.inf)
    release_s = max(p.od_release_cycles * (2.0 * d + lag), soonest_s)
    if not allowed and on_od and not ctx.job.restarting and st.slack_s <= st.reserve_s + release_s:
        allowed = [c for c in scored if c.placements == ctx.cur]
        reason = "slack just above the reserve: stays on demand until spot has room"
    if allowed and (not ctx.cur or ctx.job.restarting):
        best_now = min(c.price_usd_per_hour / c.rate for c in allowed)
        spare_s = st.slack_s - st.reserve_s
        # What an hour of slack is worth, as a share of the spot price: more when the slack to spare
        # is small against the work left (wait_slack_value x fallback time / spare slack).
        slack_value = p.wait_slack_value * objective.fallback_time_s(ctx.w_rem, st.fallback_rate) / max(spare_s, 1.0)
        cheaper = []
        options = {pl.offering_key for c in scored for pl in c.placements}
        for o in ctx.usable:
            if o.key not in ctx.views or o.spot_price_usd_per_hour is None:
                continue
            if o.key not in options and _carries_state(ctx, o):
                continue  # a move there was dropped as dearer than what is at hand (or unknown)
            price, out_s = spot_price_per_work(o, ctx.scaling), ctx.views[o.key].mean_outage_s
            # Waiting out_s for o, or taking the best now and moving to o when it is back (a
            # restart, and the premium meanwhile): wait when that costs more than the slack.
            if price < best_now / (1.0 + p.wait_premium) and best_now / price - 1.0 + d / max(out_s, 1.0) > slack_value:
                cheaper.append(out_s)
        wait_s = min(cheaper, default=math.inf)
        if st.slack_s - p.outage_margin * wait_s > st.reserve_s + 2.0 * d + lag:
            allowed = []
            reason = "slack above the reserve: waiting for a cheaper spot offering"
            wake = min(wake if wake is not None else math.inf, now + max(lag, wait_s))
    return allowed, reason, wake


def _carries_state(ctx: PlanContext, o: Offering) -> bool:
    """Whether a gang on ``o`` would carry a non-empty state to another region or cloud."""
    return (ctx.state_location is not None and ctx.size_gb > 0
            and ctx.location([Placement(o.key, SPOT, 1)]) != ctx.state_location)


def price_ratio(scored: Sequence[Candidate]) -> float:
    """k = on-demand / spot price per unit of work (best of each)."""
    od = min((c.price_usd_per_hour / c.rate for c in scored if c.all_on_demand), default=math.inf)
    sp = min((c.price_usd_per_hour / c.rate for c in scored if c.has_spot), default=math.inf)
    if not math.isfinite(od) or not math.isfinite(sp) or sp <= 0:
        return math.inf
    return od / sp


def life_ok(c: Candidate, ctx: PlanContext, k: float, *, from_od: bool) -> bool:
    """Can't Be Late's lifetime test (section 5.4) on the gang's expected life (1 / its hazard)."""
    lam = ctx.hazard(c.placements)
    if lam <= 0:
        return True
    if not math.isfinite(k):
        return True
    return objective.spot_worth_switching(3600.0 / lam, ctx.d, k, from_on_demand=from_od)


def spot_price_per_work(o: Offering, scaling: Scaling) -> float:
    """Spot USD per hour per unit of rate of one instance (the unit ``Candidate.price / rate`` uses)."""
    rate = gang_rate(scaling, ((o, 1),))
    return o.spot_price_usd_per_hour / rate if rate > 0 and o.spot_price_usd_per_hour is not None else math.inf
