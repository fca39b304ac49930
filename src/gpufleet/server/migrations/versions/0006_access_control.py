"""access control: users' Unix names, audit request ids, storage volumes

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.add_column(sa.Column("unix_name", sa.String(length=32), nullable=True))
        batch_op.create_unique_constraint(batch_op.f("uq_users_unix_name"), ["unix_name"])

    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.add_column(sa.Column("request_id", sa.String(length=36), nullable=True))
        batch_op.create_index("ix_audit_log_request_id", ["request_id"], unique=False)

    op.create_table(
        "volume",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("project_id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("size_gb", sa.Integer(), nullable=False),
        sa.Column("mount_path", sa.String(length=255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["project.id"],
            name=op.f("fk_volume_project_id_project"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_volume")),
        sa.UniqueConstraint("project_id", "name", name="uq_volume_project_name"),
    )
    with op.batch_alter_table("volume", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_volume_project_id"), ["project_id"], unique=False)

    op.create_table(
        "volume_attachment",
        sa.Column("volume_id", sa.String(length=36), nullable=False),
        sa.Column("cluster_id", sa.String(length=36), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["cluster.id"],
            name=op.f("fk_volume_attachment_cluster_id_cluster"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["volume_id"],
            ["volume.id"],
            name=op.f("fk_volume_attachment_volume_id_volume"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("volume_id", "cluster_id", name=op.f("pk_volume_attachment")),
    )
    with op.batch_alter_table("volume_attachment", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_volume_attachment_cluster_id"), ["cluster_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("volume_attachment", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_volume_attachment_cluster_id"))
    op.drop_table("volume_attachment")
    with op.batch_alter_table("volume", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_volume_project_id"))
    op.drop_table("volume")
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_index("ix_audit_log_request_id")
        batch_op.drop_column("request_id")
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_users_unix_name"), type_="unique")
        batch_op.drop_column("unix_name")
