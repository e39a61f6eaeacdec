"""declared GPUs: a join token may say how many GPUs each node joining with it has; the node keeps it

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, no default: tokens and nodes from before this revision declare nothing (the expected GPUs
    # are those a node first registered, as before).
    with op.batch_alter_table("join_tokens", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gpus", sa.Integer(), nullable=True))
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("declared_gpus", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("declared_gpus")
    with op.batch_alter_table("join_tokens", schema=None) as batch_op:
        batch_op.drop_column("gpus")
