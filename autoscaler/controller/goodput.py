"""The controller's goodput model of each job (issue 11, item 5; docs/goodput.md "controller").

Rank 0's progress reports carry, besides the step, the job's *profile* (one row per configuration it
trained at: nodes, replicas, per-GPU batch, accumulation steps, seconds per optimizer step and the
non-overlapped wait for gradient synchronisation) and its gradient statistics (``grad_sqr``,
``grad_var`` at the initial batch size). ``record_report`` keeps them on the job's row (``profile_json``,
``grad_sqr``, ``grad_var``: they survive a controller restart); ``scaling_for`` gives the policy the
job's goodput function as a ``GoodputScaling`` (``autoscaler.jobs.scaling``), through the one ``JobView``
builder.

Bounded cost per tick: the throughput model is refitted (``ThroughputModel.fit``, tens of
milliseconds for a job's few rows) only when the profile changed, at once when a new configuration
arrived and otherwise at most every ``REFIT_EVERY_S`` of the controller's clock, and at most
``MAX_FITS_PER_TICK`` times per tick over all jobs (a job whose turn has not come keeps its last model).

Before any data the job's scaling is what it was: the spec's ``simulate.scaling`` (or the simulator's
model), else the policy's prior. Gradient statistics without a profile refine a spec profile's model;
with neither there is nothing to fit.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlalchemy.orm import Session

from autoscaler.jobs.scaling import BatchConfig, GoodputScaling, batch_limits
from autoscaler.jobs.spec import JobSpec
from cost_models import batching
from cost_models.goodput import ThroughputModel
from cost_models.scaling import ProfileScaling, Scaling

from ..policy.jobmath import DEFAULT_RESTART_OVERHEAD_S
from ..policy.params import DEFAULT_PARAMS
from ..state import Job
from .fits import JobFit

if TYPE_CHECKING:
    from .context import Context

# A changed measurement of a known configuration is kept only when it moved by more than this share.
PROFILE_TOLERANCE = 0.02
# Gradient statistics are kept when they moved by more than this share (they drift every step).
GRAD_TOLERANCE = 0.05
# Configurations kept per job (a report is bounded too: the remote wire caps its size).
MAX_PROFILE_ROWS = 64
# Controller-clock seconds between two refits of a job's model when no new configuration arrived.
REFIT_EVERY_S = 300.0
BATCH_EVENT = "batch"
LR_EVENT = "lr"
# Who chose a batch (DESIGN.md wave 3): ``controller`` (a directive from the policy) or ``runtime``
# (the runtime's own choice, only when no controller runs the job). ``batch`` and ``lr`` events end
# with ``; source=<who>`` (at the end, so that readers of the reason's start keep working).
SOURCE_CONTROLLER = "controller"
SOURCE_RUNTIME = "runtime"


def _by(source: str) -> str:
    return f"; source={source}"
# A learning-rate factor the workers report (AdaScale's gain moves with the noise estimates) is an
# event when it moved by more than this share since the last one noted, or with a batch change.
LR_TOLERANCE = 0.10

_Row = tuple[int, int, float, int, float, float | None]  # nodes, replicas, local_bsz, accum, step_s, sync_s


# ----- reading reports ---------------------------------------------------------------------------------


def _num(v: Any, lo: float, hi: float) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v) if lo <= v <= hi else None


def parse_row(r: Any) -> _Row | None:
    """One reported profile row, or None when any field is missing, not finite or out of range."""
    if not isinstance(r, Mapping):
        return None
    n, k = _num(r.get("nodes"), 1, 4096), _num(r.get("replicas"), 1, 65536)
    m, a = _num(r.get("local_bsz"), 1e-9, 2**20), _num(r.get("accum_steps", 0), 0, 4096)
    t = _num(r.get("step_time_s"), 1e-9, 1e5)
    if n is None or k is None or m is None or a is None or t is None:
        return None
    if n != int(n) or k != int(k) or a != int(a) or n > k:
        return None
    sync = _num(r.get("sync_time_s"), 0.0, t) if r.get("sync_time_s") is not None else None
    return (int(n), int(k), m, int(a), t, sync)


def load_rows(profile_json: str) -> list[_Row]:
    if not profile_json:
        return []
    try:
        raw = json.loads(profile_json)
    except ValueError:
        return []
    return [r for r in (parse_row(x) for x in raw) if r is not None] if isinstance(raw, list) else []


def _dump_rows(rows: list[_Row]) -> str:
    keys = ("nodes", "replicas", "local_bsz", "accum_steps", "step_time_s", "sync_time_s")
    return json.dumps([dict(zip(keys, r)) for r in sorted(rows, key=lambda r: r[:4])], separators=(",", ":"))


def _moved(old: float | None, new: float | None, tol: float) -> bool:
    if old is None or new is None:
        return old is not new
    return abs(new - old) > tol * max(abs(old), 1e-12)


def merge_profile(stored: str, reported: Any) -> str:
    """The stored profile with the reported rows merged in (new configurations added up to
    ``MAX_PROFILE_ROWS``; a known one replaced when its times moved by more than the tolerance)."""
    if not isinstance(reported, list):
        return stored
    rows = {r[:4]: r for r in load_rows(stored)}
    changed = False
    for raw in reported[: 4 * MAX_PROFILE_ROWS]:
        r = parse_row(raw)
        if r is None:
            continue
        old = rows.get(r[:4])
        if old is None and len(rows) >= MAX_PROFILE_ROWS:
            continue
        if old is None or _moved(old[4], r[4], PROFILE_TOLERANCE) or _moved(old[5], r[5], PROFILE_TOLERANCE):
            rows[r[:4]] = r
            changed = True
    return _dump_rows(list(rows.values())) if changed else stored


def record_report(ctx: Context, s: Session, job: Job, prog: Mapping[str, Any]) -> None:
    """Keep the report's profile and gradient statistics on the job; note a batch change the runtime
    made on its own (``batch_size`` in the report differs from the one recorded)."""
    if "profile" in prog:
        job.profile_json = merge_profile(job.profile_json or "", prog["profile"])
    sqr, var = _num(prog.get("grad_sqr"), 0.0, 1e30), _num(prog.get("grad_var"), 0.0, 1e30)
    if sqr is not None and var is not None and (
            _moved(job.grad_sqr, sqr, GRAD_TOLERANCE) or _moved(job.grad_var, var, GRAD_TOLERANCE)):
        job.grad_sqr, job.grad_var = sqr, var
    reported = _reported_batch(prog)
    lr = _num(prog.get("lr_factor"), 1e-6, 1e6)
    # Only the running gang's own reports: the last report of the gang before it (its step is the
    # checkpoint this gang started from) may arrive after this gang was told another batch.
    step = _num(prog.get("step"), 0, 2**62)
    if reported is not None and job.gang.attempt and step is not None and step > job.gang.start_step:
        current = batch_of(job)
        size = current.batch_size if current is not None else ctx.spec(job).training.global_batch_size
        # The workers say who chose their batch; a runtime that does not say followed a directive
        # when its gang got one (the controller records it in ``batch_json``).
        who = prog.get("batch_source")
        source = who if who in (SOURCE_CONTROLLER, SOURCE_RUNTIME) else _noted(job, "source") or SOURCE_RUNTIME
        if size != reported.batch_size:
            at_lr = f", LR x{lr:.2f}" if lr is not None else ""
            ctx.note(s, job, BATCH_EVENT, f"the workers changed to {reported.describe()}{at_lr}{_by(source)}")
            job.batch_json = json.dumps({**reported.to_json(), "source": source,
                                         **({"lr_factor": lr} if lr is not None else {})})
        elif current is not None and lr is not None and _moved(_noted_lr(job), lr, LR_TOLERANCE):
            was = _noted_lr(job)
            ctx.note(s, job, LR_EVENT, f"learning-rate factor {f'x{was:.2f} -> ' if was is not None else ''}x{lr:.2f} "
                                       f"at batch {size} ({ctx.spec(job).training.lr_scaling}){_by(source)}")
            job.batch_json = json.dumps({**current.to_json(), "source": source, "lr_factor": lr})


def _noted_lr(job: Job) -> float | None:
    """The learning-rate factor last noted for the job's gang (kept beside its batch), if any."""
    value = _noted(job, "lr_factor")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _noted(job: Job, key: str) -> Any:
    """A field kept beside the gang's batch (``lr_factor``, ``source``), if any."""
    try:
        return json.loads(job.batch_json).get(key) if job.batch_json else None
    except (ValueError, AttributeError):
        return None


