"""workload held by admin: work an admin held is released only by an admin (Slurm's admin hold)

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Holds from before stay releasable by their owners, as they were when made.
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("held_by_admin", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.drop_column("held_by_admin")
