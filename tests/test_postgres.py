"""The controller on a real PostgreSQL (tests/pg_support.py starts a throwaway server).

The store's own checks (schema made by two controllers at once, a pre-Alembic database's upgrade,
64-bit steps; tests/test_migrations.py has the baseline's upgrade with data on PostgreSQL too)
and a representative share of the controller's tests run again with ``SPOTRAIN_DB_URL`` on a fresh
PostgreSQL database each: the SQLite-free paths of every tick (launch, preemption, recovery by tag,
a failed launch call settled by its decision, the budget, a cancel, a hostile progress file) and the
service with its CLI over HTTP. Without PostgreSQL they skip, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy import text
from test_controller import (  # noqa: F401 - collected here again, on PostgreSQL
    test_cancel_releases_everything,
    test_failed_launch_call_is_settled_by_decision_tag,
    test_preempted_job_resumes_and_finishes,
    test_recovery_adopts_unrecorded_launch_and_terminates_orphans,
)
from test_hardening import test_finding1_hostile_progress_file_breaks_neither_the_tick_nor_other_jobs  # noqa: F401
from test_service import test_sigkilled_controller_recovers_and_job_finishes  # noqa: F401
from test_state import OLD_GANG_COLUMNS

from autoscaler.state import Job, Store


@pytest.fixture()
def spotrain_home(spotrain_home: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The suite's SPOTRAIN_HOME, with the state in a fresh PostgreSQL database."""
    monkeypatch.setenv("SPOTRAIN_DB_URL", postgres_url)
    return spotrain_home


def test_two_controllers_make_the_schema_at_once_and_it_evolves_additively(postgres_url: str) -> None:
    errors: list[BaseException] = []

    def open_store() -> None:
        try:
            Store(postgres_url).engine.dispose()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    store = Store(postgres_url)
    with store.engine.begin() as conn:  # as a release before these columns (and before Alembic) made it
        conn.execute(text("DROP TABLE alembic_version"))
        conn.execute(text("ALTER TABLE jobs DROP COLUMN batch_json"))
        conn.execute(text("ALTER TABLE jobs DROP COLUMN cancel_requested"))
        conn.execute(text("DROP TABLE gangs"))  # the gang was columns of the jobs row then
        for col, ddl in OLD_GANG_COLUMNS:
            conn.execute(text(f"ALTER TABLE jobs ADD COLUMN {col} {ddl}"))
    with store.session() as s:
        s.execute(text("INSERT INTO jobs (job_id, name, controller_id, cloud, spec_json, workdir, checkpoint_uri, "
                       "state, reason, submitted_at, submitted_clock_s, attempt, gang_attempt, gang_port, "
                       "gang_stopping, restarts_on_errors, gang_start_step, stalled_restarts, preemptions, cost_usd, "
                       "on_demand_cost_usd, step, metric_name, scenario_json, profile_json) VALUES ('old-1', 'old', "
                       "'c', 'local', '{}', '/', 'file:///x', 'SUCCEEDED', 'done', 1, 0, 1, 0, 0, '', 0, 0, 0, 2, "
                       "1.5, 3.0, 10, '', '', '')"))
    store.engine.dispose()
    store = Store(postgres_url)
    with store.session() as s:
        job = store.job(s, "old")
        assert isinstance(job, Job) and job.preemptions == 2 and job.batch_json == "" and job.cancel_requested == ""
        job.step = job.total_steps = job.last_checkpoint_step = 2**53  # the protocol's range: not 32-bit
    with store.session() as s:
        assert store.job(s, "old-1").step == 2**53  # type: ignore[union-attr]
