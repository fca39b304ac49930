"""node enrolled: when the agent enrolled and with which kernel boot id (an enrollment
whose answer was lost is answered again)

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("node") as batch:
        batch.add_column(sa.Column("enrolled_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("enrolled_boot_id", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("node") as batch:
        batch.drop_column("enrolled_boot_id")
        batch.drop_column("enrolled_at")
