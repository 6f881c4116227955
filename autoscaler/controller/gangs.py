"""The gang: a job's workers of one attempt, started together, observed together, ended together.

A gang starts when every instance of the allocation is up; any change of its instances (a rescale, a
preemption, a lost machine) ends it at a minibatch boundary with a checkpoint, and the next attempt
resumes from it. Infrastructure failures are always recovered; a user-code failure is retried at
most ``retries.max_restarts_on_errors`` times (Philly: most failures are user bugs that must not be
retried forever).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session

from autoscaler.jobs.domain import JobState
from autoscaler.jobs.scaling import BatchConfig
from cloud_providers import protocol
from cloud_providers.base import SPOT, InstanceState
from cloud_providers.executor import GangState, WorkerLaunch

from ..policy.moves import carry_state, gang_location
from ..state import InstanceRow, Job
from ..state.models import ProgressSample
from . import outcomes, start_failures
from .context import Context
from .goodput import gang_directive, note_gang_batch, record_report
from .launches import end_job

log = logging.getLogger("spotrain.controller")

# Largest step count a report may carry (a bad report must not overflow the database).
MAX_STEP = 2**53


def on_instance_change(ctx: Context, s: Session, row: InstanceRow, state: InstanceState, interruption: str | None,
                       terminated_at_s: float | None) -> None:
    """Apply what the cloud reported of one instance (a notice, up, gone)."""
    job = s.get(Job, row.job_id)
    if state is InstanceState.NOTICE and not row.notice_delivered:
        row.state = state.value
        row.interruption = interruption or "preemption"
        row.notice_delivered = 1
        if row.market == SPOT:
            ctx.rooms.saw(row.offering_key, ctx.provider.now_s(), False)  # the cloud took its room back
        # Every rank must stop at the same boundary; the runtime agrees on it, and telling the whole
        # gang as well keeps workers that cannot agree (a crashed peer) from waiting in a collective.
        notice = {"reason": protocol.NOTICE_PREEMPTION, "deadline_unix_s": ctx.now() + ctx.timings.preemption_notice_s,
                  "detail": row.interruption}
        ctx.executor.notify(row.instance_id, notice)
        if job is not None and job.gang.attempt and row.attempt == job.gang.attempt:
            for peer in ctx.store.instances(s, job.job_id, alive_only=True):
                if peer.attempt == job.gang.attempt and peer.instance_id != row.instance_id:
                    ctx.executor.notify(peer.instance_id, notice)
        if job is not None:
            job.preemptions += 1
            if job.gang.attempt and row.attempt == job.gang.attempt:
                mark_disrupted(ctx, job)
            ctx.note(s, job, "preemption-notice", f"{row.instance_id} ({row.offering_key}, {row.market}): {row.interruption}")
    elif state is InstanceState.RUNNING and row.state == InstanceState.PENDING.value:
        row.state = state.value
    elif state is InstanceState.TERMINATED and row.state != InstanceState.TERMINATED.value:
        ctx.executor.stop(row.instance_id)
        row.state = state.value
        row.terminated_at_s = terminated_at_s if terminated_at_s is not None else ctx.provider.now_s()
        if interruption and not row.interruption:
            row.interruption = interruption
            if row.market == SPOT:
                ctx.rooms.saw(row.offering_key, ctx.provider.now_s(), False)
            if job is not None:
                job.preemptions += 1
        if job is not None:
            ctx.note(s, job, "instance-terminated", f"{row.instance_id} terminated ({row.interruption or 'released'})")


def mark_disrupted(ctx: Context, job: Job) -> None:
    """The running gang was told it must end (a notice, a stop): its restart overhead starts now."""
    marks = ctx.restart_marks.setdefault(job.job_id, {})
    if "ended" in marks or "disrupted" not in marks:
        ctx.restart_marks[job.job_id] = {"disrupted": ctx.provider.now_s()}


def measured_restart_s(marks: Mapping[str, float], now_s: float) -> float | None:
    """Training time a restart cost: from the later of the disruption and the newest instance's launch
    (the replacement usually launches at the notice) to training moving again. Waiting for capacity
    in between is not a restart's cost."""
    if "ended" not in marks:
        return None
    origin = max(marks.get("disrupted", marks["ended"]), marks.get("launched", marks["ended"]))
    return max(0.0, now_s - origin)


