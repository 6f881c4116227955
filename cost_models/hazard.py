"""Spot preemption hazard and availability, estimated online from what has been observed.

Two sources of evidence, both plain counts:

- *Held*: instance-hours held on an offering's spot market and the preemptions seen over them.
- *Watched*: hours the market was watched, hours it had room (``spot_available >= k``), and how many
  times room vanished ("drops"): every drop would have preempted a holder.

The preemption rate is a Gamma-Poisson posterior mean (conjugate prior, so an unseen offering gets
the prior and evidence takes over as it accumulates):

    hazard_per_hour = (PRIOR_EVENTS + events) / (PRIOR_EVENTS / prior_hazard + exposure_hours)

Spot lifetimes are heavy-tailed (Can't Be Late, NSDI'24, section 2; Kadupitiya et al. on GCP
preemptions): a market that has had room for long tends to keep it, i.e. the hazard *decreases* with
the age of the current run. For a Lomax (Pareto II) lifetime with shape ``a`` and scale ``s`` the
hazard at age ``x`` is ``a / (s + x)``; matching its mean ``s / (a - 1)`` to the mean run length gives
``age_hazard_per_hour``. The availability fraction is a Beta posterior mean with the same idea.
"""

from __future__ import annotations

import dataclasses

# Prior: one preemption per 6 instance-hours (AWS's Spot Instance Advisor puts most GPU types in the
# "5-15 %" or ">20 %" monthly-interruption buckets; fleet studies report mean lifetimes of a few
# hours for scarce GPU types), weighted as one observed event.
PRIOR_HAZARD_PER_HOUR = 1.0 / 6.0
PRIOR_EVENTS = 1.0
# Prior availability fraction and its weight in hours.
PRIOR_AVAILABLE_FRACTION = 0.5
PRIOR_AVAILABILITY_HOURS = 2.0
# Shape of the Lomax lifetime used for the age-dependent hazard (a in (1, 3): heavy tail, finite mean).
LOMAX_SHAPE = 1.5


@dataclasses.dataclass(frozen=True)
class HazardEvidence:
    """Counts for one spot offering. All fields default to "nothing seen"."""

    held_hours: float = 0.0
    preemptions: int = 0
    watched_hours: float = 0.0
    available_hours: float = 0.0
    drops: int = 0

    def __post_init__(self) -> None:
        if min(self.held_hours, self.watched_hours, self.available_hours) < 0 or self.preemptions < 0 or self.drops < 0:
            raise ValueError("hazard evidence must be non-negative")


def hazard_per_hour(ev: HazardEvidence, *, prior_hazard_per_hour: float = PRIOR_HAZARD_PER_HOUR) -> float:
    """Posterior mean preemption rate of one held instance, per hour.

    Watching the market (drops over available hours) and holding instances (preemptions over held
    hours) measure the same rate; the two are pooled, the larger exposure counting fully so that an
    instance held while the market was watched is not counted twice.
    """
    if ev.available_hours >= ev.held_hours:
        events, exposure = float(ev.drops), ev.available_hours
    else:
        events, exposure = float(ev.preemptions), ev.held_hours
    return (PRIOR_EVENTS + events) / (PRIOR_EVENTS / prior_hazard_per_hour + exposure)


def age_hazard_per_hour(mean_hazard_per_hour: float, age_hours: float | None, *, shape: float = LOMAX_SHAPE) -> float:
    """Hazard now, given that the current run of availability has lasted ``age_hours``.

    Lomax lifetime with mean 1 / mean_hazard: scale s = (shape - 1) / mean_hazard, hazard a / (s + x).
    Without an age (unknown) the mean hazard is returned.
    """
    if mean_hazard_per_hour <= 0:
        return 0.0
    if age_hours is None:
        return mean_hazard_per_hour
    scale_h = (shape - 1.0) / mean_hazard_per_hour
    return shape / (scale_h + max(0.0, age_hours))


def expected_remaining_life_hours(mean_hazard_per_hour: float, age_hours: float | None, *, shape: float = LOMAX_SHAPE) -> float:
    """Mean of the rest of the current run of availability, given its age (Lomax: the older the
    run, the longer it is expected to last; Lindy). E[X - x | X > x] = (s + x) / (a - 1)."""
    if mean_hazard_per_hour <= 0:
        return float("inf")
    mean_h = 1.0 / mean_hazard_per_hour
    if age_hours is None:
        return mean_h
    return mean_h + max(0.0, age_hours) / (shape - 1.0)


def available_fraction(ev: HazardEvidence) -> float:
    """Posterior mean of the fraction of time the market has room (Beta prior, in hours)."""
    a = PRIOR_AVAILABLE_FRACTION * PRIOR_AVAILABILITY_HOURS + ev.available_hours
    return a / (PRIOR_AVAILABILITY_HOURS + ev.watched_hours)


def mean_outage_hours(ev: HazardEvidence) -> float:
    """Mean length of a spell without room, from watched time: unavailable hours per drop."""
    unavailable = max(0.0, ev.watched_hours - ev.available_hours)
    prior_outage_h = (1.0 - PRIOR_AVAILABLE_FRACTION) / PRIOR_AVAILABLE_FRACTION / PRIOR_HAZARD_PER_HOUR
    return (prior_outage_h * PRIOR_EVENTS + unavailable) / (PRIOR_EVENTS + ev.drops)
