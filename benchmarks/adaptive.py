"""Adaptive batch vs the user's fixed batch and the best fixed batch a sweep finds (issue 20, item 3).

    python benchmarks/adaptive.py [--seeds 0 1 2] [--sweep-seed 3] [--quick] [--scenario FILE]

Pollux's baselines were given ideal configurations; so is this one. Three configurations of the same
job (``examples/adaptive/job.yaml``: an MLP on a noisy teacher task, SGD with momentum) train to the
same target test accuracy on the same market scenario and seeds:

(a) ``fixed_user``: the spec as the user wrote it, run with ``batch_policy=fixed`` and no LR scaling:
    batch 64 at LR 0.1 (the LR the spec says it is tuned for).
(b) ``fixed_best``: the best fixed configuration of a sweep of batch x LR. The grid is the user's
    batch 64 at LR 0.1 plus batches ``--sweep-batches`` (default 128 256 512 1024), each at the LR
    that the usual rules give from that base: unscaled (0.1), square-root (0.1 x sqrt(B/64)) and
    linear (0.1 x B/64) - 13 runs. Each sweep run trains on ``--sweep-seed`` (not an evaluation
    seed); the best is the one that reached the target with the fewest billed GPU-seconds (none
    reached it: the highest accuracy). Its GPU-seconds and dollars are reported as
    ``sweep_gpu_seconds`` / ``sweep_usd``: what (b) costs before its first real run.
(c) ``adaptive``: the spec as written (``batch_policy: adaptive``, AdaScale), no tuning.

Each run is ``spotrain run examples/adaptive/job.yaml --scenario ... --json`` on the local cloud in
its own ``SPOTRAIN_HOME``; the job ends when its test accuracy (checked 4 times an epoch at equal
scale-invariant progress) reaches the target (``ADAPTIVE_STOP_AT_TARGET=1``), or at the end of its
schedule (cosine over ``--epochs`` epochs), which caps a run that never gets there. Its billed
GPU-seconds are the accounting's ``spot_seconds + on_demand_seconds`` (market time: one real second
is a market minute on the local cloud, so 60 GPU-seconds per instance per real second) and its
dollars the job's ``cost_usd``. A run "reached" the target when its last accuracy is at least
``--target``; one that did not is shown with the GPU-seconds it spent (a lower bound).

The scenario (``scenarios/market.yaml``) is timed at real seconds since the local cloud started, so
every run sees the same market whatever it does: room for 2 spot workers, one taken back at 15 s
(room for 1), room for 4 from 25 s. The table lists each run's workers per attempt (from its
events) so that one sees the market played a part, and its ``batch`` events with their sources.
Runs are interleaved per seed (user, best, adaptive for seed s, then the next seed) so that the
machine's load drifts over all three alike; ``os.getloadavg()`` is recorded before and after each.
The sweep runs first (the best configuration must be known before the evaluation). Last line: JSON.
On a 2-core machine at load average 11-18 the full benchmark (22 runs) took 25 minutes, ``--quick``
(8 runs) 9; the bill follows wall time, so one configuration on one seed billed 6,048 and 9,406
GPU-seconds in two runs of the benchmark (same steps, same accuracy): compare ratios, not figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "adaptive" / "job.yaml"
SCENARIO = ROOT / "examples" / "adaptive" / "scenarios" / "market.yaml"
TARGET = 0.80  # test accuracy
EPOCHS = 3
# 8x the example's default, so that training, not the gangs' start-ups and restarts, decides the
# GPU-seconds (large batches overfit the small default set).
TRAIN_EXAMPLES = 131072
EVALS_PER_EPOCH = 4
USER_BATCH, USER_LR = 64, 0.1  # examples/adaptive/job.yaml's global_batch_size, train.py's default LR
SWEEP_BATCHES = (128, 256, 512, 1024)
RULES = {"none": 0.0, "sqrt": 0.5, "linear": 1.0}  # LR = base LR x (B / base batch) ** exponent
SWEEP_SEED = 3
QUICK_BATCHES, QUICK_RULES = (256, 512), ("none", "sqrt")
POLICIES = ("fixed_user", "fixed_best", "adaptive")


@dataclass(frozen=True)
class FixedConfig:
    """A fixed batch and learning rate, and the rule that scaled the LR from the user's base."""
    batch: int
    lr: float
    rule: str

    @property
    def label(self) -> str:
        return f"B={self.batch} lr={self.lr:g} ({self.rule})"


