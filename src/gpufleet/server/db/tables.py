"""The store's tables (SQLAlchemy 2 typed mappings). ORM classes end in ``Row``.

Rules (STYLE §8): UTC datetimes, enums stored as their string values, JSON for small
structured values, one Alembic tree (``server/migrations``) for SQLite and PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from gpufleet.core.clock import as_utc

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UtcDateTime(TypeDecorator[dt.datetime]):
    """Timezone-aware UTC on the way in and out, on both dialects."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(
        self,
        value: dt.datetime | None,
        dialect: Dialect,  # noqa: ARG002 - required by the TypeDecorator signature
    ) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; use gpufleet.core.clock.utcnow()")
        return value.astimezone(dt.UTC)

    def process_result_value(
        self,
        value: dt.datetime | None,
        dialect: Dialect,  # noqa: ARG002 - required by the TypeDecorator signature
    ) -> dt.datetime | None:
        return None if value is None else as_utc(value)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dt.datetime: UtcDateTime(), dict[str, Any]: JSON(), list[Any]: JSON()}


ID = String(36)
# PostgreSQL's fill factor of the tables every agent report rewrites (node, gpu): half of
# each page left free for the new row versions of heap-only updates. A report rewrites
# its node's eight GPU rows in one transaction, ~2.4 KB that must fit in their page (at
# 70 a page's free space held about that: 9 % of the GPU updates of the 20,000-node
# bench still went to other pages; none at 50).
HOT_FILLFACTOR = 50


class ProjectRow(Base):
    __tablename__ = "project"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    description: Mapped[str] = mapped_column(String(1000), default="")
    created_at: Mapped[dt.datetime]


class UserRow(Base):
    __tablename__ = "users"  # "user" is reserved in PostgreSQL

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    email: Mapped[str | None] = mapped_column(String(254))
    is_owner: Mapped[bool] = mapped_column(Boolean, default=False)
    oidc_subject: Mapped[str | None] = mapped_column(String(255), unique=True)
    # The user's account on cluster nodes (sudoers, Slurm AdminLevel): from the IdP's
    # preferred_username at first login, or set by the owner. One person, one name.
    unix_name: Mapped[str | None] = mapped_column(String(32), unique=True)
    created_at: Mapped[dt.datetime]


class MembershipRow(Base):
    __tablename__ = "membership"

    project_id: Mapped[str] = mapped_column(
        ForeignKey("project.id", ondelete="CASCADE"), primary_key=True
    )
    user_id: Mapped[str] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), primary_key=True
    )
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[dt.datetime]
    # "manual" (made by a person) or "oidc-group" (follows an IdP group at each login;
    # only these are changed or removed by the group mapping).
    source: Mapped[str] = mapped_column(String(16), default="manual", server_default="manual")


class ApiTokenRow(Base):
    __tablename__ = "api_token"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    # SHA-256 of the whole secret: tokens are 256-bit random, so a fast hash is enough and
    # lookup by hash is a constant-time index probe (no per-row comparison of secrets).
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    project_id: Mapped[str | None] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    role: Mapped[str | None] = mapped_column(String(16))
    created_at: Mapped[dt.datetime]
    expires_at: Mapped[dt.datetime | None]
    revoked_at: Mapped[dt.datetime | None]
    last_used_at: Mapped[dt.datetime | None]


class WebSessionRow(Base):
    """A console login: the cookie holds a 256-bit secret, the store only its SHA-256."""

    __tablename__ = "web_session"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    source_ip: Mapped[str | None] = mapped_column(String(64))
    # A console login made with an API token: the session has that token's scope (project,
    # role) and ends when the token is revoked or expires. None: an OIDC login.
    api_token_id: Mapped[str | None] = mapped_column(
        ForeignKey("api_token.id", ondelete="CASCADE"), index=True
    )
    created_at: Mapped[dt.datetime]
    expires_at: Mapped[dt.datetime]
    revoked_at: Mapped[dt.datetime | None]
    last_used_at: Mapped[dt.datetime | None]


class OidcLoginRow(Base):
    """A login in flight between ``/auth/login`` and ``/auth/callback`` (single use)."""

    __tablename__ = "oidc_login"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    state_hash: Mapped[str] = mapped_column(String(64), unique=True)
    nonce: Mapped[str] = mapped_column(String(64))
    code_verifier: Mapped[str] = mapped_column(String(128))
    return_to: Mapped[str] = mapped_column(String(1000))
    created_at: Mapped[dt.datetime]
    expires_at: Mapped[dt.datetime] = mapped_column(index=True)


class OidcTokenUseRow(Base):
    """ID tokens already exchanged for an API token: each one works once."""

    __tablename__ = "oidc_token_use"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    expires_at: Mapped[dt.datetime] = mapped_column(index=True)