def _reported_batch(prog: Mapping[str, Any]) -> BatchConfig | None:
    b, m = _num(prog.get("batch_size"), 1, 2**40), _num(prog.get("local_bsz"), 1, 2**30)
    a = _num(prog.get("accum_steps", 0), 0, 4096)
    if b is None or m is None or a is None:
        return None
    return BatchConfig(int(b), int(m), int(a))


def batch_of(job: Job) -> BatchConfig | None:
    """The batch configuration the job's gang was last told (or reported) to train with."""
    if not job.batch_json:
        return None
    try:
        d = json.loads(job.batch_json)
        return BatchConfig(int(d["batch_size"]), int(d["local_bsz"]), int(d.get("accum_steps", 0)))
    except (ValueError, KeyError, TypeError):
        return None


def gang_directive(spec: JobSpec, batch: BatchConfig | None, gpus: int) -> BatchConfig | None:
    """The batch a new gang of ``gpus`` GPUs is told to train at: the allocation's, else, for an
    adaptive job, the spec's batch laid out on those GPUs (``cost_models.batching.plan``). An adaptive
    gang always gets a directive, so the runtime knows a controller runs it and leaves the batch to
    the policy (before, a gang started before the job had a model got none, and the runtime
    re-optimized on its own: every batch change of a live job was the runtime's)."""
    t = spec.training
    if batch is not None or t.batch_policy != "adaptive" or gpus < 1:
        return batch
    p = batching.plan(t.global_batch_size, world_size=gpus, logical_workers=t.logical_workers,
                      max_local_bsz=t.max_local_batch_size)
    return BatchConfig(p.batch_size, p.local_bsz, p.accum_steps)


