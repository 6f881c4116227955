"""API latency under load (issue 14): 50 concurrent clients against the real controller on loopback.

Starts ``spotrain controller start --cloud local --port 0`` in a temporary ``SPOTRAIN_HOME`` (its tick
loop running), submits jobs over the API (torch-free protocol workers: two train throughout the
run, one is cancelled, one finishes), then runs ``--clients`` concurrent clients (one keep-alive
connection each, asyncio + httpx in this process) for ``--seconds``. Each client sends the next
request ``--think`` seconds after the last answer (0: as fast as the server answers), cycling
through what ``spotrain status``, ``logs`` and the dashboard ask for: ``/healthz``, ``/v1/jobs``, a job,
its events, its spec, its logs, ``/metrics``, and a submit that the spec validation refuses (422).
Prints p50 / p99 / max latency per endpoint and overall, requests per second and errors, and
writes JSON. Target (issue 14): p99 < 100 ms.

    python benchmarks/api_load.py [--clients 50] [--seconds 20] [--think 0.25 0] [--out api_load.json]

``--think`` takes several values: one measured run each (the controller and its jobs are shared).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from support import PROTOCOL_WORKER, start_controller  # noqa: E402

TARGET_P99_MS = 100.0


def spec(name: str, steps: int, step_s: float) -> dict[str, Any]:
    return {"name": name, "run": f"{sys.executable} {PROTOCOL_WORKER}", "envs": {"PW_STEPS": steps, "PW_STEP_S": step_s},
            "resources": {"accelerators": ["T4:1"], "clouds": ["aws", "gcp"]}, "workers": {"min": 1, "max": 1},
            "training": {"logical_workers": 4, "global_batch_size": 64}}


def prepare(url: str, token: str, workdir: Path) -> list[str]:
    """Jobs for the clients to read: two long ones, one cancelled, one finished."""
    auth = {"Authorization": f"Bearer {token}"}
    ids = []
    with httpx.Client(base_url=url, headers=auth, timeout=30) as c:
        for name, steps in (("load-a", 100_000), ("load-b", 100_000), ("load-c", 100_000), ("load-d", 20)):
            r = c.post("/v1/jobs", json={"spec": spec(name, steps, 0.2 if steps > 100 else 0.05), "workdir": str(workdir)})
            r.raise_for_status()
            ids.append(r.json()["job_id"])
        c.post(f"/v1/jobs/{ids[2]}/cancel").raise_for_status()
        deadline = time.time() + 60
        while time.time() < deadline:  # until the long ones run and the short one is done
            states = {j["job_id"]: j["state"] for j in c.get("/v1/jobs", params={"state": "all"}).json()}
            if states[ids[0]] == states[ids[1]] == "RUNNING" and states[ids[3]] == "SUCCEEDED":
                break
            time.sleep(0.5)
        else:
            raise SystemExit(f"the jobs did not reach their states: {states}")
    return ids


def endpoints(ids: list[str]) -> list[tuple[str, str, str, Any]]:
    """(label, method, path, JSON body) cycled through by each client."""
    out: list[tuple[str, str, str, Any]] = [("GET /healthz", "GET", "/healthz", None), ("GET /v1/jobs", "GET", "/v1/jobs", None)]
    for i, job in enumerate(ids):
        out.append(("GET /v1/jobs/{ref}", "GET", f"/v1/jobs/{job}", None))
        if i % 2 == 0:
            out.append(("GET /v1/jobs/{ref}/events", "GET", f"/v1/jobs/{job}/events", None))
            out.append(("GET /v1/jobs/{ref}/spec", "GET", f"/v1/jobs/{job}/spec", None))
    out.append(("GET /v1/jobs/{ref}/logs", "GET", f"/v1/jobs/{ids[0]}/logs", None))
    out.append(("GET /metrics", "GET", "/metrics", None))
    out.append(("POST /v1/jobs (refused: 422)", "POST", "/v1/jobs",
                {"spec": {**spec("bad", 1, 0.1), "workers": {"min": 3, "max": 2}}, "workdir": "/"}))
    return out


async def client(n: int, url: str, token: str, plan: list[tuple[str, str, str, Any]], until: float, warm_until: float,
                 think_s: float, samples: dict[str, list[float]], errors: dict[str, int]) -> None:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
        i = n  # clients start at different endpoints
        while time.monotonic() < until:
            label, method, path, body = plan[i % len(plan)]
            i += 1
            t0 = time.monotonic()
            try:
                r = await c.request(method, path, json=body)
                ok = r.status_code < 500 and (r.status_code < 400 or "refused" in label)
            except httpx.HTTPError:
                ok = False
            dt = time.monotonic() - t0
            if t0 >= warm_until:
                samples[label].append(dt)
                if not ok:
                    errors[label] += 1
            if think_s:
                await asyncio.sleep(think_s)


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100.0 * (len(s) - 1))))]


async def load(url: str, token: str, plan: list[tuple[str, str, str, Any]], *, clients: int, seconds: float,
               warmup_s: float, think_s: float) -> dict[str, Any]:
    samples: dict[str, list[float]] = defaultdict(list)
    errors: dict[str, int] = defaultdict(int)
    start = time.monotonic()
    warm_until, until = start + warmup_s, start + warmup_s + seconds
    await asyncio.gather(*(client(n, url, token, plan, until, warm_until, think_s, samples, errors) for n in range(clients)))
    every = [x for xs in samples.values() for x in xs]
    rows = {label: {"requests": len(xs), "errors": errors[label], "p50_ms": round(pct(xs, 50) * 1000, 1),
                    "p99_ms": round(pct(xs, 99) * 1000, 1), "max_ms": round(max(xs) * 1000, 1),
                    "mean_ms": round(statistics.fmean(xs) * 1000, 1)} for label, xs in samples.items()}
    return {"clients": clients, "seconds": seconds, "think_s": think_s, "requests": len(every),
            "requests_per_s": round(len(every) / seconds, 1), "errors": sum(errors.values()),
            "p50_ms": round(pct(every, 50) * 1000, 1), "p99_ms": round(pct(every, 99) * 1000, 1),
            "max_ms": round(max(every) * 1000, 1), "p99_under_target": pct(every, 99) * 1000 < TARGET_P99_MS,
            "endpoints": rows}


def show(result: dict[str, Any]) -> None:
    print(f"\n{result['clients']} clients, think {result['think_s']} s, {result['seconds']:.0f} s: "
          f"{result['requests']:,} requests ({result['requests_per_s']:.0f}/s), {result['errors']} errors; "
          f"p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms (target < {TARGET_P99_MS:.0f}: "
          f"{'met' if result['p99_under_target'] else 'NOT met'}), max {result['max_ms']} ms")
    width = max(len(k) for k in result["endpoints"])
    print(f"  {'endpoint':<{width}}  {'requests':>8}  {'p50 ms':>7}  {'p99 ms':>7}  {'max ms':>7}  errors")
    for label, r in result["endpoints"].items():
        print(f"  {label:<{width}}  {r['requests']:>8}  {r['p50_ms']:>7}  {r['p99_ms']:>7}  {r['max_ms']:>7}  {r['errors']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--think", type=float, nargs="+", default=[0.25, 0.0],
                    help="seconds each client waits between its requests (one run per value)")
    ap.add_argument("--out", type=Path, default=Path("api_load.json"))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="spotrain-api-load-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        os.environ["SPOTRAIN_HOME"] = str(home)
        proc = start_controller(home, "--cloud", "local")
        try:
            info = json.loads((home / "controller.json").read_text())
            url, token = str(info["url"]), (home / "token").read_text().strip()
            ids = prepare(url, token, Path(tmp))
            plan = endpoints(ids)
            runs = []
            for think in args.think:
                runs.append(asyncio.run(load(url, token, plan, clients=args.clients, seconds=args.seconds,
                                             warmup_s=args.warmup, think_s=think)))
                show(runs[-1])
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    where = f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}"
    args.out.write_text(json.dumps({"benchmark": "api_load", "machine": where, "target_p99_ms": TARGET_P99_MS,
                                    "runs": runs}, indent=2) + "\n")
    print(f"\nmeasured on {where}, clients and controller on the same machine; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
