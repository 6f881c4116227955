"""The remote executor's tables as spotrain made them at commit 72c4646 (the baseline, before Alembic).

Revision ID: agents_0001
Revises: (the first of branch ``agents``: they live in a file of their own beside a SQLite database,
``remote_executor.agent_db_url``, and in the controller's database on PostgreSQL)
"""

from __future__ import annotations

from alembic import op

from autoscaler.state.migrations import baseline

revision = "agents_0001"
down_revision = None
branch_labels = ("agents",)
depends_on = None


def upgrade() -> None:
    baseline.AGENTS.create_all(op.get_bind())


def downgrade() -> None:
    baseline.AGENTS.drop_all(op.get_bind())
