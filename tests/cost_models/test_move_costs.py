"""cost_models.moves (issue 23): a move's egress, transfer time and downtime against its saving, and the
catalog's egress list prices it is fed with."""

from __future__ import annotations

import math

import pytest

from cloud_providers.catalog import egress_usd_per_gb
from cost_models import moves as mv


def test_a_move_costs_egress_transfer_and_restart_at_the_cost_of_time() -> None:
    c = mv.move_cost(size_gb=4000, egress_usd_per_gb=0.02, restart_s=720, time_usd_per_hour=36.0, bandwidth_gb_per_s=1.0)
    assert c.egress_usd == pytest.approx(80.0)
    assert c.transfer_s == pytest.approx(4000.0)
    assert c.downtime_s == pytest.approx(4720.0)
    assert c.downtime_usd == pytest.approx(4720.0 / 3600 * 36.0)
    assert c.total_usd == pytest.approx(80.0 + 47.2)


def test_within_a_region_nothing_crosses() -> None:
    c = mv.move_cost(size_gb=4000, egress_usd_per_gb=0.0, restart_s=720, time_usd_per_hour=10.0)
    assert (c.egress_usd, c.transfer_s) == (0.0, 0.0)
    assert c.downtime_usd == pytest.approx(2.0)


def test_move_pays_only_when_the_saving_over_the_stay_beats_the_cost_with_hysteresis() -> None:
    c = mv.move_cost(size_gb=50, egress_usd_per_gb=0.02, restart_s=720, time_usd_per_hour=1.0)  # $1 + $0.2
    assert mv.move_pays(saving_usd_per_hour=0.5, stay_hours=3.0, cost=c)
    assert not mv.move_pays(saving_usd_per_hour=0.5, stay_hours=3.0, cost=c, margin=mv.hysteresis_factor(3, per_move=0.5))
    assert mv.hysteresis_factor(0, per_move=0.5) == 1.0


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_bad_numbers_are_refused_by_name(bad: float) -> None:
    with pytest.raises(ValueError, match="size_gb"):
        mv.egress_usd(bad, 0.02)
    with pytest.raises(ValueError, match="bandwidth_gb_per_s"):
        mv.transfer_s(10.0, 0.0)


def test_catalog_egress_list_prices() -> None:
    assert egress_usd_per_gb("aws", "us-east-1", "aws", "us-east-1") == 0.0
    assert egress_usd_per_gb("aws", "us-east-1", "aws", "us-west-2") == 0.02
    assert egress_usd_per_gb("aws", "us-east-1", "aws", "us-east-2") == 0.01
    assert egress_usd_per_gb("gcp", "us-central1", "gcp", "us-east1") == 0.02
    assert egress_usd_per_gb("gcp", "us-central1", "gcp", "europe-west4") == 0.05
    assert egress_usd_per_gb("aws", "us-east-1", "gcp", "us-central1") == 0.09
    assert egress_usd_per_gb("gcp", "us-central1", "aws", "us-east-1") == 0.12
    assert egress_usd_per_gb("local", "local", "local", "other") == 0.0
