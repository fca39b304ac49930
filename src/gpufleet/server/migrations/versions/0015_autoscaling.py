"""autoscaling: a cluster's policy, its actions (each change of size), and when each node
went idle

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "autoscale_policy",
        sa.Column("cluster_id", sa.String(36), nullable=False),
        sa.Column("mode", sa.String(24), nullable=False),
        sa.Column("scale_up_after_s", sa.Float(), nullable=False),
        sa.Column("scale_down_after_s", sa.Float(), nullable=False),
        sa.Column("up_cooldown_s", sa.Float(), nullable=False),
        sa.Column("down_cooldown_s", sa.Float(), nullable=False),
        sa.Column("max_step", sa.Integer(), nullable=False),
        sa.Column("last_up_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_down_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_decision", sa.Text(), server_default="", nullable=False),
        sa.Column("updated_by", sa.String(128), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["cluster.id"],
            name=op.f("fk_autoscale_policy_cluster_id_cluster"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("cluster_id", name=op.f("pk_autoscale_policy")),
    )
    op.create_table(
        "autoscale_action",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("cluster_id", sa.String(36), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("source", sa.String(24), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("node_ids", sa.JSON(), nullable=False),
        sa.Column("node_names", sa.JSON(), nullable=False),
        sa.Column("progress", sa.JSON(), nullable=False),
        sa.Column("reasons", sa.JSON(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["cluster.id"],
            name=op.f("fk_autoscale_action_cluster_id_cluster"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autoscale_action")),
    )
    op.create_index("ix_autoscale_action_cluster_id_id", "autoscale_action", ["cluster_id", "id"])
    op.create_index(
        op.f("ix_autoscale_action_status"), "autoscale_action", ["status"], unique=False
    )
    with op.batch_alter_table("node", schema=None) as batch_op:
        batch_op.add_column(sa.Column("idle_since", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(
            sa.Column("provision_error", sa.Text(), server_default="", nullable=False)
        )
        batch_op.add_column(sa.Column("provision_error_code", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("node", schema=None) as batch_op:
        batch_op.drop_column("provision_error_code")
        batch_op.drop_column("provision_error")
        batch_op.drop_column("idle_since")
    op.drop_index(op.f("ix_autoscale_action_status"), table_name="autoscale_action")
    op.drop_index("ix_autoscale_action_cluster_id_id", table_name="autoscale_action")
    op.drop_table("autoscale_action")
    op.drop_table("autoscale_policy")
