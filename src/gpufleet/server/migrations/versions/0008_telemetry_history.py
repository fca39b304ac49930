"""telemetry history: per-node and per-cluster GPU telemetry by minute (the console's
utilization charts); console sessions opened with an API token keep that token's scope

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "node_telemetry",
        sa.Column("node_id", sa.String(length=36), nullable=False),
        sa.Column("minute", sa.DateTime(timezone=True), nullable=False),
        sa.Column("mem_total_mib", sa.Integer(), nullable=False),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["node.id"],
            name=op.f("fk_node_telemetry_node_id_node"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("node_id", "minute", name=op.f("pk_node_telemetry")),
    )
    with op.batch_alter_table("node_telemetry", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_node_telemetry_minute"), ["minute"], unique=False)

    op.create_table(
        "cluster_telemetry",
        sa.Column("cluster_id", sa.String(length=36), nullable=False),
        sa.Column("minute", sa.DateTime(timezone=True), nullable=False),
        sa.Column("nodes", sa.Integer(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("util_sum", sa.Float(), nullable=False),
        sa.Column("mem_used_mib", sa.Float(), nullable=False),
        sa.Column("mem_total_mib", sa.Float(), nullable=False),
        sa.Column("power_w", sa.Float(), nullable=False),
        sa.Column("temp_sum", sa.Float(), nullable=False),
        sa.Column("temp_max", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["cluster.id"],
            name=op.f("fk_cluster_telemetry_cluster_id_cluster"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("cluster_id", "minute", name=op.f("pk_cluster_telemetry")),
    )
    with op.batch_alter_table("cluster_telemetry", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_cluster_telemetry_minute"), ["minute"], unique=False)

    with op.batch_alter_table("web_session", schema=None) as batch_op:
        batch_op.add_column(sa.Column("api_token_id", sa.String(length=36), nullable=True))
        batch_op.create_index(
            batch_op.f("ix_web_session_api_token_id"), ["api_token_id"], unique=False
        )
        batch_op.create_foreign_key(
            batch_op.f("fk_web_session_api_token_id_api_token"),
            "api_token",
            ["api_token_id"],
            ["id"],
            ondelete="CASCADE",
        )


def downgrade() -> None:
    with op.batch_alter_table("web_session", schema=None) as batch_op:
        batch_op.drop_constraint(
            batch_op.f("fk_web_session_api_token_id_api_token"), type_="foreignkey"
        )
        batch_op.drop_index(batch_op.f("ix_web_session_api_token_id"))
        batch_op.drop_column("api_token_id")
    with op.batch_alter_table("cluster_telemetry", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_cluster_telemetry_minute"))
    op.drop_table("cluster_telemetry")
    with op.batch_alter_table("node_telemetry", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_node_telemetry_minute"))
    op.drop_table("node_telemetry")
