"""How close to omniscient can *any* online policy get? The approximately Bayes-optimal online policy.

policy_cost compares spotrain with omniscient, which knows the whole trace. This runs the best policy
that knows only the past (``research.online_bound``: a dynamic program over the
generator's own model, with its true parameters) through the same simulator, on the same trace and
start times as policy_cost's "4 zones / 2 clouds, 1 GPU" rows, restricted to its K cheapest zones,
next to omniscient, uniform-progress and spotrain. What separates it from omniscient is the value of
knowing the future; no online policy can be expected to close that part of the gap.

    python benchmarks/online_bound.py [--starts N] [--zones K] [--fractions 0.6,0.8,0.9]
                                      [--restart-min D] [--seed S] [--procs P] [--scenario single]

``--scenario single`` runs policy_cost's "single-zone, 1 GPU" rows instead (one zone: seconds).

Memory and time grow as (2 x buckets)^zones x slack (the slack is largest at fraction 0.6): 3 zones
take about 4 minutes and 2 GB in all; 4 zones (the whole benchmark market) 5, 11 and 27 minutes at
fractions 0.9, 0.8 and 0.6, and up to about 10 GB, on the shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoscaler.simulator import Simulation, make_sim_job, run_named  # noqa: E402
from cloud_providers.local.market import MarketTrace, write_trace  # noqa: E402
from research.online_bound import AGE_EDGES, OnlineDP, OnlineDPPolicy, trace_history  # noqa: E402
from research.tracegen import MULTI_ZONE, SINGLE_ZONE, ZoneSpec, generate_rows  # noqa: E402

# Shared with the forked workers.
_CTX: dict[str, Any] = {}


def _task(args: tuple[str, list[float]]) -> tuple[str, list[dict[str, Any]]]:
    policy, starts = args
    sim, job = _CTX["sim"], _CTX["job"]
    if policy == "bayes-online":
        out = [sim.run(job, OnlineDPPolicy(_CTX["dp"], _CTX["keys"], _CTX["od_key"], _CTX["past"], job.restart_overhead_s),
                       sim.align(s)) for s in starts]
    else:
        out = [run_named(sim, job, policy, s) for s in starts]
    return policy, [r.to_json() for r in out]


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import policy_cost as pc

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=300)
    ap.add_argument("--zones", type=int, default=3, help="the K cheapest zones of the benchmark market (1-4)")
    ap.add_argument("--fractions", default="0.6,0.8,0.9")
    ap.add_argument("--restart-min", type=int, default=12)
    ap.add_argument("--seed", type=int, default=None, help="trace seed (default: policy_cost's)")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--scenario", choices=("multi", "single"), default="multi",
                    help="policy_cost's 4-zone market (default) or its single-zone one")
    args = ap.parse_args()
    single = args.scenario == "single"
    scen = pc.SCENARIOS["single-zone, 1 GPU" if single else "4 zones / 2 clouds, 1 GPU"]
    market = SINGLE_ZONE if single else MULTI_ZONE
    seed = scen["seed"] if args.seed is None else args.seed
    all_rows = generate_rows(scen["zones"], hours=pc.TRACE_DAYS * 24, seed=seed)
    spot_price = {z.zone: float(np.mean([r[7] for r in all_rows if r[3] == z.zone and r[9] > 0])) for z in market}
    zones: list[ZoneSpec] = sorted(market, key=lambda z: spot_price[z.zone])[: max(1, min(len(market), args.zones))]
    names = [z.zone for z in zones]
    rows = [r for r in all_rows if r[3] in names]
    sim = Simulation(MarketTrace.parse(write_trace(rows), source="benchmark market, cheapest zones"), pc._spec(scen, 0.6))
    offers = {o.zone: o for o in sim.offerings_at(0.0)}
    keys = [offers[z].key for z in names]
    od = min(offers.values(), key=lambda o: o.on_demand_price_usd_per_hour)
    past = trace_history(sim.trace, keys)
    starts = [float(x) for x in np.random.default_rng(2024).uniform(0, (pc.TRACE_DAYS - 2) * 86400, 300)][: args.starts]
    policies = ("on-demand", "omniscient", "uniform-progress", "spotrain", "bayes-online")
    figures: dict[str, Any] = {}
    print(f"zones: {', '.join(names)}; trace seed {seed}; {len(starts)} starts; d = {args.restart_min} min")
    print(f"{'frac':>4s} {'policy':16s} {'mean':>6s} {'p90':>6s} {'vs omni':>8s} {'restarts':>8s} {'od h':>5s} {'miss':>4s}")
    for fraction in (float(f) for f in args.fractions.split(",")):
        t0 = time.time()
        spec = pc._spec(scen, fraction)
        work_min = int(round(pc.DEADLINE_H * 60 * fraction))
        z_model = [(spot_price[z.zone], float(z.mean_up_h or 0), float(z.mean_down_h or 0)) for z in zones]
        job = make_sim_job(spec, restart_overhead_s=args.restart_min * 60.0)
        slack_min = int(pc.DEADLINE_H * 60) - work_min
        # No local name for the program: _CTX.pop("dp") below is what frees it before the next one.
        _CTX.update(sim=sim, job=job, keys=keys, od_key=od.key, past=past,
                    dp=OnlineDP(z_model, od.on_demand_price_usd_per_hour, work_min, slack_min, args.restart_min))
        solve_s = time.time() - t0
        tasks = [(p, starts[i:: args.procs]) for p in policies for i in range(args.procs)]
        with mp.get_context("fork").Pool(args.procs) as pool:
            res = pool.map(_task, tasks, chunksize=1)
        runs: dict[str, list[dict[str, Any]]] = {}
        for p, rs in res:
            runs.setdefault(p, []).extend(rs)
        for p in runs:
            runs[p].sort(key=lambda r: r["start_hours"])
        base = np.array([r["cost_usd"] for r in runs["on-demand"]])
        cell: dict[str, Any] = {}
        omni = float(np.mean(np.array([r["cost_usd"] for r in runs["omniscient"]]) / base))
        for p in policies[1:]:
            rel = np.array([r["cost_usd"] for r in runs[p]]) / base
            mean, p90 = float(rel.mean()), float(np.percentile(rel, 90))
            misses = sum(not r["deadline_met"] for r in runs[p])
            restarts = float(np.mean([r["restarts"] for r in runs[p]]))
            od_h = float(np.mean([r["on_demand_hours"] for r in runs[p]]))
            cell[p] = {"mean": round(mean, 4), "p90": round(p90, 4), "vs_omniscient": round(mean / omni - 1, 4),
                       "restarts": round(restarts, 2), "on_demand_hours": round(od_h, 2), "misses": misses}
            print(f"{fraction:4.1f} {p:16s} {mean:6.3f} {p90:6.3f} {mean / omni - 1:+8.1%} {restarts:8.2f} {od_h:5.2f} "
                  f"{misses:4d}")
        print(f"# fraction {fraction}: program solved in {solve_s:.0f} s, {time.time() - t0:.0f} s in all")
        figures[f"frac={fraction}"] = cell
        _CTX.pop("dp")
    print(json.dumps({"benchmark": "online_bound", "zones": names, "seed": seed, "starts": len(starts),
                      "restart_min": args.restart_min, "age_edges_ticks": list(AGE_EDGES),
                      "cost_vs_on_demand": figures}, sort_keys=True))


if __name__ == "__main__":
    main()
