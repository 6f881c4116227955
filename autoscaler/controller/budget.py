"""The hard budget: never exceeded, whatever the policy planned.

Two checks, both from the database and the last prices seen, so a failing cloud call cannot switch
them off:
- the guard, first on every tick: a job whose spend plus its burn rate until the guard runs again
  would cross the budget is stopped now (FAILED_BUDGET). The rate is the worst the cloud may bill
  until then: a spot price can rise to its cap, the on-demand price (EC2's default maximum; GCP's
  Spot and the local cloud's traces stay under it), at any moment between two ticks, so spot instances
  are reserved for at that cap, not at the last price seen (a 90 %-discount spot price back at its
  cap between two ticks used to be billed past the budget: tests/reliability/test_price_spikes.py).
  Where every change of an offering's price wakes the controller at once (the simulator's loop, for
  the markets it watches) its last price holds until then, and is what is reserved;
- before any launch: the cloud bills each launch for at least its minimum (EC2: 60 s), which can be
  longer than the guard's horizon, so spent + running until the next guard + each launch's minimum
  bill must stay under the budget.

The rules themselves (``horizon_s``, ``guard_reason``, ``guard_left_s``, ``launch_reason``) are pure
functions of the spend, the burn rate and the prices, so that the simulator's policy-only fast path
(``simulator/engine.py``, what ``spotrain tune`` runs) applies the controller's own guard, not a copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy.orm import Session

from autoscaler.fleet import accounting
from autoscaler.jobs.domain import JobState
from cloud_providers.base import MIN_BILLED_S_ATTR, Offering

from ..state import InstanceRow, Job
from .context import Context
from .launches import end_job

Prices = Mapping[str, tuple[float, float | None]]


def price_caps(prices: Prices, seen: frozenset[str] = frozenset()) -> Prices:
    """The most each offering may bill per hour before the guard runs again: on-demand at its price,
    spot at its cap (the on-demand price, or the last spot price if a market ever showed more),
    except the offerings in ``seen``, whose every change wakes the controller: their last price holds
    until it runs again."""
    return {k: (od, spot if spot is None or k in seen else max(spot, od)) for k, (od, spot) in prices.items()}


def horizon_s(tick_s: float, last_tick_s: float, clock_rate: float) -> float:
    """Provider seconds until the budget guard runs again: a few ticks, or longer when ticks run slow
    (a throttled cloud)."""
    return max(3.0 * tick_s, 2.0 * last_tick_s + tick_s) * clock_rate


def guard_horizon_s(ctx: Context) -> float:
    return horizon_s(ctx.tick_s, ctx.last_tick_s, ctx.clock_rate)


def guard_reason(cost_usd: float, budget_usd: float, rate_usd_per_hour: float, horizon: float) -> str | None:
    """Why the guard stops a job that spent ``cost_usd`` and burns up to ``rate_usd_per_hour``, or None."""
    if cost_usd + rate_usd_per_hour * horizon / 3600.0 < budget_usd:
        return None
    return (f"stopped at ${cost_usd:.2f} of a ${budget_usd:.2f} budget: spending up to ${rate_usd_per_hour:.2f}/h "
            "until the next check could cross it")


def guard_left_s(cost_usd: float, budget_usd: float, rate_usd_per_hour: float, horizon: float) -> float | None:
    """Provider seconds from now until the guard would stop the job at this rate (None: nothing burns)."""
    if rate_usd_per_hour <= 0:
        return None
    return max(0.0, (budget_usd - cost_usd) / rate_usd_per_hour * 3600.0 - horizon)


def launch_reason(cost_usd: float, budget_usd: float, rate_usd_per_hour: float, horizon: float,
                  launch_prices_usd_per_hour: Sequence[float], floor_s: float) -> str | None:
    """Why launching instances at these prices could cross the budget (each billed at least
    ``floor_s``, what runs now until the next guard), or None."""
    running = rate_usd_per_hour * horizon / 3600.0
    # At the launch price: a rise during a long minimum bill (not EC2's 60 s) is not reserved for.
    launches = sum(p * floor_s / 3600.0 for p in launch_prices_usd_per_hour)
    if cost_usd + running + launches < budget_usd:
        return None
    return (f"budget: launching {len(launch_prices_usd_per_hour)} instance(s) bills at least ${launches:.2f} "
            f"({floor_s:.0f} s each at least), ${max(budget_usd - cost_usd - running, 0.0):.2f} of ${budget_usd:.2f} left")


def end_over_budget(ctx: Context, s: Session, job: Job, reason: str) -> None:
    end_job(ctx, s, job, JobState.FAILED_BUDGET, reason, why="budget guard")


def budget_guard(ctx: Context, s: Session, job: Job, rows: list[InstanceRow], prices: Prices) -> bool:
    """Hard budget backstop: stop before the next ticks could cross the budget. True if it stopped
    the job. The policy plans within the budget; this guard makes the cap hold even if the plan was
    wrong."""
    budget = ctx.spec(job).objective.budget_usd
    if budget is None:
        return False
    rate = accounting.burn_rate_usd_per_hour(rows, price_caps(prices, ctx.prices_seen_on_change))
    why = guard_reason(job.cost_usd, budget, rate, guard_horizon_s(ctx))
    if why is None:
        return False
    end_over_budget(ctx, s, job, why)
    return True


def launch_over_budget(ctx: Context, s: Session, job: Job, missing: list[tuple[str, str]],
                       by_key: Mapping[str, Offering]) -> str | None:
    """Why launching ``missing`` could cross the hard budget, or None (the policy, planning in
    decision intervals, cannot see the cloud's minimum bill)."""
    budget = ctx.spec(job).objective.budget_usd
    if budget is None or not missing:
        return None
    horizon = guard_horizon_s(ctx)
    floor_s = max(float(getattr(ctx.provider, MIN_BILLED_S_ATTR, 0.0) or 0.0), horizon)
    prices = {k: (o.on_demand_price_usd_per_hour, o.spot_price_usd_per_hour) for k, o in by_key.items()}
    rate = accounting.burn_rate_usd_per_hour(ctx.store.instances(s, job.job_id), price_caps(prices, ctx.prices_seen_on_change))
    adding = [by_key[k].price_usd_per_hour(m) for k, m in missing if k in by_key]
    return launch_reason(job.cost_usd, budget, rate, horizon, adding, floor_s)


def guard_due_s(ctx: Context, s: Session, job: Job) -> float | None:
    """Provider-clock time at which the guard would stop ``job`` at its current burn rate (None: no
    budget, or nothing burning). A loop that does not tick on a fixed interval (the simulator's)
    must tick by then, or the guard's horizon would not hold."""
    budget = ctx.spec(job).objective.budget_usd
    if budget is None or not ctx.last_prices:
        return None
    rate = accounting.burn_rate_usd_per_hour(ctx.store.instances(s, job.job_id, alive_only=True),
                                            price_caps(ctx.last_prices, ctx.prices_seen_on_change))
    left_s = guard_left_s(job.cost_usd, budget, rate, guard_horizon_s(ctx))
    return None if left_s is None else ctx.provider.now_s() + left_s
