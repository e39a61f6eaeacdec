"""attempt backend and foreign jobs (the slurm backend)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("backend", sa.String(length=32), server_default="local", nullable=False)
        )
    op.create_table(
        "foreign_jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("backend", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("user", sa.String(length=63), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("gpus_per_node", sa.Float(), nullable=False),
        sa.Column("cpus_per_node", sa.Float(), nullable=False),
        sa.Column("gpu_indices", sa.JSON(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("backend", "job_id", name="uq_foreign_jobs_backend_job"),
    )


def downgrade() -> None:
    op.drop_table("foreign_jobs")
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("backend")