def _infra_lost(gang: list[InstanceRow]) -> bool:
    return any(r.state in (InstanceState.NOTICE.value, InstanceState.TERMINATED.value) for r in gang)


def observe_abandoned(ctx: Context, s: Session, job: Job) -> str | None:
    """Look at the workers of a job whose owner (a ``spotrain run``) was killed once: first what its
    cloud did meanwhile (a machine that shut itself down when its owner was gone ends its bill when it
    did, ``cloud_providers/local/owner.py``); a gang that finished meanwhile ends the job as it ended
    (succeeded, or failed with its exit codes) and None is returned; otherwise the reason to fail it
    with, saying what became of its workers and where it can resume from."""
    for inst in ctx.provider.poll():
        row = s.get(InstanceRow, inst.instance_id)
        if row is not None:
            on_instance_change(ctx, s, row, inst.state, inst.interruption, inst.terminated_at_s)
    rows = ctx.store.instances(s, job.job_id)
    gang = [r for r in rows if job.gang.attempt and r.attempt == job.gang.attempt]
    stopped_at = getattr(ctx.executor, "stopped_at", None)
    stopped = [r for r in gang if stopped_at is not None and stopped_at(r.instance_id) is not None]
    states = [ctx.executor.status(r.instance_id, job.gang.attempt).state for r in gang
              if r.state != InstanceState.TERMINATED.value]
    observe_gang(ctx, s, job, rows)
    if JobState(job.state).terminal:
        ctx.note(s, job, "owner-gone", f"the spotrain run that owned this job was killed; its workers had "
                                       f"ended on their own: {job.state}")
        return None
    at = f"step {job.step}" + (f"/{job.total_steps}" if job.total_steps else "")
    if stopped:
        ckpt = f"its checkpoint at step {job.last_checkpoint_step}" if job.last_checkpoint_step else "the start"
        workers = (f"its workers stopped on their own when it was gone, at a checkpoint, and their machines' bills "
                   f"ended then; `spotrain resume {job.job_id}` continues from {ckpt}")
    elif any(st is GangState.RUNNING for st in states):
        workers = "its workers were still running and have been stopped"
    elif states:
        workers = "its workers had already exited"
    else:
        workers = "no workers were running"
    return f"the spotrain run that owned this job was killed (at {at}); {workers}"


