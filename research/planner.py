"""The model-based decision rule of issue 15, tried on the simulator: the online bound's program, solved
on a market model *estimated* from the past, over subsets of a few markets (docs/policy.md, round 9).

The online bound (``online_bound``) knows the generator's true parameters and solves one program over
every zone at once: 5-27 minutes and up to 10 GB for the benchmark's four zones. This rule keeps what
makes it good and drops what makes it slow:

- **Estimated markets.** Every ``refresh_s`` of trace time (a day by default) each market's mean run
  and mean outage are re-estimated from what was seen up to then, with the market watch's own
  formulas (``cost_models.hazard``: Gamma-Poisson hazard, outage hours per drop, the same priors),
  and its price is the mean spot price seen so far. Nothing after the refresh time is read.
- **Subsets.** One program per subset of ``subset_size`` of the ``markets`` cheapest spot markets
  (``research.online_dp.Program``: three markets, coarse age buckets, slack capped at
  ``slack_cap_min``). Restricting a job to a subset is a policy the job could follow, so each
  subset's value is an upper bound on the job's expected bill; at every decision the rule takes the
  move of the subset whose value is lowest from the job's present state (which markets are up, how
  old their runs and outages are, where the job is). Re-choosing at every decision is at least as
  good as keeping any one subset.
- **No Safety Net on top.** The program never takes a move from which its model cannot finish in
  time (such states are worth ``INFEASIBLE``), so it runs spot down to one restart of slack where that
  is safe. Can't Be Late's net (on demand below ``2 d`` plus one decision interval; ``safety_net=True``)
  cost 4 % at fraction 0.9 and saved no deadline on the benchmark (docs/policy.md, round 9); with
  slack below zero or no tick left the job runs on demand either way.

Programs are cached per refresh and shared by every job and start in the process (one solve serves
every deadline and amount of work on the same markets and restart overhead). Fixed 1-instance jobs
with a deadline only, like the online bound.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from autoscaler.policy.base import Allocation, Placement, PolicyInput
from cloud_providers.base import ON_DEMAND, SPOT
from cloud_providers.local.market import MarketTrace
from cost_models.hazard import HazardEvidence, hazard_per_hour, mean_outage_hours
from research.online_bound import ticks_and_slack, trace_history
from research.online_dp import PLANNER_EDGES, TICK_MIN, MarketModel, Program, market_state

DAY_S = 86400.0


class MarketPast:
    """One market's spot room and price over the trace, read only up to a time (what a market watch
    that started with the trace has seen)."""

    def __init__(self, trace: MarketTrace, key: str) -> None:
        # Times the market went from room to none or back: what the online bound reads too.
        self.flip_s, rooms = trace_history(trace, [key])[key]
        self.up = [room > 0 for room in rooms]
        self.price_s: list[float] = []
        self.price: list[float] = []
        for t in trace.change_times():
            o = trace.offering_at(key, t)
            if o.spot_price_usd_per_hour is not None and (not self.price or self.price[-1] != o.spot_price_usd_per_hour):
                self.price_s.append(t)
                self.price.append(float(o.spot_price_usd_per_hour))

    def state_at(self, now_s: float) -> tuple[bool, float]:
        """Room now, and since when (seconds)."""
        i = bisect.bisect_right(self.flip_s, now_s) - 1
        return self.up[i], self.flip_s[i]

    def model_at(self, now_s: float) -> MarketModel:
        """The market estimated from what was seen before ``now_s`` (the market watch's formulas)."""
        watched = avail = 0.0
        drops = 0
        for i, t0 in enumerate(self.flip_s):
            if t0 >= now_s:
                break
            t1 = min(self.flip_s[i + 1] if i + 1 < len(self.flip_s) else now_s, now_s)
            watched += (t1 - t0) / 3600
            if self.up[i]:
                avail += (t1 - t0) / 3600
                drops += int(i + 1 < len(self.flip_s) and self.flip_s[i + 1] <= now_s)
        ev = HazardEvidence(watched_hours=watched, available_hours=avail, drops=drops)
        return MarketModel(self._mean_price(now_s), 1.0 / hazard_per_hour(ev), mean_outage_hours(ev))

    def _mean_price(self, now_s: float) -> float:
        j = bisect.bisect_right(self.price_s, now_s)
        if j <= 1 or now_s <= self.price_s[0]:
            return self.price[0]
        edges = [*self.price_s[:j], now_s]
        w = np.diff(edges)
        return float(np.dot(w, self.price[:j]) / w.sum())


class PlannerPolicy:
    """Replays the model-based rule in the simulator (one fixed 1-instance job with a deadline). One
    instance per simulated run (it remembers its last move, as ``OnlineDPPolicy`` does); ``cache``
    holds solved programs and may be shared between runs."""

    name = "planner"

    def __init__(self, trace: MarketTrace, keys: Sequence[str], od_key: str, od_usd_per_hour: float, restart_s: float, *,
                 cache: OrderedDict[tuple[int, float], dict[tuple[int, ...], Program]] | None = None,
                 pasts: dict[str, MarketPast] | None = None, markets: int = 4, subset_size: int = 3,
                 refresh_s: float = DAY_S, slack_cap_min: int = 360, horizon_ticks: int = 288, safety_net: bool = False) -> None:
        self.pasts = pasts if pasts is not None else {k: MarketPast(trace, k) for k in keys}
        self.keys, self.od_key, self.od_usd_per_hour, self.restart_s = list(keys), od_key, od_usd_per_hour, restart_s
        self.cache = cache if cache is not None else OrderedDict()
        self.n_markets, self.subset_size, self.refresh_s = markets, subset_size, refresh_s
        self.slack_cap_min, self.horizon_ticks, self.safety_net = slack_cap_min, horizon_ticks, safety_net
        self.last_move_s = -math.inf

    def _programs(self, now_s: float) -> tuple[list[str], dict[tuple[int, ...], Program]]:
        refresh = int(now_s // self.refresh_s)
        key = (refresh, self.restart_s)
        t0 = refresh * self.refresh_s
        models = {k: self.pasts[k].model_at(t0) for k in self.keys}
        chosen = sorted(self.keys, key=lambda k: models[k].spot_usd_per_hour)[: self.n_markets]
        if key not in self.cache:
            d_min = int(round(self.restart_s / 60))
            size = min(self.subset_size, len(chosen))
            self.cache[key] = {sub: Program([models[chosen[i]] for i in sub], self.od_usd_per_hour, self.horizon_ticks,
                                            self.slack_cap_min, d_min, PLANNER_EDGES)
                               for sub in itertools.combinations(range(len(chosen)), size)}
            while len(self.cache) > 2:
                self.cache.popitem(last=False)
        return chosen, self.cache[key]

    def decide(self, inp: PolicyInput) -> list[Allocation]:
        job, now = inp.jobs[0], inp.now_s
        t, slack = ticks_and_slack(job, now, self.restart_s, self.last_move_s, "the planner")
        where: str | None = None
        for h in job.held:
            where = ON_DEMAND if h.market == ON_DEMAND else h.offering_key
        safety_min = 2 * self.restart_s / 60 + TICK_MIN
        if (self.safety_net and slack < safety_min) or t <= 0 or slack < 0:
            target = ON_DEMAND
        else:
            target = self._best_move(now, t, slack, where)
        if target not in ("wait", where):
            self.last_move_s = now  # a restart (waiting costs none)
        if target == "wait":
            return [Allocation(job.job_id, (), reason="wait", next_decision_s=now + TICK_MIN * 60)]
        pl = Placement(self.od_key, ON_DEMAND, 1) if target == ON_DEMAND else Placement(target, SPOT, 1)
        return [Allocation(job.job_id, (pl,), reason="planner", next_decision_s=now + TICK_MIN * 60)]

    def _best_move(self, now: float, t: int, slack: int, where: str | None) -> str:
        chosen, programs = self._programs(now)
        states = []
        for k in chosen:
            up, since = self.pasts[k].state_at(now)
            states.append(market_state(up, int(round((now - since) / (TICK_MIN * 60))), PLANNER_EDGES))
        best: tuple[float, str] | None = None
        for sub, prog in programs.items():
            members = [chosen[i] for i in sub]
            spot_pos = 1 + members.index(where) if where in members else 0
            pos = 0 if where is None else (prog.on_demand if where == ON_DEMAND else spot_pos)
            joint = 0
            for i in sub:
                joint = joint * prog.Z + states[i]
            v = prog.value(t, slack, pos, joint)
            if best is None or v < best[0]:
                a = prog.decide(t, slack, pos, joint)
                best = (v, "wait" if a == 0 else (ON_DEMAND if a == prog.on_demand else members[a - 1]))
        assert best is not None
        return best[1]
