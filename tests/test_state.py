"""The state database: upgrades keep stored jobs, and name lookups find the newest job (migrations from
the baseline: tests/test_migrations.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from autoscaler.state import Job, Store


def test_an_older_database_gains_new_columns_and_keeps_its_jobs(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    Store(f"sqlite:///{db}")  # create the current schema, then make it look like an older release
    con = sqlite3.connect(db)
    con.execute("DROP TABLE alembic_version")  # made before Alembic
    for col in ("stalled_restarts", "profile_json", "batch_json"):  # added by later releases
        con.execute(f"ALTER TABLE jobs DROP COLUMN {col}")
    con.execute(
        "INSERT INTO jobs (job_id, name, controller_id, cloud, spec_json, workdir, checkpoint_uri, state, reason,"
        " submitted_at, submitted_clock_s, attempt, gang_attempt, gang_port, gang_stopping, restarts_on_errors,"
        " gang_start_step, preemptions, cost_usd, on_demand_cost_usd, step, metric_name, scenario_json)"
        " VALUES ('old-1', 'old', 'c', 'local', '{}', '/', 'file:///x', 'SUCCEEDED', 'done', 1, 0, 1, 0, 0, '', 0,"
        " 0, 2, 1.5, 3.0, 10, '', '')"
    )
    con.commit()
    con.close()
    store = Store(f"sqlite:///{db}")
    with store.session() as s:
        job = store.job(s, "old")
        assert isinstance(job, Job)
        assert job.job_id == "old-1" and job.preemptions == 2 and job.cost_usd == 1.5
        assert job.stalled_restarts == 0 and job.profile_json == "" and job.batch_json == ""
