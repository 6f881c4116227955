"""Dynamic programming over a Markov model of spot markets, for one 1-instance job with a deadline.

Why a program: the rules in ``autoscaler/policy`` see each market's price and the age of its current
run; what they cannot weigh is the whole future that an age implies (a young outage of a heavy-tailed
market usually ends soon, an old run usually lasts, a restart spends slack the rest of the job may
need). A program over a model of the markets weighs exactly that. Two users:

- ``research.online_bound`` solves it with the generator's *true* parameters over every
  zone of a market (the online bound: no online policy can be expected to beat it).
- ``research.planner`` solves it with parameters *estimated* from the market's past, over
  subsets of a few markets (``Program``), as a model-based decision rule (docs/policy.md, round 9).

The model (``tracegen``'s): each market alternates available runs and outages with Lomax lengths
(shapes 1.5 and 2.0 at the market's means), rounded to the 5-minute grid, independently per market.

    state   ticks to the deadline t, slack s in minutes (time left minus work left), where the job is
            (waiting, on one market's spot, on demand), and per market: up or down, with the age of the
            current run or outage in buckets
    moves   wait (s -= 5), run where it is (s kept), move (s -= d: the restart's d minutes are paid
            and make no progress), on demand always there; a preempted job is waiting
    value   the expected bill; a missed deadline is ``INFEASIBLE``

Pure: numpy in, numpy out, no I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

TICK_MIN = 5
# Lower edges (ticks) of the age buckets of a run or an outage; the last one is open.
AGE_EDGES = (0, 1, 3, 12, 48)
# The planner's coarser buckets: fresh (< 15 min), young (< 2 h), old. On the benchmark market they
# decide as well as AGE_EDGES (docs/policy.md, round 9) at a fifth of the states for three markets.
PLANNER_EDGES = (0, 3, 24)
UP_SHAPE, DOWN_SHAPE = 1.5, 2.0
INFEASIBLE = 1e9


class MarketModel(NamedTuple):
    """One spot market as the program sees it: price and mean lengths of its runs and outages."""

    spot_usd_per_hour: float
    mean_up_h: float
    mean_down_h: float


def age_bucket(age_ticks: int, edges: Sequence[int] = AGE_EDGES) -> int:
    return bisect.bisect_right(edges, age_ticks) - 1


def _survival(x_ticks: float, mean_ticks: float, shape: float) -> float:
    scale = mean_ticks * (shape - 1.0)
    return float((1.0 + x_ticks / scale) ** -shape)


def zone_transitions(mean_up_h: float, mean_down_h: float, edges: Sequence[int] = AGE_EDGES, *,
                     tick_min: int = TICK_MIN) -> np.ndarray:
    """One zone's tick-to-tick transition matrix over (up, bucket) then (down, bucket) states.
    A run's length in ticks is max(1, round(X)) for a Lomax X (tracegen's rounding), so at age a the
    chance it ends at the next tick is 1 - S(a + 1.5) / S(a + 0.5), 1 - S(1.5) at age 0; a bucket
    of width w is left for the next one with probability 1 / w per tick (its midpoint's hazard).
    ``tick_min``: the trace's grid (``tracegen``'s ``grid_s``; 10 minutes for the multi-region
    markets, whose runs are whole 10-minute steps)."""
    nb = len(edges)
    P = np.zeros((2 * nb, 2 * nb))
    per_tick = 60 / tick_min
    for side, (mean_h, shape) in enumerate(((mean_up_h, UP_SHAPE), (mean_down_h, DOWN_SHAPE))):
        for b in range(nb):
            lo = edges[b]
            hi = edges[b + 1] if b + 1 < nb else None
            a = lo * 1.5 if hi is None else (lo if hi - lo == 1 else (lo + hi - 1) / 2)
            s_a = 1.0 if a < 0.5 else _survival(a + 0.5, mean_h * per_tick, shape)
            p_end = 1.0 - _survival(a + 1.5, mean_h * per_tick, shape) / s_a
            me, flip = side * nb + b, (1 - side) * nb
            P[me, flip] += p_end
            advance = 0.0 if hi is None else 1.0 / (hi - lo)
            if advance > 0:
                P[me, me + 1] += (1 - p_end) * advance
            P[me, me] += (1 - p_end) * (1 - advance)
    return P


def market_state(up: bool, age_ticks: int, edges: Sequence[int]) -> int:
    """A market's state index in ``zone_transitions``' order."""
    b = age_bucket(max(0, age_ticks), edges)
    return b if up else len(edges) + b


class Program:
    """The program for a few markets, solved for every tick up to ``ticks`` and every slack up to
    ``slack_cap_min`` (a job with more slack is valued as if it had the cap: an upper bound on its
    cost, since slack only ever helps). Positions: 0 waiting, 1..n a market's spot, n + 1 on demand.

    Values are kept for every tick (float32, ticks x slack x positions x joint states), the move is
    worked out at ``decide`` from the values one tick later, so one solve serves every job on the same
    markets with the same restart overhead, whatever its deadline and work. The expectation over the
    next tick is one matrix product with the joint transition matrix (the markets' Kronecker product),
    which is why a handful of markets and coarse age buckets are what it is for."""

    def __init__(self, markets: Sequence[MarketModel], on_demand_usd_per_hour: float, ticks: int, slack_cap_min: int,
                 restart_min: int, edges: Sequence[int] = PLANNER_EDGES) -> None:
        if ticks < 1 or slack_cap_min < 0 or restart_min < 0 or not markets:
            raise ValueError("a program needs markets, at least one tick, and non-negative slack and restart")
        self.markets, self.edges = tuple(markets), tuple(edges)
        self.n = n = len(markets)
        self.on_demand, self.npos = n + 1, n + 2
        self.od_usd_per_hour, self.restart_min = on_demand_usd_per_hour, restart_min
        self.Z = Z = 2 * len(edges)
        Ps = [zone_transitions(m.mean_up_h, m.mean_down_h, edges) for m in markets]
        self.pt = [P.T.astype(np.float32) for P in Ps]  # along one market's axis: values @ P.T
        K = np.ones((1, 1))
        for P in Ps:
            K = np.kron(K, P)
        self.k = K  # the joint chain, for ``decide``'s one state
        joint = np.indices((Z,) * n).reshape(n, -1)
        self.up = (joint < len(edges)).astype(bool)  # (n, J): market i has room in joint state j
        S = slack_cap_min + 1
        self.values = [np.zeros((S, self.npos, Z ** n), np.float32)]
        for t in range(1, ticks + 1):
            self.values.append(self._step(t, self.values[-1]))

    def _work_step(self, t: int, S: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        work = TICK_MIN * t - np.arange(S)
        step = np.clip(work, 0, TICK_MIN).astype(np.float32)
        return work, step, step < TICK_MIN

    def _step(self, t: int, prev: np.ndarray) -> np.ndarray:
        S, npos, J = prev.shape
        n, d = self.n, self.restart_min
        work, step, last = self._work_step(t, S)
        # Everything that needs an expectation over the next tick, in one product.
        src = [np.where(self.up[i][None], prev[:, 1 + i], prev[:, 0]) for i in range(n)]  # preempted: waiting
        src += [prev[:, self.on_demand], prev[:, 0]]
        E = self._expect(np.stack(src).reshape(-1, J)).reshape(n + 2, S, J)
        cont = np.where(last[:, None], np.float32(0), E[: n + 1])  # (n + 1, S, J)
        run = np.empty((npos, S, J), np.float32)
        run[0] = INFEASIBLE
        for i, m in enumerate(self.markets):
            run[1 + i] = np.where(self.up[i][None], m.spot_usd_per_hour * step[:, None] / 60 + cont[i], INFEASIBLE)
        run[self.on_demand] = self.od_usd_per_hour * step[:, None] / 60 + cont[n]
        wait = np.full((S, J), INFEASIBLE, np.float32)
        if S > TICK_MIN:
            wait[TICK_MIN:] = E[n + 1][: S - TICK_MIN]
        moved = np.full_like(run, INFEASIBLE)
        if S > d:
            moved[:, d:] = run[:, : S - d]  # a restart: d more minutes to pay, d less slack
        best_move = moved[1:].min(0)  # the best place to restart in, wherever the job is
        value = np.empty_like(prev)
        for pos in range(npos):
            others = best_move if pos == 0 else np.minimum(np.delete(moved[1:], pos - 1, 0).min(0), run[pos])
            value[:, pos] = np.minimum(wait, others)
        value[work <= 0] = 0.0
        capped: np.ndarray = np.minimum(value, INFEASIBLE)
        return capped

    def _expect(self, N: np.ndarray) -> np.ndarray:
        """Expected values one tick on, market by market (the chains are independent): each pass
        applies one market's matrix along the last axis, then rotates that axis to the front."""
        R = N.shape[0]
        M = N.reshape((R,) + (self.Z,) * self.n)
        for i in reversed(range(self.n)):
            M = np.moveaxis(M @ self.pt[i], -1, 1)
        out: np.ndarray = np.ascontiguousarray(M).reshape(R, -1)
        return out

    def value(self, t: int, slack_min: int, pos: int, state: int) -> float:
        """Expected bill from here (``INFEASIBLE`` or more: no way to finish in time)."""
        t = min(t, len(self.values) - 1)
        return float(self.values[t][min(slack_min, self.values[0].shape[0] - 1), pos, state])

    def decide(self, t: int, slack_min: int, pos: int, state: int) -> int:
        """The move at this state: 0 wait, 1..n that market's spot, n + 1 on demand."""
        S = self.values[0].shape[0]
        t = min(t, len(self.values) - 1)
        s = min(slack_min, S - 1)
        if t < 1:
            return self.on_demand
        prev = self.values[t - 1]
        work = TICK_MIN * t - s
        step = float(min(max(work, 0), TICK_MIN))
        nxt = self.k[state]  # the joint state's distribution one tick on

        def run_at(q: int, slack: int) -> float:
            if slack < 0:
                return INFEASIBLE
            if q == self.on_demand:
                price, cont_v = self.od_usd_per_hour, prev[slack, q]
            else:
                if not self.up[q - 1, state]:
                    return INFEASIBLE
                price, cont_v = self.markets[q - 1].spot_usd_per_hour, np.where(self.up[q - 1], prev[slack, q], prev[slack, 0])
            cont = 0.0 if step < TICK_MIN else float(nxt @ cont_v)
            return price * step / 60 + cont

        options = [float(nxt @ prev[s - TICK_MIN, 0]) if s >= TICK_MIN else INFEASIBLE]
        for q in range(1, self.npos):
            options.append(run_at(q, s if q == pos else s - self.restart_min))
        return int(np.argmin(options))
