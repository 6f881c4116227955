"""The model-based decision rule (``research.planner``) against spotrain's rules and the online bound.

Same market, starts and accounting as ``policy_cost``'s "4 zones / 2 clouds, 1 GPU" rows (trace seed 2,
300 starts, deadline 24 h): cost / on-demand, mean and p90, deadline misses and restarts per job, for
spotrain (the shipped rules) and the planner (the online bound's program on markets estimated from
the past, over subsets of three markets; "planner+net" adds Can't Be Late's Safety Net on top of the
program's own guard). The online bound's figures are those of
``python benchmarks/online_bound.py --zones 4`` on the same trace and starts (it takes 5-27 minutes
and up to 10 GB per fraction, so they are read from ``--bound-json`` when given, else taken from the
run recorded in docs/policy.md, round 7). Last line: one JSON object with every figure.

    python benchmarks/planner.py [--starts N] [--fractions 0.6,0.8,0.9] [--restart-min D] [--procs P]
                                 [--seed S] [--bound-json FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoscaler.simulator import Simulation, make_sim_job, run_named  # noqa: E402
from research.planner import MarketPast, PlannerPolicy  # noqa: E402
from research.tracegen import generate_trace  # noqa: E402

# benchmarks/online_bound.py --zones 4 (d = 12 min, trace seed 2, the 300 starts below): mean, p90.
RECORDED_BOUND = {0.6: (0.313, 0.341), 0.8: (0.324, 0.358), 0.9: (0.351, 0.456)}
_CTX: dict[str, Any] = {}


def _task(args: tuple[list[float], list[float], float]) -> list[tuple[float, str, dict[str, Any]]]:
    starts, fractions, restart_min = args
    sim: Simulation = _CTX["sim"]
    pc = _CTX["pc"]
    scen = pc.SCENARIOS["4 zones / 2 clouds, 1 GPU"]
    offers = sim.offerings_at(0.0)
    keys = [o.key for o in offers if o.spot_price_usd_per_hour is not None]
    od = min(offers, key=lambda o: o.on_demand_price_usd_per_hour)
    pasts = {k: MarketPast(sim.trace, k) for k in keys}
    cache: OrderedDict[Any, Any] = OrderedDict()
    out = []
    for fraction in fractions:
        job = make_sim_job(pc._spec(scen, fraction), restart_overhead_s=restart_min * 60.0)
        for s in starts:
            for policy in ("on-demand", "spotrain"):
                out.append((fraction, policy, run_named(sim, job, policy, s).to_json()))
            for name, net in (("planner", False), ("planner+net", True)):
                p = PlannerPolicy(sim.trace, keys, od.key, od.on_demand_price_usd_per_hour, job.restart_overhead_s, cache=cache,
                                  pasts=pasts, safety_net=net)
                out.append((fraction, name, sim.run(job, p, sim.align(s)).to_json()))
    return out


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import policy_cost as pc

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=300)
    ap.add_argument("--fractions", default="0.6,0.8,0.9")
    ap.add_argument("--restart-min", type=int, default=12)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=None, help="trace seed (default: policy_cost's)")
    ap.add_argument("--bound-json", default=None, help="benchmarks/online_bound.py's JSON line for the same cells")
    args = ap.parse_args()
    scen = pc.SCENARIOS["4 zones / 2 clouds, 1 GPU"]
    seed = scen["seed"] if args.seed is None else args.seed
    fractions = [float(f) for f in args.fractions.split(",")]
    bound: dict[float, tuple[float, float]] = {}
    if args.bound_json:
        cells = json.loads(Path(args.bound_json).read_text().strip().splitlines()[-1])["cost_vs_on_demand"]
        bound = {f: (cells[f"frac={f}"]["bayes-online"]["mean"], cells[f"frac={f}"]["bayes-online"]["p90"])
                 for f in fractions if f"frac={f}" in cells}
    elif seed == scen["seed"] and args.restart_min == 12 and args.starts == 300:
        bound = {f: RECORDED_BOUND[f] for f in fractions if f in RECORDED_BOUND}
    sim = Simulation(generate_trace(scen["zones"], hours=pc.TRACE_DAYS * 24, seed=seed), pc._spec(scen, 0.6))
    _CTX.update(sim=sim, pc=pc)
    starts = [float(x) for x in np.random.default_rng(2024).uniform(0, (pc.TRACE_DAYS - 2) * 86400, 300)][: args.starts]
    order = sorted(starts)  # contiguous blocks per process: a refresh's programs serve many starts
    blocks = [order[i * len(order) // args.procs:(i + 1) * len(order) // args.procs] for i in range(args.procs)]
    t0 = time.time()
    with mp.get_context("fork").Pool(args.procs) as pool:
        res = pool.map(_task, [(b, fractions, float(args.restart_min)) for b in blocks], chunksize=1)
    runs: dict[tuple[float, str], dict[float, dict[str, Any]]] = {}
    for part in res:
        for fraction, policy, r in part:
            runs.setdefault((fraction, policy), {})[r["start_hours"]] = r
    figures: dict[str, Any] = {}
    print(f"4 zones / 2 clouds, 1 GPU; trace seed {seed}; {len(starts)} starts; d = {args.restart_min} min; "
          f"{time.time() - t0:.0f} s")
    print(f"{'frac':>4s} {'policy':12s} {'mean':>6s} {'p90':>6s} {'p90/mean':>8s} {'vs bound':>8s} {'restarts':>8s} {'miss':>4s}")
    for fraction in fractions:
        hours = sorted(runs[(fraction, "on-demand")])
        base = np.array([runs[(fraction, "on-demand")][h]["cost_usd"] for h in hours])
        cell: dict[str, Any] = {}
        b = bound.get(fraction)
        for policy in ("spotrain", "planner", "planner+net"):
            rs = [runs[(fraction, policy)][h] for h in hours]
            rel = np.array([r["cost_usd"] for r in rs]) / base
            mean, p90 = float(rel.mean()), float(np.percentile(rel, 90))
            vs = mean / b[0] - 1 if b else float("nan")
            cell[policy] = {"mean": round(mean, 4), "p90": round(p90, 4), "vs_bound": round(vs, 4) if b else None,
                            "restarts": round(float(np.mean([r["restarts"] for r in rs])), 2),
                            "misses": sum(not r["deadline_met"] for r in rs)}
            print(f"{fraction:4.1f} {policy:12s} {mean:6.3f} {p90:6.3f} {p90 / mean:8.3f} {vs:+8.1%} "
                  f"{cell[policy]['restarts']:8.2f} {cell[policy]['misses']:4d}")
        if b:
            cell["online-bound"] = {"mean": b[0], "p90": b[1]}
            print(f"{fraction:4.1f} {'online bound':12s} {b[0]:6.3f} {b[1]:6.3f} {b[1] / b[0]:8.3f}")
        figures[f"frac={fraction}"] = cell
    print(json.dumps({"benchmark": "planner", "seed": seed, "starts": len(starts), "restart_min": args.restart_min,
                      "cost_vs_on_demand": figures}, sort_keys=True))


if __name__ == "__main__":
    main()
