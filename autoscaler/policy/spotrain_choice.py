"""spotrain's per-job planning, steps 4-5: the budget, then the order of preference and stickiness.

``budget_filter`` keeps what can finish within the hard budget, or ends the job (FAILED_BUDGET) when
nothing could; ``rank`` orders what is left by goodput per dollar with speed breaking near-ties; and
``stick_or_switch`` keeps the running gang first unless a move is clearly worth its restart (Can't Be
Late's Exploitation, section 5.2).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from autoscaler.jobs.domain import Outcome
from cloud_providers.base import SPOT
from cost_models import hazard as hz
from cost_models import moves as mv
from cost_models import objective

from .base import Placement
from .jobmath import gang_rate, on_demand_allowed, spot_allowed
from .spotrain_candidates import Candidate, JobPlan, PlanContext
from .spotrain_deadline import DeadlineState


def budget_filter(ctx: PlanContext, scored: Sequence[Candidate], allowed: list[Candidate],
                  st: DeadlineState) -> list[Candidate] | JobPlan:
    """The allowed candidates that fit the money left, those whose expected cost fits first; or the
    job's plan when the budget decides it. A candidate fits when finishing on it without further
    preemptions (and one decision interval at its price) fits; it fits comfortably when its expected
    cost, preemptions priced in, does too. The job fails only when no way of finishing could fit,
    spot offerings without room at the moment included (those may come back); when only such spot
    fits, it waits. Under the Safety Net or at the reserve a job that must progress takes any
    candidate that fits, whatever the deadline filter allowed."""
    job, w_rem, lag = ctx.job, ctx.w_rem, ctx.lag
    budget = job.spec.objective.budget_usd
    if budget is None:
        return allowed
    left = budget - job.cost_so_far_usd
    fits, comfy = [], []
    for c in scored:
        move = ctx.move(c.placements, c.price_usd_per_hour)
        switch = ctx.switch_s(c.placements) + move.transfer_s
        # A move to another region or cloud also bills its egress (issue 23).
        nominal = c.price_usd_per_hour * (w_rem / c.rate + switch) / 3600 + move.egress_usd
        lam = ctx.hazard(c.placements)
        expected = (c.price_usd_per_hour * (w_rem / c.rate / objective.productive_fraction(lam, ctx.loss_s) + switch) / 3600
                    + move.egress_usd)
        if nominal <= left and c.price_usd_per_hour * lag / 3600 <= left:
            fits.append(c)
            if expected <= left:
                comfy.append(c)
    cheapest_finish = cheapest_finish_usd(ctx, scored)
    if w_rem > 0 and math.isfinite(cheapest_finish) and cheapest_finish > left:
        return JobPlan(job.job_id, st.urgency, (), (f"budget: finishing needs at least ${cheapest_finish:.2f} more, "
                                                    f"${max(left, 0):.2f} of ${budget:.2f} left"), outcome=Outcome.BUDGET)
    fit_set = {id(c) for c in fits}
    comfy_set = {id(c) for c in comfy}
    allowed = [c for c in allowed if id(c) in comfy_set] or [c for c in allowed if id(c) in fit_set]
    if not allowed and st.mode in ("safety-net", "behind"):
        allowed = [c for c in comfy if c.rate > 0] or [c for c in fits if c.rate > 0]
    if not allowed and not fits and scored:
        return JobPlan(job.job_id, st.urgency, (), (f"budget: only spot fits the ${max(left, 0):.2f} left "
                                                    f"(at least ${cheapest_finish:.2f}); waiting for spot room"),
                       wake_s=ctx.inp.now_s + lag)
    return allowed


def drop_dear_moves(ctx: PlanContext, scored: Sequence[Candidate], allowed: list[Candidate], *,
                    can_wait: bool = False) -> list[Candidate]:
    """Moves that cost more than they can save (issue 23): a candidate that carries the job's state to
    another region or cloud is dropped when its expected cost to finish, egress and transfer
    included, is above the cheapest way to finish where the state already is (any market: on demand
    there never runs out; with ``can_wait``, slack above the reserve, spot there too, room or not: the
    job may wait for it). Then waiting, or on-demand where the state is, beats the move; the scores
    alone (capped at ``horizon_s``) would spread an egress bill over hours the job never stays."""
    if ctx.state_location is None or ctx.size_gb <= 0 or ctx.w_rem <= 0:
        return allowed

    def finish_usd(c: Candidate) -> float:
        mc = ctx.move(c.placements, c.price_usd_per_hour)
        lam = ctx.hazard(c.placements)
        run_s = ctx.w_rem / c.rate / objective.productive_fraction(lam, ctx.loss_s) + ctx.switch_s(c.placements) + mc.transfer_s
        return c.price_usd_per_hour * run_s / 3600 + mc.egress_usd

    def moves(c: Candidate) -> bool:
        return ctx.location(c.placements) != ctx.state_location

    home = min((finish_usd(c) for c in scored if not moves(c)), default=math.inf)
    if can_wait and spot_allowed(ctx.job):
        n = ctx.job.spec.workers.max
        for o in ctx.options:
            if o.spot_price_usd_per_hour is None or n % o.gpus or ctx.location([Placement(o.key, SPOT, 1)]) != ctx.state_location:
                continue
            rate = gang_rate(ctx.scaling, ((o, n // o.gpus),))
            lam = ctx.hazards.get(o.key, hz.PRIOR_HAZARD_PER_HOUR)
            if rate > 0:
                run_s = ctx.w_rem / rate / objective.productive_fraction(lam, ctx.loss_s) + ctx.d
                home = min(home, o.spot_price_usd_per_hour * (n // o.gpus) * run_s / 3600)
    return [c for c in allowed if not moves(c) or finish_usd(c) <= home]


def cheapest_finish_usd(ctx: PlanContext, scored: Sequence[Candidate]) -> float:
    """A lower bound on the money needed to finish: the cheapest candidate now without preemptions,
    or a homogeneous gang of ``workers.min`` GPUs on any eligible offering, spot ones without room
    at the moment (or refused a moment ago) included, after one restart."""
    job, w_rem, d = ctx.job, ctx.w_rem, ctx.d
    best = math.inf
    for c in scored:
        best = min(best, c.price_usd_per_hour * (w_rem / c.rate + ctx.switch_s(c.placements)) / 3600)
    n = job.spec.workers.min
    for o in ctx.options:
        if n % o.gpus:
            continue
        k = n // o.gpus
        rate = gang_rate(ctx.scaling, ((o, k),))
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


def rank(ctx: PlanContext, allowed: list[Candidate]) -> list[Candidate]:
    """Best goodput per dollar first; among candidates within ``faster_tolerance`` of the best, the
    faster one wins (a job that finishes sooner is exposed to fewer preemptions and frees its quota),
    and at the same speed one that keeps the job's state where it is beats one within
    ``home_tolerance`` of its score that carries it to another region or cloud (issue 23: after a
    preemption a zone next to the state is as good a guess as one far away, and restarting there
    moves nothing; the scores of zones alike differ only by noise in their learned hazards).
    Ties end on the placements, so the order never depends on how candidates were listed."""
    best = max((c.score for c in allowed), default=0.0)
    cut = best * (1 - ctx.params.faster_tolerance)
    home_cut = best * (1 - ctx.params.home_tolerance)

    def stays(c: Candidate) -> int:
        moves = ctx.state_location is not None and ctx.location(c.placements) != ctx.state_location
        return 0 if not moves and c.score >= home_cut else 1

    return sorted(allowed, key=lambda c: ((0, -round(c.rate, 12), stays(c), -c.score) if c.score >= cut
                                          else (1, 0.0, 0, -c.score),
                                          [(p.offering_key, p.market, p.instances) for p in c.placements]))


def stick_or_switch(ctx: PlanContext, allowed: list[Candidate], st: DeadlineState) -> list[Candidate]:
    """No thrashing: the current allocation stays first unless something else beats it by its
    restart cost (already charged in the score); ties keep it. An intact spot gang runs until
    preempted (Exploitation, Can't Be Late section 5.2): a move to another spot offering at the same
    speed trades a certain restart for a guessed lifetime, so only a faster gang, or a spot offering
    whose expected saving pays ``switch_margin`` restarts (``big_switch_margin`` with less cushion),
    may replace it - and, under a deadline, only while the slack the restart spends leaves the job
    ``switch_cushion_cycles`` (``big_cushion_cycles``) restart cycles above the reserve.

    No freeze (issue 23): besides, at every decision outside the Safety Net, the gang is re-priced
    against each alternative with the whole move priced in (``PlanContext.move``: restart, transfer
    time and egress, the downtime valued at the deadline-weighted price): it moves when the saving
    over the expected stay pays ``reprice_margin`` times that, and the slack after the move still
    covers one preemption above the Safety Net - so a tight deadline no longer pins a job to a dear
    zone once a cheaper one is back. Every voluntary move's bar is raised by the moves the job has
    already made (``move_hysteresis``), so a flapping set of zones is not chased."""
    job, cur, d, lag, p = ctx.job, ctx.cur, ctx.d, ctx.lag, ctx.params
    keep = [c for c in allowed if c.placements == cur]
    if keep and not job.restarting and all(pl.market == SPOT for pl in cur):
        k0 = keep[0]
        no_deadline = job.deadline_s is None
        ahead = st.mode == "ahead"
        room_ok = no_deadline or (ahead and st.slack_s - d - lag > st.reserve_s + p.switch_cushion_cycles * (d + lag))
        big_ok = no_deadline or (ahead and st.slack_s - d - lag > st.reserve_s + p.big_cushion_cycles * (d + lag))
        hyst = ctx.move_hysteresis()
        # The time the job expects to stay: no longer than it has stayed per move so far.
        elapsed_h = max(0.0, ctx.inp.now_s - job.submitted_s) / 3600.0
        stay_cap_h = elapsed_h / job.region_moves if job.region_moves > 0 else math.inf

        def worth(c: Candidate) -> bool:
            mc = ctx.move(c.placements, c.price_usd_per_hour)
            # The part of the move beyond a restart: egress, and the transfer time at the new price.
            extra = mc.egress_usd + mc.transfer_s / 3600 * c.price_usd_per_hour
            saving = switch_saving_usd(k0, c, ctx.w_rem, ctx.lifes_h, d, stay_cap_h)
            unit = d / 3600 * c.price_usd_per_hour
            if (room_ok and saving > hyst * (p.switch_margin * unit + extra)) or (
                    big_ok and saving > hyst * (p.big_switch_margin * unit + extra)):
                return True
            return repriced(c, mc)

        def repriced(c: Candidate, mc: mv.MoveCost) -> bool:
            if st.mode == "safety-net":
                return False
            if st.mode != "free" and st.slack_s - mc.downtime_s - lag < st.safety_s + d + lag:
                return False
            usd_per_hour, hours = switch_saving_rate(k0, c, ctx.w_rem, ctx.lifes_h, ctx.loss_eff_s, stay_cap_h)
            return mv.move_pays(saving_usd_per_hour=usd_per_hour, stay_hours=hours, cost=mc,
                                margin=p.reprice_margin * hyst)

        movers = [c for c in allowed if c is not k0 and (
            (c.rate > k0.rate * (1 + 1e-9) and c.score > k0.score)
            or (c.all_spot and c.rate >= k0.rate * (1 - 1e-9) and worth(c)))]
        return movers + keep
    if keep and not job.restarting and keep[0].score >= allowed[0].score * (1 - 1e-9):
        return keep + [c for c in allowed if c is not keep[0]]
    return allowed


def switch_saving_usd(cur: Candidate, new: Candidate, w_rem: float, lifes_h: Mapping[str, float], d: float,
                      stay_cap_h: float = math.inf) -> float:
    """Expected saving of moving a running spot gang to ``new``: the difference of the prices with
    each offering's restarts priced in (one per expected remaining run), over the shorter of the time
    left to finish, the new offering's expected remaining run and ``stay_cap_h`` (how long the job
    has stayed per move so far: a market that made it move often will again)."""
    usd_per_hour, hours = switch_saving_rate(cur, new, w_rem, lifes_h, d, stay_cap_h)
    return usd_per_hour * hours


def switch_saving_rate(cur: Candidate, new: Candidate, w_rem: float, lifes_h: Mapping[str, float], d: float,
                       stay_cap_h: float = math.inf) -> tuple[float, float]:
    """``switch_saving_usd`` as (USD per hour saved, hours the job expects to stay)."""
    def life(c: Candidate) -> float:
        return min((lifes_h.get(p.offering_key, 0.0) for p in c.placements if p.market == SPOT), default=math.inf)

    def eff(c: Candidate) -> float:
        return c.price_usd_per_hour / c.rate * (1.0 + d / 3600.0 / max(life(c), 1e-9))

    hours = min(w_rem / new.rate / 3600.0, life(new), stay_cap_h)
    return max(0.0, eff(cur) - eff(new)) * new.rate, hours
