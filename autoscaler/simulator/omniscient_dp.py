"""The omniscient planner's dynamic programme: exact on the trace's own change points.

Why not a grid. The first version ran on the simulator's 5-minute decision grid: a configuration
could start or stop only on a grid point, spot room counted only for a tick it lasted through, and
progress was whole minutes per tick. Online policies are not so bound: the simulator wakes them at
every market change (a 195-s trace changes off the grid), at every restart completion and whenever
they ask (uniform-progress and the safety nets compute the moment to start on demand to the second).
On a trace whose changes fall between grid points a policy could ride spot to the very second it
went, start on demand the moment it had to, and beat the "optimum" on the same start.

What the optimum looks like. Prices and room are constant between the trace's change points. For
gangs of equal speed a schedule is a list of runs (a configuration from ``s`` to ``e``, restart
overhead ``d`` at its start); its cost is linear in each boundary inside one constant stretch, and
the work it does is linear too, so for a fixed order of runs the least-cost schedule is a vertex of a
linear programme: every boundary sits on a change point, except at most one boundary next to an
idle stretch that the work equation pins (the finish itself; or a start after waiting, e.g. on
demand started exactly late enough to finish on the spot that returns later; or a stop before
waiting). So the programme here

- steps from change point to change point (``points``: the start, every change of an eligible
  offering up to the deadline, the deadline), never on a grid, plus one point ``unit_s`` before every
  change that takes a configuration's room: leaving just before a preemption bills the checkpoint's
  save, not the notice, a discontinuity the linear argument does not cover;
- lets a run start or stop at any multiple of ``unit_s`` inside a stretch, including the stretch its
  restart ends in (the floating boundary; ``unit_s`` is the gcd of the change points' offsets, ``d``,
  the work and the decision grid, so that boundary is on it): the min over those positions is a
  sliding-window minimum, O(units log window) per stretch;
- jumps a start straight to its restart completion (``s + d``, at the first point after it), which
  needs no "ticks since start" sub-states and is exact for any ``d``; spot must have room throughout;
- finishes pro rata inside any stretch, and bills what the simulator bills on a change: the notice of
  a preempted gang (only the instances taken), ``checkpoint_save_s`` of a gang told to stop, and
  (``MoveCosts``) the checkpoint's egress on every change of region.

State: (point, mode, work units done). Modes: idle with no checkpoint yet, idle with the checkpoint in
region r, or running configuration c past its restart. It is exact when every offset is a multiple of
``unit_s`` (whole seconds with a common divisor; the cap ``MAX_UNITS`` keeps the work axis bounded)
and the configurations run at one speed; otherwise progress is rounded down (the plan stays feasible
and its replay costs at most what it planned) and slower configurations start and stop only on points.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from cloud_providers.base import SPOT, Offering

# A work axis longer than this coarsens the unit (inexact: progress rounded down).
MAX_UNITS = 12000


@dataclasses.dataclass(frozen=True)
class Cfg:
    """A homogeneous gang: ``instances`` of one offering in one market, ``rate`` its work per second."""

    key: str
    market: str
    instances: int
    rate: float
    region: str


@dataclasses.dataclass(frozen=True)
class Problem:
    """What the programme needs, with times absolute (seconds of the trace)."""

    points: list[float]
    offers: list[dict[str, Offering]]  # per stretch [points[k], points[k+1])
    cfgs: list[Cfg]
    regions: list[str]
    work: float
    restart_s: float
    save_s: float
    egress_usd: Callable[[str, str], float]  # checkpoint region -> new region, whole checkpoint
    grid_s: float = 0.0  # the simulator's decision grid (its multiples are moments a policy may pick)


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of the solution: configuration index ``cfg`` from ``start_s`` to ``end_s`` (the finish
    for the last run)."""

    cfg: int
    start_s: float
    end_s: float


