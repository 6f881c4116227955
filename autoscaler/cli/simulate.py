"""``spotrain simulate``: replay a market trace with a policy in virtual time (DESIGN.md contract)."""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np

from autoscaler.jobs.spec import load_spec
from cloud_providers.local.market import MarketTrace, TraceError

from ..errors import SpecError
from ..policy import get_policy
from ..policy.base import eligible_offerings
from ..policy.params import PolicyParams
from ..policy.spotrain import SpotrainPolicy
from ..simulator import POLICIES, Simulation, make_sim_job
from ..simulator.engine import SimJob, SimResult
from ..simulator.jobs import restart_overhead_from_measurements, run_controller
from ..simulator.omniscient import PlanTooLarge
from ..simulator.workload import BATCH_POLICIES, DEFAULT_DEADLINE_FACTOR, WorkloadError, read_workload, simulate_workload
from ..simulator.world import run_job
from .params import NON_NEGATIVE, SEED, STARTS, FiniteFloat, policy_params_option, read_policy_params


def load_trace(path: str | None) -> MarketTrace:
    try:
        return MarketTrace.bundled() if path is None else MarketTrace.load(path)
    except TraceError as exc:
        raise SpecError(f"trace error: {exc}") from None


def random_starts(trace: MarketTrace, job: SimJob, n: int, seed: int) -> list[float]:
    """``n`` seeded start times that leave the job's deadline (or work on one GPU) inside the trace."""
    span = job.spec.objective.deadline_s or job.work
    hi = max(0.0, trace.duration_s - span)
    rng = np.random.default_rng(seed)
    return [float(x) for x in rng.uniform(0.0, hi, n)] if hi > 0 else [0.0] * n


def run_many(trace: MarketTrace, job: SimJob, policy: str, starts: list[float], *, min_billed_s: float = 0.0,
             params: PolicyParams | None = None, oracle: bool = False) -> list[SimResult]:
    """Each start through the controller itself on a virtual clock (``simulator.world``); ``params``
    (``--policy-params``) for the spotrain policy's, else the defaults; ``oracle`` (``--oracle``): the
    policy sees the trace's spot room, which no real cloud reports."""
    if not eligible_offerings(job.spec, trace.offerings_at(0.0)):
        r = job.spec.resources
        raise SpecError(f"trace error: no offering in the trace matches the job's resources (accelerators "
                        f"{', '.join(map(str, r.accelerators))}; clouds {', '.join(r.clouds)})")
    sim = Simulation(trace, job.spec, oracle=oracle)
    try:
        if params is not None:
            return [run_job(trace, job, SpotrainPolicy(params), s, grid_s=sim.grid_s, watch_keys=sim.keys,
                            market_watch=sim.watch if oracle else None, min_billed_s=min_billed_s, oracle=oracle)
                    for s in starts]
        return [run_controller(sim, job, policy, s, min_billed_s=min_billed_s) for s in starts]
    except PlanTooLarge as exc:
        raise SpecError(str(exc)) from None


@click.command("simulate")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="Market trace CSV (default: the bundled one).")
@click.option("--job", "job_path", default=None, type=click.Path(dir_okay=False),
              help="Job spec YAML (its simulate: and objective: sections).")
@click.option("--workload", "workload_path", default=None, type=click.Path(dir_okay=False),
              help="Instead of --job: a job-arrival workload CSV (Pollux's name,time,application,num_replicas,"
                   "batch_size); reports average JCT, cost and deadline misses.")
@click.option("--deadline-factor", type=FiniteFloat(), default=DEFAULT_DEADLINE_FACTOR, show_default=True,
              help="With --workload: each job's deadline is this many times its on-demand run time (0: no deadlines).")
@click.option("--batch-policy", type=click.Choice(BATCH_POLICIES), default=None,
              help="With --workload: elastic jobs (1 to num_replicas GPUs) whose simulated workers train at their "
                   "Pollux profile and report it; the controller learns each job's goodput and keeps the user's "
                   "batch (fixed) or picks it per allocation (adaptive); "
                   "tuned: Pollux's TunedJobs, each job at the batch and GPU count chosen offline for its model. "
                   "Default: fixed gangs of num_replicas at the user's batch, unprofiled.")
@click.option("--policy", type=click.Choice(POLICIES), default="spotrain", show_default=True)
@click.option("--start-hours", type=NON_NEGATIVE, default=0.0, show_default=True,
              help="Trace hour at which the job is submitted.")
@click.option("--starts", type=STARTS, default=None, help="Run N seeded random start times instead (one JSON line each).")
@click.option("--restart-overhead-hours", type=NON_NEGATIVE, default=None,
              help="Restart overhead d (default: from --checkpoint-seconds/--restore-seconds, else 6 min).")
@click.option("--checkpoint-seconds", type=NON_NEGATIVE, default=None, help="Measured checkpoint save time.")
@click.option("--restore-seconds", type=NON_NEGATIVE, default=None, help="Measured restart + restore time.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--min-billed-seconds", type=NON_NEGATIVE, default=0.0, show_default=True,
              help="The least the cloud bills a launch (EC2: 60); the controller's budget check counts it.")
