"""attempt queue: the queue an attempt ran in, so GPU-hours stay where they were spent when pending work
moves to another queue (`gpupool update --queue`)

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("queue", sa.String(length=63), nullable=False, server_default=""))
    # Until now work never changed queues: every attempt ran in its workload's queue.
    op.execute(
        "UPDATE attempts SET queue = (SELECT workloads.queue FROM workloads "
        "WHERE workloads.id = attempts.workload_id)"
    )
    # No default from now on: an attempt recorded without its queue is an error, not GPU-hours lost to "".
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.alter_column("queue", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("queue")
