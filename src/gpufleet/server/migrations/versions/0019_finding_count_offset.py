"""finding count offset: the agent's running count of its episode when a finding opened
again after the server closed the episode's earlier finding (a repair acting)

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("finding") as batch:
        batch.add_column(
            sa.Column("count_offset", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("finding") as batch:
        batch.drop_column("count_offset")