@dataclasses.dataclass(frozen=True)
class Solution:
    cost_usd: float
    runs: tuple[Run, ...]
    egress_usd: float
    unit_s: float
    exact: bool


def unit_seconds(offsets: Sequence[float], restart_s: float, work_s: float) -> tuple[float, bool]:
    """The largest step that every boundary offset and ``d`` are whole multiples of (to the
    millisecond), coarsened when the work axis would be longer than ``MAX_UNITS``."""
    vals = [x for x in list(offsets) + [restart_s] if x > 0]
    ms = [round(x * 1000.0) for x in vals]
    exact = all(abs(m - x * 1000.0) < 1e-6 for m, x in zip(ms, vals))
    g = 0
    for m in ms:
        g = math.gcd(g, m)
    unit = g / 1000.0 if g > 0 else max(work_s, 1.0)
    n = math.ceil(work_s / unit - 1e-9)
    if n > MAX_UNITS:
        unit *= math.ceil(n / MAX_UNITS)
        exact = False
    return unit, exact


def window_min(h: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """For each y, min and argmin of ``h`` over [y, y + length) (``inf`` beyond its end): a sparse
    table, O(n log length)."""
    n = len(h)
    val, arg = h.copy(), np.arange(n)
    span = 1
    while span * 2 <= length:
        sv = np.full(n, np.inf)
        sa = np.zeros(n, dtype=np.int64)
        sv[: n - span], sa[: n - span] = val[span:], arg[span:]
        take = sv < val
        val = np.where(take, sv, val)
        arg = np.where(take, sa, arg)
        span *= 2
    if span < length:
        off = length - span
        sv = np.full(n, np.inf)
        sa = np.zeros(n, dtype=np.int64)
        sv[: n - off], sa[: n - off] = val[off:], arg[off:]
        take = sv < val
        val = np.where(take, sv, val)
        arg = np.where(take, sa, arg)
    return val, arg


# The best finish: (how, point, configuration, work units before, offset, source mode).
_Finish = tuple[str, int, int, int, int, int]

# Back-pointer kinds of a state at a point (``_Bp.kind``).
NONE, STAY, CONT, STOP, START, SHORT = 0, 1, 2, 3, 4, 5


class _Bp:
    """How each (mode, work) state at a point was reached: kind, source mode, source point, offset."""

    def __init__(self, n_modes: int, n_w: int) -> None:
        self.kind = np.zeros((n_modes, n_w), dtype=np.int8)
        self.mode = np.zeros((n_modes, n_w), dtype=np.int16)
        self.k = np.zeros((n_modes, n_w), dtype=np.int32)
        self.j = np.zeros((n_modes, n_w), dtype=np.int32)
        self.cfg = np.zeros((n_modes, n_w), dtype=np.int16)  # SHORT: the configuration that ran


def _room_ok(c: Cfg, o: Offering | None) -> bool:
    if o is None or (c.market == SPOT and o.spot_price_usd_per_hour is None):
        return False
    return c.market != SPOT or (o.spot_available or 0) >= c.instances


def with_last_moments(pb: Problem, unit: float) -> Problem:
    """``pb`` with a point ``unit`` before every change that takes a configuration's room: leaving
    just before a preemption bills the checkpoint's save, not the notice (a discontinuity the linear
    argument above does not cover), so that moment is a decision point of its own."""
    pts, offers = [pb.points[0]], [pb.offers[0]]
    for k in range(1, len(pb.points) - 1):
        drops = any(_room_ok(c, pb.offers[k - 1].get(c.key)) and not _room_ok(c, pb.offers[k].get(c.key)) for c in pb.cfgs)
        if drops and pb.points[k] - unit > pts[-1] + 1e-9:
            pts.append(pb.points[k] - unit)
            offers.append(pb.offers[k - 1])
        pts.append(pb.points[k])
        offers.append(pb.offers[k])
    pts.append(pb.points[-1])
    return dataclasses.replace(pb, points=pts, offers=offers)


def p_last(solver: Solver, i: int, m: int) -> float:
    """Configuration i's price per second in the stretch before point m."""
    return float(solver.price[i, m - 1])


class Solver:
    def __init__(self, pb: Problem) -> None:
        self.rmax = max(c.rate for c in pb.cfgs)
        self.work_s = pb.work / self.rmax  # seconds of running at the fastest rate
        # The floating boundary is pinned by the work equation, so the work is one of the offsets.
        offsets = [p - pb.points[0] for p in pb.points[1:]] + [self.work_s, pb.grid_s]
        self.unit, self.exact = unit_seconds(offsets, pb.restart_s, self.work_s)
        pb = with_last_moments(pb, self.unit)
        self.pb = pb
        pts = pb.points
        self.K = len(pts) - 1
        self.w_goal = self.work_s / self.unit
        self.n_w = max(1, math.ceil(self.w_goal - 1e-9))
        self.R = len(pb.regions)
        self.n_modes = 1 + self.R + len(pb.cfgs)
        self.q = [c.rate / self.rmax for c in pb.cfgs]
        self.floating = [abs(x - 1.0) < 1e-12 for x in self.q]
        C = len(pb.cfgs)
        self.price = np.zeros((C, self.K))  # USD per second for the gang, per stretch
        self.ok = np.zeros((C, self.K), dtype=bool)
        for k in range(self.K):
            for i, c in enumerate(pb.cfgs):
                o = pb.offers[k].get(c.key)
                if o is None or (c.market == SPOT and o.spot_price_usd_per_hour is None):
                    continue
                self.price[i, k] = o.price_usd_per_hour(c.market) * c.instances / 3600.0
                self.ok[i, k] = _room_ok(c, o)
        dt = np.diff(np.array(pts))
        self.icum = np.concatenate([np.zeros((C, 1)), np.cumsum(self.price * dt[None, :], axis=1)], axis=1)
        # First stretch >= k where the configuration has no room (K if none).
        self.next_fail = np.full((C, self.K + 1), self.K, dtype=np.int64)
        for i in range(C):
            for k in range(self.K - 1, -1, -1):
                self.next_fail[i, k] = k if not self.ok[i, k] else self.next_fail[i, k + 1]
        self._V: dict[int, np.ndarray] = {}  # costs per point still to be reached
        self._bps: dict[int, _Bp] = {}
        self.region_of = [pb.regions.index(c.region) for c in pb.cfgs]
        self.egress = np.zeros((1 + self.R, C))  # from idle mode (fresh, region r) to configuration
        for r in range(self.R):
            for i, c in enumerate(pb.cfgs):
                if pb.regions[r] != c.region:
                    self.egress[1 + r, i] = pb.egress_usd(pb.regions[r], c.region)

    def cmode(self, i: int) -> int:
        return 1 + self.R + i

    def _gain(self, i: int, seconds: float) -> int:
        return int(math.floor(self.q[i] * seconds / self.unit + 1e-9))

    def _exit_usd(self, i: int, k: int) -> tuple[float, bool]:
        """What leaving configuration i at points[k] bills, and whether it is forced (preempted)."""
        c = self.pb.cfgs[i]
        o = self.pb.offers[k].get(c.key) if k < self.K else None
        if o is None:
            return 0.0, False
        per = o.price_usd_per_hour(c.market) if not (c.market == SPOT and o.spot_price_usd_per_hour is None) else 0.0
        room = o.spot_available or 0
        if c.market == SPOT and room < c.instances:
            return per * (c.instances - room) * o.notice_seconds / 3600.0, True
        return per * c.instances * self.pb.save_s / 3600.0, False

    def _decide(self, k: int, cur: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Decisions at points[k]: a gang whose room is gone is preempted; any gang may stop. The
        states after them, and per waiting state the configuration that stopped (-1: none)."""
        U = cur.copy()
        ubp = np.full((self.R, self.n_w), -1, dtype=np.int16)
        for i in range(len(self.pb.cfgs)):
            m = self.cmode(i)
            usd, forced = self._exit_usd(i, k)
            cand = cur[m] + usd
            dst = 1 + self.region_of[i]
            better = cand < U[dst]
            U[dst][better] = cand[better]
            ubp[self.region_of[i]][better] = i
            if forced or not self.ok[i, k]:
                U[m] = np.inf
        return U, ubp

    def _put(self, t: int, mode: int, lo: int, vals: np.ndarray, kind: int, smode: np.ndarray | int,
             sk: int, sj: np.ndarray | int, cfg: int = 0) -> None:
        """Relax V[t][mode, lo:lo+len(vals)] with back-pointers."""
        tgt = self._V.setdefault(t, np.full((self.n_modes, self.n_w), np.inf))
        bp = self._bps.setdefault(t, _Bp(self.n_modes, self.n_w))
        seg = tgt[mode, lo: lo + len(vals)]
        better = vals < seg - 1e-12
        if not better.any():
            return
        idx = np.nonzero(better)[0] + lo
        tgt[mode, idx] = vals[better]
        bp.kind[mode, idx] = kind
        bp.mode[mode, idx] = smode if isinstance(smode, int) else smode[better]
        bp.k[mode, idx] = sk
        bp.j[mode, idx] = sj if isinstance(sj, int) else sj[better]
        bp.cfg[mode, idx] = cfg

    def solve(self) -> Solution | None:
        pb, K, n_w, unit = self.pb, self.K, self.n_w, self.unit
        pts = pb.points
        self._V = {0: np.full((self.n_modes, n_w), np.inf)}
        self._V[0][0, 0] = 0.0
        self._bps = {0: _Bp(self.n_modes, n_w)}
        ubps: list[np.ndarray] = []
        best_usd: float = math.inf
        best: _Finish | None = None
        ws = np.arange(n_w)
        put = self._put
        for k in range(K):
            U, ubp = self._decide(k, self._V.pop(k))
            ubps.append(ubp)
            span = pts[k + 1] - pts[k]
            n_j = max(1, int(math.ceil(span / unit - 1e-9)))  # start/stop offsets j * unit inside
            for r in range(1 + self.R):  # waiting costs nothing
                put(k + 1, r, 0, U[r], STAY, r, k, 0)
            for i in range(len(pb.cfgs)):
                if not self.ok[i, k]:
                    continue
                m = self.cmode(i)
                p = self.price[i, k]
                src = U[m]
                if np.isfinite(src).any():
                    # Run on through the stretch, or finish inside it.
                    g = self._gain(i, span)
                    if g < n_w:
                        put(k + 1, m, g, src[: n_w - g] + p * span, CONT, m, k, 0)
                    need_s = (self.w_goal - ws) * unit / self.q[i]
                    fin = np.where(need_s <= span + 1e-9, src + p * need_s, np.inf)
                    a = int(np.argmin(fin))
                    if fin[a] < best_usd - 1e-12:
                        best_usd, best = float(fin[a]), ("cont", k, i, a, 0, 0)
                    # Stop at pts[k] + j * unit (1 <= j < n_j), then wait.
                    if self.floating[i] and n_j > 1:
                        usd, _ = self._exit_usd(i, k)  # not forced inside a stretch with room
                        h = src - p * unit * ws
                        wv, wa = window_min(np.concatenate([np.full(n_j - 1, np.inf), h]), n_j - 1)
                        # Destination x takes y in [x - n_j + 1, x - 1]: window start (padded) x.
                        vals = wv[:n_w] + p * unit * ws + usd
                        put(k + 1, 1 + self.region_of[i], 0, vals, STOP, m, k, ws - (wa[:n_w] - (n_j - 1)))
                best_usd, best = self._starts(k, i, U, put, best_usd, best, n_j)
        if best is None:
            return None
        runs, egress = self._backtrack(best, self._bps, ubps)
        return Solution(best_usd, runs, egress, unit, self.exact)

    def _starts(self, k: int, i: int, U: np.ndarray, put: Callable[..., None], best_usd: float,
                best: _Finish | None, n_j: int) -> tuple[float, _Finish | None]:
        """Start configuration i at pts[k] + j * unit from a waiting state; it runs from its restart
        completion on, landing at the first point after it."""
        pb, n_w, unit, pts = self.pb, self.n_w, self.unit, self.pb.points
        src_all = U[: 1 + self.R] + self.egress[:, i][:, None]
        smode = np.argmin(src_all, axis=0)
        src = src_all[smode, np.arange(n_w)]
        if not np.isfinite(src).any():
            return best_usd, best
        d = pb.restart_s
        m_cfg = self.cmode(i)
        p = self.price[i, k]
        js = np.arange(n_j if self.floating[i] else 1)
        s = pts[k] + js * unit
        land = np.maximum(k + 1, np.searchsorted(np.array(pts), s + d - 1e-6, side="left"))
        fail = self.next_fail[i, k]  # room must last from the start to the landing
        for m in np.unique(land):
            m = int(m)
            if m > self.K or m > fail:
                continue
            sel = np.nonzero(land == m)[0]
            ja, jb = int(sel[0]), int(sel[-1]) + 1
            steady = pts[m] - pts[k] - d  # seconds of running up to pts[m] for j = 0
            g0 = self._gain(i, steady) if not self.floating[i] else int(math.floor(steady / unit + 1e-9))
            A = float(self.icum[i, m] - self.icum[i, k])
            L = jb - ja
            # S(v) = min_j src[v + j] - p*unit*j = p*unit*v + min_{x in [v+ja, v+jb)} (src[x] - p*unit*x)
            h = np.concatenate([np.full(jb - 1, np.inf), src - p * unit * np.arange(n_w)])
            wv, wa = window_min(h, L)
            # v ranges over [-(jb-1), n_w): padded window start for v is v + ja + jb - 1.
            vs = np.arange(-(jb - 1), n_w - ja)
            starts = vs + ja + jb - 1
            ok = (starts >= 0) & (starts < len(h))
            vs, starts = vs[ok], starts[ok]
            S = wv[starts] + p * unit * vs
            xs = wa[starts] - (jb - 1)
            jsel = xs - vs
            u = vs + g0
            land_ok = (u >= 0) & (u < n_w) & np.isfinite(S)
            if land_ok.any():
                uu = u[land_ok]
                lo = int(uu.min())
                vals = np.full(int(uu.max()) - lo + 1, np.inf)
                vals[uu - lo] = S[land_ok] + A
                jj = np.zeros_like(vals, dtype=np.int64)
                jj[uu - lo] = jsel[land_ok]
                sm = np.zeros_like(vals, dtype=np.int64)
                sm[uu - lo] = smode[np.clip(xs[land_ok], 0, n_w - 1)]
                put(m, m_cfg, lo, vals, START, sm, k, jj)
            if ja == 0 and self.floating[i] and g0 > 1:
                # Started on the point, stopped inside the stretch it became steady in: at
                # pts[k] + d + g * unit (1 <= g < g0), then waiting at pts[m] with g units more.
                usd = self.price[i, m - 1] * pb.save_s  # the gang checkpoints before it goes
                c0 = float(self.icum[i, m - 1] - self.icum[i, k]) + self.price[i, m - 1] * (pts[k] + d - pts[m - 1])
                hh = np.concatenate([np.full(g0 - 1, np.inf), src - p_last(self, i, m) * unit * np.arange(n_w)])
                sv, sa = window_min(hh, g0 - 1)
                xs2 = np.arange(n_w)
                vals2 = sv[xs2] + p_last(self, i, m) * unit * xs2 + c0 + usd
                w_src = sa[xs2] - (g0 - 1)
                ok2 = np.isfinite(vals2)
                if ok2.any():
                    vals2 = np.where(ok2, vals2, np.inf)
                    gsel = np.where(ok2, xs2 - w_src, 0)
                    sm2 = smode[np.clip(w_src, 0, n_w - 1)]
                    put(m, 1 + self.region_of[i], 0, vals2, SHORT, sm2, k, gsel, cfg=i)
            # Finish before pts[m]: billed until the finish, in the last stretch (m - 1).
            fin_ok = (u >= self.w_goal - 1e-9) & np.isfinite(S)
            if fin_ok.any():
                over_s = (u[fin_ok] - self.w_goal) * unit / self.q[i]
                fc = S[fin_ok] + A - self.price[i, m - 1] * over_s
                a = int(np.argmin(fc))
                if fc[a] < best_usd - 1e-12:
                    x = int(xs[fin_ok][a])
                    best_usd = float(fc[a])
                    best = ("start", k, i, x, int(jsel[fin_ok][a]), int(smode[x]))
        return best_usd, best

    def _backtrack(self, best: _Finish, bps: dict[int, _Bp], ubps: list[np.ndarray]
                   ) -> tuple[tuple[Run, ...], float]:
        """The runs of the best plan, walking the back-pointers from its finish."""
        pts, unit = self.pb.points, self.unit
        kind, k, i, w, j, sm = best
        runs: list[Run] = []
        egress = 0.0
        run_end = math.nan  # the finish is set by the caller's replay; keep the plan open-ended
        # State to resolve: (layer "U" at point k, mode, w) and the configuration running back to it.
        if kind == "cont":
            layer, pt, mode = "V", k, self.cmode(i)
            running: tuple[int, float] | None = (i, run_end)
        else:
            egress += float(self.egress[sm, i])
            runs.append(Run(i, pts[k] + j * unit, run_end))
            layer, pt, mode, running = "U", k, sm, None
        while True:
            if layer == "U":
                if mode <= self.R and mode >= 1:
                    src = int(ubps[pt][mode - 1, w])
                    if src >= 0:  # a gang stopped (or was preempted) at pts[pt]
                        running = (src, pts[pt])
                        mode = self.cmode(src)
                layer = "V"
                continue
            if pt == 0 and mode == 0 and w == 0:
                break
            bp = bps[pt]
            kd = int(bp.kind[mode, w])
            sk, sj, smd = int(bp.k[mode, w]), int(bp.j[mode, w]), int(bp.mode[mode, w])
            if kd == STAY:
                pt, layer = sk, "U"
            elif kd == CONT:
                ci = mode - 1 - self.R
                w -= self._gain(ci, pts[pt] - pts[sk])
                pt, layer = sk, "U"
            elif kd == STOP:
                ci = smd - 1 - self.R
                running = (ci, pts[sk] + sj * unit)
                w -= sj
                pt, layer, mode = sk, "U", smd
            elif kd == SHORT:
                ci = int(bp.cfg[mode, w])
                s0 = pts[sk]
                runs.append(Run(ci, s0, s0 + self.pb.restart_s + sj * unit))
                running = None
                w -= sj
                egress += float(self.egress[smd, ci])
                pt, layer, mode = sk, "U", smd
            elif kd == START:
                ci = mode - 1 - self.R
                s = pts[sk] + sj * unit
                assert running is not None and running[0] == ci
                runs.append(Run(ci, s, running[1]))
                running = None
                steady = pts[pt] - pts[sk] - self.pb.restart_s
                g0 = self._gain(ci, steady) if not self.floating[ci] else int(math.floor(steady / unit + 1e-9))
                w = w - g0 + sj
                egress += float(self.egress[smd, ci])
                pt, layer, mode = sk, "U", smd
            else:
                raise AssertionError(f"omniscient: no way back from point {pt}, mode {mode}, work {w}")
        return tuple(reversed(runs)), egress
