"""How long ``spotrain status``, ``logs`` and ``cancel`` take, without a controller (issue 13: < 0.5 s)
and with one (issue 24: ``status`` within 1.5x of ``--help``).

Without a controller: each command runs as a fresh process (``python -m autoscaler.cli.main ...``)
against a throw-away SPOTRAIN_HOME holding one ended job, ``--repeat`` times; the table shows the
median, min and max wall time, and how many modules the command imported that it must not (scipy,
numpy, torch, pandas, sqlalchemy, httpx, httpcore, pydantic). ``--json PATH`` writes the figures.
``spotrain --help`` is the floor: the interpreter's own start plus click.

With a controller: a real one (``spotrain controller start --port 0``) serves that home, and
``spotrain status`` and ``spotrain --help`` run alternately, ``--rounds`` times each, so a change
in the machine's load falls on both alike; the ratio is of their medians. ``--baseline DIR`` runs a
second copy of the CLI (another checkout's tree, e.g. ``/work/main``, put first on PYTHONPATH) in the
same rounds against the same controller, for before/after figures from one run.

    python benchmarks/cli_startup.py [--repeat 7] [--rounds 15] [--baseline DIR] [--json out.json]
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
from typing import Any

HEAVY = ("scipy", "numpy", "torch", "pandas", "sqlalchemy", "httpx", "httpcore", "pydantic")
LIMIT_S = 0.5
RATIO_LIMIT = 1.5  # ``status`` with a controller vs ``--help`` (issue 24)
REPO = Path(__file__).resolve().parents[1]
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


def time_command(args: list[str], env: dict[str, str], repeat: int) -> dict[str, Any]:
    times, heavy = [], ""
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "autoscaler.cli.main", *args], env=env, cwd=REPO, capture_output=True)
        times.append(time.perf_counter() - t0)
    probe = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY, args=args)], env=env, cwd=REPO,
                           capture_output=True, text=True)
    for line in probe.stderr.splitlines():
        if line.startswith("HEAVY="):
            heavy = line[len("HEAVY="):]
    return {"command": " ".join(["spotrain", *args]), "median_s": statistics.median(times), "min_s": min(times),
            "max_s": max(times), "runs": repeat, "heavy_modules": [m for m in heavy.split(",") if m]}


def start_controller(home: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``spotrain controller start --port 0`` serving ``home``; returns once it has written its address."""
    log = open(home / "controller.log", "ab")  # noqa: SIM115 (the controller's for its lifetime)
    proc = subprocess.Popen([sys.executable, "-m", "autoscaler.cli.main", "controller", "start", "--port", "0"],
                            env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
    info = home / "controller.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if info.exists() and json.loads(info.read_text()).get("pid") == proc.pid:
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the controller did not start: {(home / 'controller.log').read_text()[-2000:]}")


def interleaved(variants: dict[str, tuple[Path, dict[str, str]]], commands: list[list[str]],
                rounds: int) -> list[dict[str, Any]]:
    """Each (variant, command) once per round, in the same order every round; their wall times. A
    variant is a checkout's root (the working directory: ``python -m`` puts it first on sys.path) and
    the environment."""
    times: dict[tuple[str, str], list[float]] = {(v, " ".join(c)): [] for v in variants for c in commands}
    for _ in range(rounds):
        for v, (root, env) in variants.items():
            for c in commands:
                t0 = time.perf_counter()
                r = subprocess.run([sys.executable, "-m", "autoscaler.cli.main", *c], env=env, cwd=root,
                                   capture_output=True)
                times[(v, " ".join(c))].append(time.perf_counter() - t0)
                if r.returncode != 0:
                    raise SystemExit(f"{v}: spotrain {' '.join(c)} failed: {r.stderr.decode()[-500:]}")
    return [{"variant": v, "command": "spotrain " + c, "median_s": statistics.median(ts), "min_s": min(ts),
             "max_s": max(ts), "runs": len(ts)} for (v, c), ts in times.items()]


def with_controller(home: Path, env: dict[str, str], rounds: int, baseline: str | None) -> dict[str, Any]:
    """``status`` vs ``--help`` with a live controller, per variant (this tree; ``baseline``)."""
    variants = {"this tree": (REPO, {**env, "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])})}
    if baseline:
        root = Path(baseline).resolve()
        variants["baseline"] = (root, {**env, "PYTHONPATH": os.pathsep.join([str(root), env.get("PYTHONPATH", "")])})
    proc = start_controller(home, variants["this tree"][1])
    try:
        rows = interleaved(variants, [["--help"], ["status"]], rounds)
        probe = time_command(["status"], variants["this tree"][1], 1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    med = {(r["variant"], r["command"]): r["median_s"] for r in rows}
    ratios = {v: med[(v, "spotrain status")] / med[(v, "spotrain --help")] for v in variants}
    return {"rows": rows, "ratio_status_to_help": ratios, "heavy_modules": probe["heavy_modules"],
            "load_avg_1m": os.getloadavg()[0], "cpus": os.cpu_count()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=15, help="Rounds of status/--help with a controller.")
    ap.add_argument("--baseline", default=None, help="Another checkout's root, run as a second variant.")
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
        load_before = os.getloadavg()[0]
        live = with_controller(home, env, a.rounds, a.baseline)
    print(f"{'command':<44} {'median':>8} {'min':>7} {'max':>7}  heavy imports")
    for r in rows:
        print(f"{r['command'][:44]:<44} {r['median_s']:7.3f}s {r['min_s']:6.3f}s {r['max_s']:6.3f}s  "
              f"{','.join(r['heavy_modules']) or '-'}")
    slow = [r["command"] for r in rows if r["command"] != "spotrain --help" and r["median_s"] >= LIMIT_S]
    print(f"limit {LIMIT_S} s without a controller: " + ("met by every command" if not slow else f"missed by {slow}"))
    print(f"\nwith a controller ({a.rounds} rounds, interleaved; load average {load_before:.2f} before, "
          f"{live['load_avg_1m']:.2f} after, {live['cpus']} CPUs)")
    print(f"{'variant':<10} {'command':<18} {'median':>8} {'min':>7} {'max':>7}")
    for row in live["rows"]:
        print(f"{row['variant']:<10} {row['command']:<18} {row['median_s']:7.3f}s {row['min_s']:6.3f}s "
              f"{row['max_s']:6.3f}s")
    for v, ratio in live["ratio_status_to_help"].items():
        print(f"{v}: status / --help = {ratio:.2f} (limit {RATIO_LIMIT} on an idle machine)")
    print(f"heavy imports of status with a controller (this tree): {','.join(live['heavy_modules']) or '-'}")
    out = {"benchmark": "cli_startup", "limit_s": LIMIT_S, "python": sys.version.split()[0], "results": rows,
           "with_controller": {**live, "ratio_limit": RATIO_LIMIT, "rounds": a.rounds, "load_avg_1m_before": load_before}}
    if a.json_path:
        Path(a.json_path).write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
