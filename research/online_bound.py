"""An approximately Bayes-optimal *online* policy for the generator's markets: how close to omniscient
any policy that does not know the future can get (``benchmarks/online_bound.py``).

Omniscient (``omniscient.py``) knows the whole trace. This solves the best policy that knows only the
past, by dynamic programming over the model ``tracegen`` samples from, with its true parameters (an
online policy could only estimate them, so this is, if anything, optimistic for the online side):
each zone alternates available runs and outages with Lomax lengths (shapes 1.5 and 2.0 at the zone's
means), rounded to the 5-minute grid, independently per zone. For one fixed 1-instance job:

    state   ticks to the deadline t, slack s in minutes (time left minus work left), where the job is
            (waiting, on one zone's spot, on demand), and per zone: up or down, with the age of the
            current run or outage in buckets (``AGE_EDGES``)
    moves   wait (s -= 5), run where it is (s kept), move (s -= d: the restart's d minutes are paid
            and make no progress), on demand always there; a preempted job is waiting
    value   the expected bill; a missed deadline is infinite

Two approximations: ages are bucketed (realised costs move by under 0.3 % between 5 buckets and exact
ages on the legacy market; on runs of a few ticks, e.g. ``tracegen.FLAPPING_4``'s, a bucket's hazard
taken at its midpoint makes the program's own expected bill about 10 % low with 5 buckets while its
realised bill moves by under 1 %), and a restart cut short by a preemption leaves its unfinished minutes as work in the program,
where the simulator drops them (the program is slightly pessimistic there; replays do not change).
``tick_min`` sets the tick (and the model's grid: 10 minutes for the multi-region traces, whose
runs are whole 10-minute steps) and ``tail_min`` the minutes a deadline lies past the last whole
tick. It is optimal in expectation over markets drawn from the model; on one trace a policy
tuned to that trace can do a little better by luck. ``OnlineDPPolicy`` replays it through the
simulator reading only the trace's past, so its figures come from the same accounting as every
other policy's. Memory and time grow as
(2 x buckets)^zones x slack: fine for up to 3 zones, minutes and gigabytes for 4. The market model
itself (``zone_transitions``) is ``research.online_dp``'s, shared with the planner.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import numpy as np

from autoscaler.policy.base import Allocation, JobView, Placement, PolicyInput
from autoscaler.policy.jobmath import remaining_work
from cloud_providers.base import ON_DEMAND, SPOT
from cloud_providers.local.market import MarketTrace
from research.online_dp import AGE_EDGES, INFEASIBLE, TICK_MIN, age_bucket, zone_transitions

__all__ = ["AGE_EDGES", "OnlineDP", "OnlineDPPolicy", "age_bucket", "ticks_and_slack", "trace_history",
           "work_left_min", "zone_transitions"]

class OnlineDP:
    """The solved program for one 1-instance job: ``zones`` are (spot USD/hour, mean run hours, mean
    outage hours), the job needs ``work_min`` minutes with ``slack_min`` to spare and a restart costs
    ``restart_min``. ``action[t][s, position, *zone_states]``: 0 wait, 1..n that zone's spot, n + 1 on
    demand (positions use the same codes); ``value[s, position, *zone_states]`` the expected bill
    from the start (t = all ticks)."""

    def __init__(self, zones: Sequence[tuple[float, float, float]], on_demand_usd_per_hour: float, work_min: int,
                 slack_min: int, restart_min: int, edges: Sequence[int] = AGE_EDGES, *, tick_min: int = TICK_MIN,
                 tail_min: int = 0) -> None:
        """``tick_min``: the decision tick, which is also the market model's grid (the trace's step).
        ``tail_min``: minutes between the last whole tick and the deadline (a deadline off the grid):
        the job can only go on there where it already runs, a restart (longer than a tick) no longer
        fits."""
        tick = tick_min
        if (tick < 1 or not 0 <= tail_min < tick or (work_min + slack_min - tail_min) % tick
                or min(work_min, slack_min, restart_min) < 0):
            raise ValueError(f"work + slack ({work_min} + {slack_min} min) must be a whole number of {tick}-minute ticks"
                             f" plus a tail of {tail_min} min (0 <= tail < tick)")
        self.edges = tuple(edges)
        self.tick_min, self.tail_min = tick, tail_min
        self.n_zones = nz = len(zones)
        nb = len(edges)
        Z = 2 * nb
        self.on_demand = nz + 1
        npos = nz + 2
        S = slack_min + 1
        d = restart_min
        zshape = (Z,) * nz
        sparse = []
        for _, up_h, down_h in zones:
            P = zone_transitions(up_h, down_h, edges, tick_min=tick)
            k = int((P > 0).sum(1).max())
            succ, prob = np.zeros((Z, k), int), np.zeros((Z, k))
            for i in range(Z):
                js = np.nonzero(P[i])[0]
                succ[i, :len(js)], prob[i, :len(js)] = js, P[i, js]
            sparse.append((succ, prob))

        def expect(N: np.ndarray) -> np.ndarray:
            for i, (succ, prob) in enumerate(sparse):
                ax = N.ndim - nz + i
                M = np.moveaxis(N, ax, -1)
                acc = M[..., succ[:, 0]] * prob[:, 0]
                for j in range(1, succ.shape[1]):
                    acc += M[..., succ[:, j]] * prob[:, j]
                N = np.moveaxis(acc, -1, ax)
            return N

        up = [np.broadcast_to((np.arange(Z) < nb).reshape([Z if j == i else 1 for j in range(nz)]), zshape) for i in range(nz)]
        s_vals = np.arange(S)
        cols = (S,) + (1,) * nz
        prev = np.zeros((S, npos) + zshape)  # no ticks left: nothing left to do (else infeasible below)
        if tail_min:
            # The tail: the work left (tail - slack minutes) runs where the job is, or it is late.
            left = np.clip(tail_min - s_vals, 0, None).reshape(cols)
            short = left > 0
            prev[:, 0] = np.where(short, INFEASIBLE, 0.0)
            for i, (price, _, _) in enumerate(zones):
                prev[:, 1 + i] = np.where(short, np.where(up[i][None], price * left / 60, INFEASIBLE), 0.0)
            prev[:, nz + 1] = on_demand_usd_per_hour * left / 60
        self.action: list[np.ndarray | None] = [None]
        for t in range(1, (work_min + slack_min - tail_min) // tick + 1):
            work = tick * t + tail_min - s_vals
            step = np.clip(work, 0, tick).reshape(cols)
            last = step < tick  # the job finishes within this tick
            run = np.full((S, npos) + zshape, INFEASIBLE)
            for i, (price, _, _) in enumerate(zones):
                nxt = expect(np.where(up[i][None], prev[:, 1 + i], prev[:, 0]))  # preempted: waiting
                run[:, 1 + i] = np.where(up[i][None], price * step / 60 + np.where(last, 0.0, nxt), INFEASIBLE)
            run[:, nz + 1] = on_demand_usd_per_hour * step / 60 + np.where(last, 0.0, expect(prev[:, nz + 1]))
            wait = np.full((S,) + zshape, INFEASIBLE)
            if S > tick:
                wait[tick:] = expect(prev[:, 0])[: S - tick]
            moved = np.full_like(run, INFEASIBLE)
            if S > d:
                moved[d:] = run[: S - d]  # a restart: d more minutes to pay, d less slack
            value = np.empty_like(prev)
            act = np.empty(prev.shape, np.int8)
            for pos in range(npos):
                opts = np.stack([wait] + [run[:, q] if q == pos else moved[:, q] for q in range(1, npos)])
                act[:, pos] = opts.argmin(0)
                value[:, pos] = opts.min(0)
            value[work <= 0] = 0.0
            self.action.append(act)
            prev = np.minimum(value, INFEASIBLE)
        self.value = prev



def ticks_and_slack(job: JobView, now_s: float, restart_s: float, last_move_s: float, who: str) -> tuple[int, int]:
    """(decision ticks to the deadline, minutes of slack) of a 1-instance job, as the programs count
    them: the work left in whole minutes, with the restart overhead still to run since the last move."""
    if job.deadline_s is None:
        raise ValueError(f"{who} is defined for jobs with a deadline")
    t = int(round((job.deadline_s - now_s) / (TICK_MIN * 60)))
    return t, TICK_MIN * t - work_left_min(job, now_s, restart_s, last_move_s)


def work_left_min(job: JobView, now_s: float, restart_s: float, last_move_s: float, work_per_s: float = 1.0) -> int:
    """The work left in whole minutes at ``work_per_s`` (the instance's speed: reference GPU-seconds
    per second), with the restart overhead still to run since the last move."""
    overhead_left = max(0.0, restart_s - (now_s - last_move_s))
    return math.ceil((remaining_work(job) / work_per_s + overhead_left) / 60 - 1e-6)


class OnlineDPPolicy:
    """Replays an ``OnlineDP`` in the simulator (one fixed 1-instance job with a deadline). Zone states
    come from ``trace_history`` read up to now, never later; the restart overhead still to run from
    its own last move. One instance per simulated run (it remembers that move).

    ``grid_origin_s`` (traces on a grid coarser than the simulator's, e.g. 10-minute steps): the
    program's ticks are the trace's steps (``dp.tick_min``), so the policy decides only at the first
    call and on the grid (origin + k ticks, where the market changes) and holds that decision in
    between (the simulator also calls at its own events: a notice, a restart's end). A job that starts
    between two grid points is given a first tick that began at the grid point before it: the minutes
    before the start count as work to do, so its slack is the true one and the program only
    overrates what waiting through that first part-tick costs. The deadline's offset from the grid
    must be the program's ``tail_min``. ``work_per_s``: the instance's speed (reference GPU-seconds
    per second; grid mode), the same on every zone and on demand."""

    name = "bayes-online"

    def __init__(self, dp: OnlineDP, keys: Sequence[str], od_key: str, past: dict[str, tuple[list[float], list[int]]],
                 restart_s: float, grid_origin_s: float | None = None, work_per_s: float = 1.0) -> None:
        self.dp, self.keys, self.od_key, self.past, self.restart_s = dp, list(keys), od_key, past, restart_s
        self.work_per_s = work_per_s
        self.last_move_s = -math.inf
        self.grid_origin_s = grid_origin_s
        self._held: tuple[float, list[Allocation]] | None = None  # grid mode: (until, the decision)

    def _grid_state(self, job: JobView, now: float) -> tuple[int, int]:
        """Grid mode's (ticks, slack): ticks to the last grid point before the deadline, rounded up
        (a part-tick at the start counts whole), and the true slack in whole minutes."""
        assert self.grid_origin_s is not None and job.deadline_s is not None
        tick_s = self.dp.tick_min * 60.0
        tail_s = (job.deadline_s - self.grid_origin_s) % tick_s
        if abs(tail_s - self.dp.tail_min * 60) > 1e-3:
            raise ValueError(f"the deadline is {tail_s / 60:g} min past the grid; the program was solved for "
                             f"{self.dp.tail_min} min")
        t = math.ceil((job.deadline_s - tail_s - now) / tick_s - 1e-6)
        work = work_left_min(job, now, self.restart_s, self.last_move_s, self.work_per_s)
        return t, math.floor((job.deadline_s - now) / 60 + 1e-6) - work

    def zone_states(self, now: float) -> tuple[int, ...]:
        """Each zone's state index (up or down, age bucket) as the trace's past shows it at ``now``."""
        grid = self.grid_origin_s is not None
        states = []
        for k in self.keys:
            times, caps = self.past[k]
            j = bisect.bisect_right(times, now) - 1
            age = (now - times[j]) / (self.dp.tick_min * 60.0)
            b = age_bucket(math.floor(age + 1e-6) if grid else int(round(age)), self.dp.edges)
            states.append(b if caps[j] > 0 else len(self.dp.edges) + b)
        return tuple(states)

    def expected_usd(self, job: JobView, start_s: float) -> float:
        """The program's expected bill for a job that starts now, waiting (grid mode; the program
        must be solved for exactly the job's ticks, as ``value`` is the value at its last tick)."""
        t, slack = self._grid_state(job, start_s)
        if t != len(self.dp.action) - 1:
            raise ValueError(f"the program was solved for {len(self.dp.action) - 1} ticks, the job has {t}")
        return float(self.dp.value[(min(slack, self.dp.value.shape[0] - 1), 0) + self.zone_states(start_s)])

    def decide(self, inp: PolicyInput) -> list[Allocation]:
        job, now = inp.jobs[0], inp.now_s
        grid = self.grid_origin_s is not None
        if grid and self._held is not None and now < self._held[0] - 1e-3:
            return self._held[1]
        tick_s = self.dp.tick_min * 60.0
        if grid:
            t, slack = self._grid_state(job, now)
        else:
            t, slack = ticks_and_slack(job, now, self.restart_s, self.last_move_s, "the online bound")
        pos = 0
        for h in job.held:
            # Where the job is: what it holds (a preempted instance is no longer held; one the last
            # decision moved to is, while the old gang is still checkpointing).
            pos = self.dp.on_demand if h.market == ON_DEMAND else 1 + self.keys.index(h.offering_key)
        states = self.zone_states(now)
        S = self.dp.value.shape[0] - 1
        if t <= 0 and grid and self.dp.tail_min:
            act = pos or self.dp.on_demand  # the tail: go on where the job runs
        elif slack < 0 or t <= 0:
            act = self.dp.on_demand
        else:
            act = int(self.dp.action[t][(min(slack, S), pos) + states])  # type: ignore[index]
        if act not in (0, pos):
            self.last_move_s = now  # a restart (waiting costs none)
        if grid:
            assert self.grid_origin_s is not None
            wake = self.grid_origin_s + tick_s * (math.floor((now - self.grid_origin_s) / tick_s + 1e-6) + 1)
        else:
            wake = now + tick_s
        if act == 0:
            out = [Allocation(job.job_id, (), reason="wait", next_decision_s=wake)]
        else:
            pl = Placement(self.od_key, ON_DEMAND, 1) if act == self.dp.on_demand else Placement(self.keys[act - 1], SPOT, 1)
            out = [Allocation(job.job_id, (pl,), reason="dp", next_decision_s=wake)]
        if grid:
            self._held = (wake, out)
        return out


def trace_history(trace: MarketTrace, keys: Sequence[str]) -> dict[str, tuple[list[float], list[int]]]:
    """Per offering, the times its spot room changed and the room from then on (what a market watch
    records; ``OnlineDPPolicy`` reads it only up to the present)."""
    out: dict[str, tuple[list[float], list[int]]] = {k: ([], []) for k in keys}
    for t in trace.change_times():
        for k in keys:
            room = trace.offering_at(k, t).spot_available or 0
            times, rooms = out[k]
            if not rooms or (room > 0) != (rooms[-1] > 0):
                times.append(t)
                rooms.append(room)
    return out