class _Leased:
    """Row-level claim columns for reconcilers (STYLE §7)."""

    lock_owner: Mapped[str | None] = mapped_column(String(128))
    lock_token: Mapped[str | None] = mapped_column(ID)
    lock_expires_at: Mapped[dt.datetime | None]


class StackRow(Base):
    """A software stack (``core.stacks``): what it pins, and whether it is the latest."""

    __tablename__ = "stack"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    os_image: Mapped[str | None] = mapped_column(String(64))
    driver: Mapped[str | None] = mapped_column(String(64))
    cuda: Mapped[str | None] = mapped_column(String(64))
    nccl: Mapped[str | None] = mapped_column(String(64))
    dcgm: Mapped[str | None] = mapped_column(String(64))
    slurm: Mapped[str | None] = mapped_column(String(64))
    agent: Mapped[str | None] = mapped_column(String(64))
    latest: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    notes: Mapped[str] = mapped_column(Text, default="", server_default="")
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[dt.datetime]


class ClusterRow(_Leased, Base):
    __tablename__ = "cluster"
    __table_args__ = (
        # Names are unique among clusters that are not deleted; a deleted name can be reused.
        Index(
            "uq_cluster_project_name_live",
            "project_id",
            "name",
            unique=True,
            sqlite_where=text("deleted_at IS NULL"),
            postgresql_where=text("deleted_at IS NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    project_id: Mapped[str] = mapped_column(
        ForeignKey("project.id", ondelete="RESTRICT"), index=True
    )
    name: Mapped[str] = mapped_column(String(63))
    scheduler: Mapped[str] = mapped_column(String(16))
    provider: Mapped[str] = mapped_column(String(16))
    gpu_model: Mapped[str] = mapped_column(String(120))
    gpus_per_node: Mapped[int] = mapped_column(Integer)
    size: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), index=True)
    health: Mapped[str] = mapped_column(String(16))
    acceptance_tests: Mapped[bool] = mapped_column(Boolean, default=True)
    startup_scripts: Mapped[list[Any]] = mapped_column(JSON, default=list)
    autoscale_min: Mapped[int | None] = mapped_column(Integer)
    autoscale_max: Mapped[int | None] = mapped_column(Integer)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    provider_config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # How the server reaches the cluster's scheduler where that is per cluster
    # (``core.models.SchedulerConfig`` as JSON; kubernetes: the kubeconfig credential's id,
    # its context and API server, or in_cluster). Never a secret. {} for the others.
    scheduler_config: Mapped[dict[str, Any]] = mapped_column(
        JSON, default=dict, server_default="{}"
    )
    # Node names are <node_prefix><first_node_index + slot, 3 digits>; the prefix defaults
    # to "<name>-". Set both to adopt machines already named, e.g. Slurm's gpu-001.
    node_prefix: Mapped[str | None] = mapped_column(String(63))
    first_node_index: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The repair circuit breaker: set when too much of the cluster was out at once; no
    # repair starts until an admin resets it.
    repair_breaker_tripped_at: Mapped[dt.datetime | None]
    repair_breaker_reason: Mapped[str | None] = mapped_column(Text)
    # The acceptance suite (``core.acceptance.AcceptanceSuite`` as JSON); None: the default.
    acceptance_suite: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Why the cluster is in its status, in words: "acceptance failed on gpu-003: ...".
    status_detail: Mapped[str] = mapped_column(Text, default="", server_default="")
    # The enroll token bare-metal installs hand their agents (services/enrollment.py):
    # its hash, and when it stops working. None: no token, nothing can enroll.
    enroll_token_hash: Mapped[str | None] = mapped_column(String(64), unique=True)
    enroll_token_expires_at: Mapped[dt.datetime | None]
    # GPUs the cluster's jobs wait for (jobs that more nodes would start), as the
    # accounting loop last read them from its scheduler; None: never read.
    pending_gpus: Mapped[int | None] = mapped_column(Integer)
    pending_read_at: Mapped[dt.datetime | None]
    # The software stack its nodes should run (``core.stacks``); None: no stack defined.
    stack: Mapped[str | None] = mapped_column(ForeignKey("stack.name", ondelete="RESTRICT"))
    created_at: Mapped[dt.datetime]
    updated_at: Mapped[dt.datetime]
    deleted_at: Mapped[dt.datetime | None]


