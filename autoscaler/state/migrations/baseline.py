"""The schema at the baseline (spotrain at commit 72c4646, the last release before Alembic), frozen.

Models change; a migration must not: the baseline revisions create these tables, and ``migrate.py``
brings a database made before Alembic up to them (adding what an older release lacked) before it
stamps the database. Python-side defaults are kept as the models had them, because ``migrate.py``
adds a missing column with its default as the pre-Alembic code did.
"""

from __future__ import annotations

import time

import sqlalchemy as sa

STATE = sa.MetaData()
AGENTS = sa.MetaData()

sa.Table(
    "jobs", STATE,
    sa.Column("job_id", sa.String(80), primary_key=True),
    sa.Column("name", sa.String(64), nullable=False, index=True),
    sa.Column("controller_id", sa.String(80), nullable=False, index=True),
    sa.Column("cloud", sa.String(16), nullable=False),
    sa.Column("spec_json", sa.Text(), nullable=False),
    sa.Column("workdir", sa.Text(), nullable=False),
    sa.Column("checkpoint_uri", sa.Text(), nullable=False),
    sa.Column("state", sa.String(24), nullable=False, index=True, default="PENDING"),
    sa.Column("reason", sa.Text(), nullable=False, default=""),
    sa.Column("submitted_at", sa.Float(), nullable=False, default=time.time),
    sa.Column("submitted_clock_s", sa.Float(), nullable=False, default=0.0),
    sa.Column("finished_at", sa.Float(), nullable=True),
    sa.Column("finished_clock_s", sa.Float(), nullable=True),
    sa.Column("attempt", sa.Integer(), nullable=False, default=0),
    sa.Column("gang_attempt", sa.Integer(), nullable=False, default=0),
    sa.Column("gang_port", sa.Integer(), nullable=False, default=0),
    sa.Column("gang_started_at", sa.Float(), nullable=True),
    sa.Column("gang_stopping", sa.String(32), nullable=False, default=""),
    sa.Column("gang_stop_deadline", sa.Float(), nullable=True),
    sa.Column("restarts_on_errors", sa.Integer(), nullable=False, default=0),
    sa.Column("gang_start_step", sa.BigInteger(), nullable=False, default=0),
    sa.Column("stalled_restarts", sa.Integer(), nullable=False, default=0),
    sa.Column("preemptions", sa.Integer(), nullable=False, default=0),
    sa.Column("cost_usd", sa.Float(), nullable=False, default=0.0),
    sa.Column("on_demand_cost_usd", sa.Float(), nullable=False, default=0.0),
    sa.Column("step", sa.BigInteger(), nullable=False, default=0),
    sa.Column("total_steps", sa.BigInteger(), nullable=True),
    sa.Column("metric", sa.Float(), nullable=True),
    sa.Column("metric_name", sa.String(64), nullable=False, default=""),
    sa.Column("loss", sa.Float(), nullable=True),
    sa.Column("final_model", sa.Text(), nullable=True),
    sa.Column("last_checkpoint_step", sa.BigInteger(), nullable=True),
    sa.Column("restart_overhead_s", sa.Float(), nullable=True),
    sa.Column("scenario_json", sa.Text(), nullable=False, default=""),
    sa.Column("profile_json", sa.Text(), nullable=False, default=""),
    sa.Column("grad_sqr", sa.Float(), nullable=True),
    sa.Column("grad_var", sa.Float(), nullable=True),
    sa.Column("batch_json", sa.Text(), nullable=False, default=""),
    sa.Column("cancel_requested", sa.Text(), nullable=False, default="", server_default=""),
)

sa.Table(
    "instances", STATE,
    sa.Column("instance_id", sa.String(80), primary_key=True),
    sa.Column("job_id", sa.String(80), sa.ForeignKey("jobs.job_id"), nullable=False, index=True),
    sa.Column("cloud", sa.String(16), nullable=False),
    sa.Column("offering_key", sa.String(160), nullable=False),
    sa.Column("market", sa.String(16), nullable=False),
    sa.Column("region", sa.String(64), nullable=False, default=""),
    sa.Column("tags_json", sa.Text(), nullable=False, default="{}"),
    sa.Column("gpus", sa.Integer(), nullable=False, default=1),
    sa.Column("state", sa.String(16), nullable=False, index=True),
    sa.Column("decision_id", sa.String(80), nullable=False, index=True),
    sa.Column("launched_at_s", sa.Float(), nullable=False),
    sa.Column("terminated_at_s", sa.Float(), nullable=True),
    sa.Column("interruption", sa.String(64), nullable=True),
    sa.Column("notice_delivered", sa.Integer(), nullable=False, default=0),
    sa.Column("attempt", sa.Integer(), nullable=False, default=0),
    sa.Column("first_rank", sa.Integer(), nullable=False, default=0),
    sa.Column("billed_seconds", sa.Float(), nullable=False, default=0.0),
    sa.Column("cost_usd", sa.Float(), nullable=False, default=0.0),
    sa.Column("on_demand_cost_usd", sa.Float(), nullable=False, default=0.0),
)

