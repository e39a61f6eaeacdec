"""workloads by name: `gpupool ps --name`, a name as the CLI resolves it, and a service reached by its name
(`/api/v1/services/NAME/proxy/`) read the workloads of one name

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07
"""

from __future__ import annotations

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_workloads_name", "workloads", ["name"])


def downgrade() -> None:
    op.drop_index("ix_workloads_name", table_name="workloads")
