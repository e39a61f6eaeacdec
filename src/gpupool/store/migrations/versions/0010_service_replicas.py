"""a service's replicas: each a workload, grouped by `service_id` (replica 0's id), numbered by `replica`

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.add_column(sa.Column("service_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("replica", sa.Integer(), server_default="0", nullable=False))
        batch_op.create_index("ix_workloads_service_id", ["service_id"], unique=False)
    # A service submitted before replicas is one replica: replica 0 of itself.
    op.execute("UPDATE workloads SET service_id = id WHERE kind = 'service'")


def downgrade() -> None:
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.drop_index("ix_workloads_service_id")
        batch_op.drop_column("replica")
        batch_op.drop_column("service_id")
