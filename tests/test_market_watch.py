"""The controller's online market watch agrees with what happened in the market."""

from __future__ import annotations

import pytest

from autoscaler.fleet.market_watch import MarketWatcher
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


@pytest.mark.parametrize("grid_s", [300.0, 195.0])
def test_simulator_history_is_the_controllers(grid_s: float) -> None:
    """The simulator's precomputed watch gives, at any time, exactly the ``MarketHistory`` the
    controller's ``MarketWatcher`` reports after observing every change point of the trace and then
    the market at that time. (Times here are whole or half seconds, so the sums are exact however the
    segments are split: equality, not approximation.)"""
    import copy

    import numpy as np

    from autoscaler.simulator.market_watch import MarketWatch
    from research.tracegen import MULTI_ZONE, generate_trace

    trace = generate_trace(MULTI_ZONE, hours=72, seed=5, grid_s=grid_s)
    sim = MarketWatch(trace, trace.keys)
    changes = sorted(set(trace.change_times()))
    rng = np.random.default_rng(0)
    queries = sorted({*(np.round(rng.uniform(0, trace.duration_s + 7200, 300) * 2) / 2), *changes[:40], 0.0})
    live = MarketWatcher()
    i = 0
    for t in map(float, queries):
        while i < len(changes) and changes[i] <= t:
            live.observe(changes[i], trace.offerings_at(changes[i]))
            i += 1
        now = copy.deepcopy(live)
        now.observe(t, trace.offerings_at(t))
        assert sim.history_at(t) == now.merge({}), t
    assert any(h.drops > 0 for h in sim.history_at(queries[-1]).values())
