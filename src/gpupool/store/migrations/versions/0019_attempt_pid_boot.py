"""attempt pid boot: the boot a local attempt's start time counts from, so a stepped wall clock (NTP, a
VM paused or forked) no longer makes running attempts look gone (gpupool/process_start.py)

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Attempts recorded before keep pid_boot_id NULL: their pid_start_time is on the wall clock, and is
    # still checked that way.
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("pid_boot_id", sa.String(length=36), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("pid_boot_id")
