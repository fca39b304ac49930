"""stacks: versioned software stacks, the one each cluster should run, and what each node
reports it runs

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COMPONENTS = ("os_image", "driver", "cuda", "nccl", "dcgm", "slurm", "agent")


def upgrade() -> None:
    op.create_table(
        "stack",
        sa.Column("name", sa.String(63), nullable=False),
        *(sa.Column(c, sa.String(64), nullable=True) for c in COMPONENTS),
        sa.Column("latest", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("notes", sa.Text(), server_default="", nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_stack")),
    )
    with op.batch_alter_table("cluster") as batch:
        batch.add_column(sa.Column("stack", sa.String(63), nullable=True))
        batch.create_foreign_key(
            op.f("fk_cluster_stack_stack"), "stack", ["stack"], ["name"], ondelete="RESTRICT"
        )
    with op.batch_alter_table("node") as batch:
        batch.add_column(sa.Column("software", sa.JSON(), server_default="{}", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("node") as batch:
        batch.drop_column("software")
    with op.batch_alter_table("cluster") as batch:
        batch.drop_constraint(op.f("fk_cluster_stack_stack"), type_="foreignkey")
        batch.drop_column("stack")
    op.drop_table("stack")
