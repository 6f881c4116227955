"""Making the instances match the policy's allocation: keep what fits, release surplus, launch what
is missing, and start a new gang once the whole allocation is up, with the batch configuration the
allocation carries (a running gang keeps its batch until it is changed anyway).

A running gang is changed only at a minibatch boundary: it is told to checkpoint and exit, and
replacements launch at once, overlapping its notice window. Where the move needs spot room the cloud
does not report (a real cloud; the local cloud without its oracle), the replacements launch first:
a capacity refusal then leaves the running gang running (the launch was the probe) and what the
move did launch goes back at once, instead of breaking a gang for room that was not there.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from sqlalchemy.orm import Session

from autoscaler.jobs.domain import JobState
from cloud_providers.base import SPOT, InstanceState, Offering

from ..policy import Allocation
from ..state import InstanceRow, Job
from .budget import end_over_budget, launch_over_budget
from .context import Context
from .gangs import start_gang, tell_gang_to_stop
from .goodput import rebatch_reason
from .launches import end_job, launch, release

log = logging.getLogger("spotrain.controller")

_USABLE = (InstanceState.RUNNING.value, InstanceState.PENDING.value)


def match(job: Job, alloc: Allocation, usable: list[InstanceRow]) -> tuple[list[InstanceRow], list[tuple[str, str]]]:
    """Instances to keep (gang members first, then the oldest) and ``(offering_key, market)`` to launch."""
    keep: list[InstanceRow] = []
    missing: list[tuple[str, str]] = []
    pool = sorted(usable, key=lambda r: (r.attempt != job.gang.attempt or not job.gang.attempt, r.launched_at_s))
    for p in alloc.placements:
        have = [r for r in pool if r.offering_key == p.offering_key and r.market == p.market and r not in keep]
        keep.extend(have[: p.instances])
        missing.extend([(p.offering_key, p.market)] * max(0, p.instances - len(have)))
    return keep, missing


def _gang_allowed(ctx: Context, job: Job, alloc: Allocation, by_key: Mapping[str, Offering]) -> bool:
    """A gang of the allocation's GPUs is one the spec allows (``workers.min..max``): whatever a
    policy asks, workers never start fewer than the job needs (after a preemption the job holds fewer
    until the policy fills the gang again)."""
    gpus = sum(p.instances * by_key[p.offering_key].gpus for p in alloc.placements if p.offering_key in by_key)
    w = ctx.spec(job).workers
    if w.min <= gpus <= w.max:
        return True
    log.warning("job %s: not starting a gang of %d GPU(s) outside workers %d..%d", job.job_id, gpus, w.min, w.max)
    return False


def apply(ctx: Context, s: Session, job: Job, alloc: Allocation, by_key: Mapping[str, Offering]) -> None:
    if alloc.outcome is not None:
        end_job(ctx, s, job, alloc.outcome.state, alloc.reason)
        return
    rows = ctx.store.instances(s, job.job_id, alive_only=True)
    usable = [r for r in rows if r.state in _USABLE]
    keep, missing = match(job, alloc, usable)
    surplus = [r for r in usable if r not in keep]
    if job.gang.attempt:
        ctx.releasing[job.job_id] = {r.instance_id for r in surplus}
        _change_running_gang(ctx, s, job, alloc, rows, keep, missing, surplus, by_key)
        return
    ctx.releasing.pop(job.job_id, None)
    for r in surplus:
        release(ctx, s, job, r, "not in the allocation")
    if not alloc.placements:
        if job.state != JobState.PENDING.value:
            ctx.transition(s, job, JobState.PENDING, alloc.reason or "waiting for capacity")
        return
    if (why := launch_over_budget(ctx, s, job, missing, by_key)) is not None:
        end_over_budget(ctx, s, job, why)
        return
    launch(ctx, s, job, missing, by_key)
    ready = [r for r in ctx.store.instances(s, job.job_id, alive_only=True) if r.state == InstanceState.RUNNING.value]
    want = sum(p.instances for p in alloc.placements)
    if len(ready) >= want and want > 0 and _gang_allowed(ctx, job, alloc, by_key):
        if ctx.start_failures.due(job.job_id, ctx.now()):  # a failed start waits its back-off
            start_gang(ctx, s, job, ready[:want], alloc.batch)
    elif job.state == JobState.PENDING.value:
        ctx.transition(s, job, JobState.PROVISIONING, f"provisioning {alloc.reason}")


def _change_running_gang(ctx: Context, s: Session, job: Job, alloc: Allocation, rows: list[InstanceRow],
                         keep: list[InstanceRow], missing: list[tuple[str, str]], surplus: list[InstanceRow],
                         by_key: Mapping[str, Offering]) -> None:
    gang = [r for r in rows if r.attempt == job.gang.attempt]
    if not (missing or surplus or {r.instance_id for r in gang} != {r.instance_id for r in keep}):
        _rebatch(ctx, s, job, alloc, gang)
        return
    if (why := launch_over_budget(ctx, s, job, missing, by_key)) is not None:
        growing = job.state == JobState.RUNNING.value and {r.instance_id for r in gang} <= {r.instance_id for r in keep}
        if not growing:
            end_over_budget(ctx, s, job, why)
        # A running gang that was only to grow keeps running as it is.
        return
    running = (job.state == JobState.RUNNING.value and not job.gang.stopping
               and not any(r.state == InstanceState.NOTICE.value for r in gang))
    if running and any(m == SPOT and k in by_key and by_key[k].spot_available is None for k, m in missing):
        launched, refused = launch(ctx, s, job, missing, by_key)
        if refused:
            ctx.releasing.pop(job.job_id, None)  # the move is off: the gang keeps what it holds
            for r in launched:
                release(ctx, s, job, r, "the move's other launches were refused: the gang keeps running")
            return
        tell_gang_to_stop(ctx, job, gang, "rescale")
        ctx.transition(s, job, JobState.RESCALING, f"resizing to {alloc.reason}")
        return
    if not job.gang.stopping and not any(r.state == InstanceState.NOTICE.value for r in gang):
        tell_gang_to_stop(ctx, job, gang, "rescale")
        ctx.transition(s, job, JobState.RESCALING, f"resizing to {alloc.reason}")
    # Launch replacements now, while the old gang checkpoints (overlaps the notice window).
    launch(ctx, s, job, missing, by_key)


def _rebatch(ctx: Context, s: Session, job: Job, alloc: Allocation, gang: list[InstanceRow]) -> None:
    """The allocation keeps the running gang but trains better at another batch: restart it at a
    minibatch boundary (checkpoint, exit, start again with ``alloc.batch``) when that pays."""
    if job.state != JobState.RUNNING.value or job.gang.stopping or any(r.state != InstanceState.RUNNING.value for r in gang):
        return
    gpus, per_node = sum(r.gpus for r in gang), max((r.gpus for r in gang), default=1)
    why = rebatch_reason(ctx, job, alloc.batch, gpus, per_node)
    if why is not None:
        tell_gang_to_stop(ctx, job, gang, "rescale")
        ctx.transition(s, job, JobState.RESCALING, why)
