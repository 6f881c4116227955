"""``spotrain simulate``: replay a market trace with a policy in virtual time (DESIGN.md contract)."""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np

from cloud_providers.local.market import MarketTrace, TraceError

from ..errors import SpecError
from ..simulator import POLICIES, Simulation, make_sim_job, run_named
from ..simulator.engine import SimJob, SimResult
from ..spec import load_spec


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


def run_many(trace: MarketTrace, job: SimJob, policy: str, starts: list[float]) -> list[SimResult]:
    sim = Simulation(trace, job.spec)
    return [run_named(sim, job, policy, s) for s in starts]


@click.command("simulate")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None, help="Market trace CSV (default: the bundled one).")
@click.option("--job", "job_path", required=True, type=click.Path(dir_okay=False), help="Job spec YAML (its simulate: and objective: sections).")
@click.option("--policy", type=click.Choice(POLICIES), default="spotrain", show_default=True)
@click.option("--start-hours", type=float, default=0.0, show_default=True, help="Trace hour at which the job is submitted.")
@click.option("--starts", type=click.IntRange(min=1), default=None, help="Run N seeded random start times instead (one JSON line each).")
@click.option("--restart-overhead-hours", type=click.FloatRange(min=0), default=None, help="Restart overhead d (default: from --checkpoint-seconds/--restore-seconds, else 6 min).")
@click.option("--checkpoint-seconds", type=click.FloatRange(min=0), default=None, help="Measured checkpoint save time.")
@click.option("--restore-seconds", type=click.FloatRange(min=0), default=None, help="Measured restart + restore time.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--set", "overrides", multiple=True, help="Override a spec field, key.path=value.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one object per run).")
def command(trace_path: str | None, job_path: str, policy: str, start_hours: float, starts: int | None,
            restart_overhead_hours: float | None, checkpoint_seconds: float | None, restore_seconds: float | None,
            seed: int, overrides: tuple[str, ...], as_json: bool) -> None:
    """Replay a market trace with a policy in virtual time and report cost, finish time, deadline and preemptions."""
    spec, _ = load_spec(job_path, overrides=overrides)
    trace = load_trace(trace_path)
    if start_hours < 0:
        raise click.UsageError("--start-hours must be >= 0")
    job = make_sim_job(spec, spec_dir=Path(job_path).resolve().parent,
                       restart_overhead_s=None if restart_overhead_hours is None else restart_overhead_hours * 3600,
                       checkpoint_save_s=checkpoint_seconds, restore_s=restore_seconds)
    times = random_starts(trace, job, starts, seed) if starts else [start_hours * 3600.0]
    for r in run_many(trace, job, policy, times):
        if as_json:
            click.echo(json.dumps(r.to_json(), sort_keys=True))
        else:
            fin = "unfinished" if r.finish_hours is None else f"{r.finish_hours:.2f} h"
            click.echo(f"{r.policy}: start {r.start_hours:.2f} h  cost ${r.cost_usd:.2f}  finish {fin}  "
                       f"deadline {'met' if r.deadline_met else 'MISSED'}  preemptions {r.preemptions}  "
                       f"spot {r.spot_hours:.2f} h  on-demand {r.on_demand_hours:.2f} h  ({r.state})")
