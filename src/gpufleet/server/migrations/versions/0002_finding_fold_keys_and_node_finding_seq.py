"""finding fold keys and node finding seq

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("finding", schema=None) as batch_op:
        batch_op.add_column(sa.Column("fold_key", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("gpu_index", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("pci_bus_id", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("component", sa.String(length=80), nullable=True))
        batch_op.create_index("ix_finding_node_key", ["node_id", "fold_key"], unique=False)

    with op.batch_alter_table("node", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("last_finding_seq", sa.BigInteger(), server_default="0", nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("node", schema=None) as batch_op:
        batch_op.drop_column("last_finding_seq")

    with op.batch_alter_table("finding", schema=None) as batch_op:
        batch_op.drop_index("ix_finding_node_key")
        batch_op.drop_column("component")
        batch_op.drop_column("pci_bus_id")
        batch_op.drop_column("gpu_index")
        batch_op.drop_column("fold_key")