class NodeRow(_Leased, Base):
    __tablename__ = "node"
    # Every report rewrites its node row and its GPUs' rows (2,000 reports a second at
    # 20,000 nodes): on PostgreSQL those tables leave room in each page (``HOT_FILLFACTOR``)
    # and index no column a report writes, so an update stays in its page (a heap-only
    # tuple: no index entry written, the old version pruned in place, no vacuum needed).
    __table_args__ = (
        UniqueConstraint("cluster_id", "name", name="uq_node_cluster_name"),
        {"postgresql_with": {"fillfactor": HOT_FILLFACTOR}},
    )

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    cluster_id: Mapped[str] = mapped_column(
        ForeignKey("cluster.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(63))
    # Identity: one node across hostname, scheduler name, provider instance and serial.
    hostname: Mapped[str | None] = mapped_column(String(253))
    scheduler_name: Mapped[str | None] = mapped_column(String(253))
    serial: Mapped[str | None] = mapped_column(String(120), index=True)
    provider_instance_id: Mapped[str | None] = mapped_column(String(128), index=True)
    bmc_address: Mapped[str | None] = mapped_column(String(255))
    # Topology labels, for incidents that span a leaf switch, rack or PDU.
    rack: Mapped[str | None] = mapped_column(String(63))
    leaf_switch: Mapped[str | None] = mapped_column(String(63))
    pdu: Mapped[str | None] = mapped_column(String(63))
    state: Mapped[str] = mapped_column(String(16), index=True)
    health: Mapped[str] = mapped_column(String(16))
    expected_gpus: Mapped[int] = mapped_column(Integer)
    token_hash: Mapped[str | None] = mapped_column(String(64), unique=True)
    last_report_at: Mapped[dt.datetime | None] = mapped_column()  # not indexed: see above
    last_report_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    # The kernel boot id the agent last reported, and when it first reported it: a reboot
    # the control plane asked for is done when this changes (workers/repairs/acting.py).
    boot_id: Mapped[str | None] = mapped_column(String(64))
    boot_seen_at: Mapped[dt.datetime | None]
    last_finding_seq: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    provision_requested_at: Mapped[dt.datetime | None]
    provision_attempts: Mapped[int] = mapped_column(Integer, default=0)
    # Since when the node waits for its machine's agent to enroll (a bare-metal host was
    # claimed or reinstalled: a BMC cannot hand it a token). None: nothing may enroll as it.
    enroll_open_at: Mapped[dt.datetime | None]
    # When its agent last enrolled, and the kernel boot id it enrolled with: the same
    # machine asking again before any report (its answer was lost) gets a token again.
    enrolled_at: Mapped[dt.datetime | None]
    enrolled_boot_id: Mapped[str | None] = mapped_column(String(64))
    # Why the node is held where it is: a failed startup script, a failed acceptance check.
    state_detail: Mapped[str] = mapped_column(Text, default="", server_default="")
    # Since when its scheduler has seen no job on it (the autoscaler's reading; None:
    # busy, or not read yet).
    idle_since: Mapped[dt.datetime | None]
    # The provider's last refusal to make its machine (cleared once one is made), and the
    # error's code (``out_of_capacity`` for a stockout or quota): the autoscaler's
    # Cluster Autoscaler service reports it with the right error class.
    provision_error: Mapped[str] = mapped_column(Text, default="", server_default="")
    provision_error_code: Mapped[str | None] = mapped_column(String(32))
    # What its agent reports it runs (``core.stacks.NodeSoftware`` as JSON; {}: nothing yet).
    software: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict, server_default="{}")
    # The stack this node should run when it is not its cluster's (a rollout moved it on,
    # or rolled it back); None: the cluster's.
    stack: Mapped[str | None] = mapped_column(ForeignKey("stack.name", ondelete="RESTRICT"))
    created_at: Mapped[dt.datetime]
    updated_at: Mapped[dt.datetime]
    removed_at: Mapped[dt.datetime | None]


class GpuRow(Base):
    __tablename__ = "gpu"
    # Rewritten by every report, as the node row is (see NodeRow); the unique (node, uuid)
    # index is also the index by node.
    __table_args__ = (
        UniqueConstraint("node_id", "uuid", name="uq_gpu_node_uuid"),
        {"postgresql_with": {"fillfactor": HOT_FILLFACTOR}},
    )

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("node.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str] = mapped_column(String(80), index=True)
    serial: Mapped[str | None] = mapped_column(String(80))
    model: Mapped[str | None] = mapped_column(String(120))
    health: Mapped[str] = mapped_column(String(16))
    utilization_pct: Mapped[float | None] = mapped_column(Float)
    memory_used_mib: Mapped[float | None] = mapped_column(Float)
    memory_total_mib: Mapped[float | None] = mapped_column(Float)
    temperature_c: Mapped[float | None] = mapped_column(Float)
    power_w: Mapped[float | None] = mapped_column(Float)
    sm_clock_mhz: Mapped[float | None] = mapped_column(Float)
    ecc_sbe_volatile: Mapped[int | None] = mapped_column(BigInteger)
    ecc_dbe_volatile: Mapped[int | None] = mapped_column(BigInteger)
    ecc_sbe_aggregate: Mapped[int | None] = mapped_column(BigInteger)
    ecc_dbe_aggregate: Mapped[int | None] = mapped_column(BigInteger)
    sampled_at: Mapped[dt.datetime | None]
    first_seen: Mapped[dt.datetime]
    removed_at: Mapped[dt.datetime | None]  # set when the GPU left this node (swap)


class FindingRow(Base):
    __tablename__ = "finding"
    __table_args__ = (
        Index("ix_finding_node_open", "node_id", "cleared_at"),
        Index("ix_finding_node_key", "node_id", "fold_key"),
    )

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    cluster_id: Mapped[str] = mapped_column(
        ForeignKey("cluster.id", ondelete="CASCADE"), index=True
    )
    node_id: Mapped[str] = mapped_column(ForeignKey("node.id", ondelete="CASCADE"))
    gpu_uuid: Mapped[str | None] = mapped_column(String(80))
    # The agent's fold key: one open finding per key and node.
    fold_key: Mapped[str | None] = mapped_column(String(200))
    gpu_index: Mapped[int | None] = mapped_column(Integer)
    pci_bus_id: Mapped[str | None] = mapped_column(String(32))
    component: Mapped[str | None] = mapped_column(String(80))
    signature_id: Mapped[str] = mapped_column(String(80), index=True)
    title: Mapped[str] = mapped_column(String(200))
    severity: Mapped[str] = mapped_column(String(16))
    source: Mapped[str] = mapped_column(String(16))
    evidence: Mapped[str] = mapped_column(Text)
    count: Mapped[int] = mapped_column(Integer, default=1)
    # The agent's running count of this episode when this finding opened: what findings
    # of the same episode the server closed meanwhile counted (0 for a new episode).
    count_offset: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    first_seen: Mapped[dt.datetime]
    last_seen: Mapped[dt.datetime]
    cleared_at: Mapped[dt.datetime | None]


class CheckRunRow(_Leased, Base):
    __tablename__ = "check_run"
    __table_args__ = (Index("ix_check_run_cluster_id_id", "cluster_id", "id"),)

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    cluster_id: Mapped[str] = mapped_column(
        ForeignKey("cluster.id", ondelete="CASCADE"), index=True
    )
    kind: Mapped[str] = mapped_column(String(32))
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    node_ids: Mapped[list[Any]] = mapped_column(JSON, default=list)
    status: Mapped[str] = mapped_column(String(16), index=True)
    requested_by: Mapped[str | None] = mapped_column(String(128))
    result: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    raw_output: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[dt.datetime]
    started_at: Mapped[dt.datetime | None]
    finished_at: Mapped[dt.datetime | None]
    # "on_demand" (a person asked), "acceptance" (the suite), "localisation" (bisecting a
    # failed multi-node run; its rounds are child runs with the same purpose).
    purpose: Mapped[str] = mapped_column(
        String(16), default="on_demand", server_default="on_demand"
    )
    parent_id: Mapped[str | None] = mapped_column(String(36), index=True)
    forced: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    # Where it runs ("agent", "slurm"), and what the runner needs to resume following it
    # after a restart: command ids, the Slurm job id and reservation, the output paths.
    backend: Mapped[str | None] = mapped_column(String(16))
    progress: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict, server_default="{}")
    # Nodes asked for but not checked, each {node_id, node, reason} (a job runs there).
    skipped: Mapped[list[Any]] = mapped_column(JSON, default=list, server_default="[]")
    detail: Mapped[str] = mapped_column(Text, default="", server_default="")
    deadline_at: Mapped[dt.datetime | None]  # killed and failed ("did not finish") after
    updated_at: Mapped[dt.datetime | None]


class RepairRow(_Leased, Base):
    __tablename__ = "repair"
    __table_args__ = (Index("ix_repair_cluster_status", "cluster_id", "status"),)

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    cluster_id: Mapped[str] = mapped_column(
        ForeignKey("cluster.id", ondelete="CASCADE"), index=True
    )
    node_id: Mapped[str | None] = mapped_column(
        ForeignKey("node.id", ondelete="CASCADE"), index=True
    )
    kind: Mapped[str] = mapped_column(String(16), default="node", server_default="node")
    source: Mapped[str] = mapped_column(String(16), default="policy", server_default="policy")
    action: Mapped[str] = mapped_column(String(24))
    status: Mapped[str] = mapped_column(String(16), index=True)
    signature_id: Mapped[str] = mapped_column(String(80), default="", server_default="")
    # The machine the repair was made for (serial, else instance id): the ladder's history.
    host: Mapped[str | None] = mapped_column(String(128), index=True)
    gpu_index: Mapped[int | None] = mapped_column(Integer)  # for reset_gpu; None: all
    finding_ids: Mapped[list[Any]] = mapped_column(JSON, default=list, server_default="[]")
    # An incident's member nodes.
    node_ids: Mapped[list[Any]] = mapped_column(JSON, default=list, server_default="[]")
    incident_key: Mapped[str | None] = mapped_column(String(200), index=True)
    escalated_from: Mapped[str | None] = mapped_column(String(24))
    reason: Mapped[str] = mapped_column(Text)
    rule: Mapped[str] = mapped_column(Text)
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    auto_approved: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    forced: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    requested_by: Mapped[str | None] = mapped_column(String(128))
    decided_by: Mapped[str | None] = mapped_column(String(128))
    decision_reason: Mapped[str | None] = mapped_column(Text)
    # Step bookkeeping the reconciler needs to resume after a crash (when it asked the
    # provider to act, the replacement machine, ...), and the last word on progress.
    progress: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict, server_default="{}")
    detail: Mapped[str] = mapped_column(Text, default="", server_default="")
    step_started_at: Mapped[dt.datetime | None]
    approved_at: Mapped[dt.datetime | None]
    finished_at: Mapped[dt.datetime | None] = mapped_column(index=True)
    created_at: Mapped[dt.datetime]
    updated_at: Mapped[dt.datetime]


