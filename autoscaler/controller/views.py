"""What the controller shows: the policy's view of a job, and the job's summary for the API and CLI.

``job_view`` is the one ``JobView`` builder: the controller builds every view through it, on the wall
clock as a service and on the virtual clock as the simulator.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence

from cloud_providers.base import ON_DEMAND, SPOT, InstanceState, Offering

from ..domain import JobState
from ..errors import SpotrainError
from ..policy import Held, JobView
from ..schemas import JobSummary, Worker
from ..spec import spec_from_stored
from ..state import InstanceRow, Job
from .context import Context
from .outcomes import split_reason

_USABLE = (InstanceState.RUNNING.value, InstanceState.PENDING.value)


def held_of(rows: Sequence[InstanceRow], by_key: Mapping[str, Offering], releasing: frozenset[str] | set[str] = frozenset()
            ) -> tuple[Held, ...]:
    """What the job holds: its live instances, less those the last allocation already let go."""
    groups: dict[tuple[str, str], int] = {}
    for r in rows:
        if r.state in _USABLE and r.instance_id not in releasing:
            groups[(r.offering_key, r.market)] = groups.get((r.offering_key, r.market), 0) + 1
    return tuple(Held(k, m, n, by_key[k].gpus if k in by_key else 1) for (k, m), n in sorted(groups.items()))


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
    if not job.gang_attempt or moving is None or moving[0] != job.gang_attempt:
        return 0.0
    return max(0.0, ctx.now() - max(seen[1], moving[1])) * ctx.clock_rate


def job_view(ctx: Context, job: Job, rows: Sequence[InstanceRow], by_key: Mapping[str, Offering]) -> JobView:
    spec = ctx.spec(job)
    gang = [r for r in rows if job.gang_attempt and r.attempt == job.gang_attempt]
    # A gang that is restarting anyway (lost or given notice, or between attempts) pays no extra
    # restart for a change of allocation.
    restarting = (job.state in (JobState.RECOVERING.value, JobState.RESCALING.value) or not job.gang_attempt
                  or any(r.state in (InstanceState.NOTICE.value, InstanceState.TERMINATED.value) for r in gang))
    return JobView(
        job_id=job.job_id,
        spec=spec,
        submitted_s=job.submitted_clock_s,
        progress=min(1.0, job.step / job.total_steps) if job.total_steps else None,
        held=held_of(rows, by_key, ctx.releasing.get(job.job_id, set())),
        cost_so_far_usd=job.cost_usd,
        restart_overhead_s=job.restart_overhead_s,
        recent_capacity_failures=dict(ctx.capacity_failures.get(job.job_id, {})),
        scaling=ctx.scaling_of(job.job_id, spec),
        since_checkpoint_s=_since_checkpoint_s(ctx, job),
        restarting=restarting,
    )


def _deadline_met(job: Job) -> bool | None:
    """DESIGN.md's ``deadline_met``: for an ended job with ``objective.deadline``, whether it succeeded
    within the deadline, measured on the provider clock from submission (the clock the policy plans
    deadlines on; the controller clock runs slower on a time-compressed local cloud). Null while the
    job runs, without a deadline, or for a job that ended before its finish was recorded."""
    if not JobState(job.state).terminal:
        return None
    try:
        deadline_s = spec_from_stored(json.loads(job.spec_json)).objective.deadline_s
    except (ValueError, SpotrainError):
        return None
    if deadline_s is None:
        return None
    if job.state != JobState.SUCCEEDED.value:
        return False
    if job.finished_clock_s is None:
        return None
    return job.finished_clock_s - job.submitted_clock_s <= deadline_s


def job_summary(job: Job, rows: Sequence[InstanceRow], *, now: float | None = None) -> JobSummary:
    """The job as the API and the CLI show it (``schemas.JobSummary``). ``now``: the controller
    clock, for a live job's wall time (default: the wall clock)."""
    now = time.time() if now is None else now
    live = [r for r in rows if r.state != InstanceState.TERMINATED.value]
    by_market: dict[str, float] = {}
    for r in rows:
        by_market[r.market] = by_market.get(r.market, 0.0) + r.cost_usd
    reason, error_tail = split_reason(job.reason or "")
    return JobSummary(
        job_id=job.job_id,
        name=job.name,
        state=JobState(job.state),
        reason=reason,
        error_tail=error_tail,
        cloud=job.cloud,
        preemptions=job.preemptions,
        restarts_on_errors=job.restarts_on_errors,
        attempts=job.attempt,
        cost_usd=round(job.cost_usd, 6),
        on_demand_cost_usd=round(job.on_demand_cost_usd, 6),
        cost_by_market_usd={k: round(v, 6) for k, v in sorted(by_market.items())},
        metric=job.metric,
        metric_name=job.metric_name or None,
        loss=job.loss,
        step=job.step,
        total_steps=job.total_steps,
        last_checkpoint_step=job.last_checkpoint_step,
        final_model=job.final_model if job.state == JobState.SUCCEEDED.value else None,
        checkpoint_uri=job.checkpoint_uri,
        submitted_at=job.submitted_at,
        finished_at=job.finished_at,
        wall_s=(job.finished_at or now) - job.submitted_at,
        restart_overhead_s=job.restart_overhead_s,
        workers=[
            Worker(instance_id=r.instance_id, offering=r.offering_key, market=r.market, state=InstanceState(r.state),
                   gpus=r.gpus)
            for r in live
        ],
        spot_seconds=round(sum(r.billed_seconds for r in rows if r.market == SPOT), 3),
        on_demand_seconds=round(sum(r.billed_seconds for r in rows if r.market == ON_DEMAND), 3),
        deadline_met=_deadline_met(job),
    )
