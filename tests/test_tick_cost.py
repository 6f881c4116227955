"""Issue 14, finding 5: a tick's cost grows with every job ever submitted.

With 2,149 finished jobs and one live one, ticks took 2-4.5 s: one instances query per historical job
each tick, and the sweep and the market history read every job ever submitted. The regression test
drives the real controller on the virtual clock (``World``: LocalProvider, SimulatedExecutor) over a
real SQLite file holding N finished jobs, each with instances, decisions and events, plus one live
job, and measures what a tick asks of the database: SQL statements, ORM rows loaded, and SQLite VM
instructions (a progress handler; deterministic, unlike wall time on a shared machine, and it counts
the rows a query scans, not only those it returns). Ten ticks (one full sweep period) must cost the
same with 10 and with 5,000 finished jobs. ``benchmarks/tick_cost.py`` prints the same figures.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, insert

from autoscaler.controller import context as context_module
from autoscaler.jobs.spec import JobSpec, spec_from_dict
from autoscaler.policy import CheapestPolicy
from autoscaler.simulator.executor import SimWorkload
from autoscaler.simulator.world import World
from autoscaler.state import Decision, Event, InstanceRow, Job, Store
from autoscaler.state.models import Base
from cloud_providers.base import ON_DEMAND, SPOT
from cloud_providers.local.market import HEADER, MarketTrace
from cost_models.scaling import LinearScaling

GRID_S = 300.0
TICKS = 10  # one sweep period (Timings.sweep_every_ticks)
WARMUP_TICKS = 5
VM_STEP = 100  # SQLite VM instructions per progress-handler call
# An offering the trace does not list: the finished jobs' history cannot change the live job's plan.
OLD_KEY = "aws/eu-west-1a/p3.2xlarge/V100:1"
TRACE = ",".join(HEADER) + "\n0,aws,us-east-1,us-east-1a,p3.2xlarge,V100,1,0.9,3.06,4\n"


@dataclasses.dataclass
class Cost:
    statements: int = 0
    rows: int = 0
    vm_steps: int = 0
    seconds: float = 0.0

    def per_tick(self, ticks: int) -> dict[str, float]:
        return {"statements": self.statements / ticks, "rows": self.rows / ticks,
                "vm_steps": self.vm_steps / ticks, "ms": 1000.0 * self.seconds / ticks}


def _spec() -> JobSpec:
    return spec_from_dict({"name": "live", "run": "python train.py",
                           "resources": {"accelerators": ["V100:1"], "clouds": ["aws"], "spot": "auto"},
                           "workers": {"min": 1, "max": 1}, "training": {"logical_workers": 1}})


def add_finished_jobs(store: Store, n: int, controller_id: str = "sim") -> None:
    """``n`` finished jobs of ``controller_id``, each with two instances (a preempted spot one and an
    on-demand one), two launched decisions and three events, inserted in bulk."""
    jobs, insts, decisions, events = [], [], [], []
    spec_json = _spec().model_dump_json()
    for i in range(n):
        jid = f"old-{i:06d}"
        jobs.append(dict(job_id=jid, name=f"old{i}", controller_id=controller_id, cloud="aws", spec_json=spec_json,
                         workdir="/", checkpoint_uri=f"file:///ckpt/{jid}", state="SUCCEEDED", reason="done",
                         submitted_at=float(i), submitted_clock_s=float(i), finished_at=float(i) + 1.0,
                         attempt=2, cost_usd=1.0, on_demand_cost_usd=3.0, step=100, total_steps=100))
        for k, market in enumerate((SPOT, ON_DEMAND)):
            iid = f"{jid}-i{k}"
            insts.append(dict(instance_id=iid, job_id=jid, cloud="aws", offering_key=OLD_KEY, market=market,
                              state="terminated", decision_id=f"{jid}-d{k}", launched_at_s=float(i),
                              terminated_at_s=float(i) + 1.0, interruption="preempted" if market == SPOT else None,
                              attempt=k + 1, billed_seconds=3600.0, cost_usd=0.9, on_demand_cost_usd=3.06))
            decisions.append(dict(decision_id=f"{jid}-d{k}", job_id=jid, offering_key=OLD_KEY, market=market,
                                  created_at=float(i), status="launched", instance_id=iid))
        for kind, to in (("state", "PROVISIONING"), ("state", "RUNNING"), ("state", "SUCCEEDED")):
            events.append(dict(job_id=jid, ts=float(i), kind=kind, from_state="", to_state=to, reason="x"))
    with store.session() as s:
        for model, rows in ((Job, jobs), (InstanceRow, insts), (Decision, decisions), (Event, events)):
            if rows:
                s.execute(insert(model), rows)


def world_with_history(db: Path, finished: int) -> tuple[World, str]:
    """A ``World`` over the SQLite file ``db`` holding ``finished`` finished jobs, with one live job
    running on spot after ``WARMUP_TICKS`` ticks."""
    w = World(MarketTrace.parse(TRACE, source="tick cost"), CheapestPolicy(), grid_s=GRID_S)
    w.store = w.controller.ctx.store = Store(f"sqlite:///{db}")
    add_finished_jobs(w.store, finished)
    wl = SimWorkload(work_s=10 * 86400.0, scaling=LinearScaling(), restart_overhead_s=300.0,
                     checkpoint_save_s=30.0, checkpoint_interval_s=600.0)
    job_id = w.submit(_spec(), wl)
    for _ in range(WARMUP_TICKS):
        _tick(w)
    return w, job_id


def _tick(w: World) -> None:
    w.controller.tick()
    w.clock.advance_to(w.clock.now() + GRID_S)


def measure(w: World, ticks: int = TICKS) -> Cost:
    """What ``ticks`` ticks ask of the database."""
    cost = Cost()

    def on_statement(*_: Any) -> None:
        cost.statements += 1

    def on_load(*_: Any) -> None:
        cost.rows += 1

    def on_vm_steps() -> int:
        cost.vm_steps += VM_STEP
        return 0

    def on_checkout(dbapi_conn: Any, *_: Any) -> None:
        dbapi_conn.set_progress_handler(on_vm_steps, VM_STEP)

    def on_checkin(dbapi_conn: Any, *_: Any) -> None:
        dbapi_conn.set_progress_handler(None, VM_STEP)

    engine = w.store.engine
    event.listen(engine, "before_cursor_execute", on_statement)
    event.listen(engine, "checkout", on_checkout)
    event.listen(engine, "checkin", on_checkin)
    event.listen(Base, "load", on_load, propagate=True)
    try:
        t0 = time.perf_counter()
        for _ in range(ticks):
            _tick(w)
        cost.seconds = time.perf_counter() - t0
    finally:
        event.remove(Base, "load", on_load)
        event.remove(engine, "checkin", on_checkin)
        event.remove(engine, "checkout", on_checkout)
        event.remove(engine, "before_cursor_execute", on_statement)
    return cost


def test_tick_cost_is_independent_of_finished_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    costs: dict[int, Cost] = {}
    parsed: list[str] = []
    for n in (10, 5000):
        w, job_id = world_with_history(tmp_path / f"state-{n}.db", n)
        with w.store.session() as s:
            job = s.get(Job, job_id)
            assert job is not None and job.state == "RUNNING", "the live job runs before the measured ticks"
        with monkeypatch.context() as m:
            m.setattr(context_module, "spec_from_dict", lambda d: parsed.append(d["name"]) or spec_from_dict(d))
            costs[n] = measure(w)
    assert parsed == [], "the live job's spec was parsed when it was first seen, not again on every tick"
    small, large = costs[10], costs[5000]
    figures = json.dumps({n: dataclasses.asdict(c) for n, c in costs.items()})
    assert large.statements == small.statements, figures
    assert large.rows == small.rows, figures
    # B-tree descents are one VM instruction each, whatever the table's size: a query that scans the
    # finished jobs' rows shows up here as thousands of instructions per 1,000 rows.
    assert large.vm_steps <= small.vm_steps * 1.05 + 10 * VM_STEP, figures


def test_the_market_history_sums_finished_jobs_once_and_stays_exact(tmp_path: Path) -> None:
    """The history's cache (``SpotHistory``) gives what one sum over every instance gives, through
    a live job's spot hours, its cancellation (it settles) and a second job's life."""
    w, first = world_with_history(tmp_path / "state.db", 20)
    ctx = w.controller.ctx

    def check() -> None:
        with w.store.session() as s:
            assert ctx.spot_history.totals(w.store, s, "sim") == w.store.spot_history(s, "sim")

    check()
    for _ in range(3):
        _tick(w)
        check()
    # A finished job's released instance that the cloud kept alive gets a notice: unsettled again.
    for state in ("notice", "terminated"):
        with w.store.session() as s:
            row = s.get(InstanceRow, "old-000003-i0")
            assert row is not None
            row.state, row.billed_seconds = state, row.billed_seconds + 60.0
        check()
    w.controller.cancel(first)
    _tick(w)
    check()
    second = w.submit(_spec(), SimWorkload(work_s=3600.0, scaling=LinearScaling(), restart_overhead_s=300.0,
                                           checkpoint_save_s=30.0, checkpoint_interval_s=600.0))
    for _ in range(30):
        _tick(w)
        check()
    with w.store.session() as s:
        job = s.get(Job, second)
        assert job is not None and job.state == "SUCCEEDED"
        held = dict((k, h) for k, h, _ in w.store.spot_history(s, "sim"))
    assert held[OLD_KEY] == 20 * 3600.0 + 120.0 and len(held) == 2, "the live jobs' spot hours are in the history"


def test_an_older_database_gains_the_ticks_indexes(tmp_path: Path) -> None:
    """A database made before the tick's own indexes (and before Alembic) gains them when it opens."""
    db = tmp_path / "old.db"
    Store(f"sqlite:///{db}")
    con = sqlite3.connect(db)
    con.execute("DROP TABLE alembic_version")
    con.execute("DROP INDEX ix_jobs_controller_state")
    con.execute("DROP INDEX ix_decisions_status")
    con.commit()
    Store(f"sqlite:///{db}")
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    con.close()
    assert {"ix_jobs_controller_state", "ix_decisions_status"} <= names
