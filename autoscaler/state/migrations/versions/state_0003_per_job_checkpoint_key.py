"""Each job's checkpoint key, with which its workers sign checkpoint manifests (issue 21, finding 9).

Jobs submitted before this revision get an empty key: they stay unsigned to the end (docs/formats.md).

Revision ID: state_0003
Revises: state_0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "state_0003"
down_revision = "state_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("checkpoint_key", sa.Text(), server_default="", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("checkpoint_key")
