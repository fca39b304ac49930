"""acceptance runs and their reports, node starts and their startup scripts; the cluster's
acceptance suite and status detail, the node's state detail (issue 6)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("cluster", schema=None) as batch_op:
        batch_op.add_column(sa.Column("acceptance_suite", sa.JSON(), nullable=True))
        batch_op.add_column(
            sa.Column("status_detail", sa.Text(), server_default="", nullable=False)
        )
    with op.batch_alter_table("node", schema=None) as batch_op:
        batch_op.add_column(sa.Column("state_detail", sa.Text(), server_default="", nullable=False))

    op.create_table(
        "node_startup",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("node_id", sa.String(length=36), nullable=False),
        sa.Column("cluster_id", sa.String(length=36), nullable=False),
        sa.Column("trigger", sa.String(length=16), nullable=False),
        sa.Column("boot_key", sa.String(length=200), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("scripts", sa.JSON(), nullable=False),
        sa.Column("current", sa.Integer(), nullable=False),
        sa.Column("command_id", sa.String(length=36), nullable=True),
        sa.Column("results", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("repair_id", sa.String(length=36), nullable=True),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["cluster.id"],
            name=op.f("fk_node_startup_cluster_id_cluster"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["node.id"], name=op.f("fk_node_startup_node_id_node"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_node_startup")),
    )
    with op.batch_alter_table("node_startup", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_node_startup_cluster_id"), ["cluster_id"])
        batch_op.create_index(batch_op.f("ix_node_startup_node_id"), ["node_id"])
        batch_op.create_index(batch_op.f("ix_node_startup_status"), ["status"])

    op.create_table(
        "acceptance_run",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("cluster_id", sa.String(length=36), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("trigger", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("stage", sa.String(length=16), nullable=False),
        sa.Column("node_ids", sa.JSON(), nullable=False),
        sa.Column("check_run_ids", sa.JSON(), nullable=False),
        sa.Column("suite", sa.JSON(), nullable=False),
        sa.Column("results", sa.JSON(), nullable=False),
        sa.Column("repair_id", sa.String(length=36), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("report", sa.JSON(), nullable=True),
        sa.Column("report_sha256", sa.String(length=64), nullable=True),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["cluster.id"],
            name=op.f("fk_acceptance_run_cluster_id_cluster"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_acceptance_run")),
    )
    with op.batch_alter_table("acceptance_run", schema=None) as batch_op:
        batch_op.create_index("ix_acceptance_run_cluster_id_id", ["cluster_id", "id"])
        batch_op.create_index(batch_op.f("ix_acceptance_run_repair_id"), ["repair_id"])
        batch_op.create_index(batch_op.f("ix_acceptance_run_status"), ["status"])


def downgrade() -> None:
    with op.batch_alter_table("acceptance_run", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_acceptance_run_status"))
        batch_op.drop_index(batch_op.f("ix_acceptance_run_repair_id"))
        batch_op.drop_index("ix_acceptance_run_cluster_id_id")
    op.drop_table("acceptance_run")
    with op.batch_alter_table("node_startup", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_node_startup_status"))
        batch_op.drop_index(batch_op.f("ix_node_startup_node_id"))
        batch_op.drop_index(batch_op.f("ix_node_startup_cluster_id"))
    op.drop_table("node_startup")
    with op.batch_alter_table("node", schema=None) as batch_op:
        batch_op.drop_column("state_detail")
    with op.batch_alter_table("cluster", schema=None) as batch_op:
        batch_op.drop_column("status_detail")
        batch_op.drop_column("acceptance_suite")
