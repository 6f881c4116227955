"""How long ``spotrain status``, ``logs`` and ``cancel`` take without a controller (issue 13: < 0.5 s).

Each command runs as a fresh process (``python -m autoscaler.cli.main ...``) against a throw-away
SPOTRAIN_HOME holding one ended job, ``--repeat`` times; the table shows the median, min and max wall
time, and how many modules the command imported that it must not (scipy, numpy, torch, pandas,
sqlalchemy, httpx, pydantic). ``--json PATH`` writes the figures. ``spotrain --help`` is the floor: the
interpreter's own start plus click.

    python benchmarks/cli_startup.py [--repeat 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("scipy", "numpy", "torch", "pandas", "sqlalchemy", "httpx", "pydantic")
LIMIT_S = 0.5
PROBE = ("import runpy, sys, atexit\n"
         "heavy = {heavy!r}\n"
         "def report():\n"
         "    bad = sorted({{m.split('.')[0] for m in sys.modules}} & set(heavy))\n"
         "    sys.stderr.write('HEAVY=' + ','.join(bad) + '\\n')\n"
         "atexit.register(report)\n"
         "sys.argv = ['spotrain'] + {args!r}\n"
         "runpy.run_module('autoscaler.cli.main', run_name='__main__')\n")


def make_home(home: Path) -> str:
    """A SPOTRAIN_HOME with one cancelled job (written by a real controller); its id."""
    os.environ["SPOTRAIN_HOME"] = str(home)
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    from autoscaler.controller import Controller
    from autoscaler.fleet.clouds import local_cloud
    from autoscaler.home import db_url
    from autoscaler.jobs.spec import load_spec
    from autoscaler.policy import get_policy
    from autoscaler.state import Store

    spec = home / "job.yaml"
    spec.write_text("name: bench\nrun: 'true'\nresources: {accelerators: [T4:1]}\n")
    setup = local_cloud("bench-cli")
    ctl = Controller(store=Store(db_url()), provider=setup.provider, executor=setup.executor, policy=get_policy(),
                     controller_id="bench-cli", clock_rate=setup.clock_rate)
    s, workdir = load_spec(spec)
    job_id: str = ctl.submit(s, workdir)["job_id"]
    ctl.cancel(job_id)
    return job_id


def time_command(args: list[str], env: dict[str, str], repeat: int) -> dict[str, object]:
    times, heavy = [], ""
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "autoscaler.cli.main", *args], env=env, capture_output=True)
        times.append(time.perf_counter() - t0)
    probe = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY, args=args)], env=env,
                           capture_output=True, text=True)
    for line in probe.stderr.splitlines():
        if line.startswith("HEAVY="):
            heavy = line[len("HEAVY="):]
    return {"command": " ".join(["spotrain", *args]), "median_s": statistics.median(times), "min_s": min(times),
            "max_s": max(times), "runs": repeat, "heavy_modules": [m for m in heavy.split(",") if m]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", dest="json_path", default=None, help="Write the results here as JSON.")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        job_id = make_home(home)
        env = {**os.environ, "SPOTRAIN_HOME": str(home)}
        env.pop("SPOTRAIN_CONTROLLER_URL", None)
        commands = [["--help"], ["status"], ["status", job_id], ["status", "--json"], ["logs", job_id],
                    ["cancel", job_id]]
        rows = [time_command(c, env, a.repeat) for c in commands]
    print(f"{'command':<44} {'median':>8} {'min':>7} {'max':>7}  heavy imports")
    for r in rows:
        print(f"{r['command'][:44]:<44} {r['median_s']:7.3f}s {r['min_s']:6.3f}s {r['max_s']:6.3f}s  "
              f"{','.join(r['heavy_modules']) or '-'}")  # type: ignore[arg-type]
    slow = [r["command"] for r in rows if r["command"] != "spotrain --help" and r["median_s"] >= LIMIT_S]  # type: ignore[operator]
    print(f"limit {LIMIT_S} s without a controller: " + ("met by every command" if not slow else f"missed by {slow}"))
    out = {"benchmark": "cli_startup", "limit_s": LIMIT_S, "python": sys.version.split()[0], "results": rows}
    if a.json_path:
        Path(a.json_path).write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
