"""cluster node names: prefix and first index

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("cluster", schema=None) as batch_op:
        batch_op.add_column(sa.Column("node_prefix", sa.String(length=63), nullable=True))
        batch_op.add_column(
            sa.Column("first_node_index", sa.Integer(), server_default="0", nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("cluster", schema=None) as batch_op:
        batch_op.drop_column("first_node_index")
        batch_op.drop_column("node_prefix")
