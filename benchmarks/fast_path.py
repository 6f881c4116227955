"""How far the policy-only fast path (``simulator/engine.py``) is from the controller on a virtual
clock (``simulator/world.py``, what ``spotrain simulate`` runs), start by start.

Issue 10 lets the fast path stay for large sweeps (``policy_cost.py``) only if, on at least 100 starts
of two different traces, each start's cost agrees within 0.5 % and its deadline outcome is the same.
This prints, per trace and policy, the share of starts that agree, the worst and mean cost gap,
the deadline outcomes that differ, and the wall time of both paths measured side by side.

    python benchmarks/fast_path.py [--starts N] [--policies spotrain,greedy-spot,...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoscaler.jobs.spec import spec_from_dict  # noqa: E402
from autoscaler.simulator import Simulation, make_sim_job, run_named  # noqa: E402
from autoscaler.simulator.jobs import run_controller  # noqa: E402
from research.tracegen import MULTI_NODE, MULTI_NODE_16, MULTI_ZONE, SINGLE_ZONE, generate_trace  # noqa: E402

TRACES = {"single-zone (seed 7)": (SINGLE_ZONE, 7), "4 zones (seed 8)": (MULTI_ZONE, 8),
          "multi-node market (seed 9)": (MULTI_NODE, 9), "16-instance market (seed 10)": (MULTI_NODE_16, 10)}
HOURS = 24 * 8


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--starts", type=int, default=100)
    ap.add_argument("--policies", default="spotrain,greedy-spot,uniform-progress")
    ap.add_argument("--traces", default="single-zone (seed 7),4 zones (seed 8)", help="comma-separated names of TRACES")
    ap.add_argument("--fraction", type=float, default=0.8)
    ap.add_argument("--restart-min", type=float, default=12.0)
    ap.add_argument("--workers", default="1-1", help="MIN-MAX physical workers (policy_cost: 1-1, 1-4, 4-4, 16-16)")
    ap.add_argument("--serial-fraction", type=float, default=None, help="Amdahl scaling instead of linear")
    args = ap.parse_args()
    lo, hi = (int(x) for x in args.workers.split("-"))
    scaling = "linear" if args.serial_fraction is None else {"serial_fraction": args.serial_fraction}
    speedup = hi if args.serial_fraction is None else 1.0 / (args.serial_fraction + (1 - args.serial_fraction) / hi)
    spec = spec_from_dict({
        "name": "bench", "run": "x", "resources": {"accelerators": ["V100:1"], "clouds": ["aws", "gcp"]},
        "workers": {"min": lo, "max": hi}, "training": {"logical_workers": max(4, hi), "global_batch_size": 256},
        "objective": {"deadline": "24h"}, "simulate": {"work_gpu_hours": 24 * args.fraction * speedup, "scaling": scaling},
    })
    job = make_sim_job(spec, restart_overhead_s=args.restart_min * 60.0)
    rows = []
    print(f"{'trace':<22} {'policy':<17} {'within 0.5%':>11} {'same deadline':>13} {'mean gap':>9} {'worst gap':>9} "
          f"{'fast s':>7} {'full s':>7} {'ratio':>6}")
    for name in args.traces.split(","):
        zones, seed = TRACES[name]
        sim = Simulation(generate_trace(zones, hours=HOURS, seed=seed), spec)
        starts = np.random.default_rng(seed).uniform(0, (HOURS - 25) * 3600, args.starts)
        for policy in args.policies.split(","):
            gaps, same = [], 0
            t_fast = t_full = 0.0
            if policy == "omniscient" and lo != hi:
                continue  # omniscient is defined for fixed-size jobs
            for s in starts:
                t0 = time.perf_counter()
                a = run_named(sim, job, policy, float(s))
                t1 = time.perf_counter()
                b = run_controller(sim, job, policy, float(s))
                t_full += time.perf_counter() - t1
                t_fast += t1 - t0
                gaps.append(abs(b.cost_usd / a.cost_usd - 1.0) if a.cost_usd else 0.0)
                same += a.deadline_met == b.deadline_met
            g = np.array(gaps)
            row = {"trace": name, "policy": policy, "starts": len(starts), "within_half_percent": float(np.mean(g <= 0.005)),
                   "same_deadline_outcome": same / len(starts), "mean_gap": float(g.mean()), "worst_gap": float(g.max()),
                   "fast_s": round(t_fast, 2), "full_s": round(t_full, 2), "full_over_fast": round(t_full / max(t_fast, 1e-9), 1)}
            rows.append(row)
            print(f"{name:<22} {policy:<17} {row['within_half_percent']:>10.0%} {row['same_deadline_outcome']:>12.0%} "
                  f"{row['mean_gap']:>8.2%} {row['worst_gap']:>8.2%} {t_fast:>7.1f} {t_full:>7.1f} {row['full_over_fast']:>6.1f}")
    print(json.dumps({"benchmark": "fast_path", "fraction": args.fraction, "restart_min": args.restart_min,
                      "workers": args.workers, "rows": rows}, sort_keys=True))


if __name__ == "__main__":
    main()