def observe_gang(ctx: Context, s: Session, job: Job, rows: list[InstanceRow]) -> None:
    """Read the job's progress and its gang's exit codes, and end, fail or succeed the gang."""
    prog = ctx.progress(job.job_id)
    if prog:
        ckpt_before = job.last_checkpoint_step
        apply_progress(ctx, job, prog)
        record_report(ctx, s, job, prog)
        if job.last_checkpoint_step and job.last_checkpoint_step != ckpt_before:
            # The progress history `spotrain report` plots, and one log line per checkpoint.
            s.add(ProgressSample(job_id=job.job_id, ts=ctx.now(), clock_s=ctx.provider.now_s(), step=job.step,
                                 checkpoint_step=job.last_checkpoint_step))
            log.info("%s: checkpoint at step %d durable", job.job_id, job.last_checkpoint_step)
    if not job.gang.attempt:
        return
    gang = [r for r in rows if r.attempt == job.gang.attempt]
    statuses = {r.instance_id: ctx.executor.status(r.instance_id, job.gang.attempt) for r in gang}
    codes: dict[int, int] = {}
    for st in statuses.values():
        codes.update(st.exit_codes)
    # ABSENT: the gang was recorded (write-ahead, ``start_gang``) but the controller died before it
    # started this member; like a lost member, the whole gang must restart under a new attempt.
    lost = any(st.state in (GangState.LOST, GangState.ABSENT) for st in statuses.values())
    infra = _infra_lost(gang) or lost
    all_exited = all(st.state is GangState.EXITED for st in statuses.values())
    bad = {rk: c for rk, c in codes.items() if c not in (protocol.EXIT_DONE, protocol.EXIT_RESCHEDULE)}
    if all_exited and codes and all(c == protocol.EXIT_DONE for c in codes.values()):
        last = ctx.progress(job.job_id)
        if outcomes.completion_recorded(last):
            succeed(ctx, s, job)
        elif ctx.progress_predates_exit(job.job_id) and job.job_id not in ctx.exits_unconfirmed:
            ctx.exits_unconfirmed.add(job.job_id)  # the report read after the exit (next tick) decides
        else:
            end_job(ctx, s, job, JobState.FAILED, outcomes.incomplete_exit_reason(job, last), why="workers exited early")
    elif all_exited and not bad:
        gang_ended(ctx, s, job, "workers checkpointed and exited")
    elif bad and not infra:
        rank, code = sorted(bad.items())[0]
        gang_failed_user(ctx, s, job, gang, rank, code)
    elif infra and (all_exited or bad or lost):
        _gang_lost(ctx, s, job, gang)
    elif job.gang.stopping and job.gang.stop_deadline is not None and ctx.now() > job.gang.stop_deadline:
        # Told to checkpoint and exit, it has not (a rank hung in a collective, a script that does
        # not watch its notices): stop it, or the old gang and its replacements would both bill on.
        for r in gang:
            ctx.executor.stop(r.instance_id)
        limit = ctx.timings.stop_notice_s + ctx.timings.stop_grace_s
        gang_ended(ctx, s, job, f"the gang did not exit within {limit:.0f} s of being told to stop; "
                                "stopped, resuming from the last checkpoint")
    else:
        if any(c == protocol.EXIT_RESCHEDULE for c in codes.values()) and not job.gang.stopping:
            # A rank checkpointed and left: its peers must follow, not wait for it in a collective.
            tell_gang_to_stop(ctx, job, gang, "peer-checkpointed")
        if job.state not in (JobState.RUNNING.value, JobState.RESCALING.value):
            ctx.transition(s, job, JobState.RUNNING, "workers running")


def _gang_lost(ctx: Context, s: Session, job: Job, gang: list[InstanceRow]) -> None:
    for r in gang:
        ctx.executor.stop(r.instance_id)
    if not _infra_lost(gang) and job.step <= job.gang.start_step:
        # Workers vanished on machines the cloud did not take back, before any progress: an agent
        # that cannot start them must not be restarted forever.
        job.stalled_restarts += 1
        if job.stalled_restarts >= ctx.timings.max_stalled_restarts:
            end_job(ctx, s, job, JobState.FAILED, (
                f"workers were lost {job.stalled_restarts} times in a row before making any progress "
                f"(see spotrain logs {job.job_id})"), why="workers keep getting lost")
            return
    gang_ended(ctx, s, job, "an instance of the gang was lost; resuming from the last checkpoint")


def _int_field(prog: Mapping[str, Any], key: str) -> int | None:
    v = prog.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return int(v) if 0 <= v <= MAX_STEP else None


