"""The controller's tables as spotrain made them at commit 72c4646 (the baseline, before Alembic).

Revision ID: state_0001
Revises: (the first of branch ``state``: jobs, instances, decisions, events, leases, progress samples)
"""

from __future__ import annotations

from alembic import op

from autoscaler.state.migrations import baseline

revision = "state_0001"
down_revision = None
branch_labels = ("state",)
depends_on = None


def upgrade() -> None:
    baseline.STATE.create_all(op.get_bind())


def downgrade() -> None:
    baseline.STATE.drop_all(op.get_bind())
