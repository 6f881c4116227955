"""Signed agent requests carry a counter; the highest taken per launch decision refuses replays
(issue 21, finding 8: ``autoscaler/remote/auth.py``).

Revision ID: agents_0002
Revises: agents_0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "agents_0002"
down_revision = "agents_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "agent_seqs",
        sa.Column("decision_id", sa.String(80), primary_key=True),
        sa.Column("seq", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("agent_seqs")
