"""The objective: expected goodput per dollar of a candidate allocation, and the deadline arithmetic.

Expected goodput over a planning horizon ``H`` of an allocation that progresses at ``rate`` (reference
GPU-seconds per second) when running, costs ``price_usd_per_hour``, and is preempted at
``hazard_per_hour`` (0 on demand), each preemption costing ``loss_s`` seconds (the restart overhead
plus the work since the last checkpoint), after a switch overhead ``switch_s`` (0 when the allocation
is what the job already runs; one restart overhead otherwise):

    productive_s  = max(0, H - switch_s) / (1 + hazard * loss_s)      (renewal-reward: each cycle of
                                                                        mean length 1/hazard loses loss_s)
    goodput       = rate * productive_s
    cost_usd      = price_usd_per_hour * H / 3600
    per_dollar    = goodput / cost_usd

Putting the switch overhead inside the horizon is what keeps the policy from thrashing: a new
allocation wins only when its better rate or price pays back its restart within ``H``.

Deadline arithmetic follows Can't Be Late (Wu et al., NSDI'24): with ``R(t)`` the time left to the
deadline and ``C(t)`` the time the remaining work needs on the guaranteed (on-demand) fallback, the
slack is ``R - C``; a job may only take a risk that loses a restart overhead ``d`` while the slack
exceeds ``2 d`` (the Safety Net).
"""

from __future__ import annotations

import math


def productive_fraction(hazard_per_hour: float, loss_s: float) -> float:
    """Share of held time that makes progress under preemptions (renewal-reward)."""
    if hazard_per_hour < 0 or loss_s < 0:
        raise ValueError("hazard_per_hour and loss_s must be >= 0")
    return 1.0 / (1.0 + hazard_per_hour * loss_s / 3600.0)


def expected_goodput(rate: float, *, horizon_s: float, hazard_per_hour: float, loss_s: float, switch_s: float) -> float:
    """Expected reference GPU-seconds of work done over ``horizon_s``."""
    if horizon_s <= 0 or rate <= 0:
        return 0.0
    return rate * max(0.0, horizon_s - switch_s) * productive_fraction(hazard_per_hour, loss_s)


def goodput_per_usd(
    rate: float,
    price_usd_per_hour: float,
    *,
    horizon_s: float,
    hazard_per_hour: float,
    loss_s: float,
    switch_s: float,
    extra_usd: float = 0.0,
) -> float:
    """Expected work per dollar (reference GPU-seconds per USD); 0 for an empty allocation.
    ``extra_usd`` is paid once over the horizon besides the price (a move's egress, issue 23)."""
    if price_usd_per_hour <= 0 or horizon_s <= 0:
        return 0.0
    if extra_usd < 0:
        raise ValueError("extra_usd must be >= 0")
    work = expected_goodput(rate, horizon_s=horizon_s, hazard_per_hour=hazard_per_hour, loss_s=loss_s, switch_s=switch_s)
    return work / (price_usd_per_hour * horizon_s / 3600.0 + extra_usd)


def fallback_time_s(remaining_work: float, fallback_rate: float) -> float:
    """C(t): seconds the remaining work needs on the guaranteed fallback allocation."""
    if remaining_work <= 0:
        return 0.0
    if fallback_rate <= 0:
        return math.inf
    return remaining_work / fallback_rate


def slack_s(now_s: float, deadline_s: float, remaining_work: float, fallback_rate: float) -> float:
    """R(t) - C(t): time to spare if the job switched to the fallback now (without its overhead)."""
    return (deadline_s - now_s) - fallback_time_s(remaining_work, fallback_rate)


def spot_worth_switching(expected_life_s: float, restart_s: float, price_ratio: float, *, from_on_demand: bool) -> bool:
    """Can't Be Late's lifetime test (section 5.4), with the expected lifetime in place of the oracle's.

    With ``k`` = on-demand price / spot price, a spot run of life ``o`` is cheaper per unit of progress
    than on-demand when ``o / (o - d) < k`` (starting from idle) and, when leaving a running on-demand
    instance (which costs a second restart later), when ``(o + k d) / (o - d) < k``.
    """
    k = price_ratio
    if k <= 1.0:
        return False
    need = (2.0 if from_on_demand else 1.0) * k * restart_s / (k - 1.0)
    return expected_life_s > need

