"""Adaptive vs fixed batch on a market whose spot capacity changes (issue 11, done-means).

    python benchmarks/adaptive.py [--seeds 0 1 2] [--target 0.76] [--epochs 8] [--scenario FILE]

Time to target, as Pollux measures its jobs: for each seed, ``spotrain run examples/adaptive/job.yaml
--scenario ...`` twice on the local cloud (its own ``SPOTRAIN_HOME``), once with
``training.batch_policy=fixed`` (batch 64 throughout, no LR scaling) and once ``adaptive`` (the job's
spec: AdaScale). Both runs train ``--train-examples`` examples toward the same target test accuracy,
checked ``--evals-per-epoch`` times per epoch at equal scale-invariant progress, and end when they reach
it (``ADAPTIVE_STOP_AT_TARGET=1``: the script calls ``trainer.end_early()``), with the same schedule
(cosine over ``epochs`` x iterations at batch 64, which also caps a run that never gets there), on the
same market (the scenario's events are at real seconds since the local cloud started). So the
billed GPU-seconds of a run (market time, spot + on-demand, the accounting's ``spot_seconds +
on_demand_seconds``) are the GPU-seconds it took to reach the target. The target is the fixed-batch
run's: a run "reaches" it when its last reported accuracy is at least ``--target``. Reported per run:
that accuracy, billed GPU-seconds, cost, wall time, epochs trained, the job's ``batch`` events (what
the controller told each gang, and changes the workers reported) and the batch / LR-factor lines of
rank 0's output. Last line: JSON with every figure.
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
TARGET = 0.80  # test accuracy; the fixed-batch run reaches it within its schedule on every seed
EPOCHS = 3
# 8x the example's default, so that training, not the gangs' start-ups and restarts, decides the
# GPU-seconds (on 16,384 examples a run trains for 5 s between 8 s of process starts, and large
# batches overfit the small set).
TRAIN_EXAMPLES = 131072
EVALS_PER_EPOCH = 4  # the target is checked every quarter epoch (scale-invariant), for both policies


def _spotrain(args: list[str], home: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SPOTRAIN_HOME=home, GLOO_SOCKET_IFNAME="lo")
    return subprocess.run([sys.executable, "-c", "from autoscaler.cli.main import main; main()", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def run_once(policy: str, seed: int, a: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="spotrain-adaptive-") as home:
        sets = [f"training.batch_policy={policy}", f"training.seed={seed}", f"envs.ADAPTIVE_EPOCHS={a.epochs}",
                f"envs.ADAPTIVE_TARGET={a.target}", "envs.ADAPTIVE_STOP_AT_TARGET=1",
                f"envs.ADAPTIVE_TRAIN_EXAMPLES={a.train_examples}", f"envs.ADAPTIVE_EVALS_PER_EPOCH={a.evals_per_epoch}"]
        if policy == "fixed":
            sets.append("training.lr_scaling=none")
        args = ["run", str(SPEC), "--scenario", str(a.scenario), "--json", "--quiet"]
        for s in sets:
            args += ["--set", s]
        done = _spotrain(args, home, a.timeout_s)
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
    epochs_trained = max((float(m) for ln in logs.splitlines() for m in re.findall(r"^(?:epoch|eval)\s+([0-9.]+)\s", ln)),
                         default=0.0)
    gpu_s = float(job.get("spot_seconds") or 0.0) + float(job.get("on_demand_seconds") or 0.0)
    return {"policy": policy, "seed": seed, "state": job["state"], "metric": job.get("metric"),
            "gpu_seconds": round(gpu_s, 1), "cost_usd": job.get("cost_usd"), "wall_s": round(job.get("wall_s", 0.0), 1),
            "attempts": job.get("attempts"), "steps": job.get("step"), "epochs": epochs_trained, "batches_trained": batches,
            "lr_factors": [lrs[0], lrs[-1]] if lrs else [], "batch_events": batch_events}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--target", type=float, default=TARGET)
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    ap.add_argument("--train-examples", type=int, default=TRAIN_EXAMPLES)
    ap.add_argument("--evals-per-epoch", type=int, default=EVALS_PER_EPOCH)
    ap.add_argument("--scenario", type=Path, default=SCENARIO)
    ap.add_argument("--timeout-s", type=float, default=600.0)
    a = ap.parse_args()
    runs = [run_once(p, s, a) for s in a.seeds for p in ("fixed", "adaptive")]
    print(f"target test accuracy {a.target}, schedule {a.epochs} epochs of {a.train_examples} examples; "
          "each run ends when it reaches the target")
    print(f"{'seed':>4} {'policy':>9} {'state':>10} {'accuracy':>9} {'GPU-s':>8} {'cost $':>8} {'wall s':>7} "
          f"{'epochs':>6} {'steps':>6}  batches / LR factor")
    for r in runs:
        print(f"{r['seed']:>4} {r['policy']:>9} {r['state']:>10} {r['metric'] or 0:>9.4f} {r['gpu_seconds']:>8.0f} "
              f"{r['cost_usd'] or 0:>8.4f} {r['wall_s']:>7.1f} {r['epochs']:>6.2f} {r['steps'] or 0:>6}  "
              f"{r['batches_trained']} / {r['lr_factors']}")
    verdicts = []
    for s in a.seeds:
        fixed, adaptive = (next(r for r in runs if r["seed"] == s and r["policy"] == p) for p in ("fixed", "adaptive"))
        fixed_reached = float(fixed["metric"] or 0.0) >= a.target
        reached = float(adaptive["metric"] or 0.0) >= a.target
        fewer = float(adaptive["gpu_seconds"]) <= float(fixed["gpu_seconds"])  # type: ignore[arg-type]
        verdicts.append({"seed": s, "target": a.target, "fixed_reached": fixed_reached, "adaptive_reached": reached,
                         "adaptive_gpu_s_le_fixed": fewer})
        print(f"seed {s}: fixed reached {a.target}: {fixed_reached}; adaptive reached it: {reached}; "
              f"GPU-seconds to it, adaptive <= fixed: {fewer}")
    med = {p: statistics.median(float(r["gpu_seconds"]) for r in runs if r["policy"] == p)  # type: ignore[arg-type]
           for p in ("fixed", "adaptive")}
    print(f"median billed GPU-seconds: fixed {med['fixed']:.0f}, adaptive {med['adaptive']:.0f}")
    print(json.dumps({"benchmark": "adaptive", "target": a.target, "epochs": a.epochs, "train_examples": a.train_examples,
                      "scenario": str(a.scenario), "runs": runs,
                      "verdicts": verdicts, "median_gpu_seconds": med}))


if __name__ == "__main__":
    main()
