"""What a reconcile tick costs against how many finished jobs the database holds (issue 14, finding 5).

The real controller on the virtual clock (``tests/test_tick_cost.py``'s harness: LocalProvider,
SimulatedExecutor, a SQLite file) with N finished jobs (two instances, two decisions, three events
each) and one live job running on spot; ten ticks (one sweep period) are measured. Prints a table
(SQL statements, ORM rows loaded, SQLite VM instructions and milliseconds per tick) and writes JSON.

    python benchmarks/tick_cost.py [--finished 0 1000 10000] [--out tick_cost.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from test_tick_cost import TICKS, measure, world_with_history  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--finished", type=int, nargs="+", default=[0, 1000, 10000])
    ap.add_argument("--ticks", type=int, default=TICKS)
    ap.add_argument("--out", type=Path, default=Path("tick_cost.json"))
    args = ap.parse_args(argv)
    results = []
    print(f"{'finished jobs':>13}  {'statements/tick':>15}  {'rows/tick':>9}  {'VM steps/tick':>13}  {'ms/tick':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.finished:
            t0 = time.perf_counter()
            w, _ = world_with_history(Path(tmp) / f"state-{n}.db", n)
            setup_s = time.perf_counter() - t0
            per = measure(w, args.ticks).per_tick(args.ticks)
            results.append({"finished_jobs": n, "ticks": args.ticks, "setup_s": round(setup_s, 3), **per})
            print(f"{n:>13}  {per['statements']:>15.1f}  {per['rows']:>9.1f}  {per['vm_steps']:>13.0f}  "
                  f"{per['ms']:>8.2f}")
    args.out.write_text(json.dumps({"benchmark": "tick_cost", "results": results}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
