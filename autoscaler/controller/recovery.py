"""Reconciliation with the cloud: at start-up after a crash, and on every tick while a launch is unsettled.

A controller can die at any moment, including between asking the cloud for an instance and recording
the answer. On start it
- resolves write-ahead launch decisions left pending: the instance carrying the decision's tag is
  adopted; a decision with no instance never launched and is marked failed (the launch is idempotent on
  the decision id, so asking again could not have made a second one either);
- adopts instances tagged with this controller that belong to live jobs but are missing from the
  database, and terminates every other instance tagged with this controller (orphans);
- terminates instances still alive for jobs that already ended;
- lets running gangs run on: their workers are detached processes that outlive the controller, and the
  next tick observes them as usual.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from sqlalchemy import select
from sqlalchemy.orm import Session

from cloud_providers.base import TAG_CONTROLLER, TAG_DECISION, TAG_JOB, Instance, InstanceState

from ..state import Decision, InstanceRow, Job, JobState
from .context import Context
from .launches import record_instance

log = logging.getLogger("spotrain.recovery")


def resolve_pending_decisions(
    ctx: Context, s: Session, jobs: Mapping[str, Job], cloud_instances: Iterable[Instance], *, why: str,
    grace_s: float = 0.0,
) -> dict[str, int]:
    """Settle launch decisions of this controller's jobs that are still pending: adopt the instance that
    carries the decision's tag, or mark the decision failed when the cloud has none."""
    counts = {"adopted": 0, "failed": 0}
    pending = list(s.scalars(select(Decision).where(Decision.status == "pending", Decision.job_id.in_(list(jobs)))))
    if not pending:
        return counts
    by_decision = {i.tags.get(TAG_DECISION): i for i in cloud_instances}
    for d in pending:
        job = jobs[d.job_id]
        inst = by_decision.get(d.decision_id)
        if inst is not None:
            record_instance(s, job, inst, offering_key=d.offering_key, market=d.market, decision_id=d.decision_id)
            d.status, d.instance_id = "launched", inst.instance_id
            ctx.note(s, job, "adopted", f"{inst.instance_id} from an unrecorded launch (decision {d.decision_id})")
            counts["adopted"] += 1
        elif ctx.now() - d.created_at >= grace_s:
            d.status, d.reason = "failed", f"no instance found for this decision {why}"
            counts["failed"] += 1
    s.flush()
    return counts


def adopt_or_terminate_unknown(
    ctx: Context, s: Session, jobs: Mapping[str, Job], cloud_instances: Iterable[Instance]
) -> dict[str, int]:
    """Live instances tagged with this controller that the database does not know (or knows for an
    ended job): adopt those of live jobs, terminate the rest."""
    counts = {"adopted": 0, "orphans_terminated": 0}
    for inst in cloud_instances:
        if not inst.alive:
            continue
        row = s.get(InstanceRow, inst.instance_id)
        job = jobs.get(inst.tags.get(TAG_JOB, ""))
        live = job is not None and not JobState(job.state).terminal
        if row is None and live and job is not None:
            record_instance(s, job, inst, offering_key=inst.offering_key, market=inst.market,
                            decision_id=inst.tags.get(TAG_DECISION, ""))
            ctx.note(s, job, "adopted", f"{inst.instance_id} found by tag")
            counts["adopted"] += 1
        elif not live or (row is not None and row.state == InstanceState.TERMINATED.value):
            # Orphans, and instances we released that the cloud still lists as alive: (re)terminate.
            ctx.executor.stop(inst.instance_id)
            ctx.provider.terminate(inst.instance_id)
            if row is not None and row.state != InstanceState.TERMINATED.value:
                row.state = InstanceState.TERMINATED.value
                row.terminated_at_s = ctx.provider.now_s()
            counts["orphans_terminated"] += 1
    s.flush()
    return counts