class RepairPolicyRow(Base):
    """A project's repair policy (``core.repair.models.PolicyConfig`` as JSON)."""

    __tablename__ = "repair_policy"

    project_id: Mapped[str] = mapped_column(
        ForeignKey("project.id", ondelete="CASCADE"), primary_key=True
    )
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    updated_by: Mapped[str] = mapped_column(String(128))
    updated_at: Mapped[dt.datetime]


class EventRow(Base):
    __tablename__ = "event"
    __table_args__ = (
        Index("ix_event_cluster_id_id", "cluster_id", "id"),
        Index("ix_event_node_id_id", "node_id", "id"),
        Index("ix_event_project_id_id", "project_id", "id"),
    )

    id: Mapped[str] = mapped_column(ID, primary_key=True)  # UUIDv7: id order is time order
    ts: Mapped[dt.datetime]
    kind: Mapped[str] = mapped_column(String(40), index=True)
    message: Mapped[str] = mapped_column(Text)
    project_id: Mapped[str | None] = mapped_column(String(36))
    cluster_id: Mapped[str | None] = mapped_column(String(36))
    node_id: Mapped[str | None] = mapped_column(String(36))
    actor: Mapped[str | None] = mapped_column(String(128))
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class NodeTelemetryRow(Base):
    """One minute of a node's GPU telemetry: the first report of the minute, per GPU.

    Written by the ingest path (one row per node per minute, in the report's own
    transaction); kept ``telemetry_history_s``. ``gpus`` holds one entry per GPU slot in
    index order, ``[utilization %, memory used MiB, power W, temperature °C]`` rounded to
    integers (the charts need no more), or null for a slot with no GPU reporting.
    """

    __tablename__ = "node_telemetry"

    node_id: Mapped[str] = mapped_column(
        ForeignKey("node.id", ondelete="CASCADE"), primary_key=True
    )
    minute: Mapped[dt.datetime] = mapped_column(primary_key=True, index=True)
    mem_total_mib: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[list[Any]] = mapped_column(JSON)


