"""The range ``spotrain estimate`` reports, what it is made of, and how it is said (issue 24, item 6).

The Quickstart's estimate said $0.45 ($0.41-0.48) while six real runs cost $0.52-1.12: the work was
the spec's guess (``simulate.work_gpu_hours``), the restart overhead a default, and the range only
the spread over market start times. Now:

- **calibrated**: this home's finished runs of the job (``simulator/measured.py``) replace the guess
  with what the runtime measured: market seconds per step (so the work is what this machine class
  takes), start-up (launch to first step) and restart (notice to first step again) times, which the
  simulator pays at the first start and at each restart;
- **the range** is the 10th-90th percentile over the simulated market start times (each measured run
  taking its share), widened to include what the local cloud charges from its own start (``spotrain
  run`` replays the market from trace time 0) at the slowest and at the fastest speed an attempt of
  each measured run had, stretched by how much the machine's speed varies between runs (``speed_sd``:
  measured across runs, and at least ``MIN_SPEED_SD`` until three runs measured it): "80 % of runs
  should cost between ..." on this machine class;
- what the instances stay billed after the workers exit (measured: the processes ending, the
  controller releasing them) is added to each simulated run at its own price;
- billing is per second with at least ``--min-billed-seconds`` a launch, as the cloud bills.

``benchmarks/estimate_accuracy.py`` runs the Quickstart N times and reports how far each run's cost
fell from the range estimated before it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import click
import numpy as np

from cost_models.scaling import accelerator_speed

from ..simulator.engine import SimJob, SimResult
from ..simulator.measured import MeasuredRun

LOCAL_START_S = 0.0  # the local cloud replays the market from the trace's start (``LocalProvider``)
SHARE = "80%"  # of runs inside the reported range: its 10th-90th percentile
Z80 = 1.2816  # the standard normal's 90th percentile: a 10th-90th percentile range is +-Z80 sd
# How much a machine's speed varies between runs (sd of log seconds per step) until enough runs have
# measured it: a shared 2-core machine's runs of the Quickstart took 34-84 s in one benchmark
# (benchmarks/estimate_accuracy.py); a dedicated machine measures less once MEASURED_FOR_SPREAD runs exist.
MIN_SPEED_SD = 0.25
MEASURED_FOR_SPREAD = 3


def measured_runs_of(name: str) -> list[MeasuredRun]:
    """This home's measured runs of jobs named ``name`` (newest first); none when the home has no
    database yet (an estimate never creates one)."""
    import os

    from ..home import db_url, home

    if not os.environ.get("SPOTRAIN_DB_URL") and not (home() / "spotrain.db").exists():
        return []
    from ..simulator.measured import measured_runs
    from ..state import Store

    return measured_runs(Store(db_url()), name)


def calibrated_job(base: SimJob, trace: Any, run: MeasuredRun, s_per_step: float, given_d: float | None) -> SimJob:
    """``base`` with the work ``run`` measured at ``s_per_step`` market seconds a step (converted to
    reference GPU-seconds at the gang it ran on) and its start-up/restart overhead (unless given),
    scaled as the step time is: a machine that steps slower also starts slower (imports, restore)."""
    accel, _, gpus = run.offering_key.rsplit("/", 1)[-1].partition(":")
    per_node = int(gpus) if gpus.isdigit() and int(gpus) > 0 else 1
    rate = accelerator_speed(accel) * base.scaling.speedup(run.world_size, per_node)
    work_gpu_hours = run.total_steps * s_per_step * rate / 3600.0
    spec = base.spec.model_copy(update={"simulate": base.spec.simulate.model_copy(update={"work_gpu_hours": work_gpu_hours})})
    d = run.overhead_s * s_per_step / run.s_per_step if given_d is None else given_d
    return dataclasses.replace(base, spec=spec, restart_overhead_s=d)


def with_release(results: list[SimResult], run: MeasuredRun | None) -> list[SimResult]:
    """``results`` with the billing after the last exit that ``run`` measured (``release_s`` on each
    of its ``world_size`` instances), at each result's own mean price per instance-second."""
    if run is None or run.release_s <= 0:
        return results
    out = []
    for r in results:
        held_s = (r.spot_hours + r.on_demand_hours) * 3600.0
        extra = r.cost_usd * run.release_s * run.world_size / held_s if held_s > 0 else 0.0
        out.append(dataclasses.replace(r, cost_usd=r.cost_usd + extra))
    return out


def speed_sd(calib: list[MeasuredRun]) -> float:
    """The spread (sd of log seconds per step) of this machine's speed between runs: measured over
    the runs' attempts, and at least ``MIN_SPEED_SD`` until ``MEASURED_FOR_SPREAD`` runs measured it."""
    logs = [math.log(x) for m in calib for x in {m.s_per_step, m.fastest_s_per_step, m.slowest_s_per_step} if x > 0]
    measured = float(np.std(logs, ddof=1)) if len(logs) >= 2 else 0.0
    return measured if len(calib) >= MEASURED_FOR_SPREAD else max(MIN_SPEED_SD, measured)


def spread(values: list[float]) -> dict[str, float]:
    """Median and 10th/90th percentiles of ``values``."""
    a = np.array(values, dtype=float)
    return {"median": float(np.median(a)), "p10": float(np.percentile(a, 10)), "p90": float(np.percentile(a, 90))}


