"""Job lists page in submission order from covering indexes (issue 21, finding 7).

Revision ID: state_0002
Revises: state_0001
"""

from __future__ import annotations

from alembic import op

revision = "state_0002"
down_revision = "state_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_state_submitted", "jobs", ["state", "submitted_at", "job_id"])
    op.create_index("ix_jobs_submitted", "jobs", ["submitted_at", "job_id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_submitted", table_name="jobs")
    op.drop_index("ix_jobs_state_submitted", table_name="jobs")