def sweep(ctx: Context, s: Session) -> None:
    """Make the cloud and the database agree, every few ticks and whenever a launch is unsettled.

    A launch call that raised after its retries leaves its decision pending, and it may still have
    launched (EC2's describe calls are eventually consistent, too): the instance carrying the
    decision's tag is adopted when it shows up; a decision with none is failed after a grace period.
    Any instance tagged with this controller that the database does not know is adopted if its job
    is live, else terminated, so nothing bills unseen until the next restart.
    """
    ctx.ticks += 1
    pending = list(s.scalars(select(Decision).join(Job, Decision.job_id == Job.job_id).where(
        Decision.status == "pending", Job.controller_id == ctx.controller_id)))
    if not pending and ctx.ticks % ctx.timings.sweep_every_ticks:
        return
    cloud = list(ctx.provider.list_instances({TAG_CONTROLLER: ctx.controller_id}))
    # Live jobs and those with a pending decision: an instance of any other job is an orphan whether
    # or not its job is loaded, so the sweep never loads every job ever submitted (issue 14, finding 5).
    jobs = {j.job_id: j for j in ctx.store.jobs(s, controller_id=ctx.controller_id, live_only=True)}
    for d in pending:
        job = s.get(Job, d.job_id)
        if job is not None:
            jobs.setdefault(job.job_id, job)
    resolved = resolve_pending_decisions(ctx, s, jobs, cloud, why="after a failed launch call",
                                         grace_s=ctx.timings.decision_grace_s)
    swept = adopt_or_terminate_unknown(ctx, s, jobs, cloud)
    counts = {"adopted": resolved["adopted"] + swept["adopted"], "orphans_terminated": swept["orphans_terminated"],
              "decisions_failed": resolved["failed"]}
    if any(counts.values()):
        # The same figures as recovery's line: an operator (and the chaos test) sees every orphan the
        # controller terminated, whether the restart or a later sweep found it.
        log.info("sweep: %s", counts)


def _reconcile_rows(ctx: Context, s: Session, job: Job, cloud_instances: Mapping[str, Instance]) -> int:
    """The database's view of one job's instances against the cloud's; returns how many were released."""
    released = 0
    for row in ctx.store.instances(s, job.job_id, alive_only=True):
        inst = cloud_instances.get(row.instance_id)
        if inst is None or not inst.alive:
            ctx.executor.stop(row.instance_id)
            row.state = InstanceState.TERMINATED.value
            row.terminated_at_s = (inst.terminated_at_s if inst else None) or ctx.provider.now_s()
            if inst is not None and inst.interruption and not row.interruption:
                # Preempted while no controller watched (notice and termination both missed):
                # count it here, as a live controller does, since no later poll will.
                row.interruption = inst.interruption
                job.preemptions += 1
                ctx.note(s, job, "instance-terminated",
                         f"{row.instance_id} terminated ({row.interruption}) while the controller was down")
        elif JobState(job.state).terminal:
            ctx.executor.stop(row.instance_id)
            ctx.provider.terminate(row.instance_id)
            row.state = InstanceState.TERMINATED.value
            row.terminated_at_s = ctx.provider.now_s()
            released += 1
    return released


def recover(ctx: Context) -> dict[str, int]:
    """Reconcile; returns counts (adopted, orphans_terminated, decisions_failed, released) for the log.
    The caller holds the controller's lock."""
    counts = {"adopted": 0, "orphans_terminated": 0, "decisions_failed": 0, "released": 0}
    with ctx.store.session() as s:
        cloud_instances = {i.instance_id: i for i in ctx.provider.list_instances({TAG_CONTROLLER: ctx.controller_id})}
        # Live jobs, and ended ones that still hold an instance or a pending launch: an instance of
        # any other job is an orphan whether or not its job is loaded, so recovery reads the few
        # unsettled jobs, not every job ever submitted (issue 21, finding 7: ~57 s at 10,000 finished
        # jobs, long enough for a standby to take over mid-recovery).
        unsettled = sorted(ctx.store.unsettled_jobs(s, ctx.controller_id))
        jobs = {j.job_id: j for j in s.scalars(select(Job).where(Job.job_id.in_(unsettled)).order_by(Job.submitted_at))}
        resolved = resolve_pending_decisions(ctx, s, jobs, cloud_instances.values(), why="after a restart")
        counts["adopted"] += resolved["adopted"]
        counts["decisions_failed"] += resolved["failed"]
        s.flush()
        swept = adopt_or_terminate_unknown(ctx, s, jobs, cloud_instances.values())
        counts["adopted"] += swept["adopted"]
        counts["orphans_terminated"] += swept["orphans_terminated"]
        for job in jobs.values():
            counts["released"] += _reconcile_rows(ctx, s, job, cloud_instances)
        for job in (j for j in jobs.values() if not JobState(j.state).terminal):
            ctx.note(s, job, "controller-restart", f"controller {ctx.controller_id} recovered: {counts}")
    log.info("recovery: %s", counts)
    return counts
