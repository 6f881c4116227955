"""``spotrain estimate SPEC``: predicted cost and finish time, with a range, from the simulator.

It runs the controller with the spotrain policy on a virtual clock over the market trace (the
simulator is the controller: budget guard, minimum bills and back-off included) from many seeded
start times and reports the median and the range 80 % of runs should cost within (what it is made
of, and the calibration with this home's earlier runs of the job: ``estimate_range.py``), the
finish times' 10th-90th percentiles over the runs that finished, the share that did not (stopped by
the budget, or not done within the horizon) and the share that met the deadline.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import click

from autoscaler.jobs.spec import load_spec

from ..simulator import make_sim_job
from ..simulator.engine import SimJob
from ..simulator.jobs import restart_overhead_from_measurements
from ..simulator.measured import MeasuredRun
from .estimate_range import (
    LOCAL_START_S,
    Z80,
    calibrated_job,
    measured_runs_of,
    print_estimate,
    speed_sd,
    summarize,
    with_release,
    work_source,
)
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
@click.option("--min-billed-seconds", type=NON_NEGATIVE, default=0.0, show_default=True,
              help="The least a cloud bills a launch (the local cloud: 0, or its scenario's min_billed; EC2/GCE: 60).")
@click.option("--measured/--no-measured", default=True, show_default=True,
              help="Calibrate with this home's finished runs of the job (their measured speed, start-up and restart "
                   "times); ignored with --set simulate.work_gpu_hours.")
@click.option("--set", "overrides", multiple=True, help="Override a spec field, key.path=value.")
@click.option("--json", "as_json", is_flag=True)
@policy_params_option
def command(spec_path: str, trace_path: str | None, runs: int, restart_overhead_hours: float | None,
            checkpoint_seconds: float | None, restore_seconds: float | None, seed: int, min_billed_seconds: float,
            measured: bool, overrides: tuple[str, ...], as_json: bool, policy_params: str | None) -> None:
    """Predict the cost and finish time of SPEC (median and the range 80 % of runs fall in) with the
    spotrain policy, calibrated with this home's earlier runs of the job when there are any."""
    params = read_policy_params(policy_params)
    spec, _ = load_spec(spec_path, overrides=overrides)
    trace = load_trace(trace_path)
    source = work_source(spec, overrides)
    calib = measured_runs_of(spec.name) if measured and source != "--set" else []
    given_d = None if restart_overhead_hours is None else restart_overhead_hours * 3600
    if given_d is None and (checkpoint_seconds is not None or restore_seconds is not None):
        given_d = restart_overhead_from_measurements(checkpoint_save_s=checkpoint_seconds, restore_s=restore_seconds)
    spec_dir = Path(spec_path).resolve().parent
    base = make_sim_job(spec, spec_dir=spec_dir, restart_overhead_s=given_d, checkpoint_save_s=checkpoint_seconds)
    variants = [calibrated_job(base, trace, m, m.s_per_step, given_d) for m in calib] or [base]
    starts = random_starts(trace, variants[0], runs, seed)
    results = []
    for i, job in enumerate(variants):  # the start times shared out among the measured runs
        mine = starts[i::len(variants)]
        sims = run_many(trace, job, "spotrain", mine, params=params, min_billed_s=min_billed_seconds) if mine else []
        results += with_release(sims, calib[i] if calib else None)
    # What the local cloud charges from its own start (``spotrain run`` replays the market from trace
    # time 0), at the slowest and fastest speed each earlier run measured, each stretched by how much
    # this machine's speed varies between runs (``speed_sd``).
    sd = speed_sd(calib)
    local_jobs: list[tuple[MeasuredRun | None, SimJob]] = [
        (m, calibrated_job(base, trace, m, v, given_d)) for m in calib
        for v in (m.slowest_s_per_step * math.exp(Z80 * sd), m.fastest_s_per_step * math.exp(-Z80 * sd))] or [(None, base)]
    local = [with_release(run_many(trace, job, "spotrain", [LOCAL_START_S], params=params,
                                   min_billed_s=min_billed_seconds), m)[0] for m, job in local_jobs]
    out = summarize(spec, results, local, variants, calib, source, min_billed_seconds, sd)
    if as_json:
        click.echo(json.dumps(out, sort_keys=True))
        return
    print_estimate(spec, out, len(starts))
