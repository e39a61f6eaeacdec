"""expected GPUs of each node (the health checks' GPU count), filled from the GPUs each node has now

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("expected_gpus", sa.JSON(), nullable=True))
    bind = op.get_bind()
    nodes = sa.table("nodes", sa.column("id", sa.Integer), sa.column("expected_gpus", sa.JSON))
    gpus = sa.table(
        "gpus", sa.column("node_id", sa.Integer), sa.column("index", sa.Integer),
        sa.column("uuid", sa.String), sa.column("model", sa.String),
    )  # fmt: skip
    expected: dict[int, list[dict[str, object]]] = {}
    for node_id, index, uuid, model in bind.execute(
        sa.select(gpus.c.node_id, gpus.c.index, gpus.c.uuid, gpus.c.model).order_by(
            gpus.c.node_id, gpus.c.index
        )
    ):
        expected.setdefault(node_id, []).append({"index": index, "uuid": uuid, "model": model})
    for node_id, listed in expected.items():
        bind.execute(nodes.update().where(nodes.c.id == node_id).values(expected_gpus=listed))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("expected_gpus")
