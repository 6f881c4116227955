"""Prometheus metrics of the controller, rendered from the database on each scrape.

A scrape must not grow with history (issue 21, finding 7: 9.9 s at 10,000 finished jobs): jobs are
counted by state, and cost, on-demand cost and preemptions summed over all jobs, by the database
(two grouped queries); the per-job gauges are those of live jobs only. A finished job's figures
stay in Prometheus' own history, and in the totals.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from sqlalchemy import func, select

from autoscaler.state import JobState, Store
from autoscaler.state.models import Job
from autoscaler.state.store import LIVE_SELECTOR, states_of


def render_metrics(store: Store) -> str:
    reg = CollectorRegistry()
    jobs = Gauge("spotrain_jobs", "Jobs by state", ["state"], registry=reg)
    cost = Gauge("spotrain_job_cost_usd", "Cost so far of each live job", ["job_id"], registry=reg)
    od = Gauge("spotrain_job_on_demand_cost_usd", "On-demand counterfactual of each live job", ["job_id"], registry=reg)
    pre = Gauge("spotrain_job_preemptions", "Preemptions survived by each live job", ["job_id"], registry=reg)
    cost_all = Gauge("spotrain_cost_usd", "Cost of all jobs, by state", ["state"], registry=reg)
    od_all = Gauge("spotrain_on_demand_cost_usd", "On-demand counterfactual of all jobs, by state", ["state"], registry=reg)
    pre_all = Gauge("spotrain_preemptions", "Preemptions survived by all jobs, by state", ["state"], registry=reg)
    with store.session() as s:
        counts = {st.value: (0, 0.0, 0.0, 0) for st in JobState}
        totals = select(Job.state, func.count(), func.sum(Job.cost_usd), func.sum(Job.on_demand_cost_usd),
                        func.sum(Job.preemptions)).group_by(Job.state)
        for state, n, c, o, p in s.execute(totals):
            counts[state] = (int(n), float(c or 0.0), float(o or 0.0), int(p or 0))
        live = select(Job.job_id, Job.cost_usd, Job.on_demand_cost_usd, Job.preemptions).where(
            Job.state.in_(states_of(LIVE_SELECTOR) or []))
        for job_id, c, o, p in s.execute(live):
            cost.labels(job_id).set(c)
            od.labels(job_id).set(o)
            pre.labels(job_id).set(p)
    for st, (n, c, o, p) in counts.items():
        jobs.labels(st).set(n)
        cost_all.labels(st).set(c)
        od_all.labels(st).set(o)
        pre_all.labels(st).set(p)
    return generate_latest(reg).decode()
