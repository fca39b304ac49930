"""repairs: policy, steps, incidents, breaker

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "repair_policy",
        sa.Column("project_id", sa.String(length=36), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("updated_by", sa.String(length=128), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["project.id"],
            name=op.f("fk_repair_policy_project_id_project"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("project_id", name=op.f("pk_repair_policy")),
    )
    with op.batch_alter_table("cluster", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("repair_breaker_tripped_at", sa.DateTime(timezone=True), nullable=True)
        )
        batch_op.add_column(sa.Column("repair_breaker_reason", sa.Text(), nullable=True))

    with op.batch_alter_table("repair", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("kind", sa.String(length=16), server_default="node", nullable=False)
        )
        batch_op.add_column(
            sa.Column("source", sa.String(length=16), server_default="policy", nullable=False)
        )
        batch_op.add_column(
            sa.Column("signature_id", sa.String(length=80), server_default="", nullable=False)
        )
        batch_op.add_column(sa.Column("host", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("gpu_index", sa.Integer(), nullable=True))
        batch_op.add_column(
            sa.Column("finding_ids", sa.JSON(), server_default="[]", nullable=False)
        )
        batch_op.add_column(sa.Column("node_ids", sa.JSON(), server_default="[]", nullable=False))
        batch_op.add_column(sa.Column("incident_key", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("escalated_from", sa.String(length=24), nullable=True))
        batch_op.add_column(
            sa.Column("auto_approved", sa.Boolean(), server_default="0", nullable=False)
        )
        batch_op.add_column(sa.Column("forced", sa.Boolean(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("requested_by", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("progress", sa.JSON(), server_default="{}", nullable=False))
        batch_op.add_column(sa.Column("detail", sa.Text(), server_default="", nullable=False))
        batch_op.add_column(sa.Column("step_started_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("approved_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.alter_column(
            "rule", existing_type=sa.VARCHAR(length=120), type_=sa.Text(), existing_nullable=False
        )
        batch_op.create_index("ix_repair_cluster_status", ["cluster_id", "status"], unique=False)
        batch_op.create_index(batch_op.f("ix_repair_finished_at"), ["finished_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_repair_host"), ["host"], unique=False)
        batch_op.create_index(batch_op.f("ix_repair_incident_key"), ["incident_key"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("repair", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_repair_incident_key"))
        batch_op.drop_index(batch_op.f("ix_repair_host"))
        batch_op.drop_index(batch_op.f("ix_repair_finished_at"))
        batch_op.drop_index("ix_repair_cluster_status")
        batch_op.alter_column(
            "rule", existing_type=sa.Text(), type_=sa.VARCHAR(length=120), existing_nullable=False
        )
        batch_op.drop_column("finished_at")
        batch_op.drop_column("approved_at")
        batch_op.drop_column("step_started_at")
        batch_op.drop_column("detail")
        batch_op.drop_column("progress")
        batch_op.drop_column("requested_by")
        batch_op.drop_column("forced")
        batch_op.drop_column("auto_approved")
        batch_op.drop_column("escalated_from")
        batch_op.drop_column("incident_key")
        batch_op.drop_column("node_ids")
        batch_op.drop_column("finding_ids")
        batch_op.drop_column("gpu_index")
        batch_op.drop_column("host")
        batch_op.drop_column("signature_id")
        batch_op.drop_column("source")
        batch_op.drop_column("kind")

    with op.batch_alter_table("cluster", schema=None) as batch_op:
        batch_op.drop_column("repair_breaker_reason")
        batch_op.drop_column("repair_breaker_tripped_at")

    op.drop_table("repair_policy")
