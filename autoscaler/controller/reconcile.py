"""One tick of the reconcile loop.

1. The hard budget first, from the database and the last prices seen, before any cloud call can fail
   this tick (a throttled DescribeInstances must not also switch the guard off).
2. Poll the provider for what the cloud did on its own (notices, preemptions), relay notices to the
   workers, and commit what it reported (a provider reports a change once).
3. Sweep: make the cloud and the database agree (unsettled launches, unknown instances).
4. Observe each live job's gang and its progress and cost; ask the policy for every job's allocation
   at once; make the instances match it.

One job's trouble is that job's alone (issue 14, finding 1): each job's part of steps 1 and 4 runs
contained (``_contained``). An error there other than the cloud's rolls back that job's changes since
the last commit, is logged and noted on the job (``handling-error``), and the tick goes on for the
others; the ``MAX_HANDLING_ERRORS``-th such error in a row (nothing else recorded for the job in
between) fails the job with a one-line reason. A ``ProviderError`` still ends the tick (the cloud's
trouble is every job's; the next tick retries), except one raised while starting a job's gang: that
is the job's alone, classified and retried or reported by ``start_failures.py`` (issue 21, finding 6).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from autoscaler.fleet import accounting
from autoscaler.jobs.domain import JobState
from cloud_providers.base import SPOT, Offering
from cloud_providers.errors import ProviderError

from ..policy import JobView, PolicyInput
from ..state import Event, InstanceRow, Job
from .allocate import apply
from .budget import budget_guard
from .context import Context
from .gangs import observe_gang, on_instance_change
from .launches import end_job
from .recovery import sweep
from .views import job_view

log = logging.getLogger("spotrain.controller")

MAX_HANDLING_ERRORS = 3
HANDLING_ERROR = "handling-error"
T = TypeVar("T")


def _contained(ctx: Context, s: Session, job_id: str, part: str, fn: Callable[[], T], *,
               contain: bool) -> tuple[bool, T | None]:
    """``(True, fn())`` (one job's ``part`` of the tick), committed; ``(False, None)`` after an error
    of its own (see the module doc). ``contain=False`` lets every error through."""
    try:
        out = fn()
        s.commit()
        return True, out
    except ProviderError:
        raise
    except Exception as exc:
        if not contain or not ctx.leading():
            raise  # not leading (any more): the lease was lost, which is no fault of this job's
        s.rollback()
        log.exception("reconcile: %s of job %s failed", part, job_id)
        _handling_failed(ctx, s, job_id, part, exc)
        return False, None


def _handling_failed(ctx: Context, s: Session, job_id: str, part: str, exc: Exception) -> None:
    job = s.get(Job, job_id)
    if job is None or JobState(job.state).terminal:
        return
    what = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    recent = s.scalars(select(Event.kind).where(Event.job_id == job_id).order_by(Event.id.desc())
                       .limit(MAX_HANDLING_ERRORS - 1)).all()
    streak = 1 + next((i for i, kind in enumerate(recent) if kind != HANDLING_ERROR), len(recent))
    ctx.note(s, job, HANDLING_ERROR, f"{part} failed ({streak} of {MAX_HANDLING_ERRORS} in a row): {what}")
    s.commit()
    if streak < MAX_HANDLING_ERRORS:
        return
    reason = f"the controller failed to handle the job {streak} times in a row ({part}): {what}"
    try:
        end_job(ctx, s, job, JobState.FAILED, reason, why="the controller cannot handle the job")
        s.commit()
    except ProviderError:
        s.rollback()
        raise
    except Exception:
        # Releasing failed too: fail the job as it stands; the sweep releases what it still holds.
        s.rollback()
        log.exception("reconcile: ending job %s failed", job_id)
        job = s.get(Job, job_id)
        if job is not None and not JobState(job.state).terminal:
            ctx.transition(s, job, JobState.FAILED, reason)
            s.commit()


def _guard_first(ctx: Context, *, contain: bool) -> set[str]:
    """The budget guard of every live job; the ids of those whose guard failed (left alone for the
    rest of the tick: one error per job and tick)."""
    failed: set[str] = set()
    if not ctx.last_prices:
        return failed
    with ctx.store.session() as s:
        for job_id in [j.job_id for j in ctx.store.jobs(s, controller_id=ctx.controller_id, live_only=True)]:
            job = s.get(Job, job_id)
            if job is None:
                continue
            ok, _ = _contained(ctx, s, job_id, "budget guard", partial(_guard_one, ctx, s, job), contain=contain)
            if not ok:
                failed.add(job_id)
    return failed


def _guard_one(ctx: Context, s: Session, job: Job) -> None:
    rows = ctx.store.instances(s, job.job_id)
    accounting.bill_job(ctx.provider, job, rows)
    budget_guard(ctx, s, job, rows, ctx.last_prices)


def _observe_one(ctx: Context, s: Session, job: Job, by_key: dict[str, Offering]) -> JobView | None:
    rows = ctx.store.instances(s, job.job_id)
    accounting.bill_job(ctx.provider, job, rows)
    observe_gang(ctx, s, job, rows)
    if JobState(job.state).terminal or budget_guard(ctx, s, job, rows, ctx.last_prices):
        return None
    return job_view(ctx, job, rows, by_key)


def _observe(ctx: Context, s: Session, jobs: list[Job], by_key: dict[str, Offering], *, contain: bool,
             skip: set[str]) -> list[JobView]:
    s.commit()  # what the tick did before is not undone by one job's error
    views = []
    for job_id in [j.job_id for j in jobs if j.job_id not in skip]:
        job = s.get(Job, job_id)
        if job is None:
            continue
        _, view = _contained(ctx, s, job_id, "observing", partial(_observe_one, ctx, s, job, by_key), contain=contain)
        if view is not None:
            views.append(view)
    return views


def tick(ctx: Context, *, contain: bool = True) -> None:
    """One tick (see the module doc). ``contain=False``: an error in one job's handling ends the
    tick instead of being that job's alone."""
    failed = _guard_first(ctx, contain=contain)
    changed = ctx.provider.poll()
    with ctx.store.session() as s:
        for inst in changed:
            row = s.get(InstanceRow, inst.instance_id)
            if row is not None:
                on_instance_change(ctx, s, row, inst.state, inst.interruption, inst.terminated_at_s)
        s.commit()
        jobs = ctx.store.jobs(s, controller_id=ctx.controller_id, live_only=True)
        # The sweep runs with no live job too: a launch call that raised may still have created an
        # instance for a job that has ended since (cancelled, over budget); it must not bill on.
        sweep(ctx, s)
        ctx.spot_history.saw(j.job_id for j in jobs)
        ctx.next_wake_s = None
        if not jobs:
            return
        offerings = list(ctx.provider.offerings())
        now_s = ctx.provider.now_s()
        ctx.market.observe(now_s, offerings)
        by_key = {o.key: o for o in offerings}
        ctx.last_prices = {o.key: (o.on_demand_price_usd_per_hour, o.spot_price_usd_per_hour) for o in offerings}
        views = _observe(ctx, s, jobs, by_key, contain=contain, skip=failed)
        if not views:
            return
        seen = accounting.history_from_totals(ctx.spot_history.totals(ctx.store, s, ctx.controller_id))
        held_spot: dict[str, int] = {}
        for v in views:
            for h in v.held:
                if h.market == SPOT:
                    held_spot[h.offering_key] = held_spot.get(h.offering_key, 0) + h.instances
        for key in held_spot:
            ctx.rooms.holding(key, now_s)
        # Where the provider reports no room (a real cloud), the policy sees what was observed.
        inp = PolicyInput(now_s=now_s, jobs=views, offerings=ctx.rooms.believed(offerings, held_spot, now_s),
                          history=ctx.market.merge(seen),
                          decision_interval_s=ctx.tick_s * ctx.clock_rate)
        allocations = {a.job_id: a for a in ctx.policy.decide(inp)}
        wakes = [a.next_decision_s for a in allocations.values() if a.next_decision_s is not None]
        ctx.next_wake_s = min(wakes) if wakes else None
        for view in views:
            job = s.get(Job, view.job_id)
            alloc = allocations.get(view.job_id)
            if job is not None and alloc is not None:
                _contained(ctx, s, view.job_id, "allocating", partial(apply, ctx, s, job, alloc, by_key),
                           contain=contain)
