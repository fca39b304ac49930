"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("object_type", sa.String(length=32), nullable=False),
        sa.Column("object_id", sa.String(length=36), nullable=True),
        sa.Column("project_id", sa.String(length=36), nullable=True),
        sa.Column("source_ip", sa.String(length=64), nullable=True),
        sa.Column("result", sa.String(length=16), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.create_index("ix_audit_log_project_id_id", ["project_id", "id"], unique=False)

    op.create_table(
        "event",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("project_id", sa.String(length=36), nullable=True),
        sa.Column("cluster_id", sa.String(length=36), nullable=True),
        sa.Column("node_id", sa.String(length=36), nullable=True),
        sa.Column("actor", sa.String(length=128), nullable=True),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_event")),
    )
    with op.batch_alter_table("event", schema=None) as batch_op:
        batch_op.create_index("ix_event_cluster_id_id", ["cluster_id", "id"], unique=False)
        batch_op.create_index(batch_op.f("ix_event_kind"), ["kind"], unique=False)
        batch_op.create_index("ix_event_node_id_id", ["node_id", "id"], unique=False)
        batch_op.create_index("ix_event_project_id_id", ["project_id", "id"], unique=False)

    op.create_table(
        "lease",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("token", sa.String(length=36), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_lease")),
    )
    op.create_table(
        "project",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("description", sa.String(length=1000), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_project")),
        sa.UniqueConstraint("name", name=op.f("uq_project_name")),
    )
    op.create_table(
        "users",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("email", sa.String(length=254), nullable=True),
        sa.Column("is_owner", sa.Boolean(), nullable=False),
        sa.Column("oidc_subject", sa.String(length=255), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("name", name=op.f("uq_users_name")),
        sa.UniqueConstraint("oidc_subject", name=op.f("uq_users_oidc_subject")),
    )
    op.create_table(
        "api_token",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("user_id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("project_id", sa.String(length=36), nullable=True),
        sa.Column("role", sa.String(length=16), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["project.id"],
            name=op.f("fk_api_token_project_id_project"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_api_token_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_token")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_token_token_hash")),
    )
    with op.batch_alter_table("api_token", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_token_user_id"), ["user_id"], unique=False)

    op.create_table(
        "cluster",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("project_id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("scheduler", sa.String(length=16), nullable=False),
        sa.Column("provider", sa.String(length=16), nullable=False),
        sa.Column("gpu_model", sa.String(length=120), nullable=False),
        sa.Column("gpus_per_node", sa.Integer(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("health", sa.String(length=16), nullable=False),
        sa.Column("acceptance_tests", sa.Boolean(), nullable=False),
        sa.Column("startup_scripts", sa.JSON(), nullable=False),
        sa.Column("autoscale_min", sa.Integer(), nullable=True),
        sa.Column("autoscale_max", sa.Integer(), nullable=True),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("provider_config", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lock_owner", sa.String(length=128), nullable=True),
        sa.Column("lock_token", sa.String(length=36), nullable=True),
        sa.Column("lock_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["project.id"],
            name=op.f("fk_cluster_project_id_project"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cluster")),
    )
    with op.batch_alter_table("cluster", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_cluster_project_id"), ["project_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_cluster_status"), ["status"], unique=False)
        batch_op.create_index(
            "uq_cluster_project_name_live",
            ["project_id", "name"],
            unique=True,
            sqlite_where=sa.text("deleted_at IS NULL"),
            postgresql_where=sa.text("deleted_at IS NULL"),
        )

    op.create_table(
        "membership",
        sa.Column("project_id", sa.String(length=36), nullable=False),
        sa.Column("user_id", sa.String(length=36), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["project.id"],
            name=op.f("fk_membership_project_id_project"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_membership_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("project_id", "user_id", name=op.f("pk_membership")),
    )
    op.create_table(
        "check_run",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("cluster_id", sa.String(length=36), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("node_ids", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("requested_by", sa.String(length=128), nullable=True),
        sa.Column("result", sa.JSON(), nullable=False),
        sa.Column("raw_output", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lock_owner", sa.String(length=128), nullable=True),
        sa.Column("lock_token", sa.String(length=36), nullable=True),
        sa.Column("lock_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["cluster.id"],
            name=op.f("fk_check_run_cluster_id_cluster"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_check_run")),
    )
    with op.batch_alter_table("check_run", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_check_run_cluster_id"), ["cluster_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_check_run_status"), ["status"], unique=False)

    op.create_table(
        "job",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("cluster_id", sa.String(length=36), nullable=False),
        sa.Column("scheduler_job_id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("user_name", sa.String(length=128), nullable=False),
        sa.Column("account", sa.String(length=128), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("gpu_hours", sa.Float(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["cluster.id"],
            name=op.f("fk_job_cluster_id_cluster"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job")),
        sa.UniqueConstraint("cluster_id", "scheduler_job_id", name="uq_job_cluster_sjid"),
    )
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_cluster_id"), ["cluster_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_job_ended_at"), ["ended_at"], unique=False)

    op.create_table(
        "node",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("cluster_id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("hostname", sa.String(length=253), nullable=True),
        sa.Column("scheduler_name", sa.String(length=253), nullable=True),
        sa.Column("serial", sa.String(length=120), nullable=True),
        sa.Column("provider_instance_id", sa.String(length=128), nullable=True),
        sa.Column("bmc_address", sa.String(length=255), nullable=True),
        sa.Column("rack", sa.String(length=63), nullable=True),
        sa.Column("leaf_switch", sa.String(length=63), nullable=True),
        sa.Column("pdu", sa.String(length=63), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("health", sa.String(length=16), nullable=False),
        sa.Column("expected_gpus", sa.Integer(), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=True),
        sa.Column("last_report_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_report_seq", sa.BigInteger(), nullable=False),
        sa.Column("provision_requested_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("provision_attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("removed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lock_owner", sa.String(length=128), nullable=True),
        sa.Column("lock_token", sa.String(length=36), nullable=True),
        sa.Column("lock_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["cluster.id"],
            name=op.f("fk_node_cluster_id_cluster"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_node")),
        sa.UniqueConstraint("cluster_id", "name", name="uq_node_cluster_name"),
        sa.UniqueConstraint("token_hash", name=op.f("uq_node_token_hash")),
    )
    with op.batch_alter_table("node", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_node_cluster_id"), ["cluster_id"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_node_last_report_at"), ["last_report_at"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_node_provider_instance_id"), ["provider_instance_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_node_serial"), ["serial"], unique=False)
        batch_op.create_index(batch_op.f("ix_node_state"), ["state"], unique=False)

    op.create_table(
        "finding",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("cluster_id", sa.String(length=36), nullable=False),
        sa.Column("node_id", sa.String(length=36), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=80), nullable=True),
        sa.Column("signature_id", sa.String(length=80), nullable=False),
        sa.Column("title", sa.String(length=200), nullable=False),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("evidence", sa.Text(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("cleared_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["cluster.id"],
            name=op.f("fk_finding_cluster_id_cluster"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["node.id"], name=op.f("fk_finding_node_id_node"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_finding")),
    )
    with op.batch_alter_table("finding", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_finding_cluster_id"), ["cluster_id"], unique=False)
        batch_op.create_index("ix_finding_node_open", ["node_id", "cleared_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_finding_signature_id"), ["signature_id"], unique=False)

    op.create_table(
        "gpu",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("node_id", sa.String(length=36), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("uuid", sa.String(length=80), nullable=False),
        sa.Column("serial", sa.String(length=80), nullable=True),
        sa.Column("model", sa.String(length=120), nullable=True),
        sa.Column("health", sa.String(length=16), nullable=False),
        sa.Column("utilization_pct", sa.Float(), nullable=True),
        sa.Column("memory_used_mib", sa.Float(), nullable=True),
        sa.Column("memory_total_mib", sa.Float(), nullable=True),
        sa.Column("temperature_c", sa.Float(), nullable=True),
        sa.Column("power_w", sa.Float(), nullable=True),
        sa.Column("sm_clock_mhz", sa.Float(), nullable=True),
        sa.Column("ecc_sbe_volatile", sa.BigInteger(), nullable=True),
        sa.Column("ecc_dbe_volatile", sa.BigInteger(), nullable=True),
        sa.Column("ecc_sbe_aggregate", sa.BigInteger(), nullable=True),
        sa.Column("ecc_dbe_aggregate", sa.BigInteger(), nullable=True),
        sa.Column("sampled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("removed_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["node_id"], ["node.id"], name=op.f("fk_gpu_node_id_node"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu")),
        sa.UniqueConstraint("node_id", "uuid", name="uq_gpu_node_uuid"),
    )
    with op.batch_alter_table("gpu", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_gpu_node_id"), ["node_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_gpu_uuid"), ["uuid"], unique=False)

    op.create_table(
        "repair",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("cluster_id", sa.String(length=36), nullable=False),
        sa.Column("node_id", sa.String(length=36), nullable=True),
        sa.Column("action", sa.String(length=24), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("rule", sa.String(length=120), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("decided_by", sa.String(length=128), nullable=True),
        sa.Column("decision_reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("lock_owner", sa.String(length=128), nullable=True),
        sa.Column("lock_token", sa.String(length=36), nullable=True),
        sa.Column("lock_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["cluster.id"],
            name=op.f("fk_repair_cluster_id_cluster"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["node.id"], name=op.f("fk_repair_node_id_node"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_repair")),
    )
    with op.batch_alter_table("repair", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_repair_cluster_id"), ["cluster_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_repair_node_id"), ["node_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_repair_status"), ["status"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("repair", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_repair_status"))
        batch_op.drop_index(batch_op.f("ix_repair_node_id"))
        batch_op.drop_index(batch_op.f("ix_repair_cluster_id"))

    op.drop_table("repair")
    with op.batch_alter_table("gpu", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_gpu_uuid"))
        batch_op.drop_index(batch_op.f("ix_gpu_node_id"))

    op.drop_table("gpu")
    with op.batch_alter_table("finding", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_finding_signature_id"))
        batch_op.drop_index("ix_finding_node_open")
        batch_op.drop_index(batch_op.f("ix_finding_cluster_id"))

    op.drop_table("finding")
    with op.batch_alter_table("node", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_node_state"))
        batch_op.drop_index(batch_op.f("ix_node_serial"))
        batch_op.drop_index(batch_op.f("ix_node_provider_instance_id"))
        batch_op.drop_index(batch_op.f("ix_node_last_report_at"))
        batch_op.drop_index(batch_op.f("ix_node_cluster_id"))

    op.drop_table("node")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_ended_at"))
        batch_op.drop_index(batch_op.f("ix_job_cluster_id"))

    op.drop_table("job")
    with op.batch_alter_table("check_run", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_check_run_status"))
        batch_op.drop_index(batch_op.f("ix_check_run_cluster_id"))

    op.drop_table("check_run")
    op.drop_table("membership")
    with op.batch_alter_table("cluster", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_cluster_project_name_live",
            sqlite_where=sa.text("deleted_at IS NULL"),
            postgresql_where=sa.text("deleted_at IS NULL"),
        )
        batch_op.drop_index(batch_op.f("ix_cluster_status"))
        batch_op.drop_index(batch_op.f("ix_cluster_project_id"))

    op.drop_table("cluster")
    with op.batch_alter_table("api_token", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_token_user_id"))

    op.drop_table("api_token")
    op.drop_table("users")
    op.drop_table("project")
    op.drop_table("lease")
    with op.batch_alter_table("event", schema=None) as batch_op:
        batch_op.drop_index("ix_event_project_id_id")
        batch_op.drop_index("ix_event_node_id_id")
        batch_op.drop_index(batch_op.f("ix_event_kind"))
        batch_op.drop_index("ix_event_cluster_id_id")

    op.drop_table("event")
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_index("ix_audit_log_project_id_id")

    op.drop_table("audit_log")
