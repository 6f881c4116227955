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

``--scenario volatile`` / ``flapping`` (issue 23): one region of policy_cost's multi-region markets
(same trace generation, 10-minute steps: ``VOLATILE_STABLE`` us-east-1a/b/c, two volatile zones and
the stable dear one; ``FLAPPING_4`` us-east-1a/b, ``--zones 3`` adds us-west-2a), its 8 x H100 job
(one p5.48xlarge, 24 h on demand, deadline ratio x 24 h, 12-minute restarts, a 0 GB checkpoint) at
``--ratios`` (default 1.05, 1.1, 1.5, 2) and its multi-region start times (the first ``--starts``,
default 100, policy_cost's). Omniscient (policy_cost's way), bayes-online, spotrain and uniform-progress, none with the
oracle; each ratio's cost in % above omniscient (ratio of the means), misses, restarts. The program's
tick is the trace's 10-minute step, so its market model is the generator's exactly; a deadline off
that grid (25.2 h from a start 5 minutes past it) is a tail of minutes after the last tick, and one
program is solved per offset of start and deadline from the grid (``OnlineDPPolicy``'s grid mode).
With 100 starts at the four ratios (shared 2-core machine): volatile 7.5 minutes and 2.7 GB at peak,
flapping with 2 zones and its finer age buckets (``FINE_EDGES``) 9.4 minutes and 4.5 GB, with 3 zones
9.6 minutes and 2.7 GB; ratio 2's programs take most of it.

    python benchmarks/online_bound.py --scenario volatile|flapping [--starts N] [--ratios 1.05,1.1,1.5,2]
                                      [--zones 3] [--edges 0,1,3,12,48]

Memory and time grow as (2 x buckets)^zones x slack (the slack is largest at fraction 0.6): 3 zones
take about 4 minutes and 2 GB in all; 4 zones (the whole benchmark market) 5, 11 and 27 minutes at
fractions 0.9, 0.8 and 0.6, and up to about 10 GB, on the shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoscaler.policy import get_policy  # noqa: E402
from autoscaler.policy.base import JobView  # noqa: E402
from autoscaler.policy.jobmath import gang_rate  # noqa: E402
from autoscaler.simulator import Simulation, make_sim_job, run_named  # noqa: E402
from autoscaler.simulator.omniscient import PlanPolicy, plan_omniscient  # noqa: E402
from cloud_providers.local.market import MarketTrace, write_trace  # noqa: E402
from research.online_bound import AGE_EDGES, OnlineDP, OnlineDPPolicy, trace_history  # noqa: E402
from research.tracegen import MULTI_ZONE, SINGLE_ZONE, ZoneSpec, generate_rows  # noqa: E402

# Shared with the forked workers.
_CTX: dict[str, Any] = {}
REGION_SCENARIOS = ("volatile", "flapping")
REGION_MARKET = {"volatile": "2 regions, volatile cheap + stable dear", "flapping": "2 regions x 2 flapping zones"}
REGION_ZONES = {"volatile": ("us-east-1a", "us-east-1b", "us-east-1c"), "flapping": ("us-east-1a", "us-east-1b")}
REGION_POLICIES = ("omniscient", "bayes-online", "spotrain", "uniform-progress")
# Every age to 2 h, then coarser: on the flapping zones (runs of 4.5 and 3 ticks on average) the
# program's own expectation with AGE_EDGES is optimistic by ~10 % (its bucket hazards are the buckets'
# midpoints'); with these it matches the simulator's mean (docs/policy.md). 2 zones only: the states
# grow as (2 x buckets)^zones.
FINE_EDGES = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 16, 18, 21, 24, 30, 36, 48, 72)
# The program's tick on the multi-region traces: their 10-minute step, so its market model is
# tracegen's exactly (runs of whole steps, changes only on the grid).
REGION_TICK_MIN = 10