class ClusterTelemetryRow(Base):
    """One minute of a cluster's GPU telemetry: sums over the node samples of the minute
    (so averages are ``sum / gpus``); kept ``cluster_telemetry_history_s``."""

    __tablename__ = "cluster_telemetry"

    cluster_id: Mapped[str] = mapped_column(
        ForeignKey("cluster.id", ondelete="CASCADE"), primary_key=True
    )
    minute: Mapped[dt.datetime] = mapped_column(primary_key=True, index=True)
    nodes: Mapped[int] = mapped_column(Integer)  # node samples in the minute
    gpus: Mapped[int] = mapped_column(Integer)  # GPU samples in the minute
    util_sum: Mapped[float] = mapped_column(Float)
    mem_used_mib: Mapped[float] = mapped_column(Float)
    mem_total_mib: Mapped[float] = mapped_column(Float)
    power_w: Mapped[float] = mapped_column(Float)
    temp_sum: Mapped[float] = mapped_column(Float)
    temp_max: Mapped[float] = mapped_column(Float)


class JobRow(Base):
    __tablename__ = "job"
    __table_args__ = (
        UniqueConstraint("cluster_id", "scheduler_job_id", name="uq_job_cluster_sjid"),
    )

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    cluster_id: Mapped[str] = mapped_column(
        ForeignKey("cluster.id", ondelete="CASCADE"), index=True
    )
    scheduler_job_id: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(255), default="")
    user_name: Mapped[str] = mapped_column(String(128), default="")
    account: Mapped[str] = mapped_column(String(128), default="")
    state: Mapped[str] = mapped_column(String(32))
    nodes: Mapped[list[Any]] = mapped_column(JSON, default=list)
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    submitted_at: Mapped[dt.datetime | None]
    started_at: Mapped[dt.datetime | None]
    ended_at: Mapped[dt.datetime | None] = mapped_column(index=True)
    gpu_hours: Mapped[float] = mapped_column(Float, default=0.0)
    exit_code: Mapped[int | None] = mapped_column(Integer)


