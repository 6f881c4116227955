"""Workload replay: the users' fixed batches vs TunedJobs vs adaptive (issue 11 item 6, issue 20
item 5): the same Pollux workload on the same market, through the controller on a virtual clock.

    python benchmarks/workload_adaptive.py [--workload CSV] [--traces gen:0 gen:1 bundled] [--procs 2] [--out FILE.json]

Each of the six models runs with its own published data (``autoscaler/simulator/workload_models.py``:
its throughput profile, noise scale, work and largest validated batch, from Pollux's artifact; none is
simulated with another model's). Each job is elastic (1 GPU up to its gang) and its simulated workers
train at its model's truth and report profile rows and gradient statistics; the controller starts
from a linear prior and learns each job's goodput from the reports (docs/goodput.md "workload
replay"). Three modes, the same deadlines (4x each job's on-demand time at its user's GPUs and batch):

- ``fixed``: the user's batch and GPUs (the workload's ``num_replicas``, ``batch_size``);
- ``tuned``: Pollux's TunedJobs: the batch and GPU count chosen offline for the job's model with the
  truth (``tuned_config``: per GPU count the fastest batch; the fastest count with 50-80 % scaling
  efficiency and JCT under 12 h), batch fixed;
- ``adaptive``: the user's GPUs, the batch picked per allocation by the controller (from the user's
  up to the model's largest validated batch).

The policy is ``spotrain`` with a 6-minute restart overhead, as ``spotrain simulate --workload CSV
--batch-policy P``. Markets: ``gen:S`` is ``generate_trace(MULTI_ZONE, hours=336, seed=S)`` (4 zones
of 1-GPU V100s on two clouds, spot room up to 4 each); ``bundled`` is ``spotrain simulate``'s default
trace (12 offerings, T4 to A100). Reported per market, mode and model, and overall: jobs finished,
average JCT (hours from submission to success), cost, billed GPU-hours, deadline misses. Last line:
JSON with every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoscaler.policy import get_policy  # noqa: E402
from autoscaler.simulator.workload import read_workload, simulate_workload  # noqa: E402
from cloud_providers.local.market import MarketTrace  # noqa: E402
from research.tracegen import MULTI_ZONE, generate_trace  # noqa: E402

WORKLOAD = ROOT / "cost_models" / "data" / "pollux" / "workloads" / "workload-1.csv"
MODES = ("fixed", "tuned", "adaptive")
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
            "per_model": per_model(out["per_job"]),
            "configs": sorted({(j["application"], j["ran_gpus"], j["ran_batch_size"]) for j in out["per_job"]})}


def per_model(per_job: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per model: jobs, finished, average JCT (finished jobs), cost, billed GPU-hours, deadline misses."""
    out: dict[str, dict[str, Any]] = {}
    for a in sorted({j["application"] for j in per_job}):
        js = [j for j in per_job if j["application"] == a]
        done = [j["jct_hours"] for j in js if j["jct_hours"] is not None]
        out[a] = {"jobs": len(js), "finished": len(done), "avg_jct_hours": round(sum(done) / len(done), 4) if done else None,
                  "cost_usd": round(sum(j["cost_usd"] for j in js), 4), "gpu_hours": round(sum(j["gpu_hours"] for j in js), 4),
                  "deadline_misses": sum(1 for j in js if not j["deadline_met"])}
    return out


def _pct(a: float | None, b: float | None) -> str:
    return "" if a is None or not b else f" ({100 * (a / b - 1):+.0f} %)"


def _print(rows: list[dict[str, Any]], traces: list[str]) -> None:
    print(f"{'market':8} {'model':12} {'mode':9} {'done':>7} {'avg JCT h':>16} {'cost $':>16} {'GPU-h':>15} {'misses':>6}")
    for t in traces:
        by = {r["mode"]: r for r in rows if r["trace"] == t}
        models = sorted(by["fixed"]["per_model"])
        for m in [*models, "overall"]:
            for mode in MODES:
                r = by[mode]
                x = r if m == "overall" else r["per_model"][m]
                f = by["fixed"] if m == "overall" else by["fixed"]["per_model"][m]
                jct = ("n/a" if x["avg_jct_hours"] is None
                       else f"{x['avg_jct_hours']:.2f}{_pct(x['avg_jct_hours'], f['avg_jct_hours'])}")
                print(f"{t:8} {m:12} {mode:9} {x['finished']:>3}/{x['jobs']:<3} {jct:>16} "
                      f"{x['cost_usd']:>9.1f}{_pct(x['cost_usd'], f['cost_usd']):>7} "
                      f"{x['gpu_hours']:>8.1f}{_pct(x['gpu_hours'], f['gpu_hours']):>7} "
                      f"{x['deadline_misses']:>6}")
    for t in traces:
        tuned = next(r for r in rows if r["trace"] == t and r["mode"] == "tuned")
        print(f"{t}: tuned configurations (model, GPUs, batch): "
              + ", ".join(f"{a} {g}x{b}" for a, g, b in tuned["configs"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default=str(WORKLOAD))
    ap.add_argument("--traces", nargs="+", default=["gen:0", "gen:1"])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    jobs = [(t, m, a.workload) for t in a.traces for m in MODES]
    done: dict[tuple[str, str, str], dict[str, Any]] = {}
    with ProcessPoolExecutor(max_workers=max(1, a.procs)) as pool:
        futures = {pool.submit(_one, j): j for j in jobs}
        for f in as_completed(futures):
            done[futures[f]] = r = f.result()
            print(f"done: {r['trace']} {r['mode']} in {r['wall_s']} s", file=sys.stderr, flush=True)
            if a.out:  # each run as it ends (a long run's figures survive an interruption)
                with open(a.out + ".partial", "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(r, sort_keys=True) + "\n")
    rows = [done[j] for j in jobs]
    print(f"workload {Path(a.workload).name}; policy spotrain; default deadlines (from the users' configurations); "
          "6-min restart overhead; every model with its own data")
    _print(rows, a.traces)
    workload = Path(a.workload)
    text = json.dumps({"workload": str(workload.relative_to(ROOT)) if workload.is_relative_to(ROOT) else a.workload,
                       "modes": list(MODES), "runs": rows}, sort_keys=True)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