def _float_field(prog: Mapping[str, Any], key: str) -> float | None:
    v = prog.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def apply_progress(ctx: Context, job: Job, prog: Mapping[str, Any]) -> None:
    """Take rank 0's report. Values that are not finite numbers in range are ignored, field by field
    (one job's bad report must never stop the loop for the others)."""
    step = _int_field(prog, "step")
    if step is not None and step > job.step and job.gang.attempt:
        seen = ctx.moving_since.get(job.job_id)
        if seen is None or seen[0] != job.gang.attempt:
            ctx.moving_since[job.job_id] = (job.gang.attempt, ctx.now())
    if step is not None:
        marks = ctx.restart_marks.get(job.job_id)
        if marks is not None and step > job.step and job.gang.attempt and "launched" in marks:
            # Training moved again after a restart: the job's measured restart overhead, up to the
            # start of the step just reported (its duration is training, not restarting).
            step_s = _float_field(prog, "step_time_s")
            moved_s = ctx.provider.now_s() - (step_s * ctx.clock_rate if step_s is not None and step_s > 0 else 0.0)
            job.restart_overhead_s = measured_restart_s(marks, moved_s)
            ctx.restart_marks.pop(job.job_id, None)
        job.step = step
        per_step_s = _float_field(prog, "step_time_s")
        if per_step_s is not None and per_step_s > 0 and job.gang.attempt:
            ctx.step_seconds[job.job_id] = (job.gang.attempt, per_step_s * ctx.clock_rate)
        if job.step > job.gang.start_step:
            job.stalled_restarts = 0
    if (total := _int_field(prog, "total_steps")) is not None:
        job.total_steps = total
    if (metric := _float_field(prog, "metric")) is not None:
        job.metric = metric
        job.metric_name = str(prog.get("metric_name") or "metric")[:64]
    if (loss := _float_field(prog, "loss")) is not None:
        job.loss = loss
    if (ckpt := _int_field(prog, "last_checkpoint_step")) is not None:
        job.last_checkpoint_step = ckpt
        if (at := _float_field(prog, "last_checkpoint_unix_s")) is not None and at <= ctx.now() + 60.0:
            # When the runtime says it was durable (else the controller dates it when it first sees it).
            ctx.last_checkpoint[job.job_id] = (ckpt, at)
    if (size_gb := _float_field(prog, "checkpoint_size_gb")) is not None and size_gb >= 0:
        job.checkpoint_size_gb = size_gb  # the measured size replaces the spec's (issue 23)
    if isinstance(prog.get("final_model"), str):
        job.final_model = prog["final_model"]


def succeed(ctx: Context, s: Session, job: Job) -> None:
    """The runtime recorded completion (``outcomes.completion_recorded``): its final weights are the model."""
    apply_progress(ctx, job, ctx.progress(job.job_id) or {})
    end_job(ctx, s, job, JobState.SUCCEEDED, "training finished", why="job succeeded")


def tell_gang_to_stop(ctx: Context, job: Job, gang: list[InstanceRow], why: str) -> None:
    t = ctx.timings
    mark_disrupted(ctx, job)
    job.gang.stopping = why
    job.gang.stop_deadline = ctx.now() + t.stop_notice_s + t.stop_grace_s
    for r in gang:
        ctx.executor.notify(r.instance_id, {"reason": protocol.NOTICE_RESCALE, "deadline_unix_s": ctx.now() + t.stop_notice_s})


def _clear_gang(job: Job) -> None:
    job.gang.attempt = 0
    job.gang.stopping = ""
    job.gang.stop_deadline = None


def gang_ended(ctx: Context, s: Session, job: Job, reason: str) -> None:
    stopping = job.gang.stopping
    _clear_gang(job)
    now_s = ctx.provider.now_s()
    marks = ctx.restart_marks.get(job.job_id)
    if marks is None or "ended" in marks:
        marks = ctx.restart_marks[job.job_id] = {"disrupted": now_s}  # ended with no notice (a lost gang)
    marks["ended"] = now_s
    ctx.note(s, job, "gang-stopped", reason)
    if job.state == JobState.PENDING.value:
        return  # its gang never ran (recorded, then the controller died): nothing to recover from
    if stopping == "rescale":
        ctx.transition(s, job, JobState.RESCALING, "resizing: " + reason)
    else:
        ctx.transition(s, job, JobState.RECOVERING, reason)


