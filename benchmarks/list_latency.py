"""What the list views cost against how many finished jobs the database holds (issue 21, finding 7).

``tests/test_list_latency.py``'s harness: a real SQLite file with N finished jobs (two instances,
two decisions, three events each, bulk inserted through the store's models) and three live ones;
the real app over HTTP (FastAPI's TestClient) and the real ``Controller.recover`` on the local
cloud. For each view, the SQL statements of one call and the best latency of ``--repeat`` calls.
Target: each view under 200 ms at 10,000 finished jobs (before: ``GET /v1/jobs`` 147 s, ``/ui``
160 s, ``/metrics`` 9.9 s, recovery ~57 s).

    python benchmarks/list_latency.py [--finished 0 1000 10000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

TARGET_MS = 200.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--finished", type=int, nargs="+", default=[0, 1000, 10000])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="spotrain-list-latency-") as tmp:
        os.environ["SPOTRAIN_HOME"] = str(Path(tmp) / "home")
        for var in ("SPOTRAIN_DB_URL", "SPOTRAIN_FLEET_DIR", "SPOTRAIN_CONTROLLER_URL"):
            os.environ.pop(var, None)
        from test_list_latency import controller_with_history, measure

        results: dict[int, dict[str, dict[str, float]]] = {}
        for n in args.finished:
            t0 = time.perf_counter()
            ctl = controller_with_history(Path(tmp) / f"jobs-{n}.db", n)
            fill_s = time.perf_counter() - t0
            costs = measure(ctl, repeat=args.repeat)
            results[n] = {view: {"statements": c.statements, "ms": round(c.ms, 2)} for view, c in costs.items()}
            print(f"{n} finished jobs inserted in {fill_s:.1f} s", file=sys.stderr)
    views = list(next(iter(results.values())))
    width = max(len(v) for v in views)
    print(f"{'view':<{width}}  " + "  ".join(f"{f'{n} finished':>22}" for n in results))
    print(f"{'':<{width}}  " + "  ".join(f"{'statements':>10} {'ms':>11}" for _ in results))
    for view in views:
        cells = "  ".join(f"{results[n][view]['statements']:>10} {results[n][view]['ms']:>11.1f}" for n in results)
        print(f"{view:<{width}}  {cells}")
    worst = max(r["ms"] for n in results for r in results[n].values() if n == max(results))
    ok = worst < TARGET_MS
    print(f"\nslowest view at {max(results)} finished jobs: {worst:.1f} ms (target < {TARGET_MS:.0f} ms): "
          f"{'met' if ok else 'NOT met'}")
    print(json.dumps({"finished": list(results), "target_ms": TARGET_MS, "slowest_ms": worst, "met": ok,
                      "views": {str(n): r for n, r in results.items()}}))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