@click.option("--set", "overrides", multiple=True, help="Override a spec field, key.path=value.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one object per run).")
@click.option("--oracle", is_flag=True,
              help="Research view: the policy sees each offering's spot room from the trace (no real cloud reports it). "
                   "Default: only what a real cloud shows - launches that succeed, capacity errors, preemptions, prices.")
@policy_params_option
def command(trace_path: str | None, job_path: str | None, workload_path: str | None, deadline_factor: float,
            batch_policy: str | None, policy: str, start_hours: float, starts: int | None,
            restart_overhead_hours: float | None, checkpoint_seconds: float | None, restore_seconds: float | None,
            seed: int, min_billed_seconds: float, overrides: tuple[str, ...], as_json: bool, oracle: bool,
            policy_params: str | None) -> None:
    """Replay a market trace with a policy in virtual time and report cost, finish time, deadline and preemptions."""
    if policy_params is not None and policy != "spotrain":
        raise click.UsageError("--policy-params sets the spotrain policy's parameters; it needs --policy spotrain")
    params = read_policy_params(policy_params)
    if (job_path is None) == (workload_path is None):
        raise click.UsageError("give exactly one of --job SPEC and --workload CSV")
    if start_hours < 0:
        raise click.UsageError("--start-hours must be >= 0")
    trace = load_trace(trace_path)
    if workload_path is not None:
        if starts is not None or overrides:
            raise click.UsageError("--starts and --set apply to --job, not to --workload")
        _workload(trace, workload_path, policy, start_hours, restart_overhead_hours, checkpoint_seconds, restore_seconds,
                  deadline_factor, as_json, batch_policy, params=params, oracle=oracle)
        return
    if batch_policy is not None:
        raise click.UsageError("--batch-policy applies to --workload (a job's spec has training.batch_policy)")
    assert job_path is not None
    spec, _ = load_spec(job_path, overrides=overrides)
    if policy == "omniscient" and spec.workers.min != spec.workers.max:
        raise click.UsageError(f"--policy omniscient is defined for fixed-size jobs; this one has workers.min "
                               f"{spec.workers.min} != workers.max {spec.workers.max}")
    job = make_sim_job(spec, spec_dir=Path(job_path).resolve().parent,
                       restart_overhead_s=None if restart_overhead_hours is None else restart_overhead_hours * 3600,
                       checkpoint_save_s=checkpoint_seconds, restore_s=restore_seconds)
    times = random_starts(trace, job, starts, seed) if starts else [start_hours * 3600.0]
    for r in run_many(trace, job, policy, times, min_billed_s=min_billed_seconds, params=params, oracle=oracle):
        if as_json:
            click.echo(json.dumps(r.to_json(), sort_keys=True))
        else:
            fin = "unfinished" if r.finish_hours is None else f"{r.finish_hours:.2f} h"
            # Without a deadline there is nothing to meet: "met" would claim a promise never made.
            deadline_words = ("no deadline" if spec.objective.deadline_s is None
                              else "deadline met" if r.deadline_met else "deadline MISSED")
            click.echo(f"{r.policy}: start {r.start_hours:.2f} h  cost ${r.cost_usd:.2f}  finish {fin}  "
                       f"{deadline_words}  preemptions {r.preemptions}  "
                       f"spot {r.spot_hours:.2f} h  on-demand {r.on_demand_hours:.2f} h  ({r.state})")


def _workload(trace: MarketTrace, path: str, policy: str, start_hours: float, overhead_hours: float | None,
              checkpoint_seconds: float | None, restore_seconds: float | None, deadline_factor: float, as_json: bool,
              batch_policy: str | None = None, params: PolicyParams | None = None, oracle: bool = False) -> None:
    if policy == "omniscient":
        raise click.UsageError("--policy omniscient is defined for one fixed-size job, not for a workload")
    if deadline_factor != 0 and not 1 < deadline_factor <= 1000:
        raise click.UsageError("--deadline-factor must be in (1, 1000], or 0 for no deadlines")
    try:
        jobs = read_workload(path)
    except WorkloadError as exc:
        raise SpecError(f"workload error: {exc}") from None
    if overhead_hours is not None:
        d = overhead_hours * 3600
    else:
        d = restart_overhead_from_measurements(checkpoint_save_s=checkpoint_seconds, restore_s=restore_seconds)
    chosen = SpotrainPolicy(params) if params else get_policy(policy)
    try:
        out = simulate_workload(trace, jobs, chosen, start_s=start_hours * 3600.0, restart_overhead_s=d,
                                deadline_factor=None if deadline_factor == 0 else deadline_factor, batch_policy=batch_policy,
                                oracle=oracle)
    except WorkloadError as exc:
        raise SpecError(f"workload error: {exc}") from None
    if as_json:
        click.echo(json.dumps(out, sort_keys=True))
        return
    jct = "n/a" if out["avg_jct_hours"] is None else f"{out['avg_jct_hours']:.2f} h"
    batch = f", batch policy {batch_policy} ({out['batch_events']} batch events)" if batch_policy else ""
    click.echo(f"{out['policy']}: {out['finished']}/{out['jobs']} jobs finished, average JCT {jct}, "
               f"cost ${out['cost_usd']:.2f} (on-demand ${out['on_demand_cost_usd']:.2f}), {out['gpu_hours']:.1f} GPU-hours, "
               f"deadline misses {out['deadline_misses']}, preemptions {out['preemptions']}" + batch)