def gang_failed_user(ctx: Context, s: Session, job: Job, gang: list[InstanceRow], rank: int, code: int) -> None:
    for r in gang:
        ctx.executor.stop(r.instance_id)
    _clear_gang(job)
    logfile = ctx.logs_dir(job.job_id) / f"attempt-{job.attempt}-rank-{rank}.log"
    tail = outcomes.traceback_tail(logfile)
    what = f"rank {rank} exited with code {code}" + (f": {tail[-1].strip()}" if tail else "") + f" (log: {logfile})"
    limit = ctx.spec(job).retries.max_restarts_on_errors
    early = job.step <= job.gang.start_step
    if early and outcomes.repeated_early_failure(ctx.store, s, job, code):
        end_job(ctx, s, job, JobState.FAILED, outcomes.with_tail(
            f"user code failed: {what}; failed again before its first step with the same exit code, "
            "so not retried (a deterministic error)", tail))
        return
    if early:
        ctx.note(s, job, outcomes.EARLY_FAILURE, outcomes.early_failure_mark(job, code))
    if job.restarts_on_errors >= limit:
        end_job(ctx, s, job, JobState.FAILED, outcomes.with_tail(
            f"user code failed: {what}; {restarts_used(job.restarts_on_errors, limit)}", tail))
        return
    job.restarts_on_errors += 1
    ctx.transition(s, job, JobState.RECOVERING, outcomes.with_tail(
        f"user code failed: {what}; restarting (restart {job.restarts_on_errors} of at most {limit}, "
        "retries.max_restarts_on_errors)", tail))


def restarts_used(done: int, limit: int) -> str:
    """Why a failing job is not restarted, in words that cannot read as a restart still to come
    (issue 24, item 8: "restart 2 of 2" followed by "not retried" was read as a contradiction)."""
    if done == 0:
        return f"not retried (retries.max_restarts_on_errors: {limit})"
    return (f"failed after {done} restart{'s' if done != 1 else ''} "
            f"(retries.max_restarts_on_errors: {limit}): not retried")


def _start_failed(ctx: Context, s: Session, job: Job, started: list[InstanceRow], exc: Exception) -> None:
    """The attempt could not start (``start_failures``): stop what it started, clear it, record the
    cause, and retry later or end the job."""
    for r in started:
        ctx.executor.stop(r.instance_id)
    attempt = job.attempt
    _clear_gang(job)
    what = start_failures.cause(exc)
    if not start_failures.transient(exc):
        ctx.note(s, job, start_failures.GANG_START_FAILED, f"attempt {attempt}: {what}; not retried (a permanent error)")
        end_job(ctx, s, job, JobState.FAILED, f"cannot start the workers: {what}", why="the gang cannot start")
        return
    n, wait_s = ctx.start_failures.failed(job.job_id, ctx.now())
    if n >= start_failures.MAX_START_FAILURES:
        ctx.note(s, job, start_failures.GANG_START_FAILED, f"attempt {attempt}: {what}; {n} failures in a row")
        end_job(ctx, s, job, JobState.FAILED, f"cannot start the workers ({n} tries): {what}", why="the gang cannot start")
        return
    reason = f"attempt {attempt} could not start: {what}; retrying in {wait_s:.0f} s ({n} of {start_failures.MAX_START_FAILURES})"
    log.warning("job %s: %s", job.job_id, reason)
    ctx.note(s, job, start_failures.GANG_START_FAILED, reason)
    job.reason = reason


def _carry_state(ctx: Context, s: Session, job: Job, members: list[InstanceRow]) -> None:
    """The new gang restores the job's state: when it runs in another region or cloud than the gang
    that wrote it, the move is billed at the catalog's egress price for the measured checkpoint size
    (the spec's ``checkpoint.size_gb`` until measured) and counted (issue 23; the simulator's fast
    path applies the same ``carry_state``)."""
    loc = gang_location((r.cloud, r.region, r.gpus) for r in members)
    size_gb = job.checkpoint_size_gb if job.checkpoint_size_gb is not None else (ctx.spec(job).checkpoint.size_gb or 0.0)
    has_state = job.step > 0 or job.last_checkpoint_step is not None
    prev = job.state_location or None
    new, egress, moved = carry_state(prev, loc, has_state=has_state, size_gb=size_gb)
    job.state_location = new or ""
    if moved:
        job.egress_usd = (job.egress_usd or 0.0) + egress
        job.region_moves = (job.region_moves or 0) + 1
        job.cost_usd = (job.cost_usd or 0.0) + egress
        ctx.note(s, job, "moved", f"state {prev} -> {new}: {size_gb:g} GB, egress ${egress:.2f}")


