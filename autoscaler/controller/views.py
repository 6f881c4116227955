"""What the controller shows: the policy's view of a job, and the job's summary for the API and CLI.

``job_view`` is the one ``JobView`` builder: the controller builds every view through it, on the wall
clock as a service and on the virtual clock as the simulator. Its ``scaling`` is the job's goodput
function once the workers reported a profile (``goodput.scaling_for``), else the spec's. ``job_summary`` lives in the light
``autoscaler.jobs.summary`` (the CLI's ``status`` reads it without importing the controller) and is
re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from autoscaler.jobs.domain import JobState
from autoscaler.jobs.summary import job_summary
from cloud_providers.base import InstanceState, Offering

from ..policy import Held, JobView
from ..state import InstanceRow, Job
from .context import Context
from .goodput import scaling_for

__all__ = ["held_from_counts", "held_of", "job_view", "job_summary", "progress_of"]

_USABLE = (InstanceState.RUNNING.value, InstanceState.PENDING.value)


def held_of(rows: Sequence[InstanceRow], by_key: Mapping[str, Offering], releasing: frozenset[str] | set[str] = frozenset()
            ) -> tuple[Held, ...]:
    """What the job holds: its live instances, less those the last allocation already let go."""
    groups: dict[tuple[str, str], int] = {}
    for r in rows:
        if r.state in _USABLE and r.instance_id not in releasing:
            groups[(r.offering_key, r.market)] = groups.get((r.offering_key, r.market), 0) + 1
    return held_from_counts(groups, by_key)


def held_from_counts(groups: Mapping[tuple[str, str], int], by_key: Mapping[str, Offering]) -> tuple[Held, ...]:
    """The policy's ``held`` of instance counts per (offering key, market), in one order (the
    simulator's fast path holds counts)."""
    return tuple(Held(k, m, n, by_key[k].gpus if k in by_key else 1) for (k, m), n in sorted(groups.items()) if n > 0)


def progress_of(step: int, total_steps: int | None) -> float | None:
    """The fraction of the job done, as the policy sees it: whole steps reported over the total."""
    return min(1.0, step / total_steps) if total_steps else None


def _since_checkpoint_s(ctx: Context, job: Job) -> float | None:
    """Seconds of the running gang's work a preemption without time to checkpoint would lose: since
    its last checkpoint, or since its training moved again (it resumed from one); 0 with no gang
    making progress."""
    if job.last_checkpoint_step is None:
        return None
    seen = ctx.last_checkpoint.get(job.job_id)
    if seen is None or seen[0] != job.last_checkpoint_step:
        seen = (job.last_checkpoint_step, ctx.now())
        ctx.last_checkpoint[job.job_id] = seen
    moving = ctx.moving_since.get(job.job_id)
    if not job.gang.attempt or moving is None or moving[0] != job.gang.attempt:
        return 0.0
    return max(0.0, ctx.now() - max(seen[1], moving[1])) * ctx.clock_rate


def job_view(ctx: Context, job: Job, rows: Sequence[InstanceRow], by_key: Mapping[str, Offering]) -> JobView:
    spec = ctx.spec(job)
    gang = [r for r in rows if job.gang.attempt and r.attempt == job.gang.attempt]
    # A gang that is restarting anyway (lost or given notice, or between attempts) pays no extra
    # restart for a change of allocation.
    restarting = (job.state in (JobState.RECOVERING.value, JobState.RESCALING.value) or not job.gang.attempt
                  or any(r.state in (InstanceState.NOTICE.value, InstanceState.TERMINATED.value) for r in gang))
    return JobView(
        job_id=job.job_id,
        spec=spec,
        submitted_s=job.submitted_clock_s,
        progress=progress_of(job.step, job.total_steps),
        held=held_of(rows, by_key, ctx.releasing.get(job.job_id, set())),
        cost_so_far_usd=job.cost_usd,
        restart_overhead_s=job.restart_overhead_s,
        recent_capacity_failures=dict(ctx.capacity_failures.get(job.job_id, {})),
        scaling=scaling_for(ctx, job, spec),
        since_checkpoint_s=_since_checkpoint_s(ctx, job),
        restarting=restarting,
        state_location=(job.state_location or None) if (job.step > 0 or job.last_checkpoint_step is not None) else None,
        checkpoint_size_gb=job.checkpoint_size_gb,
        region_moves=job.region_moves or 0,
    )
