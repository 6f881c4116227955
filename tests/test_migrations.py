"""The state database's Alembic migrations (autoscaler/state/migrate.py).

A database as spotrain made it at commit 72c4646, the last release before Alembic (its schema is
captured in tests/data/schema_72c4646.*.sql), with data in every table, upgrades when a Store opens:
the data is intact, what came later (the agents' request counters, the job lists' paging indexes)
exists, and the schema is the models' own. The revisions alone build the models' schema, so a
model changed without a revision fails here.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import Connection

from autoscaler.errors import SchemaTooNew
from autoscaler.remote.executor import AgentTables
from autoscaler.state import Store
from autoscaler.state.migrate import AGENTS, BRANCHES, STATE, _config, branch_tables, scripts
from autoscaler.state.models import AGENT_TABLE_NAMES, AgentSeq, Base, Job, ProgressSample

DATA = Path(__file__).parent / "data"
HEADS = set(scripts().get_heads())

# One row in each table of the baseline, as the 72c4646 code wrote them.
ROWS = (
    "INSERT INTO jobs (job_id, name, controller_id, cloud, spec_json, workdir, checkpoint_uri, state, reason,"
    " submitted_at, submitted_clock_s, finished_at, attempt, gang_attempt, gang_port, gang_stopping,"
    " restarts_on_errors, gang_start_step, stalled_restarts, preemptions, cost_usd, on_demand_cost_usd, step,"
    " total_steps, metric_name, loss, last_checkpoint_step, scenario_json, profile_json, batch_json,"
    " cancel_requested) VALUES ('job-1', 'old', 'ctl', 'local', '{\"gpus\": 2}', '/w', 'file:///ck', 'SUCCEEDED',"
    " 'done', 100.5, 7.0, 200.25, 2, 0, 0, '', 1, 40, 0, 3, 1.25, 4.5, 9007199254740993, 120, 'acc', 0.5, 118,"
    " '', '[{\"nodes\": 1}]', '', '')",
    "INSERT INTO jobs (job_id, name, controller_id, cloud, spec_json, workdir, checkpoint_uri, state, reason,"
    " submitted_at, submitted_clock_s, attempt, gang_attempt, gang_port, gang_stopping, restarts_on_errors,"
    " gang_start_step, stalled_restarts, preemptions, cost_usd, on_demand_cost_usd, step, metric_name,"
    " scenario_json, profile_json, batch_json) VALUES ('job-2', 'live', 'ctl', 'local', '{}', '/w', 'file:///c2',"
    " 'RUNNING', '', 300.0, 9.0, 1, 1, 29500, '', 0, 0, 0, 0, 0.0, 0.0, 5, '', '', '', '')",
    "INSERT INTO instances (instance_id, job_id, cloud, offering_key, market, region, tags_json, gpus, state,"
    " decision_id, launched_at_s, terminated_at_s, interruption, notice_delivered, attempt, first_rank,"
    " billed_seconds, cost_usd, on_demand_cost_usd) VALUES ('i-1', 'job-1', 'local', 'local|a|g1', 'spot', 'r',"
    " '{}', 2, 'terminated', 'd-1', 10.0, 70.0, 'spot-preemption', 1, 1, 0, 60.0, 0.5, 1.5)",
    "INSERT INTO decisions (decision_id, job_id, offering_key, market, created_at, status, instance_id, reason)"
    " VALUES ('d-1', 'job-1', 'local|a|g1', 'spot', 9.5, 'launched', 'i-1', '')",
    "INSERT INTO events (job_id, ts, kind, from_state, to_state, reason)"
    " VALUES ('job-1', 200.25, 'state', 'RUNNING', 'SUCCEEDED', 'done')",
    "INSERT INTO leases (name, holder, holder_json, epoch, version, ttl_s, renewed_at, expires_at)"
    " VALUES ('ctl', '', '{}', 4, 17, 10.0, 1.0, 11.0)",
    "INSERT INTO progress_samples (job_id, ts, clock_s, step, checkpoint_step) VALUES ('job-1', 150.0, 8.0, 60, 60)",
)
AGENT_ROWS = (
    "INSERT INTO agent_assignments (instance_id, job_id, attempt, launch_json, notice_json, stop_attempt,"
    " assigned_at) VALUES ('i-1', 'job-1', 1, '{\"rank\": 0}', NULL, 0, 12.0)",
    "INSERT INTO agent_reports (instance_id, attempt, state, exit_codes_json, notice_json, address,"
    " first_report_at, reported_at) VALUES ('i-1', 1, 'running', '{}', NULL, '10.0.0.1:8', 13.0, 14.0)",
    "INSERT INTO agent_progress (job_id, attempt, progress_json, reported_at)"
    " VALUES ('job-1', 1, '{\"step\": 60}', 15.0)",
)


def _baseline_sql(dialect: str, *, agents_only: bool = False) -> list[str]:
    """The 72c4646 schema's statements (``agents_only``: the agents' file's tables alone)."""
    body = "\n".join(line for line in (DATA / f"schema_72c4646.{dialect}.sql").read_text().splitlines()
                     if not line.startswith("--"))
    statements = [s.strip() for s in body.split(";") if s.strip()]
    if agents_only:
        statements = [s for s in statements if " agent_" in s.split("(")[0]]
    return statements


