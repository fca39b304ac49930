"""a cluster's scheduler configuration: for kubernetes, the stored kubeconfig credential,
its context and API server, or in-cluster credentials (nothing secret)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("cluster", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("scheduler_config", sa.JSON(), server_default="{}", nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("cluster", schema=None) as batch_op:
        batch_op.drop_column("scheduler_config")
