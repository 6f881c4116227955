"""Moves of a job's state between regions and clouds (issue 23): where the state lives, the measured
checkpoint size, the egress billed and the number of moves.

Jobs from before this revision start with no location (their next gang sets it without a bill), no
measured size, no egress and no moves.

Revision ID: state_0005
Revises: state_0004
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "state_0005"
down_revision = "state_0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Only the columns the table lacks: a database adopted from before Alembic is stamped at the
    # revision its indexes and columns match and may already hold these (made by ``create_all``).
    have = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("jobs")}
    columns: list[sa.Column[Any]] = [
        sa.Column("state_location", sa.String(length=160), server_default="", nullable=False),
        sa.Column("checkpoint_size_gb", sa.Float(), nullable=True),
        sa.Column("egress_usd", sa.Float(), server_default="0", nullable=False),
        sa.Column("region_moves", sa.Integer(), server_default="0", nullable=False),
    ]
    missing = [c for c in columns if c.name not in have]
    if missing:
        with op.batch_alter_table("jobs", schema=None) as batch_op:
            for column in missing:
                batch_op.add_column(column)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("region_moves")
        batch_op.drop_column("egress_usd")
        batch_op.drop_column("checkpoint_size_gb")
        batch_op.drop_column("state_location")