def _region_task(args: tuple[str, list[float]]) -> tuple[str, list[dict[str, Any]]]:
    """One policy over some starts on the multi-region sub-market, policy_cost's way (``_region_task``):
    omniscient plans with the move costs of a 0 GB checkpoint, the rest run by name; bayes-online
    uses the program solved for the starts' offset from the trace's grid (``_CTX["dps"]``)."""
    import policy_cost as pc

    policy, starts = args
    sim, job = _CTX["sim"], _CTX["job"]
    out = []
    for s in starts:
        if policy == "omniscient":
            pol: Any = PlanPolicy(plan_omniscient(sim, job, s, moves=pc._move_costs(sim, 0.0)))
        elif policy == "bayes-online":
            pol = OnlineDPPolicy(_CTX["dps"][_grid_offsets(sim.align(s), _CTX["deadline_s"])], _CTX["keys"],
                                 _CTX["od_key"], _CTX["past"], job.restart_overhead_s, grid_origin_s=0.0,
                                 work_per_s=_CTX["work_per_s"])
        else:
            pol = get_policy(policy)
        expected = None
        if policy == "bayes-online":
            view = JobView(job_id=job.job_id, spec=job.spec, submitted_s=sim.align(s), progress=0.0)
            expected = pol.expected_usd(view, sim.align(s))
        r = sim.run(job, pol, s)
        out.append({"start_s": sim.align(s), "cost_usd": r.cost_usd, "expected_usd": expected, "met": r.deadline_met,
                    "restarts": r.restarts,
                    "preemptions": r.preemptions, "on_demand_hours": r.on_demand_hours, "spot_hours": r.spot_hours})
    return policy, out


def _grid_offsets(start_s: float, deadline_s: float) -> tuple[int, int]:
    """(ticks, tail minutes) of the program a start needs on the 10-minute grid: the deadline's
    minutes past the last grid point, and the ticks from the grid point at or before the start
    (``OnlineDPPolicy``'s grid mode: a start between grid points gets a first part-tick)."""
    tick_s = REGION_TICK_MIN * 60
    end = start_s + deadline_s
    tail_s = end % tick_s
    first = math.floor(start_s / tick_s + 1e-9) * tick_s
    return int(round((end - tail_s - first) / tick_s)), int(round(tail_s / 60))


