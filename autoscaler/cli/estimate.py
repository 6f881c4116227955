"""``spotrain estimate SPEC``: predicted cost and finish time, with a range, from the simulator.

It runs the controller with the spotrain policy on a virtual clock over the market trace (the
simulator is the controller: budget guard, minimum bills and back-off included) from many seeded
start times and reports the median
and the 10th-90th percentile range of cost and finish time over the runs that finished, the share
that did not (stopped by the budget, or not done within the horizon) and the share that met the
deadline: the same numbers ``spotrain simulate --starts N`` would give one by one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import numpy as np

from autoscaler.jobs.spec import load_spec

from ..simulator import make_sim_job
from .params import NON_NEGATIVE, SEED, STARTS, policy_params_option, read_policy_params
from .simulate import load_trace, random_starts, run_many


@click.command("estimate")
@click.argument("spec_path", type=click.Path(dir_okay=False))
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="Market trace CSV (default: the bundled one).")
@click.option("--runs", type=STARTS, default=50, show_default=True, help="Simulated start times.")
@click.option("--restart-overhead-hours", type=NON_NEGATIVE, default=None,
              help="Restart overhead d (default: from --checkpoint-seconds/--restore-seconds, else 6 min).")
@click.option("--checkpoint-seconds", type=NON_NEGATIVE, default=None, help="Measured checkpoint save time.")
@click.option("--restore-seconds", type=NON_NEGATIVE, default=None, help="Measured restart + restore time.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--set", "overrides", multiple=True, help="Override a spec field, key.path=value.")
@click.option("--json", "as_json", is_flag=True)
@policy_params_option
def command(spec_path: str, trace_path: str | None, runs: int, restart_overhead_hours: float | None,
            checkpoint_seconds: float | None, restore_seconds: float | None, seed: int,
            overrides: tuple[str, ...], as_json: bool, policy_params: str | None) -> None:
    """Predict the cost and finish time of SPEC (median and 10-90 % range) with the spotrain policy."""
    params = read_policy_params(policy_params)
    spec, _ = load_spec(spec_path, overrides=overrides)
    trace = load_trace(trace_path)
    job = make_sim_job(spec, spec_dir=Path(spec_path).resolve().parent,
                       restart_overhead_s=None if restart_overhead_hours is None else restart_overhead_hours * 3600,
                       checkpoint_save_s=checkpoint_seconds, restore_s=restore_seconds)
    results = run_many(trace, job, "spotrain", random_starts(trace, job, runs, seed), params=params)
    done = [r for r in results if r.state == "SUCCEEDED"]
    # Cost over the runs that finished (a run stopped by its budget spends less and says nothing of
    # what finishing costs); the share that did not finish is reported beside it.
    cost = np.array([r.cost_usd for r in (done or results)])
    fin = np.array([r.finish_hours for r in done])
    od = np.array([r.on_demand_cost_usd for r in results])
    c = _spread(cost)
    f = None if fin.size == 0 else _spread(fin)
    d = None if spec.objective.deadline_s is None else spec.objective.deadline_s / 3600
    failed_budget_share = float(np.mean([r.state == "FAILED_BUDGET" for r in results]))
    deadline_met_share = float(np.mean([r.deadline_met for r in results]))
    out = {
        "name": spec.name,
        "runs": len(results),
        "cost_usd": c,
        "finish_hours": f,
        "deadline_hours": d,
        "deadline_met_share": deadline_met_share,
        "budget_usd": spec.objective.budget_usd,
        "failed_budget_share": failed_budget_share,
        "finished_share": float(len(done) / len(results)),
        "on_demand_equivalent_usd": float(np.median(od)),
        "restart_overhead_s": job.restart_overhead_s,
        "work_gpu_hours": spec.simulate.work_gpu_hours,
        "work_gpu_hours_source": work_source(spec, overrides),
    }
    if as_json:
        click.echo(json.dumps(out, sort_keys=True))
        return
    click.echo(f"{spec.name}: cost ${c['median']:.2f} (range ${c['p10']:.2f}-${c['p90']:.2f}) "
               f"over {len(results)} simulated starts, restart overhead {job.restart_overhead_s / 60:.1f} min")
    click.echo(work_line(spec.simulate.work_gpu_hours, str(out["work_gpu_hours_source"])))
    if len(done) < len(results):
        click.echo(f"{len(results) - len(done)} of {len(results)} runs did not finish "
                   f"({failed_budget_share:.0%} stopped by the budget); "
                   + ("the cost range is over the runs that did" if done else "the cost range is what they spent"))
    if f is None:
        click.echo("finish: never within the simulated horizon")
    else:
        click.echo(f"finish: {f['median']:.2f} h of wall-clock (market) time after submission "
                   f"(range {f['p10']:.2f}-{f['p90']:.2f} h)")
    click.echo("deadline: none" if d is None else f"deadline {d:g} h: met in {deadline_met_share:.0%} of runs")
    if spec.objective.budget_usd is not None:
        click.echo(f"budget ${spec.objective.budget_usd:g}: {failed_budget_share:.0%} of runs would stop FAILED_BUDGET")
    click.echo("(median, and 10th-90th percentile range over the simulated starts)")


def work_source(spec: Any, overrides: tuple[str, ...]) -> str:
    """Where ``simulate.work_gpu_hours`` came from: ``--set``, ``spec`` or ``default``."""
    if any(o.replace(" ", "").startswith("simulate.work_gpu_hours=") for o in overrides):
        return "--set"
    return "spec" if "work_gpu_hours" in spec.simulate.model_fields_set else "default"


def work_line(hours: float, source: str) -> str:
    where = {"--set": "from --set simulate.work_gpu_hours",
             "spec": "from the spec's simulate.work_gpu_hours",
             "default": "the default: the spec sets no simulate.work_gpu_hours; measure your job and set it"}[source]
    return f"work: {hours:g} GPU-hours on one reference GPU ({where})"


def _spread(values: np.ndarray[Any, np.dtype[np.float64]]) -> dict[str, float]:
    """Median and 10th/90th percentiles of ``values``: the range the command reports."""
    return {"median": float(np.median(values)), "p10": float(np.percentile(values, 10)),
            "p90": float(np.percentile(values, 90))}
