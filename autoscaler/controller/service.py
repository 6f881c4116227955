"""The controller service: API operations (submit, cancel, inspect) and the reconcile loop's schedule.

The loop itself is ``reconcile.tick``; as a service an APScheduler interval job calls it on the wall
clock, and as the simulator ``autoscaler.simulator.world`` calls it on a virtual clock. All state is
in the database and the provider, so a restarted controller carries on where a crashed one stopped
(``recovery.py``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from autoscaler.jobs import log_cap
from autoscaler.jobs.domain import JobNameTaken, JobState, NotOwner
from autoscaler.jobs.spec import JobSpec
from cloud_providers.base import Provider
from cloud_providers.clock import WALL_CLOCK, Clock
from cloud_providers.errors import ProviderError
from cloud_providers.executor import Executor
from cloud_providers.protocol import ProgressRecord

from ..errors import Conflict, JobNotFound
from ..home import default_store
from ..policy import Policy
from ..state import Job, Store
from ..state.lease import LeaderLease
from . import reconcile
from .context import Context, Hooks, Timings
from .gangs import observe_abandoned
from .launches import end_job
from .recovery import recover
from .views import job_summary

log = logging.getLogger("spotrain.controller")


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
        clock: Clock = WALL_CLOCK,
        timings: Timings | None = None,
        strict: bool = False,
        lease: LeaderLease | None = None,
        on_lead: Callable[[], tuple[Provider, Executor]] | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        """``clock_rate``: provider-clock seconds per controller-clock second (the local cloud's time
        scale). ``clock``: where the controller reads time (virtual in the simulator). ``strict``: a
        tick that fails raises (the simulator: an error there is a bug to see, not a cloud hiccup to
        ride out). ``lease``: the fleet's leader lease (``state/lease.py``): the service ticks only
        while it holds it and is a standby otherwise; None: it always leads. ``on_lead``: the provider
        and executor to act with from a takeover on (rebuilt: a local cloud's state is read at start,
        and the leader changed it since). ``hooks``: the simulator's changes (``Hooks``)."""
        hooks = hooks or Hooks()
        self.ctx = Context(store=store, provider=provider, executor=executor, policy=policy, controller_id=controller_id,
                           clock=clock, tick_s=tick_s, clock_rate=clock_rate, timings=timings or Timings(),
                           prices_seen_on_change=hooks.prices_seen_on_change)
        if hooks.logs_dir is not None:
            self.ctx.logs_dir = hooks.logs_dir
        if hooks.scaling_of is not None:
            self.ctx.scaling_of = hooks.scaling_of
        if hooks.market_seed is not None:
            self.ctx.market.seed(hooks.market_seed)
        self._lock = threading.RLock()
        self._scheduler: Any = None
        self.last_tick_error: str | None = None
        self.strict = strict
        self.lease = lease
        self._on_lead = on_lead
        self._ready_epoch: int | None = None  # the lease epoch this controller recovered for
        if lease is not None:
            lease.install_fence(store._sessions)  # noqa: SLF001 - the store's own sessionmaker
            self.ctx.leading = self.leading

    # Collaborators, for callers that inspect the controller (the API, tests).
    @property
    def store(self) -> Store:
        return self.ctx.store

    @property
    def provider(self) -> Provider:
        return self.ctx.provider

    @property
    def executor(self) -> Executor:
        return self.ctx.executor

    @property
    def policy(self) -> Policy:
        return self.ctx.policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self.ctx.policy = policy

    @property
    def controller_id(self) -> str:
        return self.ctx.controller_id

    @property
    def tick_s(self) -> float:
        return self.ctx.tick_s

    # ----- lifecycle of the service -----
    def recover(self) -> dict[str, int]:
        with self._lock:
            return recover(self.ctx)

    def start(self) -> None:
        """Recover and tick on a schedule; with a lease, first try to take it (recovering at once if
        taken) and then renew it, or wait as a standby, every ``lease.poll_s``."""
        from apscheduler.schedulers.background import BackgroundScheduler

        if self.lease is None:
            self.recover()
        else:
            self.lease_step(raise_errors=True)
        self._scheduler = BackgroundScheduler(daemon=True)
        self._scheduler.add_job(
            self.tick, "interval", seconds=self.ctx.tick_s, max_instances=1, coalesce=True, id="reconcile",
            misfire_grace_time=None,
        )
        if self.lease is not None:
            self._scheduler.add_job(self.lease_step, "interval", seconds=self.lease.poll_s, max_instances=1,
                                    coalesce=True, id="lease", misfire_grace_time=None)
        self._scheduler.start()

    def shutdown(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None
        if self.lease is not None:
            try:
                self.lease.release()  # a standby takes over at once
            except SQLAlchemyError as exc:
                log.warning("lease: could not release it: %s", exc)

    # ----- the fleet's lease (high availability) -----
    def leading(self) -> bool:
        """Whether this controller acts now: it holds the lease and recovered since it took it."""
        lease = self.lease
        return lease is None or (lease.held() and self._ready_epoch == lease.epoch)

    @property
    def role(self) -> str:
        return "leader" if self.leading() else "standby"

    def lease_step(self, *, raise_errors: bool = False) -> None:
        """Renew the lease, or try to take it (the scheduler's ``lease`` job, apart from the tick, so a
        long tick or recovery does not let it lapse). ``raise_errors`` (at start): database errors,
        and the cloud's errors of the recovery that follows a takeover at once, are the user's to see."""
        lease = self.lease
        if lease is None:
            return
        try:
            outcome = lease.step()
        except SQLAlchemyError as exc:
            if raise_errors:
                raise
            log.warning("lease: the database did not answer: %s", " ".join(str(exc).split())[:300])
            return
        if outcome == "lost":
            log.warning("lease: lost the lease of fleet %s; standing by", self.controller_id)
        elif outcome == "standby" and raise_errors:
            who = lease.leader.get("url") or lease.leader.get("host") or "another controller"
            log.info("lease: standby of fleet %s, led by %s; taking over when its lease expires",
                     self.controller_id, who)
        if raise_errors and lease.epoch is not None and self._ready_epoch != lease.epoch:
            # At start the provider and executor were just made; a later takeover rebuilds them.
            self._take_over(raise_errors=True, rebuild=False)

    def _take_over(self, *, raise_errors: bool, rebuild: bool) -> None:
        lease = self.lease
        assert lease is not None
        epoch = lease.epoch
        with self._lock:
            if rebuild and self._on_lead is not None:
                provider, executor = self._on_lead()
                self.ctx.provider, self.ctx.executor = provider, executor
            self.ctx = self.ctx.fresh()  # another controller acted since this one's memory was made
            try:
                with lease.fenced():
                    counts = recover(self.ctx)
            except (ProviderError, SQLAlchemyError, Conflict) as exc:
                if raise_errors and not isinstance(exc, Conflict):
                    raise
                log.warning("lease: recovery after taking the lease failed (retried): %s", exc)
                return
            if lease.epoch == epoch:
                self._ready_epoch = epoch
                log.info("lease: leading fleet %s (epoch %s) after recovery %s", self.controller_id, epoch, counts)

    # ----- API operations -----
    def submit(self, spec: JobSpec, workdir: Path, *, scenario: Mapping[str, Any] | None = None) -> dict[str, Any]:
        ctx = self.ctx
        if getattr(ctx.executor, "ship_workdir", False):  # the remote executor ships it to instances
            from autoscaler.jobs.workdir import check_workdir

            check_workdir(workdir)  # SpecError, one line: over the size limit, a link out of it
        with self._lock, ctx.store.session() as s:
            if ctx.store.live_job_named(s, spec.name) is not None:
                raise JobNameTaken(f"a live job named {spec.name!r} already exists", name=spec.name)
            job_id = f"{spec.name}-{uuid.uuid4().hex[:6]}"
            store_uri = spec.checkpoint.store or default_store()
            job = Job(
                job_id=job_id, name=spec.name, controller_id=ctx.controller_id, cloud=ctx.provider.name,
                spec_json=json.dumps(spec.to_dict()), workdir=str(workdir), checkpoint_uri=f"{store_uri}/{job_id}",
                state=JobState.PENDING.value, reason="submitted", submitted_at=ctx.now(),
                submitted_clock_s=ctx.provider.now_s(), scenario_json=json.dumps(dict(scenario or {})),
                checkpoint_key=secrets.token_hex(32),
            )
            s.add(job)
            s.flush()
            ctx.note(s, job, "submitted", f"job {job_id} submitted")
            return job_summary(job, [], now=ctx.now()).to_json_dict()

    def _end(self, ref: str, to: JobState, why: str, *, own_only: bool) -> dict[str, Any]:
        ctx = self.ctx
        with self._lock, ctx.store.session() as s:
            job = ctx.store.job(s, ref)
            if job is None:
                raise JobNotFound(f"no job {ref!r}")
            live = not JobState(job.state).terminal
            if own_only and live and job.controller_id != ctx.controller_id:
                raise NotOwner(f"job {job.job_id} belongs to controller {job.controller_id}, not this one",
                               job_id=job.job_id, owner=job.controller_id)
            if live and not self.leading():
                # A standby releases nothing: it records the request, and the leader ends the job.
                if not job.cancel_requested:
                    job.cancel_requested = why
                    ctx.note(s, job, "cancel-requested", f"{why} (at a standby; the leader ends the job)")
            elif live:
                end_job(ctx, s, job, to, why, why=why if to is JobState.FAILED else "job cancelled")
            return job_summary(job, ctx.store.instances(s, job.job_id), now=ctx.now()).to_json_dict()

    def cancel(self, ref: str) -> dict[str, Any]:
        return self._end(ref, JobState.CANCELLED, "cancelled by user", own_only=True)

    def fail_abandoned(self, ref: str, why: str) -> dict[str, Any]:
        """End a live job of this controller as FAILED, releasing everything it holds: for jobs whose
        owner is gone for good (an embedded ``spotrain run`` that was killed)."""
        return self._end(ref, JobState.FAILED, why, own_only=False)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the controller's lock (reentrant): no tick or other operation runs until the block
        ends (``resume``: a new job's workers must not start before it is told its checkpoints)."""
        with self._lock:
            yield

    def observe_abandoned(self, ref: str) -> str | None:
        """Look at the gang of a job whose ``spotrain run`` was killed once, as its controller would
        have (``gangs.observe_abandoned``): None when the gang had ended the job, else why to fail it."""
        with self._lock, self.ctx.store.session() as s:
            job = s.get(Job, ref)
            return None if job is None else observe_abandoned(self.ctx, s, job)

    def job_info(self, ref: str) -> dict[str, Any]:
        ctx = self.ctx
        with ctx.store.session() as s:
            job = ctx.store.job(s, ref)
            if job is None:
                raise JobNotFound(f"no job {ref!r}")
            return job_summary(job, ctx.store.instances(s, job.job_id), now=ctx.now()).to_json_dict()

    # ----- the reconcile loop -----
    def tick(self) -> None:
        lease = self.lease
        if lease is not None and lease.held() and self._ready_epoch != lease.epoch:
            self._take_over(raise_errors=False, rebuild=True)  # recovery first, here: the lease job renews
        if not self.leading():
            return  # a standby (or a leader whose lease ran out) does not act
        snapshot = self._read_job_files()
        with self._lock, self.lease.fenced() if self.lease is not None else contextlib.nullcontext():
            t0 = self.ctx.clock.now()
            self.ctx.progress_snapshot = snapshot
            try:
                if self.lease is not None:
                    self._cancel_requested()
                reconcile.tick(self.ctx)
                self.last_tick_error = None
            except Conflict as exc:
                if self.leading():
                    raise
                self.last_tick_error = f"lost the lease: {exc}"
                log.warning("reconcile: %s", self.last_tick_error)
            except ProviderError as exc:
                # A cloud hiccup must not kill the loop; the next tick retries.
                self.last_tick_error = f"{type(exc).__name__}: {exc}"
                log.warning("reconcile: %s", self.last_tick_error)
                if self.strict:
                    raise
            except Exception as exc:  # noqa: BLE001 - the loop must survive a bug; /healthz reports it
                self.last_tick_error = f"{type(exc).__name__}: {exc}"
                if self.strict:
                    raise
                log.exception("reconcile failed")
            finally:
                self.ctx.progress_snapshot = None
                self.ctx.last_tick_s = self.ctx.clock.now() - t0

    def _read_job_files(self) -> dict[str, ProgressRecord | None] | None:
        """Rank 0's reports of this controller's live jobs, read before the tick takes the lock: a
        file a job writes must never be read while submit and cancel wait (issue 21, finding 1).
        None when the executor does not read files (its reports are in the database or in memory).
        Its workers' logs are kept to the job's cap here too (``jobs/log_cap.py``, finding 5)."""
        ctx = self.ctx
        read = getattr(ctx.executor, "read_progress", None)
        if read is None:
            return None
        try:
            with ctx.store.session() as s:
                ids = [j.job_id for j in ctx.store.jobs(s, controller_id=ctx.controller_id, live_only=True)]
            for job_id in ids:  # the workers write their logs here themselves: keep each job to its cap
                log_cap.enforce(ctx.logs_dir(job_id))
            out: dict[str, ProgressRecord | None] = read(ids)
            return out
        except (OSError, SQLAlchemyError) as exc:
            log.warning("reconcile: reading the jobs' progress before the tick failed: %s", exc)
            return None

    def _cancel_requested(self) -> None:
        """End the live jobs a standby was asked to cancel."""
        ctx = self.ctx
        with ctx.store.session() as s:
            for job in ctx.store.jobs(s, controller_id=ctx.controller_id, live_only=True):
                if job.cancel_requested:
                    end_job(ctx, s, job, JobState.CANCELLED, job.cancel_requested, why="job cancelled")
