"""retired usage: GPU-hours of deleted workloads (finished check jobs past their retention), per queue

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "retired_usage",
        sa.Column("queue", sa.String(length=63), nullable=False),
        sa.Column("gpu_hours", sa.Float(), nullable=False),
        sa.Column("workloads", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("queue"),
    )


def downgrade() -> None:
    op.drop_table("retired_usage")
