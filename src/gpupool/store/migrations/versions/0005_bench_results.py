"""bench results per node (gpupool bench --record, bench jobs)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "bench_results",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_name", sa.String(length=253), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("gpu_model", sa.String(length=64), nullable=False),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=True),
        sa.Column("source", sa.String(length=64), nullable=False),
        sa.Column("actor", sa.String(length=63), nullable=False),
        sa.Column("parameters", sa.JSON(), nullable=False),
        sa.Column("figures", sa.JSON(), nullable=False),
        sa.Column("report", sa.JSON(), nullable=False),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_bench_results_series", "bench_results", ["node_name", "kind", "key", "id"])


def downgrade() -> None:
    op.drop_index("ix_bench_results_series", table_name="bench_results")
    op.drop_table("bench_results")