def summarize(spec: Any, results: list[SimResult], local: list[SimResult], variants: list[SimJob],
              calib: list[MeasuredRun], source: str, min_billed_s: float, sd: float) -> dict[str, Any]:
    """The estimate's JSON (``spotrain estimate --json``)."""
    done = [r for r in results if r.state == "SUCCEEDED"]
    # Cost over the runs that finished (a run stopped by its budget spends less and says nothing of
    # what finishing costs); the share that did not finish is reported beside it.
    c = spread([r.cost_usd for r in (done or results)])
    fin = [r.finish_hours for r in done if r.finish_hours is not None]
    local_costs = [r.cost_usd for r in local]
    d = None if spec.objective.deadline_s is None else spec.objective.deadline_s / 3600
    work = float(np.median([v.work / 3600.0 for v in variants]))
    return {
        "name": spec.name,
        "runs": len(results),
        "cost_usd": c,
        "range_usd": {"low": min([c["p10"], *local_costs]), "high": max([c["p90"], *local_costs])},
        "range_share": 0.8,
        "local_cloud_cost_usd": local_costs,
        "finish_hours": spread(fin) if fin else None,
        "deadline_hours": d,
        "deadline_met_share": float(np.mean([r.deadline_met for r in results])),
        "budget_usd": spec.objective.budget_usd,
        "failed_budget_share": float(np.mean([r.state == "FAILED_BUDGET" for r in results])),
        "finished_share": float(len(done) / len(results)),
        "on_demand_equivalent_usd": float(np.median([r.on_demand_cost_usd for r in results])),
        "restart_overhead_s": float(np.median([v.restart_overhead_s for v in variants])),
        "min_billed_s": min_billed_s,
        "speed_sd": sd,
        "work_gpu_hours": work,
        "work_gpu_hours_source": "measured" if calib else source,
        "calibration": None if not calib else {
            "job_ids": [m.job_id for m in calib],
            "measured_cost_usd": [m.cost_usd for m in calib],
            "s_per_step": [m.s_per_step for m in calib],
            "startup_s": [m.startup_s for m in calib],
            "restart_s": [m.restart_s for m in calib],
            "release_s": [m.release_s for m in calib],
        },
    }


def print_estimate(spec: Any, out: dict[str, Any], starts: int) -> None:
    c, rng, calib = out["cost_usd"], out["range_usd"], out["calibration"]
    click.echo(f"{spec.name}: cost ${c['median']:.2f}; {SHARE} of runs should cost between ${rng['low']:.2f} and "
               f"${rng['high']:.2f}")
    vary = math.exp(Z80 * out["speed_sd"]) - 1
    click.echo(f"(the range: 10th-90th percentile over {starts} simulated market start times, widened to what the "
               "local cloud charges from its own start at the slowest and fastest measured speed"
               + (f" give or take {vary:.0%} (how this machine's speed varies between runs)" if calib else "")
               + f"; billed per second, at least {out['min_billed_s']:g} s a launch)")
    if calib:
        n = len(calib["job_ids"])
        click.echo(f"calibrated with {n} earlier run(s) of {spec.name} here (measured: "
                   f"{np.median(calib['s_per_step']):.3g} market s/step, start-up {np.median(calib['startup_s']) / 60:.1f} min"
                   + (f", restart {max(x for x in calib['restart_s'] if x is not None) / 60:.1f} min"
                      if any(x is not None for x in calib["restart_s"]) else "")
                   + f"; they cost {', '.join(f'${x:.2f}' for x in calib['measured_cost_usd'])})")
    else:
        click.echo(f"not calibrated: no finished run of {spec.name} in this SPOTRAIN_HOME; the range covers the market, "
                   "not this machine's speed: run the job once (spotrain run) and estimate again")
    click.echo(work_line(out["work_gpu_hours"], str(out["work_gpu_hours_source"])) +
               f", restart overhead {out['restart_overhead_s'] / 60:.1f} min")
    if out["finished_share"] < 1:
        fb = out["failed_budget_share"]
        click.echo(f"{out['runs'] - round(out['finished_share'] * out['runs'])} of {out['runs']} runs did not finish "
                   f"({fb:.0%} stopped by the budget); the cost range is over the runs that did")
    f = out["finish_hours"]
    if f is None:
        click.echo("finish: never within the simulated horizon")
    else:
        click.echo(f"finish: {f['median']:.2f} h of wall-clock (market) time after submission "
                   f"(range {f['p10']:.2f}-{f['p90']:.2f} h)")
    d = out["deadline_hours"]
    click.echo("deadline: none" if d is None else f"deadline {d:g} h: met in {out['deadline_met_share']:.0%} of runs")
    if spec.objective.budget_usd is not None:
        click.echo(f"budget ${spec.objective.budget_usd:g}: {out['failed_budget_share']:.0%} of runs would stop FAILED_BUDGET")


def work_source(spec: Any, overrides: tuple[str, ...]) -> str:
    """Where ``simulate.work_gpu_hours`` came from: ``--set``, ``spec`` or ``default``."""
    if any(o.replace(" ", "").startswith("simulate.work_gpu_hours=") for o in overrides):
        return "--set"
    return "spec" if "work_gpu_hours" in spec.simulate.model_fields_set else "default"


def work_line(hours: float, source: str) -> str:
    where = {"--set": "from --set simulate.work_gpu_hours",
             "spec": "from the spec's simulate.work_gpu_hours",
             "measured": "measured by the runtime in the earlier runs",
             "default": "the default: the spec sets no simulate.work_gpu_hours; measure your job and set it"}[source]
    return f"work: {hours:.3g} GPU-hours on one reference GPU ({where})"