sa.Table(
    "decisions", STATE,
    sa.Column("decision_id", sa.String(80), primary_key=True),
    sa.Column("job_id", sa.String(80), sa.ForeignKey("jobs.job_id"), nullable=False, index=True),
    sa.Column("offering_key", sa.String(160), nullable=False),
    sa.Column("market", sa.String(16), nullable=False),
    sa.Column("created_at", sa.Float(), nullable=False, default=time.time),
    sa.Column("status", sa.String(16), nullable=False, default="pending"),
    sa.Column("instance_id", sa.String(80), nullable=True),
    sa.Column("reason", sa.Text(), nullable=False, default=""),
)

sa.Table(
    "events", STATE,
    sa.Column("id", sa.Integer(), primary_key=True),
    sa.Column("job_id", sa.String(80), sa.ForeignKey("jobs.job_id"), nullable=False, index=True),
    sa.Column("ts", sa.Float(), nullable=False, default=time.time),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("from_state", sa.String(24), nullable=False, default=""),
    sa.Column("to_state", sa.String(24), nullable=False, default=""),
    sa.Column("reason", sa.Text(), nullable=False, default=""),
)

sa.Table(
    "leases", STATE,
    sa.Column("name", sa.String(80), primary_key=True),
    sa.Column("holder", sa.String(200), nullable=False, default=""),
    sa.Column("holder_json", sa.Text(), nullable=False, default="{}"),
    sa.Column("epoch", sa.BigInteger(), nullable=False, default=0),
    sa.Column("version", sa.BigInteger(), nullable=False, default=0),
    sa.Column("ttl_s", sa.Float(), nullable=False, default=10.0),
    sa.Column("renewed_at", sa.Float(), nullable=False, default=0.0),
    sa.Column("expires_at", sa.Float(), nullable=False, default=0.0),
)

sa.Table(
    "progress_samples", STATE,
    sa.Column("id", sa.Integer(), primary_key=True),
    sa.Column("job_id", sa.String(80), nullable=False, index=True),
    sa.Column("ts", sa.Float(), nullable=False, default=time.time),
    sa.Column("clock_s", sa.Float(), nullable=False, default=0.0),
    sa.Column("step", sa.BigInteger(), nullable=False, default=0),
    sa.Column("checkpoint_step", sa.BigInteger(), nullable=False, default=0),
)

# The tick's own indexes (created beside the tables by the code of the time).
sa.Index("ix_jobs_controller_state", STATE.tables["jobs"].c.controller_id, STATE.tables["jobs"].c.state)
sa.Index("ix_decisions_status", STATE.tables["decisions"].c.status)

sa.Table(
    "agent_assignments", AGENTS,
    sa.Column("instance_id", sa.String(80), primary_key=True),
    sa.Column("job_id", sa.String(80), nullable=False, index=True),
    sa.Column("attempt", sa.Integer(), nullable=False, default=0),
    sa.Column("launch_json", sa.Text(), nullable=False, default=""),
    sa.Column("notice_json", sa.Text(), nullable=True),
    sa.Column("stop_attempt", sa.Integer(), nullable=False, default=0),
    sa.Column("assigned_at", sa.Float(), nullable=False, default=time.time),
)

sa.Table(
    "agent_reports", AGENTS,
    sa.Column("instance_id", sa.String(80), primary_key=True),
    sa.Column("attempt", sa.Integer(), nullable=False, default=0),
    sa.Column("state", sa.String(16), nullable=False, default="idle"),
    sa.Column("exit_codes_json", sa.Text(), nullable=False, default="{}"),
    sa.Column("notice_json", sa.Text(), nullable=True),
    sa.Column("address", sa.String(64), nullable=True),
    sa.Column("first_report_at", sa.Float(), nullable=False, default=time.time),
    sa.Column("reported_at", sa.Float(), nullable=False, default=time.time),
)

sa.Table(
    "agent_progress", AGENTS,
    sa.Column("job_id", sa.String(80), primary_key=True),
    sa.Column("attempt", sa.Integer(), nullable=False, default=0),
    sa.Column("progress_json", sa.Text(), nullable=False, default="{}"),
    sa.Column("reported_at", sa.Float(), nullable=False, default=time.time),
)
