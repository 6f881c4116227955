"""Cost of each policy on generated market traces: Can't Be Late's cells and multi-region markets.

Legacy cells (``cost_vs_on_demand``): for each scenario and job fraction (work / deadline on the
fallback) 0.6, 0.8, 0.9 the five policies run from the same seeded random start times (300;
``--quick``: 12) on a 30-day trace from ``research.tracegen`` (heavy-tailed availability runs, zones
that differ, list prices). Deadline 24 h, restart overhead 12 min unless swept. Reports mean and p90 of
cost / on-demand cost and deadline misses.

Multi-region cells (``multi_region``, issue 23): three markets of several regions with several zones
each (``tracegen.MULTI_REGION``, ``VOLATILE_STABLE``, ``FLAPPING_4``; 10-minute steps), an 8 x H100
job of 24 h on demand with 12-minute restarts, deadline ratios (deadline / work on demand) 1.05-3, checkpoints of 0,
50, 500 and 4,000 GB and egress on every change of region (the catalog's price per region pair where
it has one, else $0.02/GB). Per cell: each policy's cost
(egress included) in % above omniscient's on the same starts (ratio of the means; 100 starts,
``--quick``: 4), deadline misses, region moves and egress per job. Omniscient plans with the egress
(``MoveCosts``), so it stays the lower bound.

``--no-oracle`` (default) is the policy's view from what a real cloud reports; ``--oracle`` the
research view with full availability knowledge (``_simulation`` wires it; the JSON says which view
ran). Last line: one JSON object with every figure.

    python benchmarks/policy_cost.py [--quick] [--starts N] [--procs P] [--oracle] [--section S] [--market M]
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

from autoscaler.errors import SpecError  # noqa: E402
from autoscaler.jobs.spec import JobSpec, spec_from_dict  # noqa: E402
from autoscaler.policy import get_policy  # noqa: E402
from autoscaler.simulator import SimResult, Simulation, make_sim_job, run_named  # noqa: E402
from autoscaler.simulator.omniscient import MoveCosts, PlanPolicy, plan_omniscient, region_of  # noqa: E402
from cloud_providers import catalog  # noqa: E402
from cloud_providers.local.market import MarketTrace  # noqa: E402
from research.moves import MoveRecorder  # noqa: E402
from research.tracegen import (  # noqa: E402
    FLAPPING_4,
    MULTI_NODE,
    MULTI_NODE_16,
    MULTI_REGION,
    MULTI_ZONE,
    SINGLE_ZONE,
    VOLATILE_STABLE,
    generate_trace,
)

POLICIES = ("on-demand", "greedy-spot", "uniform-progress", "omniscient", "spotrain")
DEADLINE_H = 24.0
TRACE_DAYS = 30
SCENARIOS: dict[str, dict[str, Any]] = {
    "single-zone, 1 GPU": {"zones": SINGLE_ZONE, "seed": 1, "workers": (1, 1), "scaling": "linear"},
    "4 zones / 2 clouds, 1 GPU": {"zones": MULTI_ZONE, "seed": 2, "workers": (1, 1), "scaling": "linear"},
    "4 zones, elastic 1-4 GPUs": {"zones": MULTI_ZONE, "seed": 2, "workers": (1, 4), "scaling": {"serial_fraction": 0.02}},
    "multi-node, 4 x 1 GPU": {"zones": MULTI_NODE, "seed": 3, "workers": (4, 4), "scaling": "linear"},
    "multi-node, 16 x 1 GPU": {"zones": MULTI_NODE_16, "seed": 4, "workers": (16, 16), "scaling": "linear"},
}
_SIMS: dict[str, Simulation] = {}

REGION_MARKETS: dict[str, dict[str, Any]] = {
    "3 regions x 3 zones": {"zones": MULTI_REGION, "seed": 21},
    "2 regions, volatile cheap + stable dear": {"zones": VOLATILE_STABLE, "seed": 22},
    "2 regions x 2 flapping zones": {"zones": FLAPPING_4, "seed": 23},
}
# The job: an 8 x H100 gang (H100 = 4 reference GPUs) that runs 24 h on demand.
REGION_RUN_H = 24.0
REGION_GPUS = 8
REGION_WORK_GPU_H = REGION_RUN_H * REGION_GPUS * 4.0
REGION_RATIOS = (1.05, 1.1, 1.5, 2.0, 3.0)
CHECKPOINT_GB = (0.0, 50.0, 500.0, 4000.0)
EGRESS_USD_PER_GB = 0.02
REGION_RESTART_MIN = 12.0
REGION_STEP_S = 600.0
REGION_POLICIES = ("omniscient", "spotrain", "uniform-progress")
ORACLE = {"requested": False}  # set in main(); forked workers inherit it


def _simulation(trace: MarketTrace, spec: JobSpec) -> Simulation:
    """The one place the --oracle / --no-oracle switch reaches the simulator: without the oracle the
    policy sees spot room only as its launches, refusals and preemptions revealed it."""
    return Simulation(trace, spec, oracle=ORACLE["requested"])



def _billed(r: SimResult, rec: MoveRecorder) -> tuple[float, float, int]:
    """THE ONE PLACE a run's egress comes from: (cost with egress, egress, region moves). Where the
    simulator bills egress (issue 23 item 1, branch wt-p23-moves: ``SimResult.egress_usd`` inside
    ``cost_usd``, ``region_moves``) its figures are used; otherwise the benchmark's own count
    (``MoveRecorder``: region moves x checkpoint GB x $/GB) is added to the bill."""
    sim_egress = getattr(r, "egress_usd", None)
    if sim_egress is not None:
        return r.cost_usd, float(sim_egress), int(getattr(r, "region_moves", rec.moves))
    return r.cost_usd + rec.egress_usd, rec.egress_usd, rec.moves


def _move_costs(sim: Simulation, size_gb: float) -> MoveCosts:
    """What omniscient is told a move costs: the catalog's egress price per region pair where the
    catalog has one (issue 23 item 1, branch wt-p23-moves: the price the simulator then bills, e.g.
    $0.01/GB between us-east-1 and us-east-2), else a flat ``EGRESS_USD_PER_GB``."""
    per_gb = getattr(catalog, "egress_usd_per_gb", None)
    if per_gb is None:
        return MoveCosts(size_gb, EGRESS_USD_PER_GB)
    regions = sorted({region_of(o) for o in sim.offerings_at(0.0)})
    table = {(a, b): float(per_gb(*a.split("/"), *b.split("/"))) for a in regions for b in regions if a != b}
    return MoveCosts(size_gb, EGRESS_USD_PER_GB, table)


def _egress_source() -> str:
    return "simulator" if "egress_usd" in SimResult.__dataclass_fields__ else "benchmark (region moves x GB x $/GB)"


def _spec(scen: dict[str, Any], fraction: float) -> Any:
    lo, hi = scen["workers"]
    speedup = hi if scen["scaling"] == "linear" else 1.0 / (0.02 + 0.98 / hi)
    return spec_from_dict({
        "name": "bench", "run": "x",
        "resources": {"accelerators": ["V100:1"], "clouds": ["aws", "gcp"]},
        "workers": {"min": lo, "max": hi},
        "training": {"logical_workers": max(4, hi), "global_batch_size": 256},
        "objective": {"deadline": f"{DEADLINE_H}h"},
        "simulate": {"work_gpu_hours": DEADLINE_H * fraction * speedup, "scaling": scen["scaling"]},
    })


def _task(args: tuple[str, float, float, str, list[float]]) -> tuple[str, float, float, str, list[float], int]:
    name, fraction, overhead_min, policy, starts = args
    scen = SCENARIOS[name]
    spec = _spec(scen, fraction)
    if name not in _SIMS:
        _SIMS[name] = _simulation(generate_trace(scen["zones"], hours=TRACE_DAYS * 24, seed=scen["seed"]), spec)
    sim = _SIMS[name]
    job = make_sim_job(spec, restart_overhead_s=overhead_min * 60.0)
    costs, misses = [], 0
    for s in starts:
        r = run_named(sim, job, policy, s)
        costs.append(r.cost_usd)
        misses += 0 if r.deadline_met else 1
    return name, fraction, overhead_min, policy, costs, misses


def _region_spec(ratio: float, size_gb: float) -> tuple[JobSpec, bool]:
    """The multi-region job, and whether its spec carries the checkpoint's size for the policy (issue
    23 item 1 adds ``checkpoint.size_gb``; a build without it plans as if moves moved nothing)."""
    base: dict[str, Any] = {
        "name": "bench", "run": "x",
        "resources": {"accelerators": [f"H100:{REGION_GPUS}"], "clouds": ["aws"]},
        "workers": {"min": REGION_GPUS, "max": REGION_GPUS},
        "training": {"logical_workers": REGION_GPUS, "global_batch_size": 256},
        "objective": {"deadline": f"{REGION_RUN_H * ratio * 3600:.0f}s"},
        "simulate": {"work_gpu_hours": REGION_WORK_GPU_H, "scaling": "linear"},
    }
    if size_gb:
        try:
            return spec_from_dict({**base, "checkpoint": {"size_gb": size_gb}}), True
        except SpecError:
            pass
    return spec_from_dict(base), not size_gb


def _region_task(args: tuple[str, float, float, str, list[float]]) -> tuple[str, float, float, str, list[dict[str, Any]]]:
    market, ratio, size_gb, policy, starts = args
    spec, sees_size = _region_spec(ratio, size_gb)
    key = "region:" + market
    if key not in _SIMS:
        m = REGION_MARKETS[market]
        _SIMS[key] = _simulation(generate_trace(m["zones"], hours=TRACE_DAYS * 24, seed=m["seed"], grid_s=REGION_STEP_S), spec)
    sim = _SIMS[key]
    job = make_sim_job(spec, restart_overhead_s=REGION_RESTART_MIN * 60.0)
    costs = _move_costs(sim, size_gb)
    out = []
    for s in starts:
        inner = PlanPolicy(plan_omniscient(sim, job, s, moves=costs)) if policy == "omniscient" else get_policy(policy)
        rec = MoveRecorder(inner, costs)
        r = sim.run(job, rec, s)
        cost, egress, moves = _billed(r, rec)
        out.append({"cost_usd": cost, "egress_usd": egress, "moves": moves, "met": r.deadline_met,
                    "sees_size": sees_size})
    return market, ratio, size_gb, policy, out


def _region_cells(starts: list[float], procs: int, markets: tuple[str, ...] = tuple(REGION_MARKETS)) -> dict[str, Any]:
    tasks = [(m, ratio, gb, p, starts) for m in markets for ratio in REGION_RATIOS for gb in CHECKPOINT_GB
             for p in REGION_POLICIES]
    with mp.get_context("fork").Pool(max(1, procs)) as pool:
        results = pool.map(_region_task, tasks, chunksize=1)
    runs = {(m, ratio, gb, p): out for m, ratio, gb, p, out in results}
    fig: dict[str, Any] = {}
    print(f"{'market':40s} {'ratio':>5s} {'ckpt GB':>7s} {'spotrain':>9s} {'UP':>8s} {'misses s/u/o':>12s} "
          f"{'moves/job s':>11s} {'moves/job o':>11s} {'egress $ s/o':>13s}")
    for m in markets:
        for ratio in REGION_RATIOS:
            for gb in CHECKPOINT_GB:
                om = runs[(m, ratio, gb, "omniscient")]
                om_mean = float(np.mean([x["cost_usd"] for x in om]))
                cell: dict[str, Any] = {}
                for p in REGION_POLICIES:
                    xs = runs[(m, ratio, gb, p)]
                    mean = float(np.mean([x["cost_usd"] for x in xs]))
                    cell[p] = {"above_omniscient": round(mean / om_mean - 1, 4), "cost_usd": round(mean, 4),
                               "misses": sum(0 if x["met"] else 1 for x in xs),
                               "moves_per_job": round(float(np.mean([x["moves"] for x in xs])), 3),
                               "egress_usd_per_job": round(float(np.mean([x["egress_usd"] for x in xs])), 4)}
                cell["policy_sees_checkpoint_size"] = all(x["sees_size"] for x in runs[(m, ratio, gb, "spotrain")])
                fig.setdefault(m, {})[f"ratio={ratio:g},ckpt={gb:g}GB"] = cell
                sp, up, o = cell["spotrain"], cell["uniform-progress"], cell["omniscient"]
                print(f"{m:40s} {ratio:5.2f} {gb:7.0f} {sp['above_omniscient']:+9.1%} {up['above_omniscient']:+8.1%} "
                      f"{sp['misses']:>4d}/{up['misses']}/{o['misses']:<4d} {sp['moves_per_job']:11.2f} "
                      f"{o['moves_per_job']:11.2f} {sp['egress_usd_per_job']:6.1f}/{o['egress_usd_per_job']:<6.1f}")
    return fig


def _region_targets(fig: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Issue 23's "done means" on the multi-region cells."""
    cells = [(m, k, c) for m, cs in fig.items() for k, c in cs.items()]
    small = [c["spotrain"]["above_omniscient"] for _, k, c in cells if k.endswith(("ckpt=0GB", "ckpt=50GB"))]
    large = [c["spotrain"]["above_omniscient"] for _, k, c in cells if not k.endswith(("ckpt=0GB", "ckpt=50GB"))]
    misses = sum(c["spotrain"]["misses"] for _, _, c in cells)
    over = [(m, k) for m, k, c in cells if c["spotrain"]["moves_per_job"] > 2 * c["omniscient"]["moves_per_job"] + 1e-9]
    return {
        "multi-region, 0-50 GB: spotrain within 5% of omniscient": {
            "met": max(small) <= 0.05, "detail": f"worst {max(small):+.1%}"},
        "multi-region, 500 GB-4 TB: spotrain within 10% of omniscient": {
            "met": max(large) <= 0.10, "detail": f"worst {max(large):+.1%}"},
        "multi-region: zero spotrain misses": {"met": misses == 0, "detail": f"{misses} misses"},
        "multi-region: spotrain moves per job <= 2x omniscient's": {
            "met": not over, "detail": f"{len(over)} of {len(cells)} cells over"},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="12 starts per legacy cell, 4 per multi-region cell (smoke test)")
    ap.add_argument("--starts", type=int, default=None, help="starts per cell (both sections)")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--oracle", action=argparse.BooleanOptionalAction, default=False,
                    help="the policy sees full availability (research view); default: only what a cloud reports")
    ap.add_argument("--section", choices=("all", "legacy", "multi-region"), default="all")
    ap.add_argument("--market", action="append", choices=tuple(REGION_MARKETS), default=None,
                    help="only this multi-region market (repeatable; default: all three)")
    args = ap.parse_args()
    ORACLE["requested"] = args.oracle
    n = args.starts or (12 if args.quick else 300)
    n_region = args.starts or (4 if args.quick else 100)
    t0 = time.time()
    out: dict[str, Any] = {"benchmark": "policy_cost", "oracle": args.oracle}
    targets: dict[str, dict[str, Any]] = {}
    if args.section in ("all", "legacy"):
        starts = [float(x) for x in np.random.default_rng(2024).uniform(0, (TRACE_DAYS - 2) * 86400, n)]
        figures = _legacy_cells(starts, args.procs)
        targets.update(_targets(figures))
        out.update({"starts": n, "deadline_hours": DEADLINE_H, "cost_vs_on_demand": figures})
    if args.section in ("all", "multi-region"):
        span_s = (TRACE_DAYS - 1) * 86400 - REGION_RUN_H * max(REGION_RATIOS) * 3600
        starts = [float(x) for x in np.random.default_rng(2025).uniform(0, span_s, n_region)]
        fig = _region_cells(starts, args.procs, tuple(args.market or REGION_MARKETS))
        print(f"# multi-region: {n_region} starts per cell, egress from {_egress_source()}")
        targets.update(_region_targets(fig))
        out.update({"multi_region": fig, "multi_region_starts": n_region, "egress_usd_per_gb": EGRESS_USD_PER_GB,
                    "multi_region_run_hours_on_demand": REGION_RUN_H, "egress_source": _egress_source()})
    print(f"# {time.time() - t0:.0f} s")
    for k, v in targets.items():
        print(f"# target {k}: {'met' if v['met'] else 'NOT met'} ({v['detail']})")
    out["targets"] = targets
    print(json.dumps(out, sort_keys=True))


