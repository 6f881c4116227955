"""Hazard estimation and the goodput-per-dollar objective."""

from __future__ import annotations

import numpy as np
import pytest

from cost_models import hazard, objective
from cost_models.hazard import HazardEvidence


def test_unseen_offering_gets_the_prior_and_evidence_takes_over() -> None:
    assert hazard.hazard_per_hour(HazardEvidence()) == pytest.approx(hazard.PRIOR_HAZARD_PER_HOUR)
    # 50 preemptions over 100 held hours: the estimate approaches 0.5 / h.
    h = hazard.hazard_per_hour(HazardEvidence(held_hours=100, preemptions=50))
    assert 0.45 < h < 0.51
    # Watching the market counts as evidence too (drops over available hours).
    w = hazard.hazard_per_hour(HazardEvidence(watched_hours=300, available_hours=200, drops=10))
    assert 0.04 < w < 0.07
    with pytest.raises(ValueError):
        HazardEvidence(preemptions=-1)


def test_hazard_estimate_converges_on_simulated_poisson_preemptions() -> None:
    rng = np.random.default_rng(3)
    for true_rate in (0.05, 0.3, 1.0):
        held = 400.0
        n = int(rng.poisson(true_rate * held))
        est = hazard.hazard_per_hour(HazardEvidence(held_hours=held, preemptions=n))
        assert abs(est - true_rate) < 0.25 * true_rate + 0.02


def test_age_hazard_decreases_with_age_and_keeps_the_mean() -> None:
    h = [hazard.age_hazard_per_hour(0.2, a) for a in (0.0, 1.0, 5.0, 50.0)]
    assert all(x > y for x, y in zip(h, h[1:]))
    assert hazard.age_hazard_per_hour(0.2, None) == 0.2
    # Lomax mean life = scale / (shape - 1) = 1 / mean hazard.
    scale = (hazard.LOMAX_SHAPE - 1) / 0.2
    assert scale / (hazard.LOMAX_SHAPE - 1) == pytest.approx(5.0)


def test_availability_fraction_and_outage() -> None:
    assert hazard.available_fraction(HazardEvidence()) == pytest.approx(0.5)
    ev = HazardEvidence(watched_hours=100, available_hours=80, drops=10)
    assert hazard.available_fraction(ev) == pytest.approx((1 + 80) / 102)
    assert 1.5 < hazard.mean_outage_hours(ev) < 3.0


def test_goodput_per_dollar_accounts_for_hazard_restart_and_price() -> None:
    base = dict(horizon_s=3600 * 10, loss_s=600.0, switch_s=0.0)
    safe = objective.goodput_per_usd(1.0, 1.0, hazard_per_hour=0.0, **base)
    risky = objective.goodput_per_usd(1.0, 1.0, hazard_per_hour=1.0, **base)
    assert safe == pytest.approx(3600.0) and risky < safe
    # A switch costs its overhead inside the horizon: staying beats a marginally cheaper move.
    stay = objective.goodput_per_usd(1.0, 1.0, hazard_per_hour=0.1, horizon_s=3600, loss_s=600, switch_s=0)
    move = objective.goodput_per_usd(1.0, 0.9, hazard_per_hour=0.1, horizon_s=3600, loss_s=600, switch_s=600)
    assert stay > move
    assert objective.goodput_per_usd(1.0, 0.0, hazard_per_hour=0, horizon_s=1, loss_s=0, switch_s=0) == 0.0


def test_deadline_arithmetic_and_lifetime_test() -> None:
    assert objective.slack_s(0, 100, 50, 1.0) == 50
    assert objective.slack_s(0, 100, 50, 0.0) == -np.inf
    # k = 3, d = 0.2 h: idle -> spot needs a life over 0.3 h, on-demand -> spot over 0.6 h.
    assert objective.spot_worth_switching(0.4 * 3600, 0.2 * 3600, 3.0, from_on_demand=False)
    assert not objective.spot_worth_switching(0.4 * 3600, 0.2 * 3600, 3.0, from_on_demand=True)
    assert not objective.spot_worth_switching(1e9, 1.0, 1.0, from_on_demand=False)


def test_expected_remaining_life_grows_with_age() -> None:
    """Lindy under a Lomax lifetime: a fresh run is expected to last its mean, an older one longer."""
    from cost_models.hazard import LOMAX_SHAPE, expected_remaining_life_hours

    assert expected_remaining_life_hours(0.25, None) == expected_remaining_life_hours(0.25, 0.0) == 4.0
    assert expected_remaining_life_hours(0.25, 3.0) == 4.0 + 3.0 / (LOMAX_SHAPE - 1.0)
    ages = [0.0, 1.0, 5.0, 20.0]
    lives = [expected_remaining_life_hours(0.5, a) for a in ages]
    assert lives == sorted(lives) and lives[0] < lives[-1]
    assert expected_remaining_life_hours(0.0, 1.0) == float("inf")
