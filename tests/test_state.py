"""The state database: upgrades keep stored jobs, and name lookups find the newest job (migrations from
the baseline: tests/test_migrations.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from autoscaler.state import Job, Store

# The jobs row's gang columns before they had a table of their own (migration state_0004).
OLD_GANG_COLUMNS = (("gang_attempt", "INTEGER NOT NULL DEFAULT 0"), ("gang_port", "INTEGER NOT NULL DEFAULT 0"),
                    ("gang_started_at", "FLOAT"), ("gang_stopping", "VARCHAR(32) NOT NULL DEFAULT ''"),
                    ("gang_stop_deadline", "FLOAT"), ("gang_start_step", "BIGINT NOT NULL DEFAULT 0"))


def test_an_older_database_gains_new_columns_and_keeps_its_jobs(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    Store(f"sqlite:///{db}")  # create the current schema, then make it look like an older release
    con = sqlite3.connect(db)
    con.execute("DROP TABLE alembic_version")  # made before Alembic
    # added by later releases (the last four by Alembic revision state_0005)
    for col in ("stalled_restarts", "profile_json", "batch_json", "state_location", "checkpoint_size_gb",
                "egress_usd", "region_moves"):
        con.execute(f"ALTER TABLE jobs DROP COLUMN {col}")
    con.execute("DROP TABLE gangs")  # the gang was columns of the jobs row then
    for col, ddl in OLD_GANG_COLUMNS:
        con.execute(f"ALTER TABLE jobs ADD COLUMN {col} {ddl}")
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