def _region(args: argparse.Namespace) -> None:
    """One region of policy_cost's multi-region markets (``--scenario volatile`` / ``flapping``), its
    8 x H100 job at 0 GB checkpoints, cost in % above omniscient (ratio of the means)."""
    import policy_cost as pc

    n_starts = 100 if args.starts is None else args.starts
    market = REGION_MARKET[args.scenario]
    names = list(REGION_ZONES[args.scenario])
    if args.scenario == "flapping" and (args.zones or 2) >= 3:
        names.append("us-west-2a")
    elif args.zones not in (None, len(names)):
        raise SystemExit(f"error: --zones {args.zones}: {args.scenario} has {len(names)} zones (flapping: 2 or 3)")
    if args.edges:
        edges = tuple(int(x) for x in args.edges.split(","))
    else:
        edges = FINE_EDGES if len(names) == 2 else AGE_EDGES
    m = pc.REGION_MARKETS[market]
    seed = m["seed"] if args.seed is None else args.seed
    all_rows = generate_rows(m["zones"], hours=pc.TRACE_DAYS * 24, seed=seed, grid_s=pc.REGION_STEP_S)
    if pc.REGION_STEP_S != REGION_TICK_MIN * 60:
        raise SystemExit(f"error: the program's tick ({REGION_TICK_MIN} min) must be the trace's step")
    specs = {z.zone: z for z in m["zones"]}
    rows = [r for r in all_rows if r[3] in names]
    spot_price = {z: float(np.mean([r[7] for r in rows if r[3] == z and r[9] > 0])) for z in names}
    z_model = [(spot_price[z], float(specs[z].mean_up_h or 0), float(specs[z].mean_down_h or 0)) for z in names]
    trace = MarketTrace.parse(write_trace(rows), source=f"{market}, zones {', '.join(names)}")
    span_s = (pc.TRACE_DAYS - 1) * 86400 - pc.REGION_RUN_H * max(pc.REGION_RATIOS) * 3600
    starts = [float(x) for x in np.random.default_rng(2025).uniform(0, span_s, n_starts)]
    print(f"{market}: zones {', '.join(names)}; trace seed {seed}; {len(starts)} starts; d = {args.restart_min} min; "
          f"program tick {REGION_TICK_MIN} min, age edges {list(edges)} ticks")
    print(f"{'ratio':>5s} {'policy':16s} {'mean $':>9s} {'vs omni':>8s} {'restarts':>8s} {'preempt':>7s} "
          f"{'od h':>5s} {'miss':>4s}")
    figures: dict[str, Any] = {}
    timing: dict[str, Any] = {}
    for ratio in (float(x) for x in args.ratios.split(",")):
        t0 = time.time()
        spec, _ = pc._region_spec(ratio, 0.0)
        sim = Simulation(trace, spec)  # policy_cost's view: no oracle
        offers = {o.zone: o for o in sim.offerings_at(0.0)}
        keys = [offers[z].key for z in names]
        od = min(offers.values(), key=lambda o: o.on_demand_price_usd_per_hour)
        job = make_sim_job(spec, restart_overhead_s=args.restart_min * 60.0)
        work_per_s = gang_rate(job.scaling, [(od, 1)])
        work_min = job.work / work_per_s / 60
        deadline_s = float(spec.objective.deadline_s or 0)
        if abs(work_min - round(work_min)) > 1e-6 or deadline_s % 60:
            raise SystemExit(f"error: work ({work_min} min) and deadline ({deadline_s} s) must be whole minutes")
        slack_min = int(round(deadline_s / 60 - work_min))
        _CTX.update(sim=sim, job=job, keys=keys, od_key=od.key, past=trace_history(trace, keys), work_per_s=work_per_s,
                    deadline_s=deadline_s, dps={})
        runs: dict[str, list[dict[str, Any]]] = {}
        solve_s = 0.0
        # Omniscient and the online policies first, then one program per offset of the deadline from
        # the grid (starts on and between grid points), each freed before the next.
        _pool_run(["omniscient", "spotrain", "uniform-progress"], starts, args.procs, runs)
        groups: dict[tuple[int, int], list[float]] = {}
        for s in starts:
            groups.setdefault(_grid_offsets(sim.align(s), deadline_s), []).append(s)
        for (ticks, tail), group in sorted(groups.items()):
            t1 = time.time()
            total = REGION_TICK_MIN * ticks + tail
            _CTX["dps"] = {(ticks, tail): OnlineDP(z_model, od.on_demand_price_usd_per_hour, total - slack_min,
                                                   slack_min, args.restart_min, edges, tick_min=REGION_TICK_MIN,
                                                   tail_min=tail)}
            solve_s += time.time() - t1
            _pool_run(["bayes-online"], group, args.procs, runs)
            _CTX["dps"] = {}
        cell: dict[str, Any] = {}
        om_mean = float(np.mean([r["cost_usd"] for r in runs["omniscient"]]))
        for p in REGION_POLICIES:
            rs = runs[p]
            mean = float(np.mean([r["cost_usd"] for r in rs]))
            c = {"cost_usd": round(mean, 4), "above_omniscient": round(mean / om_mean - 1, 4),
                 "misses": sum(0 if r["met"] else 1 for r in rs),
                 "restarts": round(float(np.mean([r["restarts"] for r in rs])), 3),
                 "preemptions": round(float(np.mean([r["preemptions"] for r in rs])), 3),
                 "on_demand_hours": round(float(np.mean([r["on_demand_hours"] for r in rs])), 3)}
            if p == "bayes-online":
                # The program's own expectation over the same starts: where the model is the market's,
                # the realised mean scatters around it.
                c["program_expected_usd"] = round(float(np.mean([r["expected_usd"] for r in rs])), 4)
            cell[p] = c
            print(f"{ratio:5.2f} {p:16s} {mean:9.2f} {mean / om_mean - 1:+8.2%} {c['restarts']:8.2f} "
                  f"{c['preemptions']:7.2f} {c['on_demand_hours']:5.2f} {c['misses']:4d}")
        # Start by start: how often the online bound beats spotrain (its expected cost is the lower one).
        by_start = {p: np.array([r["cost_usd"] for r in sorted(runs[p], key=lambda r: r["start_s"])]) for p in REGION_POLICIES}
        diff = by_start["spotrain"] - by_start["bayes-online"]
        cell["spotrain_minus_bayes_usd"] = {"mean": round(float(diff.mean()), 3),
                                            "stderr": round(float(diff.std(ddof=1) / np.sqrt(len(diff))), 3)
                                            if len(diff) > 1 else None,
                                            "bayes_cheaper_starts": int((diff > 1e-6).sum())}
        print(f"# ratio {ratio:g}: the program expected ${cell['bayes-online']['program_expected_usd']:.2f} for "
              f"bayes-online; spotrain - bayes-online = ${diff.mean():.2f} per job (stderr "
              f"{cell['spotrain_minus_bayes_usd']['stderr']}), bayes-online cheaper on "
              f"{cell['spotrain_minus_bayes_usd']['bayes_cheaper_starts']}/{len(diff)} starts; programs "
              f"{sorted(groups)} (ticks, tail min) solved in {solve_s:.0f} s, {time.time() - t0:.0f} s in all")
        figures[f"ratio={ratio:g}"] = cell
        timing[f"ratio={ratio:g}"] = {"solve_s": round(solve_s, 1), "total_s": round(time.time() - t0, 1)}
    print(json.dumps({"benchmark": "online_bound", "scenario": args.scenario, "market": market, "zones": names,
                      "seed": seed, "starts": len(starts), "restart_min": args.restart_min, "checkpoint_gb": 0,
                      "tick_min": REGION_TICK_MIN, "age_edges_ticks": list(edges), "oracle": False,
                      "cost_vs_omniscient": figures, "timing": timing}, sort_keys=True))


