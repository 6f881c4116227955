"""One tick of the reconcile loop.

1. The hard budget first, from the database and the last prices seen, before any cloud call can fail
   this tick (a throttled DescribeInstances must not also switch the guard off).
2. Poll the provider for what the cloud did on its own (notices, preemptions), relay notices to the
   workers, and commit what it reported (a provider reports a change once).
3. Sweep: make the cloud and the database agree (unsettled launches, unknown instances).
4. Observe each live job's gang and its progress and cost; ask the policy for every job's allocation
   at once; make the instances match it.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from cloud_providers.base import Offering

from .. import accounting
from ..domain import JobState
from ..policy import JobView, PolicyInput
from ..state import InstanceRow, Job
from .allocate import apply
from .budget import budget_guard
from .context import Context
from .gangs import observe_gang, on_instance_change
from .recovery import sweep
from .views import job_view


def _guard_first(ctx: Context) -> None:
    if not ctx.last_prices:
        return
    with ctx.store.session() as s:
        for job in ctx.store.jobs(s, controller_id=ctx.controller_id, live_only=True):
            rows = ctx.store.instances(s, job.job_id)
            job.cost_usd, job.on_demand_cost_usd = accounting.update_billing(ctx.provider, rows)
            budget_guard(ctx, s, job, rows, ctx.last_prices)


def _observe(ctx: Context, s: Session, jobs: list[Job], by_key: dict[str, Offering]) -> list[JobView]:
    views = []
    for job in jobs:
        rows = ctx.store.instances(s, job.job_id)
        job.cost_usd, job.on_demand_cost_usd = accounting.update_billing(ctx.provider, rows)
        observe_gang(ctx, s, job, rows)
        if JobState(job.state).terminal or budget_guard(ctx, s, job, rows, ctx.last_prices):
            continue
        views.append(job_view(ctx, job, rows, by_key))
    return views


def tick(ctx: Context) -> None:
    _guard_first(ctx)
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
        ctx.next_wake_s = None
        if not jobs:
            return
        offerings = list(ctx.provider.offerings())
        now_s = ctx.provider.now_s()
        ctx.market.observe(now_s, offerings)
        by_key = {o.key: o for o in offerings}
        ctx.last_prices = {o.key: (o.on_demand_price_usd_per_hour, o.spot_price_usd_per_hour) for o in offerings}
        views = _observe(ctx, s, jobs, by_key)
        if not views:
            return
        all_rows = [r for j in ctx.store.jobs(s, controller_id=ctx.controller_id) for r in ctx.store.instances(s, j.job_id)]
        inp = PolicyInput(now_s=now_s, jobs=views, offerings=offerings,
                          history=ctx.market.merge(accounting.market_history(all_rows)),
                          decision_interval_s=ctx.tick_s * ctx.clock_rate)
        allocations = {a.job_id: a for a in ctx.policy.decide(inp)}
        wakes = [a.next_decision_s for a in allocations.values() if a.next_decision_s is not None]
        ctx.next_wake_s = min(wakes) if wakes else None
        for view in views:
            job = s.get(Job, view.job_id)
            alloc = allocations.get(view.job_id)
            if job is not None and alloc is not None:
                apply(ctx, s, job, alloc, by_key)