class AuditLogRow(Base):
    __tablename__ = "audit_log"
    __table_args__ = (
        Index("ix_audit_log_project_id_id", "project_id", "id"),
        Index("ix_audit_log_request_id", "request_id"),
    )

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    ts: Mapped[dt.datetime]
    actor: Mapped[str] = mapped_column(String(128))  # "user:<id>", "node:<id>", "system:<loop>"
    action: Mapped[str] = mapped_column(String(64))
    object_type: Mapped[str] = mapped_column(String(32))
    object_id: Mapped[str | None] = mapped_column(String(36))
    project_id: Mapped[str | None] = mapped_column(String(36))
    source_ip: Mapped[str | None] = mapped_column(String(64))
    result: Mapped[str] = mapped_column(String(16))
    # The HTTP request the row came from (X-Request-ID); None for background work.
    request_id: Mapped[str | None] = mapped_column(String(36))
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class VolumeRow(Base):
    """A project's storage volume (name, size, mount path); attached to its clusters."""

    __tablename__ = "volume"
    __table_args__ = (UniqueConstraint("project_id", "name", name="uq_volume_project_name"),)

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    project_id: Mapped[str] = mapped_column(
        ForeignKey("project.id", ondelete="RESTRICT"), index=True
    )
    name: Mapped[str] = mapped_column(String(63))
    size_gb: Mapped[int] = mapped_column(Integer)
    mount_path: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[dt.datetime]
    updated_at: Mapped[dt.datetime]


class VolumeAttachmentRow(Base):
    __tablename__ = "volume_attachment"

    volume_id: Mapped[str] = mapped_column(
        ForeignKey("volume.id", ondelete="CASCADE"), primary_key=True
    )
    cluster_id: Mapped[str] = mapped_column(
        ForeignKey("cluster.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    created_at: Mapped[dt.datetime]


class NodeCommandRow(Base):
    """A command for one node's agent (``core.agent_protocol.NodeCommand``), and how it
    ended (``CommandResult``, as the agent sent it). See ``services/node_commands.py``."""

    __tablename__ = "node_command"
    __table_args__ = (
        Index("ix_node_command_node_id_id", "node_id", "id"),
        # The expiry sweep and the per-replica "who has work waiting" scan.
        Index("ix_node_command_status_updated_at", "status", "updated_at"),
    )

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("node.id", ondelete="CASCADE"))
    cluster_id: Mapped[str] = mapped_column(
        ForeignKey("cluster.id", ondelete="CASCADE"), index=True
    )
    kind: Mapped[str] = mapped_column(String(16))
    argv: Mapped[list[Any]] = mapped_column(JSON)
    env: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    cwd: Mapped[str | None] = mapped_column(String(4096))
    timeout_s: Mapped[float] = mapped_column(Float)
    max_output_bytes: Mapped[int] = mapped_column(Integer)
    purpose: Mapped[str] = mapped_column(String(200), default="")
    ref: Mapped[str | None] = mapped_column(String(128), index=True)  # e.g. check_run:<id>
    requested_by: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16))
    status_reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[dt.datetime]
    updated_at: Mapped[dt.datetime]
    expires_at: Mapped[dt.datetime]
    sent_at: Mapped[dt.datetime | None]
    deadline_at: Mapped[dt.datetime | None]
    agent_boot_id: Mapped[str | None] = mapped_column(String(64))
    deliveries: Mapped[int] = mapped_column(Integer, default=0)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    result_at: Mapped[dt.datetime | None]
    late_result: Mapped[bool] = mapped_column(Boolean, default=False)


class LeaseRow(Base):
    """A named lease: which replica runs a loop, until when (one active replica per loop)."""

    __tablename__ = "lease"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    owner: Mapped[str] = mapped_column(String(128))
    token: Mapped[str] = mapped_column(ID)
    acquired_at: Mapped[dt.datetime]
    expires_at: Mapped[dt.datetime]


class NodeStartupRow(Base):
    """One node start (provision, reboot, reprovision, failover, retry) and its startup
    scripts, run in order through the agent command channel."""

    __tablename__ = "node_startup"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("node.id", ondelete="CASCADE"), index=True)
    cluster_id: Mapped[str] = mapped_column(
        ForeignKey("cluster.id", ondelete="CASCADE"), index=True
    )
    trigger: Mapped[str] = mapped_column(String(16))
    # The machine and boot the scripts ran on (instance id @ boot time).
    boot_key: Mapped[str | None] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), index=True)
    scripts: Mapped[list[Any]] = mapped_column(JSON, default=list)  # as they were then
    current: Mapped[int] = mapped_column(Integer, default=0)  # the script running now
    command_id: Mapped[str | None] = mapped_column(String(36))  # its command, once sent
    results: Mapped[list[Any]] = mapped_column(JSON, default=list)
    error: Mapped[str] = mapped_column(Text, default="")
    repair_id: Mapped[str | None] = mapped_column(String(36))
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[dt.datetime]
    updated_at: Mapped[dt.datetime]
    finished_at: Mapped[dt.datetime | None]


