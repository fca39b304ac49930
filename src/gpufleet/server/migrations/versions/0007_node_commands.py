"""node commands: the agent command channel (issue 6)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "node_command",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("node_id", sa.String(length=36), nullable=False),
        sa.Column("cluster_id", sa.String(length=36), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("argv", sa.JSON(), nullable=False),
        sa.Column("env", sa.JSON(), nullable=False),
        sa.Column("cwd", sa.String(length=4096), nullable=True),
        sa.Column("timeout_s", sa.Float(), nullable=False),
        sa.Column("max_output_bytes", sa.Integer(), nullable=False),
        sa.Column("purpose", sa.String(length=200), nullable=False),
        sa.Column("ref", sa.String(length=128), nullable=True),
        sa.Column("requested_by", sa.String(length=128), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("status_reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("agent_boot_id", sa.String(length=64), nullable=True),
        sa.Column("deliveries", sa.Integer(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("result_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("late_result", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["cluster.id"],
            name=op.f("fk_node_command_cluster_id_cluster"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["node.id"], name=op.f("fk_node_command_node_id_node"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_node_command")),
    )
    with op.batch_alter_table("node_command", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_node_command_cluster_id"), ["cluster_id"], unique=False
        )
        batch_op.create_index("ix_node_command_node_id_id", ["node_id", "id"], unique=False)
        batch_op.create_index(batch_op.f("ix_node_command_ref"), ["ref"], unique=False)
        batch_op.create_index(
            "ix_node_command_status_updated_at", ["status", "updated_at"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("node_command", schema=None) as batch_op:
        batch_op.drop_index("ix_node_command_status_updated_at")
        batch_op.drop_index(batch_op.f("ix_node_command_ref"))
        batch_op.drop_index("ix_node_command_node_id_id")
        batch_op.drop_index(batch_op.f("ix_node_command_cluster_id"))
    op.drop_table("node_command")
