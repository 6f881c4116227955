"""The controller's online market watch agrees with what happened in the market."""

from __future__ import annotations

import pytest

from autoscaler.market_watch import MarketWatcher
from autoscaler.policy import MarketHistory
from cloud_providers.base import Offering


def offer(avail: int, spot: float | None = 0.2) -> Offering:
    return Offering("aws", "us-east-1", "us-east-1a", "g4dn.xlarge", "T4", 1, 0.526, spot, avail)


def test_watch_accumulates_room_drops_and_runs() -> None:
    w = MarketWatcher()
    w.observe(0, [offer(2)])
    w.observe(100, [offer(0)])  # room for 2 during [0, 100), then gone
    w.observe(160, [offer(1)])  # no room during [100, 160)
    w.observe(200, [offer(1)])  # room for 1 during [160, 200)
    key = offer(1).key
    h = w.merge({key: MarketHistory(key, spot_seconds_held=50.0, preemptions=1)})[key]
    assert h.watched_s == 200
    assert h.available_s_at_least[0] == pytest.approx(140)
    assert h.available_s_at_least[1] == pytest.approx(100)
    assert h.drops == 1 and h.available_since_s == 160
    assert h.spot_seconds_held == 50.0 and h.preemptions == 1  # the controller's own history is kept


def test_offerings_without_spot_are_not_watched() -> None:
    w = MarketWatcher()
    w.observe(0, [offer(0, spot=None)])
    assert w.merge({}) == {}
