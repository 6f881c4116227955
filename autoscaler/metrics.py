"""Prometheus metrics of the controller, rendered from the database on each scrape."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from .state import JobState, Store


def render_metrics(store: Store) -> str:
    reg = CollectorRegistry()
    jobs = Gauge("spotrain_jobs", "Jobs by state", ["state"], registry=reg)
    cost = Gauge("spotrain_job_cost_usd", "Cost so far of each job", ["job_id"], registry=reg)
    od = Gauge("spotrain_job_on_demand_cost_usd", "On-demand counterfactual of each job", ["job_id"], registry=reg)
    pre = Gauge("spotrain_job_preemptions", "Preemptions survived by each job", ["job_id"], registry=reg)
    with store.session() as s:
        counts = {st.value: 0 for st in JobState}
        for j in store.jobs(s):
            counts[j.state] = counts.get(j.state, 0) + 1
            cost.labels(j.job_id).set(j.cost_usd)
            od.labels(j.job_id).set(j.on_demand_cost_usd)
            pre.labels(j.job_id).set(j.preemptions)
        for st, n in counts.items():
            jobs.labels(st).set(n)
    return generate_latest(reg).decode()
