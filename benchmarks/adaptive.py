"""Adaptive vs fixed batch on a market whose spot capacity changes (issue 11, done-means).

    python benchmarks/adaptive.py [--seeds 0 1 2] [--epochs 6] [--scenario FILE]

For each seed, ``spotrain run examples/adaptive/job.yaml --scenario ...`` twice on the local cloud
(its own ``SPOTRAIN_HOME``): once with ``training.batch_policy=fixed`` (batch 64 throughout, no LR
scaling), once ``adaptive`` (the job's spec: AdaScale). Both train the same amount of scale-invariant
progress (``epochs`` x iterations at batch 64). Reported per run: the final test accuracy, billed
GPU-seconds (market time, spot + on-demand, the accounting's ``spot_seconds + on_demand_seconds``),
cost, wall time, and the job's ``batch`` events (what the controller told each gang, and changes the
workers reported) and the batch / LR-factor lines of rank 0's output. The target metric of a seed is
its fixed run's final accuracy (less 0.01: one test example in 100 of noise); adaptive "reaches" it
when its own final accuracy does. The GPU-seconds are to the end of each run, not to the moment the
target was first reached (the runs end at the same progress; the workers print when they reach
``ADAPTIVE_TARGET``, see the logs). Last line: JSON with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "adaptive" / "job.yaml"
SCENARIO = ROOT / "examples" / "adaptive" / "scenarios" / "capacity.yaml"
TOLERANCE = 0.01


def _spotrain(args: list[str], home: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SPOTRAIN_HOME=home, GLOO_SOCKET_IFNAME="lo")
    return subprocess.run([sys.executable, "-c", "from autoscaler.cli.main import main; main()", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def run_once(policy: str, seed: int, epochs: int, scenario: Path, timeout: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="spotrain-adaptive-") as home:
        sets = [f"training.batch_policy={policy}", f"training.seed={seed}", f"envs.ADAPTIVE_EPOCHS={epochs}"]
        if policy == "fixed":
            sets.append("training.lr_scaling=none")
        args = ["run", str(SPEC), "--scenario", str(scenario), "--json", "--quiet"]
        for s in sets:
            args += ["--set", s]
        done = _spotrain(args, home, timeout)
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            raise SystemExit(f"spotrain run failed ({policy}, seed {seed}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        job = json.loads(lines[-1])
        logs = _spotrain(["logs", job["job_id"]], home, 60).stdout
    # the controller's ``batch`` events and rank 0's own batch changes
    batch_events = [" ".join(ln.split()) for ln in logs.splitlines()
                    if re.match(r"^\S+\s+batch\s", ln) or ln.startswith("[spotrain] batch")][:20]
    worker_lines = [ln for ln in logs.splitlines() if "lr x" in ln or "batch " in ln and "->" in ln]
    batches = sorted({int(m) for ln in worker_lines for m in re.findall(r"batch\s+(\d+)\s", ln)})
    lrs = sorted({float(m) for ln in worker_lines for m in re.findall(r"lr x([0-9.]+)", ln)})
    gpu_s = float(job.get("spot_seconds") or 0.0) + float(job.get("on_demand_seconds") or 0.0)
    return {"policy": policy, "seed": seed, "state": job["state"], "metric": job.get("metric"),
            "gpu_seconds": round(gpu_s, 1), "cost_usd": job.get("cost_usd"), "wall_s": round(job.get("wall_s", 0.0), 1),
            "attempts": job.get("attempts"), "steps": job.get("step"), "batches_trained": batches,
            "lr_factors": [lrs[0], lrs[-1]] if lrs else [], "batch_events": batch_events}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--scenario", type=Path, default=SCENARIO)
    ap.add_argument("--timeout-s", type=float, default=600.0)
    a = ap.parse_args()
    runs = [run_once(p, s, a.epochs, a.scenario, a.timeout_s) for s in a.seeds for p in ("fixed", "adaptive")]
    print(f"{'seed':>4} {'policy':>9} {'state':>10} {'accuracy':>9} {'GPU-s':>8} {'cost $':>8} {'wall s':>7} "
          f"{'steps':>6}  batches / LR factor")
    for r in runs:
        print(f"{r['seed']:>4} {r['policy']:>9} {r['state']:>10} {r['metric'] or 0:>9.4f} {r['gpu_seconds']:>8.0f} "
              f"{r['cost_usd'] or 0:>8.4f} {r['wall_s']:>7.1f} {r['steps'] or 0:>6}  {r['batches_trained']} / "
              f"{r['lr_factors']}")
    verdicts = []
    for s in a.seeds:
        fixed, adaptive = (next(r for r in runs if r["seed"] == s and r["policy"] == p) for p in ("fixed", "adaptive"))
        target = float(fixed["metric"] or 0.0) - TOLERANCE
        reached = float(adaptive["metric"] or 0.0) >= target
        fewer = float(adaptive["gpu_seconds"]) <= float(fixed["gpu_seconds"])  # type: ignore[arg-type]
        verdicts.append({"seed": s, "target": round(target, 4), "adaptive_reached": reached,
                         "adaptive_gpu_s_le_fixed": fewer})
        print(f"seed {s}: target {target:.4f}; adaptive reached it: {reached}; GPU-seconds adaptive <= fixed: {fewer}")
    med = {p: statistics.median(float(r["gpu_seconds"]) for r in runs if r["policy"] == p)  # type: ignore[arg-type]
           for p in ("fixed", "adaptive")}
    print(f"median billed GPU-seconds: fixed {med['fixed']:.0f}, adaptive {med['adaptive']:.0f}")
    print(json.dumps({"benchmark": "adaptive", "epochs": a.epochs, "scenario": str(a.scenario), "runs": runs,
                      "verdicts": verdicts, "median_gpu_seconds": med}))


if __name__ == "__main__":
    main()
