"""Changeover: from a preemption notice to training running again on the replacement workers.

The cost of a preemption in the policy's model is exactly this figure (plus an instance's boot
time on a real cloud). Each case runs a real job on the local cloud, driven by the real controller
(``Controller.tick`` in a loop, as ``spotrain run`` does), with ``benchmarks/workloads/
changeover_train.py`` as the training script (one spot T4 worker, plain SGD, a state of the given
size) and a scenario that preempts the worker at a training step. The parts come from files that the
local cloud and the runtime write anyway, all in wall-clock time:

    notice      mtime of instances/<id>/attempt-1/notice.json   (the controller relays the notice)
    boundary    runtime timeline: every rank agreed to stop after the current step
    durable     runtime timeline: manifest of the notice checkpoint fsynced
    exited      mtime of attempt-1/exit-0                       (the agent records the exit code)
    started     mtime of <replacement>/attempt-2/pid             (the controller starts the new gang)
    init        runtime timeline: ElasticTrainer built (after interpreter, imports, model)
    restored    runtime timeline: checkpoint read, verified and loaded
    stepped     runtime timeline: first optimizer step after the restore done

    python benchmarks/changeover.py [--quick] [--sizes-mb 1 1000] [--repeats 1]

Prints a table per part and, as the last line, one JSON object with every figure. The market runs
at time scale 1, so the cloud's notice (AWS: 120 s) never cuts a checkpoint short here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = REPO / "benchmarks" / "workloads"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "FAILED_NO_RESOURCE", "FAILED_BUDGET"}
PARTS = ("to_boundary", "checkpoint", "exit", "reschedule", "start", "restore", "first_step")


def _spec(path: Path, *, name: str, state_mb: float, steps: int, step_s: float, store: str) -> Path:
    path.write_text(
        f"name: {name}\n"
        f"workdir: {WORKLOAD}\n"
        f"run: CHANGEOVER_STATE_MB={state_mb:g} CHANGEOVER_STEPS={steps} CHANGEOVER_STEP_S={step_s:g} "
        f"{sys.executable} changeover_train.py\n"
        "resources: {accelerators: [T4:1], clouds: [aws], spot: always}\n"
        "workers: {min: 1, max: 1}\n"
        "training: {logical_workers: 1, global_batch_size: 4, determinism: fast}\n"
        f"checkpoint: {{store: '{store}', interval: 100h, keep: 2}}\n"
    )
    return path


def _mtime(path: Path) -> float:
    return path.stat().st_mtime


def _one(events: list[dict[str, Any]], name: str, attempt: int) -> dict[str, Any]:
    found = [e for e in events if e["event"] == name and e["attempt"] == attempt]
    if not found:
        raise RuntimeError(f"timeline has no {name!r} for attempt {attempt}: {events}")
    return found[0]


def run_case(state_mb: float, *, steps: int, at_step: int, step_s: float, timeout_s: float) -> dict[str, Any]:
    """One job with one preemption; the changeover's parts in seconds."""
    home = Path(tempfile.mkdtemp(prefix="changeover-", dir=REPO / "benchmarks" / "results"))
    os.environ["SPOTRAIN_HOME"] = str(home)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from autoscaler.controller import Controller
    from autoscaler.fleet.clouds import local_cloud
    from autoscaler.home import db_url, localcloud_dir
    from autoscaler.jobs.spec import load_spec
    from autoscaler.policy import get_policy
    from autoscaler.state import Store
    from cloud_providers.local.scenario import parse_scenario
    from runtime.timeline import read_timeline

    try:
        cloud_id = f"changeover-{int(state_mb)}mb"
        scenario = parse_scenario(f"time_scale: 1\nevents:\n  - {{at_step: {at_step}, preempt: 1}}\n", base_dir=home)
        setup = local_cloud(cloud_id, scenario=scenario)
        ctl = Controller(store=Store(db_url()), provider=setup.provider, executor=setup.executor,
                         policy=get_policy(), controller_id=cloud_id, tick_s=0.1, clock_rate=setup.clock_rate)
        spec, workdir = load_spec(_spec(home / "job.yaml", name=f"changeover-{int(state_mb)}", state_mb=state_mb,
                                        steps=steps, step_s=step_s, store=f"file://{home}/store"))
        job_id = ctl.submit(spec, workdir)["job_id"]
        deadline = time.time() + timeout_s
        while True:
            ctl.tick()
            info = ctl.job_info(job_id)
            if info["state"] in TERMINAL:
                break
            if time.time() > deadline:
                ctl.cancel(job_id)
                raise RuntimeError(f"job did not finish in {timeout_s:.0f} s: {info}")
            time.sleep(0.02)
        if info["state"] != "SUCCEEDED" or info["preemptions"] < 1:
            raise RuntimeError(f"job ended {info['state']} with {info['preemptions']} preemption(s): {info}")
        root = localcloud_dir(cloud_id) / "executor"
        notices = sorted(root.glob("instances/*/attempt-1/notice.json"))
        if not notices:
            raise RuntimeError("no notice file: the scenario's preemption did not reach the workers")
        old = notices[0].parent
        new = [p.parent for p in root.glob("instances/*/attempt-2/pid")]
        if len(new) != 1:
            raise RuntimeError(f"expected one replacement gang, found {len(new)}")
        events = read_timeline(str(root / "jobs" / job_id / "timeline.jsonl"))
        t = {
            "notice": _mtime(notices[0]),
            "notice_seen": _one(events, "notice_seen", 1)["t_unix_s"],
            "boundary": _one(events, "boundary", 1)["t_unix_s"],
            "snapshot_done": _one(events, "snapshot_done", 1)["t_unix_s"],
            "durable": _one(events, "durable", 1)["t_unix_s"],
            "exiting": _one(events, "exiting", 1)["t_unix_s"],
            "exited": _mtime(old / "exit-0"),
            "started": _mtime(new[0] / "pid"),
            "process_start": _one(events, "process_start", 2)["t_unix_s"],
            "imports_done": _one(events, "imports_done", 2)["t_unix_s"],
            "model_built": _one(events, "model_built", 2)["t_unix_s"],
            "init": _one(events, "trainer_init", 2)["t_unix_s"],
            "restored": _one(events, "restore_done", 2)["t_unix_s"],
            "stepped": _one(events, "first_step", 2)["t_unix_s"],
        }
        durable_step = _one(events, "durable", 1)["step"]
        restored = _one(events, "restore_done", 2)
        if restored["step"] != durable_step:
            raise RuntimeError(f"resumed from step {restored['step']}, but the notice checkpoint was {durable_step}")
        parts = {
            "to_boundary": t["boundary"] - t["notice"],
            "checkpoint": t["durable"] - t["boundary"],
            "exit": t["exited"] - t["durable"],
            "reschedule": t["started"] - t["exited"],
            "start": t["init"] - t["started"],
            "restore": t["restored"] - t["init"],
            "first_step": t["stepped"] - t["restored"],
        }
        return {
            "state_mb": round(_one(events, "model_built", 2)["state_bytes"] / 1e6, 1),
            "step_time_s": round(_one(events, "first_step", 1)["step_time_s"], 4),
            "notice_step": durable_step,
            **{k: round(v, 4) for k, v in parts.items()},
            "detail": {
                "notice_seen": round(t["notice_seen"] - t["notice"], 4),
                "stall": round(_one(events, "snapshot_done", 1)["stall_s"], 4),
                "persist": round(t["durable"] - t["snapshot_done"], 4),
                "wind_down": round(t["exiting"] - t["durable"], 4),
                "interpreter_exit": round(t["exited"] - t["exiting"], 4),
                "process_spawn": round(t["process_start"] - t["started"], 4),
                "imports": round(t["imports_done"] - t["process_start"], 4),
                "model_build": round(t["model_built"] - t["imports_done"], 4),
                "script_to_trainer": round(t["init"] - t["model_built"], 4),
                "read_verify": round(restored.get("read_s") or 0.0, 4),
                "prefetched": int(bool(restored.get("prefetched"))),
            },
            "until_restored_s": round(t["restored"] - t["notice"], 4),
            "total_s": round(t["stepped"] - t["notice"], 4),
        }
    finally:
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the small state only (smoke test)")
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1.0, 1000.0])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    sizes = [1.0] if args.quick else args.sizes_mb
    (REPO / "benchmarks" / "results").mkdir(parents=True, exist_ok=True)
    rows = []
    for mb in sizes:
        # A small state trains fast: steps are padded to 50 ms so that the notice lands mid-run.
        small = mb < 100
        runs = [run_case(mb, steps=80 if small else 8, at_step=20 if small else 3, step_s=0.05 if small else 0.0,
                         timeout_s=300) for _ in range(args.repeats)]
        row = {k: statistics.median(r[k] for r in runs) if isinstance(runs[0][k], (int, float)) else runs[0][k]
               for k in runs[0]}
        row["detail"] = {k: round(statistics.median(r["detail"][k] for r in runs), 4) for k in runs[0]["detail"]}
        row["runs"] = len(runs)
        rows.append(row)
    print(f"changeover on the local cloud: notice -> training again on the replacement "
          f"(median of {args.repeats}; seconds)")
    print(f"{'part':<14}" + "".join(f"{r['state_mb']:>10.0f} MB" for r in rows))
    for part in PARTS:
        print(f"{part:<14}" + "".join(f"{r[part]:>13.3f}" for r in rows))
    print(f"{'= restored':<14}" + "".join(f"{r['until_restored_s']:>13.3f}" for r in rows))
    print(f"{'= total':<14}" + "".join(f"{r['total_s']:>13.3f}" for r in rows))
    print("detail: " + "; ".join(f"{r['state_mb']:.0f} MB " + ", ".join(f"{k} {v:.3f}" for k, v in r["detail"].items())
                                 for r in rows))
    print(json.dumps({"quick": args.quick, "repeats": args.repeats, "rows": rows}))


if __name__ == "__main__":
    main()
