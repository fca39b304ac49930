"""rollouts: a cluster's migration to another stack inside maintenance windows, node by
node; the stack a node should run when it is not its cluster's

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "rollout",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("cluster_id", sa.String(36), nullable=False),
        sa.Column("from_stack", sa.String(63), nullable=True),
        sa.Column("to_stack", sa.String(63), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("window", sa.JSON(), nullable=False),
        sa.Column("max_unavailable", sa.String(8), nullable=False),
        sa.Column("failure_budget", sa.Integer(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("on_window_close", sa.String(8), nullable=False),
        sa.Column("reservation", sa.String(64), nullable=False),
        sa.Column("reserved_for", sa.String(40), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["cluster.id"],
            name=op.f("fk_rollout_cluster_id_cluster"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["to_stack"],
            ["stack.name"],
            name=op.f("fk_rollout_to_stack_stack"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollout")),
    )
    op.create_index("ix_rollout_cluster_id_id", "rollout", ["cluster_id", "id"])
    op.create_index(op.f("ix_rollout_status"), "rollout", ["status"])
    op.create_table(
        "rollout_node",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("rollout_id", sa.String(36), nullable=False),
        sa.Column("node_id", sa.String(36), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("from_stack", sa.String(63), nullable=True),
        sa.Column("repair_id", sa.String(36), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["rollout_id"],
            ["rollout.id"],
            name=op.f("fk_rollout_node_rollout_id_rollout"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["node.id"],
            name=op.f("fk_rollout_node_node_id_node"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollout_node")),
        sa.UniqueConstraint("rollout_id", "node_id", name="uq_rollout_node"),
    )
    op.create_index(op.f("ix_rollout_node_rollout_id"), "rollout_node", ["rollout_id"])
    op.create_index(op.f("ix_rollout_node_node_id"), "rollout_node", ["node_id"])
    with op.batch_alter_table("node") as batch:
        batch.add_column(sa.Column("stack", sa.String(63), nullable=True))
        batch.create_foreign_key(
            op.f("fk_node_stack_stack"), "stack", ["stack"], ["name"], ondelete="RESTRICT"
        )


def downgrade() -> None:
    with op.batch_alter_table("node") as batch:
        batch.drop_constraint(op.f("fk_node_stack_stack"), type_="foreignkey")
        batch.drop_column("stack")
    op.drop_table("rollout_node")
    op.drop_table("rollout")
