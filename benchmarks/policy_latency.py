"""Decision time of the spotrain policy for 10, 100 and 1,000 jobs over 100 offerings.

Each job may use one of four accelerator types, 1-4 workers, half with a deadline; offerings span
five regions, two markets each. Every job is in a different state (progress, spend), so the policy
plans each one separately (jobs in identical states share one plan; that case is faster still).
Reports the median of 5 decisions (``--quick``: 1). Last line: JSON.

    python benchmarks/policy_latency.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoscaler.jobs.spec import spec_from_dict  # noqa: E402
from autoscaler.policy import JobView, MarketHistory, PolicyInput  # noqa: E402
from autoscaler.policy.spotrain import SpotrainPolicy  # noqa: E402
from cloud_providers.base import Offering  # noqa: E402


def offerings(n: int) -> list[Offering]:
    accs = ["T4", "V100", "A10G", "L4"]
    return [Offering("aws", f"r{i % 5}", f"r{i % 5}-z{i}", f"type-{i}", accs[i % 4], 1, 1.0 + i % 7, 0.3 + (i % 11) / 20,
                     spot_available=i % 6) for i in range(n)]


def jobs(n: int) -> list[JobView]:
    specs = []
    for a in ("T4:1", "V100:1", "A10G:1", "L4:1"):
        for deadline in (None, "30h"):
            specs.append(spec_from_dict({"name": "j", "run": "x", "resources": {"accelerators": [a], "clouds": ["aws"]},
                                         "workers": {"min": 1, "max": 4}, "training": {"logical_workers": 4},
                                         "objective": {"deadline": deadline} if deadline else {},
                                         "simulate": {"work_gpu_hours": 10}}))
    # Every job in its own state (distinct progress and spend): no two plans can be shared.
    return [JobView(f"j{i}", specs[i % len(specs)], submitted_s=0, progress=(i % n) / n, cost_so_far_usd=i * 0.01)
            for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    offers = offerings(100)
    history = {o.key: MarketHistory(o.key, watched_s=86400, available_s_at_least=(43200.0, 20000.0), drops=5,
                                    available_since_s=0.0)
               for o in offers}
    out = {}
    print(f"{'jobs':>6s} {'offerings':>9s} {'median ms':>10s}")
    for n in (10, 100, 1000):
        inp = PolicyInput(now_s=3600, jobs=jobs(n), offerings=offers, history=history)
        times = []
        for _ in range(1 if args.quick else 5):
            t0 = time.perf_counter()
            SpotrainPolicy().decide(inp)
            times.append(time.perf_counter() - t0)
        ms = statistics.median(times) * 1000
        out[str(n)] = round(ms, 2)
        print(f"{n:6d} {len(offers):9d} {ms:10.1f}")
    print(json.dumps({"benchmark": "policy_latency", "offerings": len(offers), "median_ms_by_jobs": out}, sort_keys=True))


if __name__ == "__main__":
    main()
