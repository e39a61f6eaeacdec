"""attempt efficiency: mean GPU utilization and peak GPU memory of each attempt, from telemetry

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, no default: the attempts from before this revision have no telemetry recorded ("no GPU
    # telemetry"), which a 0 would misstate as idle GPUs.
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gpu_seconds_sampled", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("gpu_utilization_pct", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("gpu_memory_peak_bytes", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("gpu_memory_total_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("gpu_memory_total_bytes")
        batch_op.drop_column("gpu_memory_peak_bytes")
        batch_op.drop_column("gpu_utilization_pct")
        batch_op.drop_column("gpu_seconds_sampled")
