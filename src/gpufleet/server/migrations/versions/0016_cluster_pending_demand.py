"""cluster pending demand: the GPUs the cluster's jobs wait for, as last read from its
scheduler, and when

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("cluster") as batch:
        batch.add_column(sa.Column("pending_gpus", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("pending_read_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cluster") as batch:
        batch.drop_column("pending_read_at")
        batch.drop_column("pending_gpus")
