"""How well ``spotrain estimate`` predicts what the local cloud charges for the Quickstart (issue 24, item 6).

In a throw-away SPOTRAIN_HOME, ``--n`` runs of the Quickstart (``spotrain run``, ``--epochs`` of its
60, each a fresh process as a user starts it). Before each run, ``spotrain estimate`` predicts it
from the runs measured so far (the first one uncalibrated: the spec's ``simulate.work_gpu_hours``
guess); after it, the same estimate with that run measured too (the model reproducing a run it has
seen: start-up, restart, release and billing all counted). The table gives each run's cost, the
range estimated before it and after it, and by how much a range missed (0 when inside).

    python benchmarks/estimate_accuracy.py [--n 3] [--epochs 20] [--starts 20] [--json out.json]

The last line is one JSON object: the costs, the ranges, how many runs each kind of range held, and
the largest miss in percent of the run's cost.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "examples" / "quickstart" / "job.yaml"


def cli(home: Path, *args: str, env: dict[str, str] | None = None, timeout_s: float = 600) -> dict[str, Any]:
    """``spotrain ARGS --json`` in ``home``: its last JSON line."""
    full_env = {**os.environ, "SPOTRAIN_HOME": str(home), "GLOO_SOCKET_IFNAME": "lo", **(env or {})}
    full_env.pop("SPOTRAIN_CONTROLLER_URL", None)
    full_env.pop("SPOTRAIN_DB_URL", None)
    r = subprocess.run([sys.executable, "-m", "autoscaler.cli.main", *args, "--json"], env=full_env, cwd=REPO,
                       capture_output=True, text=True, timeout=timeout_s)
    if r.returncode != 0:
        raise SystemExit(f"spotrain {' '.join(args)} failed ({r.returncode}): {r.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def miss_pct(cost: float, rng: dict[str, float]) -> float:
    """How far ``cost`` fell outside ``rng``, in percent of ``cost`` (negative: below it; 0: inside)."""
    if cost < rng["low"]:
        return -100.0 * (rng["low"] - cost) / cost
    if cost > rng["high"]:
        return 100.0 * (cost - rng["high"]) / cost
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=3, help="Quickstart runs")
    ap.add_argument("--epochs", type=int, default=20, help="QUICKSTART_EPOCHS of each run (the Quickstart: 60)")
    ap.add_argument("--starts", type=int, default=20, help="simulated market start times per estimate")
    ap.add_argument("--json", dest="json_path", default=None)
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="spotrain-estimate-bench-") as tmp:
        home = Path(tmp)
        for i in range(args.n):
            before = cli(home, "estimate", str(QUICKSTART), "--runs", str(args.starts))
            t0 = time.time()
            job = cli(home, "run", str(QUICKSTART), env={"QUICKSTART_EPOCHS": str(args.epochs)})
            wall_s = time.time() - t0
            after = cli(home, "estimate", str(QUICKSTART), "--runs", str(args.starts))
            cost = float(job["cost_usd"])
            calibrated_with = len((before["calibration"] or {}).get("job_ids", []))
            rows.append({"run": i + 1, "state": job["state"], "wall_s": round(wall_s, 1), "cost_usd": cost,
                         "preemptions": job["preemptions"], "calibrated_with": calibrated_with,
                         "before": before["range_usd"], "before_median": before["cost_usd"]["median"],
                         "before_miss_pct": miss_pct(cost, before["range_usd"]),
                         "after": after["range_usd"], "after_miss_pct": miss_pct(cost, after["range_usd"])})
    print(f"Quickstart ({args.epochs} epochs) on the local cloud, {args.n} runs; estimate with {args.starts} market starts")
    print(f"{'run':>3} {'wall s':>7} {'cost':>8} {'pre':>4} {'calib':>5} {'range before run':>18} {'miss':>7} "
          f"{'range after run':>18} {'miss':>7}")
    for r in rows:
        b, a = r["before"], r["after"]
        print(f"{r['run']:>3} {r['wall_s']:>7.1f} ${r['cost_usd']:>7.4f} {r['preemptions']:>4} {r['calibrated_with']:>5} "
              f"{'$%.4f-%.4f' % (b['low'], b['high']):>18} {r['before_miss_pct']:>6.1f}% "
              f"{'$%.4f-%.4f' % (a['low'], a['high']):>18} {r['after_miss_pct']:>6.1f}%")
    predicted = [r for r in rows if r["calibrated_with"] > 0]
    summary = {
        "runs": args.n, "epochs": args.epochs, "starts": args.starts,
        "cost_usd": [r["cost_usd"] for r in rows],
        "range_before_usd": [r["before"] for r in rows], "range_after_usd": [r["after"] for r in rows],
        "uncalibrated_hits": sum(r["before_miss_pct"] == 0 for r in rows if r["calibrated_with"] == 0),
        "predicted_hits": sum(r["before_miss_pct"] == 0 for r in predicted), "predicted": len(predicted),
        "predicted_max_miss_pct": max((abs(r["before_miss_pct"]) for r in predicted), default=None),
        "reproduced_hits": sum(r["after_miss_pct"] == 0 for r in rows),
        "reproduced_max_miss_pct": max(abs(r["after_miss_pct"]) for r in rows) if rows else None,
    }
    print(f"calibrated predictions inside the range: {summary['predicted_hits']} of {summary['predicted']} "
          f"(largest miss {summary['predicted_max_miss_pct']}%); each run inside the range made with it measured: "
          f"{summary['reproduced_hits']} of {args.n}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"rows": rows, **summary}, indent=1))
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
