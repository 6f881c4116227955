"""Workload replay, fixed batch vs adaptive (issue 11, item 6): the same Pollux workload on the same
market, through the controller on a virtual clock, with each job's batch fixed at the user's or
picked per allocation by the controller (co-adaptation).

    python benchmarks/workload_adaptive.py [--workload CSV] [--traces bundled gen:0 gen:1] [--procs 2] [--out FILE.json]

Each job is elastic (1 to its ``num_replicas`` GPUs); its simulated workers train at its model's Pollux
throughput model and a constant gradient noise scale (``autoscaler/simulator/workload.py``,
``NOISE_SCALE``) and report profile rows and gradient statistics; the controller starts from a linear
prior and learns each job's goodput from the reports (docs/goodput.md "workload replay"). The policy
is ``spotrain`` with the default deadlines (4x each job's on-demand time at its user's size and
batch) and a 6-minute restart overhead, as ``spotrain simulate --workload CSV --batch-policy P``.

Markets: ``bundled`` is ``spotrain simulate``'s default trace (cloud_providers/local, 12 offerings,
47.5 h, held at its last row after); ``gen:S`` is ``generate_trace(MULTI_ZONE, hours=336, seed=S)``
(4 zones of 1-GPU V100s on two clouds, spot room up to 4 each). Reported per market and mode: jobs
finished, average JCT (hours from submission to success), cost, billed GPU-hours, deadline misses,
preemptions, batch events. Last line: JSON with every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoscaler.policy import get_policy  # noqa: E402
from research.tracegen import MULTI_ZONE, generate_trace  # noqa: E402
from autoscaler.simulator.workload import read_workload, simulate_workload  # noqa: E402
from cloud_providers.local.market import MarketTrace  # noqa: E402

WORKLOAD = ROOT / "cost_models" / "data" / "pollux" / "workloads" / "workload-1.csv"
MODES = ("fixed", "adaptive")
KEYS = ("finished", "jobs", "avg_jct_hours", "cost_usd", "on_demand_cost_usd", "gpu_hours", "deadline_misses",
        "preemptions", "batch_events")


def _trace(name: str) -> MarketTrace:
    if name == "bundled":
        return MarketTrace.bundled()
    if name.startswith("gen:"):
        return generate_trace(MULTI_ZONE, hours=24 * 14, seed=int(name[4:]))
    return MarketTrace.load(name)


def _one(args: tuple[str, str, str]) -> dict[str, Any]:
    trace_name, mode, workload = args
    t0 = time.perf_counter()
    out = simulate_workload(_trace(trace_name), read_workload(workload), get_policy("spotrain"), batch_policy=mode)
    return {"trace": trace_name, "mode": mode, "wall_s": round(time.perf_counter() - t0, 1), **{k: out[k] for k in KEYS},
            "per_app_jct_hours": _per_app(out["per_job"])}


def _per_app(per_job: list[dict[str, Any]]) -> dict[str, float]:
    apps: dict[str, list[float]] = {}
    for j in per_job:
        if j["jct_hours"] is not None:
            apps.setdefault(j["application"], []).append(j["jct_hours"])
    return {a: round(sum(v) / len(v), 3) for a, v in sorted(apps.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default=str(WORKLOAD))
    ap.add_argument("--traces", nargs="+", default=["bundled", "gen:0", "gen:1"])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    jobs = [(t, m, a.workload) for t in a.traces for m in MODES]
    with ProcessPoolExecutor(max_workers=max(1, a.procs)) as pool:
        rows = list(pool.map(_one, jobs))
    print(f"workload {Path(a.workload).name}; policy spotrain; default deadlines; 6-min restart overhead")
    print(f"{'market':10} {'mode':9} {'done':>7} {'avg JCT h':>10} {'cost $':>9} {'GPU-h':>8} {'misses':>6} {'preempt':>7} {'batch ev':>8}")
    for r in rows:
        print(f"{r['trace']:10} {r['mode']:9} {r['finished']:>3}/{r['jobs']:<3} {r['avg_jct_hours']:>10.3f} {r['cost_usd']:>9.2f} "
              f"{r['gpu_hours']:>8.1f} {r['deadline_misses']:>6} {r['preemptions']:>7} {r['batch_events']:>8}")
    for t in a.traces:
        f, ad = (next(r for r in rows if r["trace"] == t and r["mode"] == m) for m in MODES)
        print(f"{t}: adaptive vs fixed: JCT {100 * (ad['avg_jct_hours'] / f['avg_jct_hours'] - 1):+.1f} %, "
              f"cost {100 * (ad['cost_usd'] / f['cost_usd'] - 1):+.1f} %, GPU-hours {100 * (ad['gpu_hours'] / f['gpu_hours'] - 1):+.1f} %")
    text = json.dumps({"workload": str(Path(a.workload).relative_to(ROOT)) if Path(a.workload).is_relative_to(ROOT) else a.workload,
                       "runs": rows}, sort_keys=True)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
