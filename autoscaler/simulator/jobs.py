"""Building simulated jobs from specs, and running any named policy (omniscient included) on them."""

from __future__ import annotations

from pathlib import Path

from autoscaler.jobs.scaling import spec_scaling
from autoscaler.jobs.spec import JobSpec
from cost_models.scaling import Scaling

from ..policy import Policy, get_policy
from ..policy.jobmath import DEFAULT_RESTART_OVERHEAD_S
from .engine import SimJob, SimResult, Simulation
from .omniscient import PlanPolicy, plan_omniscient
from .world import run_job

POLICIES = ("on-demand", "greedy-spot", "uniform-progress", "omniscient", "spotrain")
# Seconds from asking the cloud for an instance to the worker process starting (AWS/GCP GPU VMs
# typically boot in 1-2 minutes).
LAUNCH_S = 90.0


def restart_overhead_from_measurements(*, checkpoint_save_s: float | None, restore_s: float | None) -> float:
    """Restart overhead d = checkpoint save + instance launch + restore (measured parts when known)."""
    if checkpoint_save_s is None and restore_s is None:
        return DEFAULT_RESTART_OVERHEAD_S
    return (checkpoint_save_s or 0.0) + LAUNCH_S + (restore_s or 0.0)


def make_sim_job(
    spec: JobSpec,
    *,
    spec_dir: Path | None = None,
    restart_overhead_s: float | None = None,
    checkpoint_save_s: float | None = None,
    restore_s: float | None = None,
    scaling: Scaling | None = None,
) -> SimJob:
    if restart_overhead_s is None:
        restart_overhead_s = restart_overhead_from_measurements(checkpoint_save_s=checkpoint_save_s, restore_s=restore_s)
    return SimJob(
        spec=spec,
        scaling=scaling if scaling is not None else spec_scaling(spec, spec_dir),
        restart_overhead_s=restart_overhead_s,
        checkpoint_save_s=30.0 if checkpoint_save_s is None else checkpoint_save_s,
    )


def named_policy(sim: Simulation, job: SimJob, policy: str, start_s: float) -> Policy:
    """One of ``POLICIES`` for a job starting at ``start_s`` (omniscient plans from the whole trace)."""
    if policy == "omniscient":
        if job.spec.workers.min != job.spec.workers.max:
            raise ValueError("omniscient is defined for fixed-size jobs (workers.min == workers.max)")
        return PlanPolicy(plan_omniscient(sim, job, start_s))
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} (choose from {', '.join(POLICIES)})")
    return get_policy(policy)


def run_controller(sim: Simulation, job: SimJob, policy: str, start_s: float, *, min_billed_s: float = 0.0) -> SimResult:
    """One of ``POLICIES`` from ``start_s`` through the controller on a virtual clock: what
    ``spotrain simulate`` and ``estimate`` report."""
    return run_job(sim.trace, job, named_policy(sim, job, policy, start_s), start_s, grid_s=sim.grid_s,
                   watch_keys=sim.keys, market_watch=sim.watch if sim.oracle else None, min_billed_s=min_billed_s,
                   oracle=sim.oracle)


def run_named(sim: Simulation, job: SimJob, policy: str, start_s: float) -> SimResult:
    """One of ``POLICIES`` from ``start_s`` on the policy-only fast path (``engine``), for large
    sweeps; ``tests/policy/test_fast_path.py`` checks it against ``run_controller``."""
    return sim.run(job, named_policy(sim, job, policy, start_s), start_s)
