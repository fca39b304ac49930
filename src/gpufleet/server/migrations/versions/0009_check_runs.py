"""check runs: purpose, parent, force, backend bookkeeping, skipped nodes, deadline

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("check_run", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("purpose", sa.String(length=16), server_default="on_demand", nullable=False)
        )
        batch_op.add_column(sa.Column("parent_id", sa.String(length=36), nullable=True))
        batch_op.add_column(sa.Column("forced", sa.Boolean(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("backend", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("progress", sa.JSON(), server_default="{}", nullable=False))
        batch_op.add_column(sa.Column("skipped", sa.JSON(), server_default="[]", nullable=False))
        batch_op.add_column(sa.Column("detail", sa.Text(), server_default="", nullable=False))
        batch_op.add_column(sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index(batch_op.f("ix_check_run_parent_id"), ["parent_id"], unique=False)
        batch_op.create_index("ix_check_run_cluster_id_id", ["cluster_id", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("check_run", schema=None) as batch_op:
        batch_op.drop_index("ix_check_run_cluster_id_id")
        batch_op.drop_index(batch_op.f("ix_check_run_parent_id"))
        for column in (
            "updated_at",
            "deadline_at",
            "detail",
            "skipped",
            "progress",
            "backend",
            "forced",
            "parent_id",
            "purpose",
        ):
            batch_op.drop_column(column)
