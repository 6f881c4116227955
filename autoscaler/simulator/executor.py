"""The simulated executor: workers with no processes, for the controller on a virtual clock.

It implements the executor contract (``cloud_providers.executor``) the way the runtime behaves
(DESIGN.md "One world"):
- a gang makes progress once all its members are started, at the rate the job's scaling model gives
  for the allocation (``gang_rate``: the slowest accelerator sets the pace), in reference GPU-seconds
  (one step = 1/``STEPS_PER_S`` of a reference GPU-second, so ``step / total_steps`` is the fraction
  of ``simulate.work_gpu_hours`` done, as finely as the policy reads it);
- a gang resumes from its last checkpoint, and pays the job's restart overhead ``d`` (checkpoint,
  exit, start, restore) counted from the moment its previous gang was disrupted (notice or stop), or
  from its first start;
- it checkpoints periodically (``checkpoint.interval`` of running time) and, on a notice long enough
  to reach a boundary and save (``notice >= checkpoint_save_s``), saves and exits with 85
  ``checkpoint_save_s`` later; on a shorter notice it cannot save, runs on until the instance is
  taken and loses the work since the last periodic checkpoint;
- when the work is done every rank exits 0 and the final model is reported.

Progress is reported through the worker protocol's fields (``step``, ``total_steps``,
``last_checkpoint_step``, ``final_model``), read by the controller exactly as a real rank 0's report.
``next_event_s`` tells the simulation loop when something will next happen (an exit, the first step
after a restart, a periodic checkpoint is not an event).

A workload with a ``profile`` (a Pollux throughput model, issue 11) trains as the runtime would: at
the batch configuration the controller gave the gang (``SPOTRAIN_BATCH_JSON``; absent: the spec's
batch split over the GPUs), progressing at its goodput under the true model and gradient statistics
(``grad_stats``), and it reports what the runtime measures: one ``profile`` row per configuration
trained at (seconds per step and the wait for synchronisation, from the model), ``grad_sqr`` /
``grad_var`` and the batch configuration.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from autoscaler.jobs.scaling import BatchConfig, GoodputScaling
from cloud_providers import protocol
from cloud_providers.base import Offering
from cloud_providers.clock import Clock
from cloud_providers.executor import GangState, WorkerLaunch, WorkerStatus
from cost_models import batching
from cost_models.goodput import ThroughputModel
from cost_models.scaling import Scaling, accelerator_speed

from ..policy.jobmath import gang_rate, gang_shape

STEPS_PER_S = 100
# Rounding slack when counting whole steps (a step done in float arithmetic may fall a hair short).
STEP_EPS = 1e-6


@dataclasses.dataclass(frozen=True)
class SimWorkload:
    """What the simulated workers of one job do."""

    work_s: float  # reference GPU-seconds of the whole job
    scaling: Scaling
    restart_overhead_s: float
    checkpoint_save_s: float = 30.0
    checkpoint_interval_s: float = 600.0
    # The true throughput model (reference GPU): the workers run at, and report, its step times.
    # None: progress follows ``scaling`` and no profile is reported.
    profile: ThroughputModel | None = None
    # The true (grad_sqr, grad_var) at the spec's batch, reported; they set the statistical
    # efficiency of a larger batch. None: not reported, efficiency 1.
    grad_stats: tuple[float, float] | None = None

    @property
    def total_steps(self) -> int:
        return max(1, int(math.ceil(self.work_s * STEPS_PER_S - 1e-9)))


@dataclasses.dataclass
class _Gang:
    attempt: int
    world_size: int
    members: dict[str, list[int]]  # instance_id -> ranks
    started_s: float  # when the last member started (progress starts at ``resume_s``)
    resume_s: float = math.inf
    rate: float = 0.0
    exit_s: float | None = None  # when every rank exits (checkpoint on notice, or done)
    exit_code: int | None = None
    lost: set[str] = dataclasses.field(default_factory=set)
    noticed: bool = False
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    batch: BatchConfig | None = None
    # (nodes, replicas, local_bsz, accum_steps, step_time_s, sync_time_s) of this gang (profiled jobs).
    row: tuple[int, int, float, int, float, float] | None = None


@dataclasses.dataclass
class _Job:
    workload: SimWorkload
    done: float = 0.0  # work done, as of ``as_of_s``
    as_of_s: float = 0.0
    checkpoint: float = 0.0  # work saved in the last checkpoint
    checkpoint_s: float | None = None  # when (provider clock)
    disrupted_s: float | None = None
    gang: _Gang | None = None
    final: bool = False
    # The profile the runtime keeps in its checkpoints: one row per configuration trained at.
    rows: dict[tuple[int, int, float, int], tuple[float, float]] = dataclasses.field(default_factory=dict)


class SimulatedExecutor:
    def __init__(self, clock: Clock, *, offering_of: Callable[[str], Offering | None],
                 launched_at_s: Callable[[str], float | None], now_s: Callable[[], float]) -> None:
        """``offering_of``: an instance's offering (its accelerator sets the pace); ``launched_at_s``:
        when it was launched; ``now_s``: the provider's clock, in which rates, checkpoints and restart
        overheads are counted."""
        self.clock = clock
        self._offering_of = offering_of
        self._launched_at_s = launched_at_s
        self._now_s = now_s
        self._jobs: dict[str, _Job] = {}
        self._instances: dict[str, tuple[str, int]] = {}  # instance_id -> (job_id, attempt)

    def add_job(self, job_id: str, workload: SimWorkload) -> None:
        self._jobs[job_id] = _Job(workload)

    # ----- the model -----
    def _advance(self, job: _Job, t: float) -> None:
        """Bring ``job.done`` and its checkpoint up to time ``t``."""
        g = job.gang
        if g is None or g.rate <= 0 or t <= job.as_of_s:
            job.as_of_s = max(job.as_of_s, t)
            return
        end = t if g.exit_s is None else min(t, g.exit_s)
        run_from = max(job.as_of_s, g.resume_s)
        if end > run_from:
            job.done = min(job.workload.work_s, job.done + g.rate * (end - run_from))
            # Periodic checkpoints every interval of running time since the gang resumed.
            iv = job.workload.checkpoint_interval_s
            if iv > 0:
                k = math.floor((end - g.resume_s) / iv + 1e-9)
                if k >= 1:
                    ck_t = g.resume_s + k * iv
                    if job.checkpoint_s is None or ck_t > job.checkpoint_s:
                        job.checkpoint = job.done - g.rate * (end - ck_t)
                        job.checkpoint_s = ck_t
        job.as_of_s = max(job.as_of_s, t)

    def _start_running(self, job: _Job, g: _Gang, t: float) -> None:
        w = job.workload
        parts: dict[str, tuple[Offering, int]] = {}
        for iid in g.members:
            o = self._offering_of(iid)
            if o is not None:
                parts[o.key] = (o, parts.get(o.key, (o, 0))[1] + 1)
        g.rate = gang_rate(w.scaling, parts.values()) if w.profile is None else _profiled_rate(w, g, list(parts.values()))
        job.done = job.checkpoint  # resume from the last checkpoint
        job.as_of_s = t
        # The restart overhead runs from the change that made this gang: the disruption of the last
        # one (its replacement was launched at once), or the launch of its newest member.
        launched = [x for x in (self._launched_at_s(iid) for iid in g.members) if x is not None]
        origin = max([job.disrupted_s if job.disrupted_s is not None else t] + launched)
        g.resume_s = max(t, min(origin, t) + w.restart_overhead_s)
        job.disrupted_s = None
        if g.rate > 0:
            g.exit_s = g.resume_s + (w.work_s - job.done) / g.rate
            g.exit_code = protocol.EXIT_DONE

    # ----- the executor contract -----
    def start(self, launch: WorkerLaunch) -> None:
        job = self._jobs[launch.job_id]
        key = (launch.job_id, launch.attempt)
        if self._instances.get(launch.instance_id) == key:
            return  # idempotent per (instance, attempt)
        t = self._now_s()
        self._advance(job, t)
        g = job.gang
        if g is None or g.attempt != launch.attempt:
            g = job.gang = _Gang(launch.attempt, launch.world_size, {}, t)
        g.members[launch.instance_id] = list(launch.ranks)
        g.env = launch.env
        self._instances[launch.instance_id] = key
        if sum(len(r) for r in g.members.values()) >= g.world_size:
            g.started_s = t
            self._start_running(job, g, t)

    def _gang_of(self, instance_id: str) -> tuple[_Job, _Gang] | None:
        ref = self._instances.get(instance_id)
        if ref is None:
            return None
        job = self._jobs[ref[0]]
        if job.gang is None or job.gang.attempt != ref[1]:
            return None
        return job, job.gang

    def status(self, instance_id: str, attempt: int) -> WorkerStatus:
        ref = self._instances.get(instance_id)
        if ref is None or ref[1] != attempt:
            return WorkerStatus(GangState.ABSENT)
        job = self._jobs[ref[0]]
        g = job.gang
        if g is None or g.attempt != attempt:
            return WorkerStatus(GangState.LOST)
        if instance_id in g.lost:
            return WorkerStatus(GangState.LOST)
        t = self._now_s()
        if g.exit_s is not None and t >= g.exit_s - 1e-9 and g.exit_code is not None:
            self._advance(job, t)
            if g.exit_code == protocol.EXIT_DONE:
                job.final = True
            return WorkerStatus(GangState.EXITED, {r: g.exit_code for r in g.members[instance_id]})
        return WorkerStatus(GangState.RUNNING)

    def notify(self, instance_id: str, notice: Mapping[str, Any]) -> None:
        found = self._gang_of(instance_id)
        if found is None:
            return
        job, g = found
        t = self._now_s()
        if g.noticed or (g.exit_s is not None and t >= g.exit_s):
            return
        self._advance(job, t)
        g.noticed = True
        job.disrupted_s = t if job.disrupted_s is None else job.disrupted_s
        w = job.workload
        o = self._offering_of(instance_id)
        if notice.get("reason") == protocol.NOTICE_PREEMPTION:
            notice_s = o.notice_seconds if o is not None else 120.0
        else:
            notice_s = math.inf
        if notice_s >= w.checkpoint_save_s:
            # Checkpoint at the boundary, save, exit 85: no work lost.
            job.checkpoint = job.done
            job.checkpoint_s = t
            g.rate = 0.0
            g.exit_s, g.exit_code = t + w.checkpoint_save_s, protocol.EXIT_RESCHEDULE
        # A shorter notice: it cannot save; the gang runs on until the instance is taken.

    def stop(self, instance_id: str) -> None:
        found = self._gang_of(instance_id)
        if found is None:
            return
        job, g = found
        t = self._now_s()
        if g.exit_s is not None and t >= g.exit_s - 1e-9:
            return  # already exited on its own
        self._advance(job, t)
        if job.disrupted_s is None:
            job.disrupted_s = t
        g.lost.add(instance_id)
        g.rate = 0.0
        g.exit_s, g.exit_code = None, None  # the work since the last checkpoint is lost

    def progress(self, job_id: str) -> protocol.ProgressRecord | None:
        job = self._jobs.get(job_id)
        if job is None:
            return None
        self._advance(job, self._now_s())
        out: protocol.ProgressRecord = {"step": int(math.floor(job.done * STEPS_PER_S + STEP_EPS)),
                               "total_steps": job.workload.total_steps,
                               "last_checkpoint_step": int(math.floor(job.checkpoint * STEPS_PER_S + STEP_EPS))}
        if job.gang is not None and job.gang.rate > 0:
            out["step_time_s"] = 1.0 / (job.gang.rate * STEPS_PER_S)
        _report_profile(job, self._now_s(), out)
        if job.checkpoint_s is not None:
            # In the controller's clock, as a real rank 0 reports wall time.
            out["last_checkpoint_unix_s"] = self.clock.now() - (self._now_s() - job.checkpoint_s)
        if job.final or job.done >= job.workload.work_s - 1e-9:
            out["step"] = job.workload.total_steps
            out["final_model"] = "simulated"
        return out

    def progress_file(self, job_id: str) -> str:
        return ""

    def rendezvous(self, instance_id: str) -> tuple[str, int]:
        return ("127.0.0.1", 0)

    # ----- for the simulation loop -----
    def next_event_s(self) -> float:
        """The next provider-clock time at which a worker does something the controller must see."""
        t = self._now_s()
        best = math.inf
        for job in self._jobs.values():
            g = job.gang
            if g is None:
                continue
            if g.exit_s is not None and g.exit_s > t + 1e-9:
                best = min(best, g.exit_s)
            if g.rate > 0 and g.resume_s < math.inf:
                # The first step after a restart (the controller measures the restart overhead by it).
                first = g.resume_s + 1.0 / (g.rate * STEPS_PER_S)
                if first > t + 1e-9:
                    best = min(best, first)
        return best


def _gang_batch(g: _Gang) -> tuple[int, BatchConfig | None]:
    """The spec's batch (from the gang's training JSON) and the batch the controller gave the gang."""
    try:
        m0 = int(json.loads(g.env.get(protocol.ENV_TRAINING_JSON, "{}")).get("global_batch_size", 32))
    except (ValueError, TypeError, AttributeError):
        m0 = 32
    raw = g.env.get(protocol.ENV_BATCH_JSON)
    if not raw:
        return m0, None
    d = json.loads(raw)
    return m0, BatchConfig(int(d["batch_size"]), int(d["local_bsz"]), int(d.get("accum_steps", 0)))


def _profiled_rate(w: SimWorkload, g: _Gang, parts: list[tuple[Offering, int]]) -> float:
    """Work per second of a profiled workload's gang: its goodput at its batch under the true model,
    relative to one reference GPU at the spec's batch; the slowest GPU sets the pace. Also sets the
    gang's profile row (step times on that GPU)."""
    assert w.profile is not None
    workers, per_node = gang_shape(parts)
    if workers == 0:
        return 0.0
    m0, batch = _gang_batch(g)
    if batch is None:  # the spec's batch, split over the GPUs (Pollux's split, no accumulation)
        local, accum = batching.split(m0, workers)
        batch = BatchConfig(m0, max(1, math.ceil(local)), int(accum))
    else:
        local = batching.local_of(batch.batch_size, workers, batch.accum_steps)
    g.batch = batch
    speed = min(accelerator_speed(o.accelerator) for o, n in parts if n > 0)
    truth = GoodputScaling(w.profile, init_batch_size=m0, max_batch_size=m0, grad=w.grad_stats)
    nodes = math.ceil(workers / per_node)
    step = float(w.profile.step_time(nodes, workers, local, batch.accum_steps))
    compute = (batch.accum_steps + 1) * float(w.profile.grad_time(local))
    g.row = (nodes, workers, local, batch.accum_steps, step / speed, max(0.0, step - compute) / speed)
    return speed * truth.speedup_at(workers, per_node, batch)


def _report_profile(job: _Job, now_s: float, out: protocol.ProgressRecord) -> None:
    """What a profiling runtime adds to its report: the profile (a row once the gang trains),
    the gradient statistics, the batch configuration."""
    w, g = job.workload, job.gang
    if w.profile is None:
        return
    if g is not None and g.row is not None and g.rate > 0 and now_s > g.resume_s:
        job.rows[g.row[:4]] = g.row[4:]
    if job.rows:
        keys = ("nodes", "replicas", "local_bsz", "accum_steps")
        out["profile"] = [{**dict(zip(keys, k)), "step_time_s": v[0], "sync_time_s": v[1]} for k, v in sorted(job.rows.items())]
    if w.grad_stats is not None:
        out["grad_sqr"], out["grad_var"] = w.grad_stats
    if g is not None and g.batch is not None and g.rate > 0:
        b = g.batch
        out["batch_size"], out["local_bsz"], out["accum_steps"] = b.batch_size, b.local_bsz, b.accum_steps
