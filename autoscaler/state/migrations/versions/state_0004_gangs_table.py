"""The gang's six fields leave the jobs row for a table of their own, ``gangs`` (issue 22).

``jobs.gang_attempt, gang_port, gang_started_at, gang_stopping, gang_stop_deadline, gang_start_step``
become ``gangs.attempt, port, started_at, stopping, stop_deadline, start_step``, one row per job,
copied over for every job (a running job keeps its gang: the next controller finds its attempt,
port and stop deadline). On SQLite the jobs table is rebuilt without the columns (Alembic's batch
mode; the data and indexes are kept).

A ``gangs`` table already there (a database made by this release whose version row was lost, then
adopted at an older revision) is kept, and only jobs without a row get one.

Revision ID: state_0004
Revises: state_0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "state_0004"
down_revision = "state_0003"
branch_labels = None
depends_on = None

# (old jobs column, gangs column, its type, nullable, the value a missing one reads as)
MOVED = (
    ("gang_attempt", "attempt", sa.Integer(), False, "0"),
    ("gang_port", "port", sa.Integer(), False, "0"),
    ("gang_started_at", "started_at", sa.Float(), True, None),
    ("gang_stopping", "stopping", sa.String(32), False, "''"),
    ("gang_stop_deadline", "stop_deadline", sa.Float(), True, None),
    ("gang_start_step", "start_step", sa.BigInteger(), False, "0"),
)


def upgrade() -> None:
    if not sa.inspect(op.get_bind()).has_table("gangs"):
        op.create_table(
            "gangs",
            sa.Column("job_id", sa.String(80), nullable=False),
            *(sa.Column(new, type_, nullable=nullable) for _, new, type_, nullable, _ in MOVED),
            sa.ForeignKeyConstraint(["job_id"], ["jobs.job_id"]),
            sa.PrimaryKeyConstraint("job_id"),
        )
    new_columns = ", ".join(new for _, new, _, _, _ in MOVED)
    values = ", ".join(f"COALESCE({old}, {missing})" if missing is not None else old for old, _, _, _, missing in MOVED)
    op.execute(f"INSERT INTO gangs (job_id, {new_columns}) SELECT job_id, {values} FROM jobs "
               "WHERE job_id NOT IN (SELECT job_id FROM gangs)")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        for old, _, _, _, _ in MOVED:
            batch_op.drop_column(old)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        for old, _, type_, nullable, missing in MOVED:
            batch_op.add_column(sa.Column(old, type_, nullable=nullable,
                                          server_default=sa.text(missing) if missing is not None else None))
    for old, new, _, _, missing in MOVED:
        value = f"(SELECT {new} FROM gangs WHERE gangs.job_id = jobs.job_id)"
        op.execute(f"UPDATE jobs SET {old} = COALESCE({value}, {missing})" if missing is not None
                   else f"UPDATE jobs SET {old} = {value}")
    op.drop_table("gangs")
