"""Multi-job simulation: replay a job-arrival workload against a market trace with one policy.

A workload is Pollux's format (Qiao et al., OSDI'21; ``cost_models/data/pollux/workloads``):
``name,time,application,num_replicas,batch_size`` - submit time in seconds, the model, and the replicas
and total batch size the user asked for. Each of Pollux's six applications runs with its OWN published
data (``cost_models/data/pollux/<model>/``, from Pollux's artifact; no model borrows another's):

- its throughput model, fitted to its ``scalability.csv`` and/or ``placements.csv`` (``deepspeech2``
  has only multi-node ``scalability.csv`` rows (6-16 nodes), ``yolov3`` only ``placements.csv`` (1-4
  nodes): those are the rows the artifact has for them);
- its initial batch ``M0`` (the smallest validated batch; ``deepspeech2``: 20, see ``INITIAL_BATCH``),
  its work (the scale-invariant iterations of the last row of its smallest ``validation-<M>.csv``, at
  ``M0``), its gradient noise scale (``model_stats``) and its largest validated batch (the adaptive cap).

A job's work is ``P x T_step(1 GPU, M0)`` reference GPU-seconds (``P``: the scale-invariant
iterations at ``M0`` to Pollux's validation target); it then runs at its own batch with the profile's
speedup for it.

The workload runs through one controller on a virtual clock (``world.World``): the jobs share the
local cloud's market (spot room per offering; when room shrinks the newest instances are preempted
first), and the policy decides for all live jobs at once, as it does in the service. Deadlines are
optional: ``deadline_factor`` F gives each job F times its time on the fastest on-demand gang of the
size and batch its user asked for (in every mode: the same deadline for the same job).

Co-adaptation (issue 11, docs/goodput.md "workload replay"): with ``batch_policy`` ``fixed``,
``adaptive`` or ``tuned`` each job is elastic (1 GPU up to its gang size) and its simulated workers
train at the truth - the model's throughput model and a constant gradient noise scale - and report
profile rows and gradient statistics as the runtime does; the controller starts from a linear prior
and learns the job's goodput from those reports only. ``fixed`` keeps the user's batch ``M`` and GPUs;
``adaptive`` starts at ``M`` and lets the controller pick the batch for each allocation, from ``M`` up
to the model's largest validated batch; ``tuned`` is Pollux's TunedJobs baseline: the job runs at the
batch and GPU count chosen offline for it with the truth (``tuned_config``), batch fixed. All reach
the same target, ``P`` scale-invariant iterations at ``M0``: ``P x M0 / (M x E(M)) x T_step(1 GPU,
M)`` reference GPU-seconds at batch ``M``, ``E(M) = (B + M0) / (B + M)``.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import select

from autoscaler.jobs.spec import JobSpec, spec_from_dict
from cloud_providers.base import Offering
from cloud_providers.local.market import MarketTrace
from cloud_providers.safe_files import FileRefused, read_text_file
from cost_models.scaling import LinearScaling, ProfileScaling

from ..errors import SpecError
from ..policy.base import Policy
from ..policy.jobmath import gang_rate
from ..state import InstanceRow
from .executor import SimWorkload
from .workload_models import MODELS, model_stats, run_time_s, throughput_model, tuned_config
from .world import JobOutcome, World

# A workload is a few hundred jobs (Pollux's traces: 160); past these it is not one (issue 21, finding 12).
MAX_WORKLOAD_JOBS = 100_000
MAX_WORKLOAD_BYTES = 16 * 1024 * 1024
# Replay modes (module doc): the spec's batch policy of each, and ``tuned`` (TunedJobs: fixed batch,
# the batch and GPU count chosen offline).
BATCH_POLICIES = ("fixed", "adaptive", "tuned")


# Pollux's jobs are short (most under a GPU-hour): a deadline of a few times the on-demand run time
# leaves them slack for spot beyond the Safety Net's 2 restarts.
DEFAULT_DEADLINE_FACTOR = 4.0


# Sanity bounds on a workload row (Pollux's workloads ask for at most 64 replicas and batch 4096).
MAX_REPLICAS = 4096
MAX_BATCH = 1 << 20


class WorkloadError(SpecError, ValueError):
    """A workload file that cannot be read; the message names the line and the field."""


@dataclasses.dataclass(frozen=True)
class WorkloadJob:
    name: str
    submit_s: float
    application: str
    replicas: int
    batch_size: int

    @property
    def profile(self) -> str:
        """The data the job runs with: its own model's (no model borrows another's)."""
        return self.application


def read_workload(path: str | Path) -> list[WorkloadJob]:
    try:  # a bounded regular file (issue 21, finding 12): a FIFO or /dev/zero is refused at once
        text = read_text_file(path, max_bytes=MAX_WORKLOAD_BYTES, what="workload")
    except FileRefused as exc:
        raise WorkloadError(str(exc)) from None
    try:
        rows = list(csv.DictReader(text.splitlines()))
    except csv.Error as exc:
        raise WorkloadError(f"workload {path}: not a CSV file ({exc})") from None
    if len(rows) > MAX_WORKLOAD_JOBS:
        raise WorkloadError(f"workload {path}: more than {MAX_WORKLOAD_JOBS} jobs")
    out = []
    for i, r in enumerate(rows, start=2):
        try:
            job = WorkloadJob(r["name"], float(r["time"]), r["application"], int(r["num_replicas"]), int(r["batch_size"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise WorkloadError(f"workload {path}: line {i}: bad or missing column ({exc})") from None
        if job.application not in MODELS:
            raise WorkloadError(f"workload {path}: line {i}: application {job.application!r} has no profile of its own "
                                f"(known: {', '.join(sorted(MODELS))})")
        if job.replicas < 1 or job.batch_size < 1 or not 0 <= job.submit_s < math.inf:
            raise WorkloadError(f"workload {path}: line {i}: time, num_replicas and batch_size must be positive "
                                "(and time finite)")
        if job.replicas > MAX_REPLICAS or job.batch_size > MAX_BATCH:
            raise WorkloadError(f"workload {path}: line {i}: num_replicas (at most {MAX_REPLICAS}) or batch_size "
                                f"(at most {MAX_BATCH}) out of range")
        out.append(job)
    if not out:
        raise WorkloadError(f"workload {path}: no jobs")
    return sorted(out, key=lambda j: (j.submit_s, j.name))


def work_gpu_seconds(application: str) -> float:
    """Reference GPU-seconds to reach the validation target: one GPU at the model's initial batch
    ``M0`` (the unit of the spec's ``simulate.work_gpu_hours``), whatever batch the user asked for."""
    s = model_stats(application)
    return s.target_progress * float(throughput_model(application).step_time(1, 1, s.initial_batch))


def noise_scale(application: str) -> float:
    return model_stats(application).noise_scale


def adaptive_work_gpu_seconds(application: str, batch_size: int) -> float:
    """Reference GPU-seconds to the validation target for a job training at ``batch_size`` (one GPU
    at that batch, statistical efficiency 1 at it: the unit of a profiled ``SimWorkload``)."""
    return run_time_s(application, 1, batch_size)


def workload_spec(job: WorkloadJob, offerings: Sequence[Offering], work_s: float, deadline_s: float | None,
                  batch_policy: str | None = None) -> JobSpec:
    """The job's spec: a fixed gang of its replicas (no ``batch_policy``), or elastic from 1 GPU to
    them with ``batch_policy`` fixed, adaptive or tuned (``job`` then carries the tuned GPUs and batch)."""
    accs = sorted({f"{o.accelerator}:{o.gpus}" for o in offerings if job.replicas % o.gpus == 0})
    cap = max(model_stats(job.application).max_batch_size, job.batch_size) if batch_policy else max(4096, job.batch_size)
    d: dict[str, Any] = {
        "name": "w-" + (re.sub(r"[^a-z0-9]+", "-", job.name.lower()).strip("-")[:40] or "job"),
        "run": "simulated",
        "resources": {"accelerators": accs, "clouds": sorted({o.cloud for o in offerings})},
        "workers": {"min": 1 if batch_policy else job.replicas, "max": job.replicas},
        "training": {"logical_workers": job.replicas, # The spec wants a batch divisible by the workers; the simulated
                     # scaling (``ProfileScaling``) uses the workload's batch as is.
                     "global_batch_size": _spec_batch(job), "max_batch_size": cap},
        "simulate": {"work_gpu_hours": work_s / 3600.0},
    }
    if batch_policy:
        d["training"]["batch_policy"] = "fixed" if batch_policy == "tuned" else batch_policy
    if deadline_s is not None:
        d["objective"] = {"deadline": f"{max(1, int(math.ceil(deadline_s)))}s"}
    return spec_from_dict(d)


def _spec_batch(job: WorkloadJob) -> int:
    """The spec's batch: the user's, as a multiple of the logical workers (in both modes: starting
    adaptive jobs at the model's ``M0`` instead was tried, docs/goodput.md "workload replay")."""
    return max(job.replicas, job.batch_size - job.batch_size % job.replicas)


@dataclasses.dataclass
class _Run:
    job: WorkloadJob  # as the user asked
    spec: JobSpec
    workload: SimWorkload
    deadline_s: float | None
    ran: WorkloadJob  # the GPUs and batch it ran with (TunedJobs: the tuned ones)
    job_id: str = ""


def _sim_workload(j: WorkloadJob, restart_overhead_s: float, interval_s: float, batch_policy: str | None) -> SimWorkload:
    """What the job's simulated workers do. Profiled (``batch_policy`` set): the true model and
    gradient statistics at the spec's batch (grad_var normalised to it: B = grad_var / grad_sqr x M),
    and a linear prior for the controller, which learns the rest from the reports."""
    model = throughput_model(j.application)
    if batch_policy is None:
        return SimWorkload(work_s=work_gpu_seconds(j.application), scaling=ProfileScaling(model, j.batch_size),
                           restart_overhead_s=restart_overhead_s, checkpoint_interval_s=interval_s)
    m = _spec_batch(j)
    return SimWorkload(work_s=adaptive_work_gpu_seconds(j.application, m), scaling=LinearScaling(),
                       restart_overhead_s=restart_overhead_s, checkpoint_interval_s=interval_s,
                       profile=model, grad_stats=(1.0, noise_scale(j.application) / m))


def tuned_job(j: WorkloadJob) -> WorkloadJob:
    """The job as TunedJobs runs it: the GPU count and batch ``tuned_config`` picks for its model
    (offline, with the truth; one GPU per node, as on the generated markets)."""
    c = tuned_config(j.application, user_batch=j.batch_size)
    return dataclasses.replace(j, replicas=c.gpus, batch_size=c.batch_size)


def workload_world(trace: MarketTrace, jobs: Sequence[WorkloadJob], policy: Policy, *, start_s: float = 0.0,
                   restart_overhead_s: float = 360.0, deadline_factor: float | None = DEFAULT_DEADLINE_FACTOR,
                   batch_policy: str | None = None, oracle: bool = False) -> tuple[World, list[_Run]]:
    """The world and the jobs' runs, before any arrival (``simulate_workload`` runs them). A job's
    deadline comes from the configuration its user asked for, in every mode. ``oracle``: the
    controller sees the trace's spot room (``World``)."""
    if deadline_factor is not None and deadline_factor <= 1.0:
        raise ValueError("deadline_factor must be > 1 (or None for no deadlines)")
    if batch_policy is not None and batch_policy not in BATCH_POLICIES:
        raise ValueError(f"batch_policy must be one of {', '.join(BATCH_POLICIES)} (or None)")
    offers0 = trace.offerings_at(start_s)
    runs: list[_Run] = []
    for j in jobs:
        scaling = ProfileScaling(throughput_model(j.application), j.batch_size)
        fits = [o for o in offers0 if j.replicas % o.gpus == 0]
        if not fits:
            raise WorkloadError(f"job {j.name}: no offering in the trace fits {j.replicas} replicas")
        # The deadline's unit: the run time on the on-demand gang cheapest per unit of work (what the
        # on-demand baseline runs), so that running on demand always meets it.
        od = min(fits, key=lambda o: o.on_demand_price_usd_per_hour / gang_rate(scaling, ((o, j.replicas // o.gpus),)))
        user = _sim_workload(j, restart_overhead_s, 600.0, "fixed" if batch_policy == "tuned" else batch_policy)
        base_s = user.work_s / gang_rate(scaling, ((od, j.replicas // od.gpus),)) + restart_overhead_s
        deadline = None if deadline_factor is None else deadline_factor * base_s
        ran, sim = j, user
        if batch_policy == "tuned":
            ran = tuned_job(j)
            sim = _sim_workload(ran, restart_overhead_s, 600.0, batch_policy)
            fits = [o for o in offers0 if ran.replicas % o.gpus == 0]
            if not fits:
                raise WorkloadError(f"job {j.name}: no offering in the trace fits its tuned {ran.replicas} GPUs")
        try:
            spec = workload_spec(ran, fits, sim.work_s, deadline, batch_policy)
        except SpecError as exc:
            raise WorkloadError(f"job {j.name}: {str(exc).removeprefix('spec error: ')}") from None
        sim = dataclasses.replace(sim, checkpoint_interval_s=spec.checkpoint.interval_s)
        runs.append(_Run(j, spec, sim, deadline, ran))
    return World(trace, policy, start_s=start_s, oracle=oracle), runs


def simulate_workload(trace: MarketTrace, jobs: Sequence[WorkloadJob], policy: Policy, *, start_s: float = 0.0,
                      restart_overhead_s: float = 360.0, deadline_factor: float | None = DEFAULT_DEADLINE_FACTOR,
                      max_s: float = 14 * 86400.0, batch_policy: str | None = None, oracle: bool = False) -> dict[str, Any]:
    """Replay ``jobs`` (submit times relative to ``start_s`` on the trace) through one controller on a
    virtual clock (``World``) and return the summary and one record per job (cost, JCT, deadline,
    GPU-hours, batch events). The jobs share the market as they would the cloud: the local cloud's
    spot room per offering. ``batch_policy``: see the module doc (None: fixed gangs, unprofiled)."""
    world, runs = workload_world(trace, jobs, policy, start_s=start_s, restart_overhead_s=restart_overhead_s,
                                 deadline_factor=deadline_factor, batch_policy=batch_policy, oracle=oracle)
    ids = world.run(horizon_s=start_s + max_s,
                    arrivals=[(start_s + r.job.submit_s, r.spec, r.workload) for r in runs])
    for k, v in ids.items():
        runs[int(k)].job_id = v
    outcomes = [world.outcome(ids[str(k)]) if str(k) in ids else None for k in range(len(runs))]
    out = _summary(runs, outcomes, start_s, getattr(policy, "name", type(policy).__name__))
    _add_gpu_hours(world, runs, out)
    out["batch_policy"] = batch_policy
    return out


def _add_gpu_hours(world: World, runs: Sequence[_Run], out: dict[str, Any]) -> None:
    """Billed GPU-hours and batch events per job, and their totals."""
    with world.store.session() as s:
        for r, rec in zip(runs, out["per_job"]):
            rows: list[InstanceRow] = []
            if r.job_id:
                rows = list(s.scalars(select(InstanceRow).where(InstanceRow.job_id == r.job_id)))
            rec["gpu_hours"] = round(sum(x.billed_seconds * x.gpus for x in rows) / 3600.0, 4)
            rec["batch_events"] = sum(1 for e in world.events(r.job_id) if e[1] == "batch") if r.job_id else 0
    out["gpu_hours"] = round(sum(j["gpu_hours"] for j in out["per_job"]), 4)
    out["batch_events"] = sum(j["batch_events"] for j in out["per_job"])


def _summary(runs: Sequence[_Run], outcomes: Sequence[JobOutcome | None], start_s: float, policy: str) -> dict[str, Any]:
    per_job: list[dict[str, Any]] = []
    for r, o in zip(runs, outcomes):
        ended = o is not None and o.state == "SUCCEEDED" and o.finished_s is not None
        jct = (o.finished_s - start_s - r.job.submit_s) / 3600.0 if ended and o is not None and o.finished_s is not None else None
        per_job.append({"name": r.job.name, "application": r.job.application, "profile": r.job.profile,
                        "replicas": r.job.replicas,
                        "batch_size": r.job.batch_size, "ran_gpus": r.ran.replicas, "ran_batch_size": r.ran.batch_size,
                        "state": o.state if o is not None else "UNFINISHED", "cost_usd": round(o.cost_usd if o else 0.0, 4),
                        "on_demand_cost_usd": round(o.on_demand_cost_usd if o else 0.0, 4),
                        "jct_hours": None if jct is None else round(jct, 4),
                        "deadline_hours": None if r.deadline_s is None else round(r.deadline_s / 3600.0, 4),
                        "deadline_met": bool(o is not None and o.deadline_met), "preemptions": o.preemptions if o else 0})
    done = [j["jct_hours"] for j in per_job if j["jct_hours"] is not None]
    return {
        "policy": policy,
        "jobs": len(per_job),
        "finished": len(done),
        "avg_jct_hours": round(sum(done) / len(done), 4) if done else None,
        "cost_usd": round(sum(j["cost_usd"] for j in per_job), 4),
        "on_demand_cost_usd": round(sum(j["on_demand_cost_usd"] for j in per_job), 4),
        "deadline_misses": sum(1 for j in per_job if not j["deadline_met"]),
        "preemptions": sum(j["preemptions"] for j in per_job),
        "per_job": per_job,
    }