def scaled_lr(base_lr: float, base_batch: int, batch: int, rule: str) -> float:
    """The LR a rule gives at ``batch`` from ``base_lr`` at ``base_batch`` (Goyal et al.'s linear rule,
    Krizhevsky's square-root rule, or none)."""
    if rule not in RULES:
        raise ValueError(f"LR rule {rule!r}: one of {', '.join(RULES)}")
    return round(base_lr * (batch / base_batch) ** RULES[rule], 6)


def sweep_grid(base_batch: int, base_lr: float, batches: Sequence[int], rules: Sequence[str]) -> list[FixedConfig]:
    """The user's configuration, then every batch at every rule's LR; a (batch, LR) pair once."""
    grid = [FixedConfig(base_batch, base_lr, "user")]
    for b in batches:
        for r in rules:
            c = FixedConfig(b, scaled_lr(base_lr, base_batch, b, r), r)
            if all((g.batch, g.lr) != (c.batch, c.lr) for g in grid):
                grid.append(c)
    return grid


def select_best(runs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The sweep run that reached the target with the fewest billed GPU-seconds; when none reached
    it, the one with the highest accuracy (fewest GPU-seconds on a tie)."""
    if not runs:
        raise ValueError("an empty sweep has no best configuration")
    reached = [r for r in runs if r["reached_target"]]
    if reached:
        return min(reached, key=lambda r: (r["gpu_seconds"], r["batch"], r["lr"]))
    return min(runs, key=lambda r: (-(r["metric"] or 0.0), r["gpu_seconds"], r["batch"], r["lr"]))


def summarize(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-seed lists (in seed order) and totals of one policy's runs."""
    runs = sorted(runs, key=lambda r: r["seed"])
    gpu_s = [float(r["gpu_seconds"]) for r in runs]
    usd = [float(r["usd"]) for r in runs]
    return {"seeds": [r["seed"] for r in runs], "gpu_seconds": gpu_s, "usd": usd,
            "reached_target": [bool(r["reached_target"]) for r in runs], "steps": [r["steps"] for r in runs],
            "metric": [r["metric"] for r in runs], "max_workers": [r["max_workers"] for r in runs],
            "gpu_seconds_total": round(sum(gpu_s), 1), "usd_total": round(sum(usd), 6),
            "gpu_seconds_median": statistics.median(gpu_s) if gpu_s else None,
            "reached_all": bool(runs) and all(r["reached_target"] for r in runs)}


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b > 0 else None


def ratios(summary: Mapping[str, Mapping[str, Any]], sweep_gpu_seconds: float) -> dict[str, Any]:
    """Adaptive over each baseline: of the totals over seeds and per seed; and over the best fixed
    configuration with the sweep that found it counted in (what (b) costs a user who must sweep)."""
    ad, user, best = summary["adaptive"], summary["fixed_user"], summary["fixed_best"]
    return {
        "adaptive_over_user": _ratio(ad["gpu_seconds_total"], user["gpu_seconds_total"]),
        "adaptive_over_best": _ratio(ad["gpu_seconds_total"], best["gpu_seconds_total"]),
        "adaptive_over_user_usd": _ratio(ad["usd_total"], user["usd_total"]),
        "adaptive_over_best_usd": _ratio(ad["usd_total"], best["usd_total"]),
        "adaptive_over_user_per_seed": [_ratio(a, u) for a, u in zip(ad["gpu_seconds"], user["gpu_seconds"])],
        "adaptive_over_best_per_seed": [_ratio(a, b) for a, b in zip(ad["gpu_seconds"], best["gpu_seconds"])],
        "adaptive_over_best_plus_sweep": _ratio(ad["gpu_seconds_total"], best["gpu_seconds_total"] + sweep_gpu_seconds),
    }


def _attempt_workers(logs: str) -> list[int]:
    """Workers of each attempt, in order, from the job's ``attempt N: K worker(s)`` events."""
    return [int(m) for m in re.findall(r"attempt \d+: (\d+) worker\(s\)", logs)]


def _batch_events(logs: str) -> list[str]:
    """The job's ``batch`` events (``spotrain logs`` lines whose kind is ``batch``)."""
    return [" ".join(ln.split()[1:]) for ln in logs.splitlines() if re.match(r"^\d\d:\d\d:\d\d\s+batch\s", ln)]


def _spotrain(args: list[str], home: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SPOTRAIN_HOME=home, GLOO_SOCKET_IFNAME="lo")
    return subprocess.run([sys.executable, "-m", "autoscaler.cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=timeout_s, cwd=ROOT)


def run_once(policy: str, config: FixedConfig | None, seed: int, a: argparse.Namespace) -> dict[str, Any]:
    """One ``spotrain run`` of the example to the target: fixed at ``config``, or adaptive (None)."""
    sets = [f"training.seed={seed}", f"envs.ADAPTIVE_EPOCHS={a.epochs}", f"envs.ADAPTIVE_TARGET={a.target}",
            "envs.ADAPTIVE_STOP_AT_TARGET=1", f"envs.ADAPTIVE_TRAIN_EXAMPLES={a.train_examples}",
            f"envs.ADAPTIVE_EVALS_PER_EPOCH={a.evals_per_epoch}"]
    if config is None:
        sets += ["training.batch_policy=adaptive", f"envs.ADAPTIVE_LR={USER_LR}"]
    else:
        sets += ["training.batch_policy=fixed", "training.lr_scaling=none", f"training.global_batch_size={config.batch}",
                 f"envs.ADAPTIVE_LR={config.lr}"]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="spotrain-adaptive-") as home:
        args = ["run", str(SPEC), "--scenario", str(a.scenario), "--json", "--quiet"]
        for s in sets:
            args += ["--set", s]
        done = _spotrain(args, home, a.timeout_s)
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            raise SystemExit(f"spotrain run failed ({policy}, seed {seed}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        job = json.loads(lines[-1])
        logs = _spotrain(["logs", job["job_id"]], home, 60).stdout
    workers = _attempt_workers(logs)
    batch_events = _batch_events(logs)
    metric = job.get("metric")
    gpu_s = float(job.get("spot_seconds") or 0.0) + float(job.get("on_demand_seconds") or 0.0)
    worker_lines = [ln for ln in logs.splitlines() if re.match(r"^(epoch|eval)\s", ln)]
    return {"policy": policy, "seed": seed, "batch": config.batch if config else USER_BATCH,
            "lr": config.lr if config else USER_LR, "rule": config.rule if config else "adascale",
            "state": job["state"], "metric": metric, "reached_target": metric is not None and float(metric) >= a.target,
            "gpu_seconds": round(gpu_s, 1), "usd": round(float(job.get("cost_usd") or 0.0), 6),
            "wall_s": round(float(job.get("wall_s") or 0.0), 1), "steps": job.get("step"),
            "preemptions": job.get("preemptions"), "attempt_workers": workers, "max_workers": max(workers, default=0),
            "batches_trained": sorted({int(b) for ln in worker_lines for b in re.findall(r"batch\s+(\d+)\s", ln)}),
            "batch_events": batch_events[:20], "batch_event_count": len(batch_events),
            "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()]}


def _row(r: Mapping[str, Any]) -> str:
    return (f"{r['seed']:>4} {r['policy']:>10} {r['batch']:>5} {r['lr']:>7g} {r['rule']:>8} {r['state']:>9} "
            f"{r['metric'] or 0:>8.4f} {'yes' if r['reached_target'] else 'NO':>7} {r['gpu_seconds']:>7.0f} "
            f"{r['usd']:>7.4f} {r['wall_s']:>6.1f} {r['steps'] or 0:>6} {str(r['attempt_workers']):>10} "
            f"{r['batches_trained'][:1] + r['batches_trained'][-1:] if r['batches_trained'] else []} "
            f"load {r['load_before'][0]:.1f}")


HEADER = (f"{'seed':>4} {'policy':>10} {'batch':>5} {'lr':>7} {'rule':>8} {'state':>9} {'accuracy':>8} {'reached':>7} "
          f"{'GPU-s':>7} {'cost $':>7} {'wall s':>6} {'steps':>6} {'workers':>10} batches(min,max)")


def _print(line: str) -> None:
    print(line, flush=True)  # a long run's rows show as they come


def evaluate(a: argparse.Namespace, run: Callable[[str, FixedConfig | None, int, argparse.Namespace], dict[str, Any]],
             log: Callable[[str], None] = _print) -> dict[str, Any]:
    """The sweep on the sweep seed, then (a), (b), (c) interleaved per evaluation seed; every figure."""
    load_start = os.getloadavg()
    t0 = time.monotonic()
    grid = sweep_grid(USER_BATCH, USER_LR, a.sweep_batches, a.sweep_rules)
    log(f"sweep on seed {a.sweep_seed}: {len(grid)} fixed configurations; target test accuracy {a.target}")
    log(HEADER)
    sweep = []
    for c in grid:
        sweep.append(run("sweep", c, a.sweep_seed, a))
        log(_row(sweep[-1]))
    pick = select_best(sweep)
    best = next(c for c in grid if (c.batch, c.lr) == (pick["batch"], pick["lr"]))
    user = grid[0]
    log(f"best fixed configuration (seed {a.sweep_seed}): {best.label}, {pick['gpu_seconds']:.0f} GPU-s, "
        f"reached: {pick['reached_target']}")
    log("")
    log(f"evaluation, seeds {' '.join(map(str, a.seeds))} (user, best, adaptive per seed)")
    log(HEADER)
    runs: list[dict[str, Any]] = []
    for s in a.seeds:
        for policy, config in (("fixed_user", user), ("fixed_best", best), ("adaptive", None)):
            runs.append(run(policy, config, s, a))
            log(_row(runs[-1]))
    summary = {p: summarize([r for r in runs if r["policy"] == p]) for p in POLICIES}
    sweep_gpu_s = round(sum(float(r["gpu_seconds"]) for r in sweep), 1)
    sweep_usd = round(sum(float(r["usd"]) for r in sweep), 6)
    rat = ratios(summary, sweep_gpu_s)
    return {"summary": summary, "ratios": rat, "sweep_runs": sweep, "runs": runs, "best": asdict(best), "user": asdict(user),
            "sweep_gpu_seconds": sweep_gpu_s, "sweep_usd": sweep_usd, "wall_s": round(time.monotonic() - t0, 1),
            "load_start": [round(x, 2) for x in load_start], "load_end": [round(x, 2) for x in os.getloadavg()]}


def report(a: argparse.Namespace, res: Mapping[str, Any], log: Callable[[str], None] = _print) -> dict[str, Any]:
    """The summary table and the last line's JSON object."""
    summary, rat = res["summary"], res["ratios"]
    labels = {"fixed_user": f"(a) user {FixedConfig(**res['user']).label}",
              "fixed_best": f"(b) best {FixedConfig(**res['best']).label}", "adaptive": "(c) adaptive (AdaScale)"}
    log("")
    log(f"{'configuration':<36} {'GPU-s per seed':>24} {'total':>8} {'$ total':>8} reached")
    for p in POLICIES:
        s = summary[p]
        log(f"{labels[p]:<36} {' / '.join(f'{g:.0f}' for g in s['gpu_seconds']):>24} {s['gpu_seconds_total']:>8.0f} "
            f"{s['usd_total']:>8.4f} {sum(s['reached_target'])}/{len(s['reached_target'])}")
    log(f"sweep ({len(res['sweep_runs'])} runs, seed {a.sweep_seed}): {res['sweep_gpu_seconds']:.0f} GPU-s, "
        f"${res['sweep_usd']:.4f}")
    log(f"adaptive / user {rat['adaptive_over_user']} (per seed {rat['adaptive_over_user_per_seed']}); "
        f"adaptive / best {rat['adaptive_over_best']} (per seed {rat['adaptive_over_best_per_seed']}); "
        f"adaptive / (best + sweep) {rat['adaptive_over_best_plus_sweep']}")
    log(f"load average (1 min) at start {res['load_start'][0]}, at end {res['load_end'][0]} on {os.cpu_count()} CPUs; "
        f"wall {res['wall_s']:.0f} s")
    out: dict[str, Any] = {"benchmark": "adaptive", "target": a.target, "epochs": a.epochs,
                           "train_examples": a.train_examples, "scenario": str(a.scenario), "seeds": a.seeds,
                           "sweep_seed": a.sweep_seed, "quick": a.quick}
    for p in POLICIES:
        out[p] = {"label": labels[p], **summary[p], "runs": [r for r in res["runs"] if r["policy"] == p]}
    out.update({"sweep_gpu_seconds": res["sweep_gpu_seconds"], "sweep_usd": res["sweep_usd"],
                "sweep": {"batches": list(a.sweep_batches), "rules": list(a.sweep_rules), "runs": res["sweep_runs"],
                          "best": res["best"]},
                "ratios": rat, "load_start": res["load_start"], "load_end": res["load_end"], "cpus": os.cpu_count(),
                "wall_s": res["wall_s"]})
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="evaluation seeds (default 0 1 2; --quick: 0)")
    ap.add_argument("--sweep-seed", type=int, default=SWEEP_SEED, help="the seed the sweep picks on (not an evaluation seed)")
    ap.add_argument("--sweep-batches", type=int, nargs="+", default=None, help=f"default {' '.join(map(str, SWEEP_BATCHES))}")
    ap.add_argument("--sweep-rules", nargs="+", default=None, help=f"LR rules from the user's LR: {', '.join(RULES)}")
    ap.add_argument("--quick", action="store_true", help="smoke test: 2 batches x 2 rules, seed 0")
    ap.add_argument("--target", type=float, default=TARGET)
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    ap.add_argument("--train-examples", type=int, default=TRAIN_EXAMPLES)
    ap.add_argument("--evals-per-epoch", type=int, default=EVALS_PER_EPOCH)
    ap.add_argument("--scenario", type=Path, default=SCENARIO)
    ap.add_argument("--timeout-s", type=float, default=900.0, help="per run")
    a = ap.parse_args(argv)
    a.seeds = a.seeds if a.seeds is not None else ([0] if a.quick else [0, 1, 2])
    a.sweep_batches = tuple(a.sweep_batches or (QUICK_BATCHES if a.quick else SWEEP_BATCHES))
    a.sweep_rules = tuple(a.sweep_rules or (QUICK_RULES if a.quick else tuple(RULES)))
    if a.sweep_seed in a.seeds:
        ap.error(f"--sweep-seed {a.sweep_seed}: must not be an evaluation seed ({' '.join(map(str, a.seeds))})")
    if bad := [r for r in a.sweep_rules if r not in RULES]:
        ap.error(f"--sweep-rules {bad[0]}: one of {', '.join(RULES)}")
    if bad_b := [b for b in a.sweep_batches if b < 1]:
        ap.error(f"--sweep-batches {bad_b[0]}: must be a positive batch size")
    if not (0.0 < a.target <= 1.0) or math.isnan(a.target):
        ap.error(f"--target {a.target}: a test accuracy in (0, 1]")
    return a


def main(argv: Sequence[str] | None = None) -> None:
    a = parse_args(argv)
    res = evaluate(a, run_once)
    print(json.dumps(report(a, res)))


if __name__ == "__main__":
    main()