def _make_old_database(url: str, dialect: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        for statement in [*_baseline_sql(dialect), *ROWS, *AGENT_ROWS]:
            conn.execute(text(statement))
    engine.dispose()


def _schema_diff(conn: Connection, tables: set[str]) -> list[object]:
    """What differs between the database and the models, over ``tables`` (empty: the same)."""
    def include(obj, name, type_, reflected, compare_to):  # type: ignore[no-untyped-def]
        table = name if type_ == "table" else getattr(getattr(obj, "table", None), "name", None)
        return table is None or table in tables

    context = MigrationContext.configure(conn, opts={"include_object": include, "compare_type": True})
    return list(compare_metadata(context, Base.metadata))


def _assert_upgraded_with_data(store: Store) -> None:
    with store.engine.connect() as conn:
        assert set(MigrationContext.configure(conn).get_current_heads()) == HEADS
        insp = inspect(conn)
        assert insp.has_table("agent_seqs")
        assert {"ix_jobs_state_submitted", "ix_jobs_submitted", "ix_jobs_controller_state"} <= {
            i["name"] for i in insp.get_indexes("jobs")}
        assert _schema_diff(conn, {t.name for t in Base.metadata.sorted_tables}) == []
        assert conn.execute(text("SELECT instance_id, job_id, attempt, launch_json, assigned_at FROM agent_assignments"
                                 )).all() == [("i-1", "job-1", 1, '{"rank": 0}', 12.0)]
        assert conn.execute(text("SELECT address, reported_at FROM agent_reports")).all() == [("10.0.0.1:8", 14.0)]
        assert conn.execute(text("SELECT progress_json FROM agent_progress")).scalar_one() == '{"step": 60}'
        assert conn.execute(text("SELECT epoch, version FROM leases WHERE name = 'ctl'")).one() == (4, 17)
        # The gang's fields left the jobs row for their own table, every job's values with them.
        assert not {c["name"] for c in insp.get_columns("jobs")} & {
            "gang_attempt", "gang_port", "gang_started_at", "gang_stopping", "gang_stop_deadline", "gang_start_step"}
        assert conn.execute(text("SELECT job_id, attempt, port, started_at, stopping, stop_deadline, start_step"
                                 " FROM gangs ORDER BY job_id")).all() == [
            ("job-1", 0, 0, None, "", None, 40), ("job-2", 1, 29500, None, "", None, 0)]
    with store.session() as s:
        job = store.job(s, "old")
        assert isinstance(job, Job)
        assert (job.job_id, job.state, job.spec_json, job.step, job.total_steps, job.cost_usd, job.preemptions,
                job.finished_at, job.profile_json, job.last_checkpoint_step) == (
            "job-1", "SUCCEEDED", '{"gpus": 2}', 9007199254740993, 120, 1.25, 3, 200.25, '[{"nodes": 1}]', 118)
        assert [(i.instance_id, i.billed_seconds, i.interruption) for i in store.instances(s, "job-1")] == [
            ("i-1", 60.0, "spot-preemption")]
        assert [(e.from_state, e.to_state) for e in store.events(s, "job-1")] == [("RUNNING", "SUCCEEDED")]
        assert [j.job_id for j in store.job_page(s, states=["RUNNING"], limit=10)] == ["job-2"]
        live = store.job(s, "live")
        assert live is not None and (live.gang.attempt, live.gang.port) == (1, 29500)  # the running gang
        assert s.get(ProgressSample, 1).step == 60  # type: ignore[union-attr]
        # New rows go where the old ones are: an autoincrement id after theirs, a new table's row.
        s.add(ProgressSample(job_id="job-1", ts=1.0, clock_s=1.0, step=70, checkpoint_step=70))
        s.add(AgentSeq(decision_id="d-1", seq=3))
    with store.session() as s:
        assert [p.id for p in s.query(ProgressSample).order_by(ProgressSample.id)] == [1, 2]
        assert s.get(AgentSeq, "d-1").seq == 3  # type: ignore[union-attr]


def _open_at_once(url: str, n: int = 4) -> None:
    """``n`` Stores open ``url`` at once (controllers of a fleet, or ``run`` beside ``status``)."""
    errors: list[BaseException] = []

    def open_store() -> None:
        try:
            Store(url).engine.dispose()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_database_made_at_72c4646_upgrades_with_its_data(tmp_path: Path) -> None:
    """Four processes' worth of Stores open it at once: one migrates (the flock beside the file)."""
    url = f"sqlite:///{tmp_path / 'spotrain.db'}"
    _make_old_database(url, "sqlite")
    _open_at_once(url)
    store = Store(url)
    _assert_upgraded_with_data(store)
    store.engine.dispose()


def test_the_agents_file_made_at_72c4646_upgrades_alone(tmp_path: Path) -> None:
    """Beside a SQLite database the agents' tables have a file of their own: it gains the request
    counters' table and stays the agents' alone."""
    db = tmp_path / "spotrain-agents.db"
    con = sqlite3.connect(db)
    for statement in [*_baseline_sql("sqlite", agents_only=True), *AGENT_ROWS]:
        con.execute(statement)
    con.commit()
    con.close()
    agents = AgentTables(f"sqlite:///{db}")
    with agents.engine.connect() as conn:
        assert set(MigrationContext.configure(conn).get_current_heads()) == {scripts().get_revision("agents@head").revision}
        assert set(inspect(conn).get_table_names()) == AGENT_TABLE_NAMES | {"alembic_version"}
        assert _schema_diff(conn, set(AGENT_TABLE_NAMES)) == []
        assert conn.execute(text("SELECT state FROM agent_reports WHERE instance_id = 'i-1'")).scalar_one() == "running"


def test_the_revisions_build_the_models_schema(tmp_path: Path) -> None:
    """Upgrading an empty database revision by revision gives what a new database gets (the models'
    tables, stamped at the heads): a model changed without a revision fails here."""
    engine = create_engine(f"sqlite:///{tmp_path / 'chain.db'}")
    with engine.begin() as conn:
        for branch in BRANCHES:
            command.upgrade(_config(conn), f"{branch}@head")
    with engine.connect() as conn:
        assert set(MigrationContext.configure(conn).get_current_heads()) == HEADS
        assert _schema_diff(conn, {t.name for t in Base.metadata.sorted_tables}) == []
    engine.dispose()
    assert {t.name for t in branch_tables(AGENTS)} == AGENT_TABLE_NAMES
    assert {t.name for t in branch_tables(STATE)} == {"jobs", "gangs", "instances", "decisions", "events", "leases",
                                                      "progress_samples"}


def test_a_database_migrated_by_a_newer_spotrain_is_refused_in_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'spotrain.db'}"
    Store(url).engine.dispose()
    con = sqlite3.connect(tmp_path / "spotrain.db")
    con.execute("UPDATE alembic_version SET version_num = 'state_0099' WHERE version_num LIKE 'state%'")
    con.commit()
    con.close()
    with pytest.raises(SchemaTooNew, match="state_0099.*upgrade spotrain") as err:
        Store(url)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_a_72c4646_database_upgrades_on_postgresql_once_under_concurrent_controllers(postgres_url: str) -> None:
    """Four controllers of a fleet open the old database at once: one migrates (the advisory lock),
    none fails, and the data is intact."""
    _make_old_database(postgres_url, "postgresql")
    _open_at_once(postgres_url)
    store = Store(postgres_url)
    _assert_upgraded_with_data(store)
    with store.session() as s:  # the sequence behind events' ids survived the upgrade
        store.note(s, s.get(Job, "job-1"), "note", "after the upgrade")  # type: ignore[arg-type]
    store.engine.dispose()