def _pool_run(policies: list[str], starts: list[float], procs: int, runs: dict[str, list[dict[str, Any]]]) -> None:
    tasks = [(p, starts[i:: procs]) for p in policies for i in range(procs)]
    with mp.get_context("fork").Pool(procs) as pool:
        for p, rs in pool.map(_region_task, tasks, chunksize=1):
            runs.setdefault(p, []).extend(rs)


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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=None, help="start times (default: 300; volatile/flapping: 100)")
    ap.add_argument("--zones", type=int, default=None,
                    help="multi: the K cheapest zones of the benchmark market (1-4, default 3); flapping: 2 (us-east-1's "
                         "a and b, the default) or 3 (and us-west-2a)")
    ap.add_argument("--fractions", default="0.6,0.8,0.9")
    ap.add_argument("--ratios", default="1.05,1.1,1.5,2", help="volatile/flapping: deadline / work on demand")
    ap.add_argument("--edges", default=None,
                    help="volatile/flapping: age buckets' lower edges in ticks, comma-separated (default: "
                         "research.online_dp.AGE_EDGES; flapping with 2 zones: FINE_EDGES)")
    ap.add_argument("--restart-min", type=int, default=12)
    ap.add_argument("--seed", type=int, default=None, help="trace seed (default: policy_cost's)")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--scenario", choices=("multi", "single", "volatile", "flapping"), default="multi",
                    help="policy_cost's 4-zone market (default), its single-zone one, or one region of its "
                         "multi-region markets (issue 23)")
    args = ap.parse_args()
    if args.scenario in REGION_SCENARIOS:
        _region(args)
    else:
        _legacy(args)


def _legacy(args: argparse.Namespace) -> None:
    """policy_cost's legacy 1-GPU rows ("multi", "single"), cost relative to on demand."""
    import policy_cost as pc

    args.starts = 300 if args.starts is None else args.starts
    args.zones = 3 if args.zones is None else args.zones
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
