"""the host inventory and its encrypted credentials (issue 13)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "credential",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("project_id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("username", sa.String(length=255), nullable=True),
        sa.Column("ciphertext", sa.LargeBinary(), nullable=False),
        sa.Column("key_id", sa.String(length=32), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("rotated_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["project.id"],
            name=op.f("fk_credential_project_id_project"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_credential")),
        sa.UniqueConstraint("project_id", "name", name="uq_credential_project_name"),
    )
    with op.batch_alter_table("credential", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_credential_project_id"), ["project_id"])

    op.create_table(
        "host",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("project_id", sa.String(length=36), nullable=False),
        sa.Column("hostname", sa.String(length=253), nullable=False),
        sa.Column("serial", sa.String(length=120), nullable=True),
        sa.Column("bmc_type", sa.String(length=16), nullable=False),
        sa.Column("bmc_address", sa.String(length=255), nullable=False),
        sa.Column("port", sa.Integer(), nullable=True),
        sa.Column("system_id", sa.String(length=255), nullable=True),
        sa.Column("host_key", sa.Text(), nullable=True),
        sa.Column("credential_id", sa.String(length=36), nullable=True),
        sa.Column("rack", sa.String(length=63), nullable=True),
        sa.Column("leaf_switch", sa.String(length=63), nullable=True),
        sa.Column("pdu", sa.String(length=63), nullable=True),
        sa.Column("cluster_id", sa.String(length=36), nullable=True),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("node_id", sa.String(length=36), nullable=True),
        sa.Column("claim_token", sa.String(length=128), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["cluster.id"],
            name=op.f("fk_host_cluster_id_cluster"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["credential_id"],
            ["credential.id"],
            name=op.f("fk_host_credential_id_credential"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["node.id"], name=op.f("fk_host_node_id_node"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["project.id"],
            name=op.f("fk_host_project_id_project"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_host")),
        sa.UniqueConstraint("claim_token", name=op.f("uq_host_claim_token")),
        sa.UniqueConstraint("hostname", name=op.f("uq_host_hostname")),
    )
    with op.batch_alter_table("host", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_host_cluster_id"), ["cluster_id"])
        batch_op.create_index(batch_op.f("ix_host_credential_id"), ["credential_id"])
        batch_op.create_index(batch_op.f("ix_host_node_id"), ["node_id"])
        batch_op.create_index(batch_op.f("ix_host_project_id"), ["project_id"])


def downgrade() -> None:
    with op.batch_alter_table("host", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_host_project_id"))
        batch_op.drop_index(batch_op.f("ix_host_node_id"))
        batch_op.drop_index(batch_op.f("ix_host_credential_id"))
        batch_op.drop_index(batch_op.f("ix_host_cluster_id"))
    op.drop_table("host")
    with op.batch_alter_table("credential", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_credential_project_id"))
    op.drop_table("credential")