def start_gang(ctx: Context, s: Session, job: Job, members: list[InstanceRow], batch: BatchConfig | None = None) -> None:
    """Start the job's next attempt on ``members``; ``batch``: the batch configuration the allocation
    chose (the goodput optimizer's), given to the workers as ``SPOTRAIN_BATCH_JSON``."""
    spec = ctx.spec(job)
    job.attempt += 1
    job.gang.attempt = job.attempt
    master_addr, job.gang.port = ctx.executor.rendezvous(members[0].instance_id)
    job.gang.started_at = ctx.now()
    job.gang.start_step = job.step
    job.gang.stopping = ""
    job.gang.stop_deadline = None
    world = sum(r.gpus for r in members)
    if job.job_id in ctx.restart_marks:
        ctx.restart_marks[job.job_id]["launched"] = max(r.launched_at_s for r in members)
    for r in members:
        r.attempt = job.attempt
    _carry_state(ctx, s, job, members)
    batch = gang_directive(spec, batch, world)
    note_gang_batch(ctx, s, job, batch, world)
    # Write-ahead, as for launches: the attempt and its rendezvous port are durable before any worker
    # starts. Otherwise a crash between two members' starts leaves agents of an attempt number the
    # database never recorded; the next controller reuses that number, the executor keeps the agents
    # already started (start is idempotent per attempt) and starts the rest with a new port, so the
    # ranks rendezvous on different ports and the gang hangs.
    s.commit()
    env = {
        **spec.envs,  # the spec's own (never a protocol name: the spec refuses those)
        protocol.ENV_JOB_ID: job.job_id,
        protocol.ENV_ATTEMPT: str(job.attempt),
        protocol.ENV_CHECKPOINT_URI: job.checkpoint_uri,
        protocol.ENV_CHECKPOINT_INTERVAL_S: repr(spec.checkpoint.interval_s / ctx.clock_rate),
        protocol.ENV_CHECKPOINT_KEEP: str(spec.checkpoint.keep),
        protocol.ENV_TRAINING_JSON: json.dumps(spec.training.model_dump(mode="json")),
    }
    if batch is not None:
        env[protocol.ENV_BATCH_JSON] = json.dumps(batch.to_json())
    if job.checkpoint_key:  # issue 21, finding 9; "" for a job submitted before keys: unsigned
        env[protocol.ENV_CHECKPOINT_KEY] = job.checkpoint_key
    rank = 0
    log_dir = str(ctx.logs_dir(job.job_id))
    started: list[InstanceRow] = []
    try:
        for r in members:
            r.first_rank = rank
            started.append(r)
            ctx.executor.start(WorkerLaunch(
                instance_id=r.instance_id, job_id=job.job_id, attempt=job.attempt, run=spec.run, setup=spec.setup,
                cwd=job.workdir, ranks=list(range(rank, rank + r.gpus)), world_size=world,
                master_addr=master_addr, master_port=job.gang.port, env=env, log_dir=log_dir,
            ))
            rank += r.gpus
    except Exception as exc:
        if not start_failures.handled(exc):
            raise  # a bug of ours: the tick's containment (reconcile._contained)
        _start_failed(ctx, s, job, started, exc)
        return
    ctx.start_failures.started(job.job_id)
    markets = ", ".join(f"{r.instance_id} {r.offering_key} {r.market}" for r in members)
    ctx.transition(s, job, JobState.RUNNING, f"attempt {job.attempt}: {world} worker(s) on {markets}")
