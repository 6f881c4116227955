"""Launching and releasing instances: write-ahead launch decisions, so a crash never launches twice.

A launch decision is committed before the cloud is asked; the launch is idempotent on its id, and the
instance carries it as a tag, so recovery (``recovery.py``) can always tell whether it happened.
Capacity and quota refusals fail over: the policy avoids the offering for a while.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping

from sqlalchemy.orm import Session

from autoscaler.fleet import accounting
from autoscaler.jobs.domain import JobState
from cloud_providers.base import (
    SPOT,
    TAG_CONTROLLER,
    TAG_DECISION,
    TAG_JOB,
    TAG_MARKET,
    Instance,
    InstanceState,
    LaunchRequest,
    Offering,
)
from cloud_providers.errors import CapacityUnavailable, InvalidRequest, ProviderError, QuotaExceeded

from ..errors import Conflict
from ..state import Decision, InstanceRow, Job
from .context import Context, gpus_of
from .faults import maybe_crash_after_launch


def launch(ctx: Context, s: Session, job: Job, missing: list[tuple[str, str]], by_key: Mapping[str, Offering]
           ) -> tuple[list[InstanceRow], list[tuple[str, str]]]:
    """Launch one instance per ``(offering_key, market)`` in ``missing``. Returns the rows launched and
    the ``(offering_key, market)`` the cloud refused (capacity, quota, an invalid request)."""
    launched: list[InstanceRow] = []
    refused: list[tuple[str, str]] = []
    for key, market in missing:
        o = by_key.get(key)
        if o is None:
            continue
        decision = Decision(
            decision_id=f"d-{uuid.uuid4().hex[:20]}", job_id=job.job_id, offering_key=key, market=market,
            created_at=ctx.now(),
        )
        s.add(decision)
        s.commit()  # write-ahead: the decision is durable before the cloud is asked
        if not ctx.leading():
            # The lease ran out since the commit (a paused leader): the decision stays pending for
            # the new leader to settle, and this controller does not ask the cloud.
            raise Conflict(f"controller {ctx.controller_id} lost its lease before launching {decision.decision_id}")
        tags = {TAG_JOB: job.job_id, TAG_CONTROLLER: ctx.controller_id, TAG_MARKET: market, TAG_DECISION: decision.decision_id}
        try:
            inst = ctx.provider.launch(LaunchRequest(offering=o, market=market, decision_id=decision.decision_id, tags=tags))
        except (CapacityUnavailable, QuotaExceeded, InvalidRequest) as exc:
            # Capacity and quota: fail over (the policy avoids this offering for a while).
            # An invalid request is not retried as is either. Throttling, credentials and other
            # provider errors propagate: the tick is skipped and retried.
            decision.status = "failed"
            decision.reason = f"{type(exc).__name__}: {exc}"
            ctx.capacity_failures.setdefault(job.job_id, {})[f"{key}|{market}"] = ctx.provider.now_s()
            if market == SPOT and isinstance(exc, CapacityUnavailable):
                ctx.rooms.saw(key, ctx.provider.now_s(), False)  # an observation, not a preemption
            ctx.note(s, job, "capacity", f"{key} ({market}): {exc}")
            s.commit()
            refused.append((key, market))
            continue
        if market == SPOT:
            ctx.rooms.saw(key, ctx.provider.now_s(), True)
        maybe_crash_after_launch()
        launched.append(record_instance(s, job, inst, offering_key=key, market=market, decision_id=decision.decision_id))
        decision.status = "launched"
        decision.instance_id = inst.instance_id
        ctx.note(s, job, "launched", f"{inst.instance_id} on {key} ({market})")
        s.commit()
    return launched, refused


def record_instance(s: Session, job: Job, inst: Instance, *, offering_key: str, market: str, decision_id: str) -> InstanceRow:
    """Record an instance the cloud reported (launched now, or found by tag after a crash)."""
    row = s.get(InstanceRow, inst.instance_id)
    if row is not None and row.job_id != job.job_id:
        raise ProviderError(f"instance id {inst.instance_id} is already recorded for job {row.job_id}")
    if row is None:
        row = InstanceRow(
            instance_id=inst.instance_id, job_id=job.job_id, cloud=offering_key.split("/")[0],
            offering_key=offering_key, market=market, region=inst.region, tags_json=json.dumps(dict(inst.tags)),
            gpus=gpus_of(offering_key), state=inst.state.value, decision_id=decision_id,
            launched_at_s=inst.launched_at_s,
        )
        s.add(row)
    return row


def release(ctx: Context, s: Session, job: Job, row: InstanceRow, why: str) -> None:
    ctx.executor.stop(row.instance_id)
    ctx.provider.terminate(row.instance_id)
    if row.state != InstanceState.TERMINATED.value:
        row.state = InstanceState.TERMINATED.value
        row.terminated_at_s = ctx.provider.now_s()
        ctx.note(s, job, "released", f"{row.instance_id}: {why}")


def release_all(ctx: Context, s: Session, job: Job, why: str = "job ended") -> None:
    for r in ctx.store.instances(s, job.job_id, alive_only=True):
        release(ctx, s, job, r, why)
    rows = ctx.store.instances(s, job.job_id)
    accounting.bill_job(ctx.provider, job, rows)


def end_job(ctx: Context, s: Session, job: Job, to: JobState, reason: str, *, why: str = "job ended") -> None:
    """Release everything the job holds and move it to the terminal state ``to``."""
    release_all(ctx, s, job, why)
    job.gang.attempt = 0
    job.gang.stopping = ""
    job.gang.stop_deadline = None
    if not JobState(job.state).terminal:
        job.finished_clock_s = ctx.provider.now_s()
    ctx.transition(s, job, to, reason)
    ctx.forget(job.job_id)

