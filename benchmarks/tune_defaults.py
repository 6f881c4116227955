"""Choosing the spotrain policy's shipped defaults with Optuna on the benchmark's generated markets (issue 15).

The way ``spotrain tune`` tunes one market (``autoscaler/policy/tuning.py``: seeded TPE over
``TUNING_RANGES``, the defaults enqueued as trial 0, a trial with any missed deadline infeasible), over
several markets at once: the traces of ``benchmarks/policy_cost.py`` (``tracegen``, 30 days), its job
(24 h deadline, fractions 0.6 / 0.8 / 0.9 of it on the fallback) in 12 cells:

- single zone, 1 GPU (seed 1), 12-minute restarts;
- 4 zones / 2 clouds, 1 GPU (seed 2), 12-minute and 3-minute restarts;
- multi-node, a gang of 4 x 1 GPU (seed 3), 12-minute restarts.

Split in time, per trace (``tuning.split_windows``): the first 60 % trains, the rest is held back;
starts are uniform in each window (seed S for training, S + 1 held back), each leaving the whole 24 h
deadline inside its window. A trial's value is the mean over the cells of the mean cost / on-demand
over the training starts (``tuning.combine``). Trial 0 is ``HAND_DEFAULTS``, the hand-tuned values the
policy shipped with before this study (kept here, so the study reproduces after the shipped defaults
changed to its result). The best trial and the hand defaults then run from the held-back starts, and
that table is printed first, the training one second. ``--guard`` also makes a trial infeasible that is
worse than the hand defaults on a 3-minute cell's training starts (the benchmark's within-3 %-of-
omniscient target; without it the best trial gave that up). ``--guard-all-cells TOL`` also makes a
trial infeasible that is worse than the hand defaults by more than TOL (0.005: 0.5 %) on any cell's
training starts (``--guard`` alone traded the 4-zone 0.9 cell with 12-minute restarts, +2.0 % in
training, for the others; the held-back starts never enter a guard). ``--evaluate FILE`` skips the
study and compares FILE's parameters (the shipped ones, rounded) with the hand defaults the same way.

The shipped ``DEFAULT_PARAMS`` are ``HAND_DEFAULTS``: ``--guard --guard-all-cells 0.005 --trials 150``'s
best trial was 1.1 % cheaper held back but dearer on the benchmark's 4-zone fraction-0.9 row, and
``--guard`` alone (100 trials, shipped for a while) dearer still there (docs/policy.md, "How the shipped
defaults were chosen"; about 6 minutes here):

    python benchmarks/tune_defaults.py [--trials 100] [--starts 20] [--test-starts 60] [--seed 0] [--procs 2]
        [--guard] [--guard-all-cells TOL] [--out FILE.json] [--params-out FILE.json] [--evaluate FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from policy_cost import SCENARIOS, TRACE_DAYS, _spec  # noqa: E402

from autoscaler.policy.params import PolicyParams, load_params_file, save_params_file  # noqa: E402
from autoscaler.policy.tuning import (  # noqa: E402
    INFEASIBLE,
    Score,
    Windows,
    combine,
    objective_value,
    score,
    split_windows,
    train_and_test_starts,
    tune_with,
)
from autoscaler.simulator import SimJob, Simulation, make_sim_job  # noqa: E402
from research.tracegen import generate_trace  # noqa: E402

TRAIN_FRACTION = 0.6
# The hand-tuned defaults (docs/policy.md's rounds 1-8), shipped as DEFAULT_PARAMS: trial 0 and the baseline.
HAND_DEFAULTS = PolicyParams(
    spot_candidates=4, od_candidates=2, horizon_s=6 * 3600.0, faster_tolerance=0.2, short_notice_s=30.0,
    default_restart_overhead_s=360.0, capacity_backoff_s=600.0, safety_net_restarts=2.0, slack_tolerance_s=1.0,
    outage_reserve=0.7, wait_premium=0.05, outage_margin=1.5, wait_slack_value=0.05, established_run_h=2.0,
    od_release_cycles=1.0, switch_margin=3.0, switch_cushion_cycles=4.0, big_switch_margin=8.0, big_cushion_cycles=1.0)
MARKETS = ("single-zone, 1 GPU", "4 zones / 2 clouds, 1 GPU", "multi-node, 4 x 1 GPU")
# (scenario, job fraction, restart overhead in minutes); the 3-minute cells are the benchmark's
# "several zones within 3 % of omniscient" target.
CELLS: tuple[tuple[str, float, float], ...] = tuple(
    [(m, f, 12.0) for m in MARKETS for f in (0.6, 0.8, 0.9)] + [("4 zones / 2 clouds, 1 GPU", f, 3.0) for f in (0.6, 0.8, 0.9)])
# ``--guard``: the cells where the benchmark's target is met with little margin (+2.1 / +2.8 / +2.9 %
# above omniscient against 3 %); a study without the guard traded them for the others.
GUARDED = tuple(i for i, c in enumerate(CELLS) if c[2] == 3.0)


def guard_excess(scores: list[Score], hand: list[Score], *, guard: bool, all_cells: float | None) -> float:
    """How far a trial's training scores break the guards (> 0: infeasible): ``guard``, worse than the
    hand defaults in a 3-minute cell at all; ``all_cells`` (a share), worse by more than it in any cell."""
    ratio = [s.mean_cost_ratio / h.mean_cost_ratio - 1.0 for s, h in zip(scores, hand, strict=True)]
    excess = max(ratio[i] for i in GUARDED) if guard else 0.0
    return max(excess, max(r - all_cells for r in ratio)) if all_cells is not None else excess


class Cell:
    """One market and job, its windows and its training and held-back starts."""

    def __init__(self, sim: Simulation, job: SimJob, w: Windows, train: list[float], test: list[float]) -> None:
        self.sim, self.job, self.w, self.train, self.test = sim, job, w, train, test


_CELLS: list[Cell] = []  # built before the pool forks, so the workers inherit the traces


def build_cells(n_train: int, n_test: int, seed: int) -> list[Cell]:
    sims: dict[str, Simulation] = {}
    out = []
    for name, fraction, overhead_min in CELLS:
        scen = SCENARIOS[name]
        spec = _spec(scen, fraction)
        if name not in sims:
            sims[name] = Simulation(generate_trace(scen["zones"], hours=TRACE_DAYS * 24, seed=scen["seed"]), spec)
        job = make_sim_job(spec, restart_overhead_s=overhead_min * 60.0)
        w = split_windows(sims[name].trace, job, TRAIN_FRACTION)
        train, test = train_and_test_starts(w, n_train, n_test, seed)
        # Each cell's own Simulation (its spec: the gang's size), sharing the scenario's trace.
        out.append(Cell(Simulation(sims[name].trace, spec), job, w, train, test))
    return out


def _task(args: tuple[int, dict[str, Any], str]) -> tuple[int, Score]:
    i, values, leg = args
    c = _CELLS[i]
    return i, score(c.sim, c.job, PolicyParams.from_mapping(values), c.train if leg == "training" else c.test)


def evaluate(pool: Any, params: PolicyParams, leg: str) -> list[Score]:
    """Every cell's score on ``leg``'s starts, the cells spread over the pool (the gangs first: slowest)."""
    order = sorted(range(len(_CELLS)), key=lambda i: -_CELLS[i].job.spec.workers.min)
    got = dict(pool.imap_unordered(_task, [(i, params.to_dict(), leg) for i in order], chunksize=1))
    return [got[i] for i in range(len(_CELLS))]


def _cell_name(i: int) -> str:
    name, fraction, overhead = CELLS[i]
    return f"{name}, frac={fraction}, d={overhead:g}min"


def report(pool: Any, best: PolicyParams) -> dict[str, Any]:
    legs: dict[str, Any] = {}
    for leg in ("held_back", "training"):
        tuned, default = evaluate(pool, best, leg), evaluate(pool, HAND_DEFAULTS, leg)
        cells = {}
        for i, c in enumerate(_CELLS):
            lo, hi = (c.w.split_s, c.w.duration_s) if leg == "held_back" else (0.0, c.w.split_s)
            cells[_cell_name(i)] = {"window_hours": [lo / 3600, hi / 3600], "tuned": tuned[i].to_json(),
                                    "hand": default[i].to_json()}
        legs[leg] = {"cells": cells, "overall": {"tuned": combine(tuned).to_json(), "hand": combine(default).to_json()}}
    return legs


def _print(out: dict[str, Any]) -> None:
    for leg in ("held_back", "training"):
        r = out[leg]
        print(f"\n{leg.replace('_', '-')}: cost / on-demand, mean (p90), tuned vs hand defaults; misses tuned/hand")
        print(f"{'cell':52s} {'hours':>9s} {'n':>3s} {'tuned':>15s} {'hand':>15s} {'change':>7s} {'misses':>7s}")
        rows = [*r["cells"].items(), ("mean over cells", {**r["overall"], "window_hours": None})]
        for name, c in rows:
            t, d = c["tuned"], c["hand"]
            tm, dm = t["mean_cost_over_on_demand"], d["mean_cost_over_on_demand"]
            hours = "" if c["window_hours"] is None else "{:.0f}-{:.0f}".format(*c["window_hours"])
            print(f"{name:52s} {hours:>9s} {t['runs']:3d} {tm:7.3f} ({t['p90_cost_over_on_demand']:.3f}) "
                  f"{dm:7.3f} ({d['p90_cost_over_on_demand']:.3f}) {(tm / dm - 1) * 100:+6.1f}% "
                  f"{t['deadline_misses']:3d}/{d['deadline_misses']:<3d}")
    if "trials" in out:
        print(f"\n{out['trials']} trials, {out['infeasible_trials']} infeasible; best trial value {out['best_value']:.4f} "
              f"(hand defaults, trial 0: {out['default_value']:.4f}); {out['wall_s']:.0f} s")


def main() -> None:
    global _CELLS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--starts", type=int, default=20, help="training starts per cell")
    ap.add_argument("--test-starts", type=int, default=60, help="held-back starts per cell")
    ap.add_argument("--seed", type=int, default=0, help="seeds the TPE sampler and the start times")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--out", default=None, help="JSON file with every figure")
    ap.add_argument("--params-out", default=None, help="the best parameters, as a --policy-params file")
    ap.add_argument("--evaluate", default=None, metavar="FILE", help="no study: FILE's parameters vs the hand defaults")
    ap.add_argument("--guard", action="store_true",
                    help="a trial worse than the hand defaults on the training starts of a 4-zone 3-minute cell is infeasible")
    ap.add_argument("--guard-all-cells", type=float, default=None, metavar="TOL",
                    help="also infeasible: worse than the hand defaults by more than TOL (0.005: 0.5 %%) "
                         "on any cell's training starts")
    args = ap.parse_args()
    t0 = time.time()
    _CELLS = build_cells(args.starts, args.test_starts, args.seed)
    trials: list[dict[str, Any]] = []
    with mp.get_context("fork").Pool(max(1, args.procs)) as pool:
        if args.evaluate:
            out = {**report(pool, load_params_file(args.evaluate)), "params": load_params_file(args.evaluate).to_dict()}
            _print(out)
            if args.out:
                Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
            return

        def objective(p: PolicyParams) -> Score:
            scores = evaluate(pool, p, "training")
            s = combine(scores)
            hand = trials[0]["scores"] if trials else scores  # trial 0 is the hand defaults
            excess = guard_excess(scores, hand, guard=args.guard, all_cells=args.guard_all_cells)
            if excess > 0.0 and s.misses == 0:
                # Worse than the hand defaults in a guarded cell: infeasible, as a miss is.
                s = Score(INFEASIBLE + excess, s.p90_cost_ratio, 0, s.runs)
            trials.append({"value": objective_value(s), "scores": scores, "cells": [x.to_json() for x in scores],
                           "guard_excess": excess, "params": p.to_dict()})
            print(f"trial {len(trials) - 1}: {objective_value(s):.4f} ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
            return s

        res = tune_with(objective, trials=args.trials, seed=args.seed, storage=None, study_name="spotrain-defaults",
                        first=HAND_DEFAULTS)
        out = report(pool, res.best)
    out.update({"trials": res.trials, "infeasible_trials": res.infeasible_trials, "best_value": res.best_value,
                "default_value": trials[0]["value"], "seed": args.seed, "train_fraction": TRAIN_FRACTION,
                "training_starts": args.starts, "held_back_starts": args.test_starts,
                "cells": [_cell_name(i) for i in range(len(CELLS))], "params": res.best.to_dict(),
                "guard": args.guard, "guard_all_cells": args.guard_all_cells,
                "guard_infeasible_trials": sum(1 for t in trials if t["guard_excess"] > 0
                                               and not any(c["deadline_misses"] for c in t["cells"])),
                "trial_log": [{k: v for k, v in t.items() if k != "scores"} for t in trials], "wall_s": time.time() - t0})
    _print(out)
    if args.params_out:
        save_params_file(res.best, args.params_out)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k not in ("trial_log",)}, sort_keys=True))


if __name__ == "__main__":
    main()