def _legacy_cells(starts: list[float], procs: int) -> dict[str, Any]:
    """Can't Be Late's cells: cost / on-demand per scenario, fraction and restart overhead."""
    tasks = []
    for name, scen in SCENARIOS.items():
        for fraction in (0.6, 0.8, 0.9):
            for p in POLICIES:
                if p == "omniscient" and scen["workers"][0] != scen["workers"][1]:
                    continue  # omniscient is defined for fixed-size jobs
                tasks.append((name, fraction, 12.0, p, starts))
    for overhead in (6.0, 3.0, 1.0):
        for p in POLICIES:
            tasks.append(("single-zone, 1 GPU", 0.8, overhead, p, starts))
        # Several zones as restarts get cheaper (from measured checkpoint and restore times the
        # simulator's d is those plus 90 s to launch: under 2 minutes for benchmarks/changeover.py's
        # jobs; Can't Be Late's evaluation uses 0.05 h and 0.2 h, i.e. 3 and 12 minutes).
        for fraction in (0.6, 0.8, 0.9):
            for p in POLICIES:
                tasks.append(("4 zones / 2 clouds, 1 GPU", fraction, overhead, p, starts))
    t0 = time.time()
    with mp.get_context("fork").Pool(max(1, procs)) as pool:
        results = pool.map(_task, tasks, chunksize=1)
    od_cost: dict[tuple[str, float, float], np.ndarray] = {}
    for name, fraction, ov, p, costs, _ in results:
        if p == "on-demand":
            od_cost[(name, fraction, ov)] = np.array(costs)
    figures: dict[str, Any] = {}
    print(f"{'scenario':28s} {'frac':>4s} {'d(min)':>6s} {'policy':17s} {'mean':>6s} {'p90':>6s} {'miss':>5s}")
    for name, fraction, ov, p, costs, misses in results:
        rel = np.array(costs) / od_cost[(name, fraction, ov)]
        mean, p90 = float(np.mean(rel)), float(np.percentile(rel, 90))
        cell = figures.setdefault(name, {}).setdefault(f"frac={fraction},d={ov:g}min", {})
        cell[p] = {"mean": round(mean, 4), "p90": round(p90, 4), "misses": misses}
        print(f"{name:28s} {fraction:4.1f} {ov:6.0f} {p:17s} {mean:6.3f} {p90:6.3f} {misses:5d}")
    print(f"# {len(starts)} starts per cell, {len(tasks)} cells, {time.time() - t0:.0f} s")
    return figures


