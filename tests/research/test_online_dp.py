"""research.online_dp.Program: the planner's program is the online bound's, solved once for every job."""

from __future__ import annotations

import numpy as np
import pytest

from research.online_bound import OnlineDP
from research.online_dp import AGE_EDGES, INFEASIBLE, PLANNER_EDGES, MarketModel, Program, market_state

MARKETS = [MarketModel(0.82, 4.0, 1.0), MarketModel(0.93, 5.0, 1.5)]


def test_values_and_moves_are_the_online_bounds() -> None:
    """Solved for one job's work and slack, the program's values are OnlineDP's (float32 against
    float64) and its move at every sampled state is OnlineDP's, or one as cheap (a tie)."""
    work, slack, d = 240, 60, 12
    ticks = (work + slack) // 5
    ref = OnlineDP([tuple(m) for m in MARKETS], 3.06, work, slack, d)
    prog = Program(MARKETS, 3.06, ticks, slack, d, AGE_EDGES)
    want = ref.value.reshape(slack + 1, prog.npos, -1)
    got = prog.values[ticks]
    feasible = want < INFEASIBLE / 10
    np.testing.assert_allclose(got[feasible], want[feasible], rtol=1e-5)
    assert np.all(got[~feasible] >= INFEASIBLE / 10)
    rng = np.random.default_rng(0)
    for _ in range(400):
        t, s = int(rng.integers(1, ticks + 1)), int(rng.integers(0, slack + 1))
        pos, j = int(rng.integers(0, prog.npos)), int(rng.integers(0, prog.Z ** 2))
        mine = prog.decide(t, s, pos, j)
        theirs = int(ref.action[t].reshape(slack + 1, prog.npos, -1)[s, pos, j])  # type: ignore[union-attr]
        if mine != theirs:  # a tie: both moves are worth the state's value
            assert _q(prog, t, s, pos, j, mine) == pytest.approx(_q(prog, t, s, pos, j, theirs), rel=1e-5)


def _q(prog: Program, t: int, s: int, pos: int, j: int, move: int) -> float:
    prev, nxt = prog.values[t - 1], prog.k[j]
    step = min(max(5 * t - s, 0), 5)
    if move == 0:
        return float(nxt @ prev[s - 5, 0]) if s >= 5 else INFEASIBLE
    s2 = s if move == pos else s - prog.restart_min
    if s2 < 0:
        return INFEASIBLE
    if move == prog.on_demand:
        return prog.od_usd_per_hour * step / 60 + (0.0 if step < 5 else float(nxt @ prev[s2, move]))
    if not prog.up[move - 1, j]:
        return INFEASIBLE
    cont = np.where(prog.up[move - 1], prev[s2, move], prev[s2, 0])
    return prog.markets[move - 1].spot_usd_per_hour * step / 60 + (0.0 if step < 5 else float(nxt @ cont))


def test_one_solve_serves_every_deadline_and_caps_slack_conservatively() -> None:
    big = Program(MARKETS, 3.06, 120, 90, 12)
    for work, slack in ((300, 60), (420, 90), (200, 40)):
        own = Program(MARKETS, 3.06, (work + slack) // 5, slack, 12)
        np.testing.assert_allclose(big.values[(work + slack) // 5][: slack + 1], own.values[-1], rtol=1e-5)
    # More slack than the cap is valued as the cap: never below the true value.
    capped = Program(MARKETS, 3.06, 120, 30, 12)
    t = 100
    fresh = market_state(True, 0, PLANNER_EDGES) * 6 + market_state(False, 5, PLANNER_EDGES)
    assert capped.value(t, 90, 0, fresh) >= big.value(t, 90, 0, fresh) - 1e-4
    assert capped.value(t, 90, 0, fresh) == pytest.approx(capped.value(t, 30, 0, fresh))


def test_extremes() -> None:
    # A market that is nearly always up: one restart, then spot to the end.
    prog = Program([MarketModel(1.0, 10_000.0, 0.01)], 3.0, 60, 60, 12)
    up_fresh = market_state(True, 0, PLANNER_EDGES)
    assert prog.value(60, 60, 0, up_fresh) == pytest.approx(1.0 * (240 + 12) / 60, rel=1e-3)
    assert prog.decide(60, 60, 0, up_fresh) == 1
    # No spot at all: waiting is free until the slack would no longer cover the restart to on demand
    # (waiting 5 more minutes from 14 leaves 9 < 12), and without slack for a restart nothing works.
    down = market_state(False, 100, PLANNER_EDGES)
    dead = Program([MarketModel(1.0, 0.01, 10_000.0)], 3.0, 60, 60, 12)
    assert dead.decide(60, 30, 0, down) == 0
    assert dead.decide(60, 14, 0, down) == dead.on_demand
    assert dead.value(60, 14, 0, down) == pytest.approx(3.0 * (300 - 14 + 12) / 60, rel=1e-4)
    assert dead.value(60, 5, 0, down) >= INFEASIBLE / 10
    with pytest.raises(ValueError):
        Program([], 3.0, 10, 10, 12)