def note_gang_batch(ctx: Context, s: Session, job: Job, batch: BatchConfig | None, gpus: int) -> None:
    """A new gang starts with ``batch`` (None: the spec's batch): record it, and a ``batch`` event
    (source controller) when it changed (the total batch, or its layout on the new gang)."""
    before = batch_of(job)
    if batch == before:
        return
    m0 = ctx.spec(job).training.global_batch_size
    if batch is None:
        ctx.note(s, job, BATCH_EVENT, f"back to the spec's batch {m0}{_by(SOURCE_CONTROLLER)}")
        job.batch_json = ""
        return
    if before is not None or batch.batch_size != m0:  # the spec's batch at the first gang is no change
        was = f"from {before.batch_size}" if before is not None else f"from the spec's {m0}"
        ctx.note(s, job, BATCH_EVENT, f"{batch.describe(gpus)}, {was}{_by(SOURCE_CONTROLLER)}")
    job.batch_json = json.dumps({**batch.to_json(), "source": SOURCE_CONTROLLER})


# ----- the job's goodput function for the policy -------------------------------------------------------


def _fit(rows: list[_Row]) -> ThroughputModel | None:
    n, k, m, a, t = (np.array([r[i] for r in rows], dtype=np.float64) for i in range(5))
    sync = np.array([r[5] if r[5] is not None else 0.0 for r in rows], dtype=np.float64)
    has_sync = any(r[5] is not None for r in rows)
    try:
        return ThroughputModel.fit(n, k, m, t, sync if has_sync else None, a)
    except (ValueError, ArithmeticError, np.linalg.LinAlgError):
        return None  # a profile the model cannot fit: the job keeps the spec's scaling