class AcceptanceRunRow(Base):
    """One run of a cluster's acceptance suite over some of its nodes, and its report."""

    __tablename__ = "acceptance_run"
    __table_args__ = (Index("ix_acceptance_run_cluster_id_id", "cluster_id", "id"),)

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    cluster_id: Mapped[str] = mapped_column(ForeignKey("cluster.id", ondelete="CASCADE"))
    scope: Mapped[str] = mapped_column(String(16))  # cluster | node
    trigger: Mapped[str] = mapped_column(String(16))  # provisioning | repair | manual
    status: Mapped[str] = mapped_column(String(16), index=True)
    stage: Mapped[str] = mapped_column(String(16))  # node | cluster | done
    node_ids: Mapped[list[Any]] = mapped_column(JSON, default=list)
    check_run_ids: Mapped[list[Any]] = mapped_column(JSON, default=list)
    suite: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # as it was then
    # Per node: {"outcome": pending|pass|warn|fail|skipped, "reasons": [...]}.
    results: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    repair_id: Mapped[str | None] = mapped_column(String(36), index=True)
    detail: Mapped[str] = mapped_column(Text, default="")
    report: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # SHA-256 of the report's canonical JSON (``core.acceptance.canonical_json``).
    report_sha256: Mapped[str | None] = mapped_column(String(64))
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[dt.datetime]
    started_at: Mapped[dt.datetime | None]
    finished_at: Mapped[dt.datetime | None]
    updated_at: Mapped[dt.datetime]


class CredentialRow(Base):
    """A secret (BMC password, SSH private key, cloud key) sealed with AES-256-GCM under one
    key of the server's keyring (``key_id``), bound to this row by its id (associated
    data), so a ciphertext copied to another row does not decrypt. Never leaves the
    server: only ``services/host_directory.py`` decrypts, for a driver's call."""

    __tablename__ = "credential"
    __table_args__ = (UniqueConstraint("project_id", "name", name="uq_credential_project_name"),)

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    project_id: Mapped[str] = mapped_column(
        ForeignKey("project.id", ondelete="RESTRICT"), index=True
    )
    name: Mapped[str] = mapped_column(String(63))
    kind: Mapped[str] = mapped_column(String(16))  # core.inventory.CredentialKind
    username: Mapped[str | None] = mapped_column(String(255))
    ciphertext: Mapped[bytes] = mapped_column(LargeBinary)  # nonce (12 bytes) + sealed + tag
    key_id: Mapped[str] = mapped_column(String(32))
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[dt.datetime]
    rotated_at: Mapped[dt.datetime | None]


class HostRow(Base):
    """One machine of the inventory and how to reach its management path."""

    __tablename__ = "host"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    project_id: Mapped[str] = mapped_column(
        ForeignKey("project.id", ondelete="RESTRICT"), index=True
    )
    hostname: Mapped[str] = mapped_column(String(253), unique=True)
    serial: Mapped[str | None] = mapped_column(String(120))
    bmc_type: Mapped[str] = mapped_column(String(16))  # ipmi | redfish | ssh | aws
    bmc_address: Mapped[str] = mapped_column(String(255))
    port: Mapped[int | None] = mapped_column(Integer)
    system_id: Mapped[str | None] = mapped_column(String(255))
    host_key: Mapped[str | None] = mapped_column(Text)
    credential_id: Mapped[str | None] = mapped_column(
        ForeignKey("credential.id", ondelete="RESTRICT"), index=True
    )
    rack: Mapped[str | None] = mapped_column(String(63))
    leaf_switch: Mapped[str | None] = mapped_column(String(63))
    pdu: Mapped[str | None] = mapped_column(String(63))
    cluster_id: Mapped[str | None] = mapped_column(
        ForeignKey("cluster.id", ondelete="SET NULL"), index=True
    )
    role: Mapped[str] = mapped_column(String(16))  # member | spare
    state: Mapped[str] = mapped_column(String(16))  # in_service | spare | claimed | out_of_service
    node_id: Mapped[str | None] = mapped_column(
        ForeignKey("node.id", ondelete="SET NULL"), index=True
    )
    # The failover that took it from the pool: the same token always gets the same host.
    claim_token: Mapped[str | None] = mapped_column(String(128), unique=True)
    created_at: Mapped[dt.datetime]
    updated_at: Mapped[dt.datetime]


