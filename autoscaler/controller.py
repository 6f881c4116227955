"""The controller: job lifecycle and the reconcile loop.

Each tick (an APScheduler interval job) it
1. polls the provider for what the cloud did on its own (notices, preemptions) and relays notices to
   the workers;
2. observes each job's gang of workers (finished, checkpointed and waiting, failed, lost) and its
   progress and cost;
3. asks the policy for every job's allocation, and makes the instances match it: release surplus,
   launch what is missing (write-ahead decisions, so a crash never launches twice), and start a new
   gang when the whole allocation is up.

Infrastructure failures (preemption, a lost instance) are always recovered; a user-code failure is
retried at most ``retries.max_restarts_on_errors`` times (Philly: most failures are user bugs that
must not be retried forever). All state is in the database and the provider, so a restarted controller
carries on where a crashed one stopped (``recovery.py``).
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from cloud_providers import protocol
from cloud_providers.base import (
    MIN_BILLED_S_ATTR,
    ON_DEMAND,
    SPOT,
    TAG_CONTROLLER,
    TAG_DECISION,
    TAG_JOB,
    TAG_MARKET,
    Instance,
    InstanceState,
    LaunchRequest,
    Offering,
    Provider,
)
from cloud_providers.errors import CapacityUnavailable, InvalidRequest, ProviderError, QuotaExceeded
from cloud_providers.executor import Executor, GangState, WorkerLaunch

from . import accounting
from .market_watch import MarketWatcher
from .errors import ApiError, JobNotFound
from .home import default_store, logs_dir
from .policy import Allocation, Held, JobView, Policy, PolicyInput
from .spec import JobSpec, spec_from_dict
from .state import Decision, InstanceRow, Job, JobState, Store

log = logging.getLogger("spotrain.controller")

# How often (ticks) the controller lists its instances by tag to catch unknown ones, and how long a
# launch decision with no instance stays pending before it is failed.
SWEEP_EVERY_TICKS = 10
DECISION_GRACE_S = 120.0
# Gangs lost in a row on healthy instances before any progress, after which the job fails.
MAX_STALLED_RESTARTS = 5
# A gang told to stop (rescale, a peer that checkpointed) gets this long to checkpoint and exit (the
# runtime's notice deadline) ...
STOP_NOTICE_S = 30.0
# ... and the controller stops it this long after that (a checkpoint of a large model takes time).
STOP_GRACE_S = 120.0

# Fault injection for crash-recovery tests (docs/aws.md): the probability, 0..1, that the controller
# dies as if SIGKILLed right after the cloud accepted a launch and before the result is recorded. That
# window is the hardest one for recovery (an instance exists that only its tags know about), and a
# random SIGKILL almost never lands in it. Unset (the default) means never.
FAULT_CRASH_AFTER_LAUNCH_ENV = "SPOTRAIN_FAULT_CRASH_AFTER_LAUNCH"
FAULT_EXIT_CODE = 137  # what a shell reports for SIGKILL


def _maybe_crash_after_launch() -> None:
    raw = os.environ.get(FAULT_CRASH_AFTER_LAUNCH_ENV, "")
    if not raw:
        return
    try:
        probability = float(raw)
    except ValueError:
        raise ValueError(f"{FAULT_CRASH_AFTER_LAUNCH_ENV}={raw!r} must be a probability between 0 and 1") from None
    if random.random() < probability:
        log.warning("fault injection: exiting right after a launch, before recording it")
        logging.shutdown()
        os._exit(FAULT_EXIT_CODE)


def gpus_of(offering_key: str) -> int:
    """GPUs per instance from an offering key (``cloud/zone/type/ACCEL:N``)."""
    try:
        return max(1, int(offering_key.rsplit(":", 1)[1]))
    except (IndexError, ValueError):
        return 1


class Controller:
    def __init__(
        self,
        *,
        store: Store,
        provider: Provider,
        executor: Executor,
        policy: Policy,
        controller_id: str,
        tick_s: float = 1.0,
        clock_rate: float = 1.0,
    ) -> None:
        """``clock_rate``: provider-clock seconds per wall second (the local cloud's time scale)."""
        self.store = store
        self.provider = provider
        self.executor = executor
        self.policy = policy
        self.controller_id = controller_id
        self.tick_s = tick_s
        self.clock_rate = clock_rate
        self._lock = threading.RLock()
        self._scheduler: Any = None
        # job_id -> {"<offering_key>|<market>": provider-clock time of the last capacity refusal}
        self._capacity_failures: dict[str, dict[str, float]] = {}
        # job_id -> wall time the last gang stopped (for measuring the restart overhead)
        self._gang_stopped_at: dict[str, float] = {}
        self.last_tick_error: str | None = None
        self._market = MarketWatcher()
        # Prices of the last successful offerings() call, for the budget guard of a tick whose cloud calls fail.
        self._last_prices: dict[str, tuple[float, float | None]] = {}
        self._ticks = 0
        self._last_tick_wall_s = 0.0
        # job_id -> (last checkpoint step seen, wall time it was first seen)
        self._last_checkpoint: dict[str, tuple[int, float]] = {}

    # ----- lifecycle of the service -----
    def start(self) -> None:
        from apscheduler.schedulers.background import BackgroundScheduler

        from .recovery import recover

        recover(self)
        self._scheduler = BackgroundScheduler(daemon=True)
        self._scheduler.add_job(
            self.tick, "interval", seconds=self.tick_s, max_instances=1, coalesce=True, id="reconcile",
            misfire_grace_time=None,
        )
        self._scheduler.start()

    def shutdown(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None

    # ----- API operations -----
    def submit(self, spec: JobSpec, workdir: Path, *, scenario: Mapping[str, Any] | None = None) -> dict[str, Any]:
        with self._lock, self.store.session() as s:
            if self.store.live_job_named(s, spec.name) is not None:
                raise ApiError(f"a live job named {spec.name!r} already exists", status=409)
            job_id = f"{spec.name}-{uuid.uuid4().hex[:6]}"
            store_uri = spec.checkpoint.store or default_store()
            job = Job(
                job_id=job_id,
                name=spec.name,
                controller_id=self.controller_id,
                cloud=self.provider.name,
                spec_json=json.dumps(spec.to_dict()),
                workdir=str(workdir),
                checkpoint_uri=f"{store_uri}/{job_id}",
                state=JobState.PENDING.value,
                reason="submitted",
                submitted_at=time.time(),
                submitted_clock_s=self.provider.now_s(),
                scenario_json=json.dumps(dict(scenario or {})),
            )
            s.add(job)
            s.flush()
            Store.note(s, job, "submitted", f"job {job_id} submitted")
            return job_summary(job, [])

    def cancel(self, ref: str) -> dict[str, Any]:
        with self._lock, self.store.session() as s:
            job = self.store.job(s, ref)
            if job is None:
                raise JobNotFound(f"no job {ref!r}")
            if job.controller_id != self.controller_id and not JobState(job.state).terminal:
                raise ApiError(f"job {job.job_id} belongs to controller {job.controller_id}, not this one", status=409)
            if not JobState(job.state).terminal:
                self._release_all(s, job, "job cancelled")
                job.gang_attempt = 0
                Store.transition(s, job, JobState.CANCELLED, "cancelled by user")
            return job_summary(job, self.store.instances(s, job.job_id))

    def fail_abandoned(self, ref: str, why: str) -> dict[str, Any]:
        """End a live job of this controller as FAILED, releasing everything it holds: for jobs whose
        owner is gone for good (an embedded ``spotrain run`` that was killed)."""
        with self._lock, self.store.session() as s:
            job = self.store.job(s, ref)
            if job is None:
                raise JobNotFound(f"no job {ref!r}")
            if not JobState(job.state).terminal:
                self._release_all(s, job, why)
                job.gang_attempt = 0
                Store.transition(s, job, JobState.FAILED, why)
            return job_summary(job, self.store.instances(s, job.job_id))

    # ----- the reconcile loop -----
    def tick(self) -> None:
        with self._lock:
            t0 = time.monotonic()
            try:
                self._tick()
                self.last_tick_error = None
            except ProviderError as exc:
                # A cloud hiccup must not kill the loop; the next tick retries.
                self.last_tick_error = f"{type(exc).__name__}: {exc}"
                log.warning("reconcile: %s", self.last_tick_error)
            except Exception as exc:  # noqa: BLE001 - the loop must survive a bug; /healthz reports it
                self.last_tick_error = f"{type(exc).__name__}: {exc}"
                log.exception("reconcile failed")
            finally:
                self._last_tick_wall_s = time.monotonic() - t0

    def _tick(self) -> None:
        # The hard budget first, from the database and the last prices seen, before any cloud call
        # can fail this tick (a throttled DescribeInstances must not also switch the guard off).
        if self._last_prices:
            with self.store.session() as s:
                for job in self.store.jobs(s, controller_id=self.controller_id, live_only=True):
                    rows = self.store.instances(s, job.job_id)
                    job.cost_usd, job.on_demand_cost_usd = accounting.update_billing(self.provider, rows)
                    self._budget_guard(s, job, rows, self._last_prices)
        changed = self.provider.poll()
        with self.store.session() as s:
            for inst in changed:
                row = s.get(InstanceRow, inst.instance_id)
                if row is not None:
                    self._on_instance_change(s, row, inst.state, inst.interruption, inst.terminated_at_s)
            # A provider reports a change once: keep it even if a cloud call later in this tick fails.
            s.commit()
            jobs = self.store.jobs(s, controller_id=self.controller_id, live_only=True)
            # The sweep runs with no live job too: a launch call that raised may still have created an
            # instance for a job that has ended since (cancelled, over budget); it must not bill on.
            self._sweep(s)
            if not jobs:
                return
            offerings = list(self.provider.offerings())
            now_s = self.provider.now_s()
            self._market.observe(now_s, offerings)
            by_key = {o.key: o for o in offerings}
            prices = {o.key: (o.on_demand_price_usd_per_hour, o.spot_price_usd_per_hour) for o in offerings}
            self._last_prices = prices
            views = []
            for job in jobs:
                rows = self.store.instances(s, job.job_id)
                job.cost_usd, job.on_demand_cost_usd = accounting.update_billing(self.provider, rows)
                self._observe_gang(s, job, rows)
                if JobState(job.state).terminal:
                    continue
                if self._budget_guard(s, job, rows, prices):
                    continue
                views.append(self._view(job, rows, by_key))
            if not views:
                return
            all_rows = [r for j in self.store.jobs(s, controller_id=self.controller_id) for r in self.store.instances(s, j.job_id)]
            inp = PolicyInput(
                now_s=now_s,
                jobs=views,
                offerings=offerings,
                history=self._market.merge(accounting.market_history(all_rows)),
                decision_interval_s=self.tick_s * self.clock_rate,
            )
            allocations = {a.job_id: a for a in self.policy.decide(inp)}
            for view in views:
                job = s.get(Job, view.job_id)
                alloc = allocations.get(view.job_id)
                if job is not None and alloc is not None:
                    self._apply(s, job, alloc, by_key)

    def _sweep(self, s: Session) -> None:
        """Make the cloud and the database agree, every few ticks and whenever a launch is unsettled.

        A launch call that raised after its retries leaves its decision pending, and it may still have
        launched (EC2's describe calls are eventually consistent, too): the instance carrying the
        decision's tag is adopted when it shows up; a decision with none is failed after a grace period.
        Any instance tagged with this controller that the database does not know is adopted if its job
        is live, else terminated, so nothing bills unseen until the next restart.
        """
        self._ticks += 1
        pending = list(s.scalars(select(Decision).join(Job, Decision.job_id == Job.job_id).where(
            Decision.status == "pending", Job.controller_id == self.controller_id)))
        if not pending and self._ticks % SWEEP_EVERY_TICKS:
            return
        from .recovery import adopt_or_terminate_unknown, resolve_pending_decisions

        cloud = list(self.provider.list_instances({TAG_CONTROLLER: self.controller_id}))
        jobs = {j.job_id: j for j in self.store.jobs(s, controller_id=self.controller_id)}
        resolve_pending_decisions(self, s, jobs, cloud, why="after a failed launch call", grace_s=DECISION_GRACE_S)
        adopt_or_terminate_unknown(self, s, jobs, cloud)

    def _on_instance_change(
        self, s: Session, row: InstanceRow, state: InstanceState, interruption: str | None, terminated_at_s: float | None
    ) -> None:
        job = s.get(Job, row.job_id)
        if state is InstanceState.NOTICE and not row.notice_delivered:
            row.state = state.value
            row.interruption = interruption or "preemption"
            row.notice_delivered = 1
            # Every rank must stop at the same boundary; the runtime agrees on it, and telling the whole
            # gang as well keeps workers that cannot agree (a crashed peer) from waiting in a collective.
            notice = {"reason": protocol.NOTICE_PREEMPTION, "deadline_unix_s": time.time() + 2.0, "detail": row.interruption}
            self.executor.notify(row.instance_id, notice)
            if job is not None and job.gang_attempt and row.attempt == job.gang_attempt:
                for peer in self.store.instances(s, job.job_id, alive_only=True):
                    if peer.attempt == job.gang_attempt:
                        self.executor.notify(peer.instance_id, notice)
            if job is not None:
                job.preemptions += 1
                Store.note(s, job, "preemption-notice", f"{row.instance_id} ({row.offering_key}, {row.market}): {row.interruption}")
        elif state is InstanceState.RUNNING and row.state == InstanceState.PENDING.value:
            row.state = state.value
        elif state is InstanceState.TERMINATED and row.state != InstanceState.TERMINATED.value:
            self.executor.stop(row.instance_id)
            row.state = state.value
            row.terminated_at_s = terminated_at_s if terminated_at_s is not None else self.provider.now_s()
            if interruption and not row.interruption:
                row.interruption = interruption
                if job is not None:
                    job.preemptions += 1
            if job is not None:
                Store.note(s, job, "instance-terminated", f"{row.instance_id} terminated ({row.interruption or 'released'})")

    # ----- observing the gang -----
    def _observe_gang(self, s: Session, job: Job, rows: list[InstanceRow]) -> None:
        prog = self.executor.progress(job.job_id)
        if prog:
            self._apply_progress(job, prog)
        if not job.gang_attempt:
            return
        gang = [r for r in rows if r.attempt == job.gang_attempt]
        statuses = {r.instance_id: self.executor.status(r.instance_id, job.gang_attempt) for r in gang}
        codes: dict[int, int] = {}
        for st in statuses.values():
            codes.update(st.exit_codes)
        # ABSENT: the gang was recorded (write-ahead, ``_start_gang``) but the controller died before it
        # started this member; like a lost member, the whole gang must restart under a new attempt.
        lost = any(st.state in (GangState.LOST, GangState.ABSENT) for st in statuses.values())
        infra = any(r.state in (InstanceState.NOTICE.value, InstanceState.TERMINATED.value) for r in gang) or lost
        all_exited = all(st.state is GangState.EXITED for st in statuses.values())
        bad = {rk: c for rk, c in codes.items() if c not in (protocol.EXIT_DONE, protocol.EXIT_RESCHEDULE)}
        if all_exited and codes and all(c == protocol.EXIT_DONE for c in codes.values()):
            self._succeed(s, job, rows)
            return
        if all_exited and not bad:
            self._gang_ended(s, job, gang, "workers checkpointed and exited")
            return
        if bad and not infra:
            rank, code = sorted(bad.items())[0]
            self._gang_failed_user(s, job, gang, rank, code)
            return
        if infra and (all_exited or bad or lost):
            for r in gang:
                self.executor.stop(r.instance_id)
            healthy = not any(r.state in (InstanceState.NOTICE.value, InstanceState.TERMINATED.value) for r in gang)
            if healthy and job.step <= job.gang_start_step:
                # Workers vanished on machines the cloud did not take back, before any progress: an
                # agent that cannot start them must not be restarted forever.
                job.stalled_restarts += 1
                if job.stalled_restarts >= MAX_STALLED_RESTARTS:
                    job.gang_attempt = 0
                    self._release_all(s, job, "workers keep getting lost")
                    Store.transition(s, job, JobState.FAILED, (
                        f"workers were lost {job.stalled_restarts} times in a row before making any progress "
                        f"(see spotrain logs {job.job_id})"))
                    return
            self._gang_ended(s, job, gang, "an instance of the gang was lost; resuming from the last checkpoint")
            return
        if job.gang_stopping and job.gang_stop_deadline is not None and time.time() > job.gang_stop_deadline:
            # Told to checkpoint and exit, it has not (a rank hung in a collective, a script that does
            # not watch its notices): stop it, or the old gang and its replacements would both bill on.
            for r in gang:
                self.executor.stop(r.instance_id)
            self._gang_ended(s, job, gang, f"the gang did not exit within {STOP_NOTICE_S + STOP_GRACE_S:.0f} s of being told to stop; "
                                           "stopped, resuming from the last checkpoint")
            return
        if any(c == protocol.EXIT_RESCHEDULE for c in codes.values()) and not job.gang_stopping:
            # A rank checkpointed and left: its peers must follow, not wait for it in a collective.
            self._tell_gang_to_stop(job, gang, "peer-checkpointed")
        if job.state not in (JobState.RUNNING.value, JobState.RESCALING.value):
            Store.transition(s, job, JobState.RUNNING, "workers running")

    def _apply_progress(self, job: Job, prog: Mapping[str, Any]) -> None:
        def num(k: str) -> float | None:
            v = prog.get(k)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        step = num("step")
        if step is not None:
            if job.job_id in self._gang_stopped_at and step > job.step and job.gang_attempt:
                # Training moved again after a restart: that gap is the job's measured restart overhead.
                job.restart_overhead_s = (time.time() - self._gang_stopped_at.pop(job.job_id)) * self.clock_rate
            job.step = int(step)
            if job.step > job.gang_start_step:
                job.stalled_restarts = 0
        if num("total_steps") is not None:
            job.total_steps = int(num("total_steps") or 0)
        if num("metric") is not None:
            job.metric = num("metric")
            job.metric_name = str(prog.get("metric_name") or "metric")
        if num("loss") is not None:
            job.loss = num("loss")
        if num("last_checkpoint_step") is not None:
            job.last_checkpoint_step = int(num("last_checkpoint_step") or 0)
        if isinstance(prog.get("final_model"), str):
            job.final_model = prog["final_model"]

    def _succeed(self, s: Session, job: Job, rows: list[InstanceRow]) -> None:
        prog = self.executor.progress(job.job_id) or {}
        self._apply_progress(job, prog)
        if not job.final_model:
            job.final_model = f"{job.checkpoint_uri}/final/model.safetensors"
        self._release_all(s, job, "job succeeded")
        job.gang_attempt = 0
        Store.transition(s, job, JobState.SUCCEEDED, "training finished")

    def _tell_gang_to_stop(self, job: Job, gang: list[InstanceRow], why: str) -> None:
        job.gang_stopping = why
        job.gang_stop_deadline = time.time() + STOP_NOTICE_S + STOP_GRACE_S
        for r in gang:
            self.executor.notify(r.instance_id, {"reason": protocol.NOTICE_RESCALE, "deadline_unix_s": time.time() + STOP_NOTICE_S})

    def _gang_ended(self, s: Session, job: Job, gang: list[InstanceRow], reason: str) -> None:
        stopping = job.gang_stopping
        job.gang_attempt = 0
        job.gang_stopping = ""
        job.gang_stop_deadline = None
        self._gang_stopped_at[job.job_id] = time.time()
        Store.note(s, job, "gang-stopped", reason)
        if stopping == "rescale":
            Store.transition(s, job, JobState.RESCALING, "resizing: " + reason)
        else:
            Store.transition(s, job, JobState.RECOVERING, reason)

    def _gang_failed_user(self, s: Session, job: Job, gang: list[InstanceRow], rank: int, code: int) -> None:
        for r in gang:
            self.executor.stop(r.instance_id)
        job.gang_attempt = 0
        job.gang_stopping = ""
        job.gang_stop_deadline = None
        logfile = logs_dir(job.job_id) / f"attempt-{job.attempt}-rank-{rank}.log"
        what = f"rank {rank} exited with code {code} (log: {logfile})"
        spec = self._spec(job)
        if job.restarts_on_errors >= spec.retries.max_restarts_on_errors:
            self._release_all(s, job)
            Store.transition(
                s, job, JobState.FAILED,
                f"user code failed: {what}; not retried after {job.restarts_on_errors} restart(s)",
            )
            return
        job.restarts_on_errors += 1
        Store.transition(
            s, job, JobState.RECOVERING,
            f"user code failed: {what}; restart {job.restarts_on_errors} of {spec.retries.max_restarts_on_errors}",
        )

    # ----- money -----
    def _guard_horizon_s(self) -> float:
        """Provider seconds until the budget guard runs again: a few ticks, or longer when ticks run
        slow (a throttled cloud)."""
        return max(3.0 * self.tick_s, 2.0 * self._last_tick_wall_s + self.tick_s) * self.clock_rate

    def _budget_guard(
        self, s: Session, job: Job, rows: list[InstanceRow], prices: Mapping[str, tuple[float, float | None]]
    ) -> bool:
        """Hard budget backstop: stop before the next ticks could cross the budget.

        The policy plans within the budget; this guard makes the cap hold even if the plan was wrong.
        """
        budget = self._spec(job).objective.budget_usd
        if budget is None:
            return False
        rate = accounting.burn_rate_usd_per_hour(rows, prices)
        if job.cost_usd + rate * self._guard_horizon_s() / 3600.0 < budget:
            return False
        self._end_over_budget(s, job, f"stopped at ${job.cost_usd:.2f} of a ${budget:.2f} budget: spending ${rate:.2f}/h would cross it")
        return True

    def _launch_over_budget(self, s: Session, job: Job, missing: list[tuple[str, str]], by_key: Mapping[str, Offering]) -> str | None:
        """Why launching ``missing`` could cross the hard budget, or None. The cloud bills each launch
        for at least its minimum (EC2: 60 s), which can be longer than the guard's horizon: what the
        job has spent, plus its running instances until the guard runs again, plus each launch's
        minimum bill must stay under the budget (the policy, planning in decision intervals, cannot
        see the minimum)."""
        budget = self._spec(job).objective.budget_usd
        if budget is None or not missing:
            return None
        horizon_s = self._guard_horizon_s()
        floor_s = max(float(getattr(self.provider, MIN_BILLED_S_ATTR, 0.0) or 0.0), horizon_s)
        prices = {k: (o.on_demand_price_usd_per_hour, o.spot_price_usd_per_hour) for k, o in by_key.items()}
        running = accounting.burn_rate_usd_per_hour(self.store.instances(s, job.job_id), prices) * horizon_s / 3600.0
        launches = sum(by_key[k].price_usd_per_hour(m) * floor_s / 3600.0 for k, m in missing if k in by_key)
        if job.cost_usd + running + launches < budget:
            return None
        return (f"budget: launching {len(missing)} instance(s) bills at least ${launches:.2f} "
                f"({floor_s:.0f} s each at least), ${max(budget - job.cost_usd - running, 0.0):.2f} of ${budget:.2f} left")

    def _end_over_budget(self, s: Session, job: Job, reason: str) -> None:
        self._release_all(s, job, "budget guard")
        job.gang_attempt = 0
        Store.transition(s, job, JobState.FAILED_BUDGET, reason)

    # ----- applying the policy's allocation -----
    def _view(self, job: Job, rows: list[InstanceRow], by_key: Mapping[str, Offering]) -> JobView:
        groups: dict[tuple[str, str], int] = {}
        for r in rows:
            if r.state in (InstanceState.RUNNING.value, InstanceState.PENDING.value):
                groups[(r.offering_key, r.market)] = groups.get((r.offering_key, r.market), 0) + 1
        held = tuple(
            Held(k, m, n, by_key[k].gpus if k in by_key else 1) for (k, m), n in sorted(groups.items())
        )
        progress = None
        if job.total_steps:
            progress = min(1.0, job.step / job.total_steps)
        since_ckpt = None
        if job.last_checkpoint_step is not None:
            seen = self._last_checkpoint.get(job.job_id)
            if seen is None or seen[0] != job.last_checkpoint_step:
                seen = (job.last_checkpoint_step, time.time())
                self._last_checkpoint[job.job_id] = seen
            since_ckpt = (time.time() - seen[1]) * self.clock_rate
        return JobView(
            job_id=job.job_id,
            spec=self._spec(job),
            submitted_s=job.submitted_clock_s,
            progress=progress,
            held=held,
            cost_so_far_usd=job.cost_usd,
            restart_overhead_s=job.restart_overhead_s,
            recent_capacity_failures=dict(self._capacity_failures.get(job.job_id, {})),
            since_checkpoint_s=since_ckpt,
            # A gang that is restarting anyway pays no extra restart for a change of allocation.
            restarting=job.state in (JobState.RECOVERING.value, JobState.RESCALING.value) or not job.gang_attempt,
        )

    def _apply(self, s: Session, job: Job, alloc: Allocation, by_key: Mapping[str, Offering]) -> None:
        if alloc.outcome is not None:
            self._release_all(s, job)
            job.gang_attempt = 0
            Store.transition(s, job, alloc.outcome.state, alloc.reason)
            return
        rows = self.store.instances(s, job.job_id, alive_only=True)
        usable = [r for r in rows if r.state in (InstanceState.RUNNING.value, InstanceState.PENDING.value)]
        # Match the allocation to instances: keep what fits (gang members first), note what is missing.
        keep: list[InstanceRow] = []
        missing: list[tuple[str, str]] = []
        pool = sorted(usable, key=lambda r: (r.attempt != job.gang_attempt or not job.gang_attempt, r.launched_at_s))
        for p in alloc.placements:
            have = [r for r in pool if r.offering_key == p.offering_key and r.market == p.market and r not in keep]
            keep.extend(have[: p.instances])
            missing.extend([(p.offering_key, p.market)] * max(0, p.instances - len(have)))
        surplus = [r for r in usable if r not in keep]

        if job.gang_attempt:
            gang = [r for r in rows if r.attempt == job.gang_attempt]
            if missing or surplus or {r.instance_id for r in gang} != {r.instance_id for r in keep}:
                if (why := self._launch_over_budget(s, job, missing, by_key)) is not None:
                    growing = job.state == JobState.RUNNING.value and {r.instance_id for r in gang} <= {r.instance_id for r in keep}
                    if not growing:
                        self._end_over_budget(s, job, why)
                    # A running gang that was only to grow keeps running as it is.
                    return
                if not job.gang_stopping and not any(r.state == InstanceState.NOTICE.value for r in gang):
                    self._tell_gang_to_stop(job, gang, "rescale")
                    Store.transition(s, job, JobState.RESCALING, f"resizing to {alloc.reason}")
                # Launch replacements now, while the old gang checkpoints (overlaps the notice window).
                self._launch(s, job, missing, by_key)
            return

        for r in surplus:
            self._release(s, job, r, "not in the allocation")
        if not alloc.placements:
            if job.state != JobState.PENDING.value:
                Store.transition(s, job, JobState.PENDING, alloc.reason or "waiting for capacity")
            return
        if (why := self._launch_over_budget(s, job, missing, by_key)) is not None:
            self._end_over_budget(s, job, why)
            return
        self._launch(s, job, missing, by_key)
        keep = [s.get(InstanceRow, r.instance_id) or r for r in keep]
        rows_now = self.store.instances(s, job.job_id, alive_only=True)
        ready = [r for r in rows_now if r.state == InstanceState.RUNNING.value]
        want = sum(p.instances for p in alloc.placements)
        if len(ready) >= want and want > 0:
            self._start_gang(s, job, ready[:want])
        elif job.state == JobState.PENDING.value:
            Store.transition(s, job, JobState.PROVISIONING, f"provisioning {alloc.reason}")

    def _launch(self, s: Session, job: Job, missing: list[tuple[str, str]], by_key: Mapping[str, Offering]) -> None:
        for key, market in missing:
            o = by_key.get(key)
            if o is None:
                continue
            decision = Decision(
                decision_id=f"d-{uuid.uuid4().hex[:20]}", job_id=job.job_id, offering_key=key, market=market,
            )
            s.add(decision)
            s.commit()  # write-ahead: the decision is durable before the cloud is asked
            tags = {
                TAG_JOB: job.job_id,
                TAG_CONTROLLER: self.controller_id,
                TAG_MARKET: market,
                TAG_DECISION: decision.decision_id,
            }
            try:
                inst = self.provider.launch(LaunchRequest(offering=o, market=market, decision_id=decision.decision_id, tags=tags))
            except (CapacityUnavailable, QuotaExceeded, InvalidRequest) as exc:
                # Capacity and quota: fail over (the policy avoids this offering for a while).
                # An invalid request is not retried as is either. Throttling, credentials and other
                # provider errors propagate: the tick is skipped and retried.
                decision.status = "failed"
                decision.reason = f"{type(exc).__name__}: {exc}"
                self._capacity_failures.setdefault(job.job_id, {})[f"{key}|{market}"] = self.provider.now_s()
                Store.note(s, job, "capacity", f"{key} ({market}): {exc}")
                s.commit()
                continue
            _maybe_crash_after_launch()
            self.record_instance(s, job, inst, offering_key=key, market=market, decision_id=decision.decision_id)
            decision.status = "launched"
            decision.instance_id = inst.instance_id
            Store.note(s, job, "launched", f"{inst.instance_id} on {key} ({market})")
            s.commit()

    @staticmethod
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

    def _start_gang(self, s: Session, job: Job, members: list[InstanceRow]) -> None:
        spec = self._spec(job)
        job.attempt += 1
        job.gang_attempt = job.attempt
        master_addr, job.gang_port = self.executor.rendezvous(members[0].instance_id)
        job.gang_started_at = time.time()
        job.gang_start_step = job.step
        job.gang_stopping = ""
        job.gang_stop_deadline = None
        world = sum(r.gpus for r in members)
        for r in members:
            r.attempt = job.attempt
        # Write-ahead, as for launches: the attempt and its rendezvous port are durable before any worker
        # starts. Otherwise a crash between two members' starts leaves agents of an attempt number the
        # database never recorded; the next controller reuses that number, the executor keeps the agents
        # already started (start is idempotent per attempt) and starts the rest with a new port, so the
        # ranks rendezvous on different ports and the gang hangs.
        s.commit()
        env = {
            protocol.ENV_JOB_ID: job.job_id,
            protocol.ENV_ATTEMPT: str(job.attempt),
            protocol.ENV_CHECKPOINT_URI: job.checkpoint_uri,
            protocol.ENV_CHECKPOINT_INTERVAL_S: repr(spec.checkpoint.interval_s / self.clock_rate),
            protocol.ENV_CHECKPOINT_KEEP: str(spec.checkpoint.keep),
            protocol.ENV_TRAINING_JSON: json.dumps(spec.training.model_dump(mode="json")),
        }
        rank = 0
        for r in members:
            r.attempt = job.attempt
            r.first_rank = rank
            self.executor.start(
                WorkerLaunch(
                    instance_id=r.instance_id, job_id=job.job_id, attempt=job.attempt, run=spec.run, setup=spec.setup,
                    cwd=job.workdir, ranks=list(range(rank, rank + r.gpus)), world_size=world,
                    master_addr=master_addr, master_port=job.gang_port, env=env, log_dir=str(logs_dir(job.job_id)),
                )
            )
            rank += r.gpus
        markets = ", ".join(f"{r.instance_id} {r.offering_key} {r.market}" for r in members)
        Store.transition(s, job, JobState.RUNNING, f"attempt {job.attempt}: {world} worker(s) on {markets}")

    # ----- releasing -----
    def _release(self, s: Session, job: Job, row: InstanceRow, why: str) -> None:
        self.executor.stop(row.instance_id)
        self.provider.terminate(row.instance_id)
        if row.state != InstanceState.TERMINATED.value:
            row.state = InstanceState.TERMINATED.value
            row.terminated_at_s = self.provider.now_s()
            Store.note(s, job, "released", f"{row.instance_id}: {why}")

    def _release_all(self, s: Session, job: Job, why: str = "job ended") -> None:
        for r in self.store.instances(s, job.job_id, alive_only=True):
            self._release(s, job, r, why)
        rows = self.store.instances(s, job.job_id)
        job.cost_usd, job.on_demand_cost_usd = accounting.update_billing(self.provider, rows)

    # ----- views -----
    @staticmethod
    def _spec(job: Job) -> JobSpec:
        return spec_from_dict(json.loads(job.spec_json))

    def job_info(self, ref: str) -> dict[str, Any]:
        with self.store.session() as s:
            job = self.store.job(s, ref)
            if job is None:
                raise JobNotFound(f"no job {ref!r}")
            return job_summary(job, self.store.instances(s, job.job_id))


def job_summary(job: Job, rows: list[InstanceRow]) -> dict[str, Any]:
    """The JSON form of a job (DESIGN.md: job_id, name, state, preemptions, cost_usd,
    on_demand_cost_usd, metric, final_model, and more)."""
    live = [r for r in rows if r.state != InstanceState.TERMINATED.value]
    by_market: dict[str, float] = {}
    for r in rows:
        by_market[r.market] = by_market.get(r.market, 0.0) + r.cost_usd
    return {
        "job_id": job.job_id,
        "name": job.name,
        "state": job.state,
        "reason": job.reason,
        "cloud": job.cloud,
        "preemptions": job.preemptions,
        "restarts_on_errors": job.restarts_on_errors,
        "attempts": job.attempt,
        "cost_usd": round(job.cost_usd, 6),
        "on_demand_cost_usd": round(job.on_demand_cost_usd, 6),
        "cost_by_market_usd": {k: round(v, 6) for k, v in sorted(by_market.items())},
        "metric": job.metric,
        "metric_name": job.metric_name or None,
        "loss": job.loss,
        "step": job.step,
        "total_steps": job.total_steps,
        "last_checkpoint_step": job.last_checkpoint_step,
        "final_model": job.final_model if job.state == JobState.SUCCEEDED.value else None,
        "checkpoint_uri": job.checkpoint_uri,
        "submitted_at": job.submitted_at,
        "finished_at": job.finished_at,
        "wall_s": ((job.finished_at or time.time()) - job.submitted_at),
        "restart_overhead_s": job.restart_overhead_s,
        "workers": [
            {"instance_id": r.instance_id, "offering": r.offering_key, "market": r.market, "state": r.state, "gpus": r.gpus}
            for r in live
        ],
        "spot_seconds": round(sum(r.billed_seconds for r in rows if r.market == SPOT), 3),
        "on_demand_seconds": round(sum(r.billed_seconds for r in rows if r.market == ON_DEMAND), 3),
    }