def _targets(fig: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The issue's targets, checked on this run's figures."""
    out: dict[str, dict[str, Any]] = {}
    misses = sum(c[p]["misses"] for s in fig.values() for c in s.values()
                 for p in ("uniform-progress", "omniscient", "spotrain") if p in c)
    out["zero deadline misses (UP, omniscient, spotrain)"] = {"met": misses == 0, "detail": f"{misses} misses"}
    one = fig["single-zone, 1 GPU"]
    cells = [one[f"frac={f},d=12min"] for f in (0.6, 0.8, 0.9)]
    out["single zone: spotrain mean < uniform-progress at 0.6/0.8/0.9"] = {
        "met": all(c["spotrain"]["mean"] < c["uniform-progress"]["mean"] for c in cells),
        "detail": ", ".join(f"{c['spotrain']['mean']:.3f} vs {c['uniform-progress']['mean']:.3f}" for c in cells)}
    gap = [(c["uniform-progress"]["mean"] - c["spotrain"]["mean"])
           / max(1e-9, c["uniform-progress"]["mean"] - c["omniscient"]["mean"]) for c in cells]
    out["single zone: share of UP's gap to omniscient closed"] = {"met": min(gap) > 0.2,
                                                                  "detail": ", ".join(f"{g:.0%}" for g in gap)}
    for d in (12, 6, 3, 1):
        multi = [fig["4 zones / 2 clouds, 1 GPU"][f"frac={f},d={d}min"] for f in (0.6, 0.8, 0.9)]
        out[f"several zones, d={d}min: spotrain mean within 3% of omniscient"] = {
            "met": all(c["spotrain"]["mean"] <= 1.03 * c["omniscient"]["mean"] for c in multi),
            "detail": ", ".join(f"{c['spotrain']['mean'] / c['omniscient']['mean'] - 1:+.1%}" for c in multi)}
        out[f"several zones, d={d}min: spotrain p90 close to its mean (<= 1.15 x)"] = {
            "met": all(c["spotrain"]["p90"] <= 1.15 * c["spotrain"]["mean"] for c in multi),
            "detail": ", ".join(f"{c['spotrain']['p90'] / c['spotrain']['mean']:.2f}x" for c in multi)}
    for size in (4, 16):
        node = [fig[f"multi-node, {size} x 1 GPU"][f"frac={f},d=12min"] for f in (0.6, 0.8, 0.9)]
        out[f"multi-node {size}: spotrain mean >= 3% below polarized uniform-progress, p90 <= on-demand"] = {
            "met": all(c["spotrain"]["mean"] <= 0.97 * c["uniform-progress"]["mean"] and c["spotrain"]["p90"] <= 1.0
                       for c in node),
            "detail": ", ".join(f"{c['spotrain']['mean']:.3f} vs {c['uniform-progress']['mean']:.3f} "
                                f"(p90 {c['spotrain']['p90']:.3f})" for c in node)}
    sweep = [one[f"frac=0.8,d={d}min"] for d in (12, 6, 3, 1)]
    out["overhead sweep 12->1 min: spotrain mean <= uniform-progress"] = {
        "met": all(c["spotrain"]["mean"] <= c["uniform-progress"]["mean"] for c in sweep),
        "detail": ", ".join(f"{c['spotrain']['mean']:.3f} vs {c['uniform-progress']['mean']:.3f}" for c in sweep)}
    return out


if __name__ == "__main__":
    main()