class AutoscalePolicyRow(Base):
    """A cluster's autoscaling settings (``core.autoscaling.AutoscaleSettings``; the bounds
    are the cluster's ``autoscale_min``/``autoscale_max``) and the policy's memory: when it
    last stepped, and what it last concluded."""

    __tablename__ = "autoscale_policy"

    cluster_id: Mapped[str] = mapped_column(
        ForeignKey("cluster.id", ondelete="CASCADE"), primary_key=True
    )
    mode: Mapped[str] = mapped_column(String(24))  # core.autoscaling.AutoscaleMode
    scale_up_after_s: Mapped[float] = mapped_column(Float)
    scale_down_after_s: Mapped[float] = mapped_column(Float)
    up_cooldown_s: Mapped[float] = mapped_column(Float)
    down_cooldown_s: Mapped[float] = mapped_column(Float)
    max_step: Mapped[int] = mapped_column(Integer)
    last_up_at: Mapped[dt.datetime | None]
    last_down_at: Mapped[dt.datetime | None]
    last_decision: Mapped[str] = mapped_column(Text, default="", server_default="")
    updated_by: Mapped[str] = mapped_column(String(128))
    updated_at: Mapped[dt.datetime]


class AutoscaleActionRow(Base):
    """One change of a cluster's size: nodes added (their rows made at once, provisioned
    and accepted by their own loops) or removed (each held, checked idle, its machine given
    back). ``status`` is the action's lifecycle (``core/transitions.py``)."""

    __tablename__ = "autoscale_action"
    __table_args__ = (Index("ix_autoscale_action_cluster_id_id", "cluster_id", "id"),)

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    cluster_id: Mapped[str] = mapped_column(ForeignKey("cluster.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))  # scale_up | scale_down
    status: Mapped[str] = mapped_column(String(16), index=True)
    source: Mapped[str] = mapped_column(String(24))
    count: Mapped[int] = mapped_column(Integer)
    node_ids: Mapped[list[Any]] = mapped_column(JSON, default=list)
    node_names: Mapped[list[Any]] = mapped_column(JSON, default=list)
    # Per node id, for a step down: held | removed | kept (took work, released) | gone.
    progress: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    reasons: Mapped[list[Any]] = mapped_column(JSON, default=list)
    detail: Mapped[str] = mapped_column(Text, default="")
    actor: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[dt.datetime]
    updated_at: Mapped[dt.datetime]
    finished_at: Mapped[dt.datetime | None]


class RolloutRow(Base):
    """A cluster's migration to another software stack inside maintenance windows
    (``core.windows.Window`` as JSON), node by node in batches of at most
    ``max_unavailable`` (a count or a share), pausing once ``failures`` reach
    ``failure_budget``. ``status`` is its lifecycle (``core/transitions.py``)."""

    __tablename__ = "rollout"
    __table_args__ = (Index("ix_rollout_cluster_id_id", "cluster_id", "id"),)

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    cluster_id: Mapped[str] = mapped_column(ForeignKey("cluster.id", ondelete="CASCADE"))
    from_stack: Mapped[str | None] = mapped_column(String(63))
    to_stack: Mapped[str] = mapped_column(ForeignKey("stack.name", ondelete="RESTRICT"))
    status: Mapped[str] = mapped_column(String(16), index=True)
    window: Mapped[dict[str, Any]] = mapped_column(JSON)
    max_unavailable: Mapped[str] = mapped_column(String(8))
    failure_budget: Mapped[int] = mapped_column(Integer)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    # A node not yet reinstalled when the window closes: wait (drained, for the next
    # opening) or release (back in service, in line again).
    on_window_close: Mapped[str] = mapped_column(String(8), default="wait")
    # The Slurm MAINT reservation made for the current or next opening ("" for none), and
    # the opening it covers (UTC ISO start), so it is made once per opening.
    reservation: Mapped[str] = mapped_column(String(64), default="")
    reserved_for: Mapped[str] = mapped_column(String(40), default="")
    detail: Mapped[str] = mapped_column(Text, default="")
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[dt.datetime]
    updated_at: Mapped[dt.datetime]
    finished_at: Mapped[dt.datetime | None]


class RolloutNodeRow(Base):
    """One node of a rollout: its migration (``repair_id``: the repair that cordons,
    drains, reprovisions and re-accepts it), and the stack it came from."""

    __tablename__ = "rollout_node"
    __table_args__ = (UniqueConstraint("rollout_id", "node_id", name="uq_rollout_node"),)

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    rollout_id: Mapped[str] = mapped_column(
        ForeignKey("rollout.id", ondelete="CASCADE"), index=True
    )
    node_id: Mapped[str] = mapped_column(ForeignKey("node.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer)  # the order nodes go in
    status: Mapped[str] = mapped_column(String(16))
    from_stack: Mapped[str | None] = mapped_column(String(63))
    repair_id: Mapped[str | None] = mapped_column(ID)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    detail: Mapped[str] = mapped_column(Text, default="")
    started_at: Mapped[dt.datetime | None]
    finished_at: Mapped[dt.datetime | None]
    updated_at: Mapped[dt.datetime]