def scaling_for(ctx: Context, job: Job, spec: JobSpec) -> Scaling | None:
    """The job's scaling for the policy: a ``GoodputScaling`` once it reported a profile or gradient
    statistics (see the module doc for when it is refitted), else ``ctx.scaling_of`` (the spec's)."""
    base = ctx.scaling_of(job.job_id, spec)
    profile = job.profile_json or ""
    grad = (job.grad_sqr, job.grad_var) if job.grad_sqr is not None and job.grad_var is not None else None
    key = (profile, job.grad_sqr, job.grad_var)
    fits = ctx.goodput
    fit = fits.jobs.get(job.job_id)
    if fit is not None and fit.key == key:
        return fit.scaling or base
    if not profile and grad is None:
        return base
    rows = load_rows(profile)
    new_config = fit is None or len(rows) != fit.configs
    if fit is not None and not new_config and ctx.now() - fit.at < REFIT_EVERY_S:
        return fit.scaling or base
    model = fit.model if fit is not None and fit.profile_json == profile else None
    if model is None and rows:
        if not fits.take(ctx.ticks):
            return (fit.scaling if fit is not None else None) or base
        model = _fit(rows)
    if model is None and isinstance(base, ProfileScaling):
        model = base.model
    scaling: Scaling | None = None
    if model is not None:
        m0, cap, local = batch_limits(spec)
        try:
            scaling = GoodputScaling(model, init_batch_size=m0, max_batch_size=cap, max_local_bsz=local,
                                     grad=grad, adaptive=spec.training.batch_policy == "adaptive",
                                     logical_workers=spec.training.logical_workers)
        except ValueError:
            scaling = None  # a degenerate fit (no throughput on one GPU): the spec's scaling
    fits.jobs[job.job_id] = JobFit(key, profile, len(rows), ctx.now(), model, scaling)
    return scaling or base


def remaining_s(ctx: Context, job: Job) -> float | None:
    """The job's measured remaining time on the controller's clock: the steps left (the workers'
    ``total_steps`` minus their ``step``) at the seconds per step the running gang reported. None
    when the gang has not reported both."""
    seen = ctx.step_seconds.get(job.job_id)
    if seen is None or seen[0] != job.gang.attempt or not job.total_steps:
        return None
    return max(0, job.total_steps - job.step) * seen[1]


def rebatch_reason(ctx: Context, job: Job, batch: BatchConfig | None, gpus: int, per_node: int) -> str | None:
    """Why the running gang of ``gpus`` GPUs should restart to train at ``batch`` (None: it should
    not): ``cost_models.batching.rebatch_pays`` with the policy's thresholds (``PolicyParams``), over
    the job's measured remaining time (``remaining_s``; the spec's ``simulate.work_gpu_hours`` is only
    an estimate, and a live job knows better)."""
    fit = ctx.goodput.jobs.get(job.job_id)
    if batch is None or fit is None or not isinstance(fit.scaling, GoodputScaling) or gpus <= 0:
        return None
    spec = ctx.spec(job)
    current = batch_of(job) or gang_directive(spec, None, gpus)
    if current is None:
        m0 = spec.training.global_batch_size
        local, accum = batching.split(m0, gpus)
        current = BatchConfig(m0, max(1, math.ceil(local)), int(accum))
    if current.batch_size == batch.batch_size and current.accum_steps == batch.accum_steps:
        return None
    left_s = remaining_s(ctx, job)
    if left_s is None:
        return None
    old = fit.scaling.speedup_at(gpus, per_node, current)
    new = fit.scaling.speedup(gpus, per_node)
    d = job.restart_overhead_s if job.restart_overhead_s is not None else DEFAULT_RESTART_OVERHEAD_S
    rule = getattr(ctx.policy, "params", DEFAULT_PARAMS).rebatch
    if not batching.rebatch_pays(old, new, remaining_s=left_s, restart_s=d, rule=rule):
        return None
    return (f"re-batching to {batch.describe(gpus)}: {100 * (new / old - 1):.0f} % more goodput than batch "
            f"{current.batch_size}, over {left_s:.0f} s of measured remaining work")
