"""web sessions, OIDC logins in flight, one-time ID token exchanges, membership source

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "web_session",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("user_id", sa.String(length=36), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("source_ip", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_web_session_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_web_session")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_web_session_token_hash")),
    )
    with op.batch_alter_table("web_session", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_web_session_user_id"), ["user_id"], unique=False)

    op.create_table(
        "oidc_login",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("state_hash", sa.String(length=64), nullable=False),
        sa.Column("nonce", sa.String(length=64), nullable=False),
        sa.Column("code_verifier", sa.String(length=128), nullable=False),
        sa.Column("return_to", sa.String(length=1000), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_oidc_login")),
        sa.UniqueConstraint("state_hash", name=op.f("uq_oidc_login_state_hash")),
    )
    with op.batch_alter_table("oidc_login", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_oidc_login_expires_at"), ["expires_at"], unique=False)

    op.create_table(
        "oidc_token_use",
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("token_hash", name=op.f("pk_oidc_token_use")),
    )
    with op.batch_alter_table("oidc_token_use", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_oidc_token_use_expires_at"), ["expires_at"], unique=False
        )

    with op.batch_alter_table("membership", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("source", sa.String(length=16), server_default="manual", nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("membership", schema=None) as batch_op:
        batch_op.drop_column("source")
    with op.batch_alter_table("oidc_token_use", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_oidc_token_use_expires_at"))
    op.drop_table("oidc_token_use")
    with op.batch_alter_table("oidc_login", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_oidc_login_expires_at"))
    op.drop_table("oidc_login")
    with op.batch_alter_table("web_session", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_web_session_user_id"))
    op.drop_table("web_session")
