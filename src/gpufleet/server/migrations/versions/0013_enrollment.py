"""enrollment of bare-metal agents: a cluster's enroll token (its hash and expiry) and
when a node started waiting for its machine's agent to enroll (issue 13)

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("cluster", schema=None) as batch_op:
        batch_op.add_column(sa.Column("enroll_token_hash", sa.String(length=64), nullable=True))
        batch_op.add_column(
            sa.Column("enroll_token_expires_at", sa.DateTime(timezone=True), nullable=True)
        )
        batch_op.create_unique_constraint("uq_cluster_enroll_token_hash", ["enroll_token_hash"])
    with op.batch_alter_table("node", schema=None) as batch_op:
        batch_op.add_column(sa.Column("enroll_open_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("node", schema=None) as batch_op:
        batch_op.drop_column("enroll_open_at")
    with op.batch_alter_table("cluster", schema=None) as batch_op:
        batch_op.drop_constraint("uq_cluster_enroll_token_hash", type_="unique")
        batch_op.drop_column("enroll_token_expires_at")
        batch_op.drop_column("enroll_token_hash")
