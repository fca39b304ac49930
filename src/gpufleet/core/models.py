"""Domain objects as the API returns them. Pydantic, frozen, no suffix (STYLE §4)."""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from typing import Annotated, Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.core.acceptance import AcceptanceSuite, default_suite
from gpufleet.core.enums import (
    ClusterStatus,
    EventKind,
    FindingSource,
    Health,
    NodeState,
    ProviderKind,
    RepairAction,
    RepairStatus,
    Role,
    SchedulerKind,
    Severity,
)
from gpufleet.core.stacks import NodeSoftware, Skew


class _Domain(BaseModel):
    model_config = ConfigDict(frozen=True, from_attributes=True, defer_build=True)


class Project(_Domain):
    id: str
    name: str
    description: str
    created_at: dt.datetime


class User(_Domain):
    id: str
    name: str
    email: str | None
    is_owner: bool
    created_at: dt.datetime
    unix_name: str | None = None  # the account on cluster nodes (sudoers, Slurm admins)


class Membership(_Domain):
    project_id: str
    user_id: str
    role: Role


class ApiToken(_Domain):
    id: str
    user_id: str
    name: str
    project_id: str | None
    role: Role | None
    prefix: str
    created_at: dt.datetime
    expires_at: dt.datetime | None
    revoked_at: dt.datetime | None
    last_used_at: dt.datetime | None
    user_name: str | None = None  # filled where a listing shows other users' tokens


class CreatedToken(_Domain):
    """Returned once, when a token is created: the only time the secret is shown."""

    token: str
    info: ApiToken


class CallerToken(_Domain):
    """The credential a request came with and what it is limited to."""

    id: str  # the token's id; for a console login, the session's
    project_id: str | None  # None: every project of the user
    role: Role | None  # None: the user's own role in each project


class Me(_Domain):
    """``GET /api/v1/me``: who the credential belongs to and the projects they are in."""

    user: User
    memberships: list[Membership]
    token: CallerToken


class AuthConfig(_Domain):
    """``GET /api/v1/auth/config``: how to log in to this server (public values only)."""

    oidc: bool
    issuer: str | None = None
    cli_client_id: str | None = None
    scopes: str | None = None
    device_authorization_endpoint: str | None = None
    token_endpoint: str | None = None


class NodeCounts(_Domain):
    total: int
    by_state: dict[str, int]
    by_health: dict[str, int]
    gpus: int


class SchedulerConfig(_Domain):
    """How the server reaches a cluster's scheduler, where that is per cluster
    (``kubernetes``): the kubeconfig's context and API server (the kubeconfig itself is
    the stored credential ``credential_id``, sealed), or the server's own pod's service
    account (``in_cluster``). Nothing here is secret."""

    credential_id: str | None = None  # a credential of kind kubeconfig; None in-cluster
    context: str | None = None  # the kubeconfig's context used; None in-cluster
    server: str | None = None  # the API server's URL; None in-cluster (the pod's own)
    in_cluster: bool = False
    # Slurm runs on the cluster's nodes under Slinky (slurmd pods): a hold drains the
    # node's Slurm node first, through the server's Slurm driver (docs/kubernetes.md).
    slurm: bool = False


class Cluster(_Domain):
    id: str
    project_id: str
    name: str
    scheduler: SchedulerKind
    provider: ProviderKind
    gpu_model: str
    gpus_per_node: int
    size: int
    status: ClusterStatus
    health: Health
    acceptance_tests: bool
    startup_scripts: list[str]
    autoscale_min: int | None
    autoscale_max: int | None
    labels: dict[str, str]
    created_at: dt.datetime
    updated_at: dt.datetime
    nodes: NodeCounts | None = None
    node_prefix: str = ""  # node names: <node_prefix><first_node_index + slot, 3 digits>
    first_node_index: int = 0
    # Run unless acceptance_tests is off.
    acceptance_suite: AcceptanceSuite = Field(default_factory=default_suite)
    status_detail: str = ""  # why the cluster is in its status, e.g. the node that failed
    # kubernetes: how its API server is reached; None for the other schedulers.
    scheduler_config: SchedulerConfig | None = None
    stack: str | None = None  # the software stack its nodes should run (core.stacks)


class ClusterStatusReport(_Domain):
    """``GET /api/v1/clusters/{id}/status``: the cheap status view of one cluster."""

    id: str
    name: str
    status: ClusterStatus
    status_detail: str = ""  # why, e.g. the nodes that failed acceptance
    health: Health
    size: int
    nodes: NodeCounts


class Gpu(_Domain):
    id: str
    node_id: str
    index: int
    uuid: str
    serial: str | None
    model: str | None
    health: Health
    utilization_pct: float | None
    memory_used_mib: float | None
    memory_total_mib: float | None
    temperature_c: float | None
    power_w: float | None
    sm_clock_mhz: float | None
    ecc_sbe_volatile: int | None
    ecc_dbe_volatile: int | None
    ecc_sbe_aggregate: int | None
    ecc_dbe_aggregate: int | None
    sampled_at: dt.datetime | None


class Node(_Domain):
    id: str
    cluster_id: str
    name: str
    hostname: str | None
    scheduler_name: str | None
    serial: str | None
    provider_instance_id: str | None
    state: NodeState
    health: Health
    rack: str | None
    leaf_switch: str | None
    pdu: str | None
    expected_gpus: int
    last_report_at: dt.datetime | None
    last_report_seq: int
    created_at: dt.datetime
    updated_at: dt.datetime
    gpus: list[Gpu] | None = None
    state_detail: str = ""  # why it is held: a failed startup script or acceptance check
    boot_id: str | None = None  # the kernel boot id its agent last reported
    boot_seen_at: dt.datetime | None = None  # when that boot id was first reported
    software: NodeSoftware | None = None  # what its agent says it runs; None: not yet
    # What it runs otherwise than its cluster's stack; only on ``GET /nodes/{id}``.
    stack_skew: list[Skew] | None = None


class Event(_Domain):
    id: str
    ts: dt.datetime
    kind: EventKind
    message: str
    project_id: str | None
    cluster_id: str | None
    node_id: str | None
    actor: str | None
    data: dict[str, Any]


class Finding(_Domain):
    id: str
    cluster_id: str
    node_id: str
    gpu_uuid: str | None
    gpu_index: int | None = None
    pci_bus_id: str | None = None
    component: str | None = None
    signature_id: str
    title: str
    severity: Severity
    source: FindingSource
    evidence: str
    count: int
    first_seen: dt.datetime
    last_seen: dt.datetime
    cleared_at: dt.datetime | None


class Repair(_Domain):
    """A repair recommendation and its execution (DESIGN "Repair semantics")."""

    id: str
    cluster_id: str
    node_id: str | None  # None for an infrastructure incident
    node_name: str | None
    kind: str  # "node" | "incident"
    source: str  # "policy" | "manual"
    action: RepairAction
    status: RepairStatus
    signature_id: str
    host: str | None
    gpu_index: int | None
    reason: str
    rule: str
    evidence: dict[str, Any]
    finding_ids: list[str]
    incident_key: str | None
    node_ids: list[str]
    escalated_from: RepairAction | None
    auto_approved: bool
    forced: bool
    requested_by: str | None
    decided_by: str | None
    decision_reason: str | None
    detail: str  # the last word on progress: "waiting for job 4711 (alice) to end"
    jobs: list[dict[str, Any]] | None = None  # live, on show: the jobs on the node now
    created_at: dt.datetime
    updated_at: dt.datetime
    approved_at: dt.datetime | None
    finished_at: dt.datetime | None


class NodeAction(StrEnum):
    """What ``POST /api/v1/nodes/{id}/actions`` does. The first three hold the node in
    the scheduler; the others run as an approved repair (cordon, drain, act, verify)."""

    CORDON = "cordon"
    UNCORDON = "uncordon"
    DRAIN = "drain"
    REBOOT = "reboot"
    REPROVISION = "reprovision"
    REPLACE = "replace"  # failover to a new host
    REMOVE = "remove"
    RESET_GPU = "reset_gpu"
    # Run the startup scripts again on a node a failed script holds in provisioning.
    RETRY_STARTUP = "retry_startup"


class IssuedNodeToken(_Domain):
    """``POST /api/v1/nodes/{id}/token``: a new node token, shown this once. The node's
    previous token stopped working when this one was made."""

    node_id: str
    node_name: str
    cluster_id: str
    token: str


class EnrollTokenRequest(BaseModel):
    """``POST /api/v1/clusters/{id}/enroll-token``: how long the new token works."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    # An install round of a rack takes hours, not weeks: 24 h by default, 30 days at most.
    ttl_s: Annotated[int, Field(ge=60, le=30 * 86400)] = 86400


class IssuedEnrollToken(_Domain):
    """A cluster's enroll token, shown this once: the install puts it on each bare-metal
    machine, whose agent trades it (with its hostname) for its node's own token. A new one
    replaces the previous one at once."""

    cluster_id: str
    cluster_name: str
    token: str
    expires_at: dt.datetime


class NodeActionResult(_Domain):
    """``POST /api/v1/nodes/{id}/actions``: the node after the action, and the repair it
    started (None for cordon, uncordon, drain and retry_startup)."""

    node: Node
    repair: Repair | None


class Breaker(_Domain):
    """A cluster's repair circuit breaker."""

    cluster_id: str
    tripped: bool
    tripped_at: dt.datetime | None
    reason: str | None
    max_share: float
    affected_nodes: int
    total_nodes: int


class HealthSummary(_Domain):
    clusters: int
    nodes: int
    gpus: int
    nodes_by_health: dict[str, int]
    gpus_by_health: dict[str, int]
    open_findings_by_severity: dict[str, int]
    stale_nodes: int


class UsageGroup(StrEnum):
    """What ``GET /api/v1/usage/gpu-hours`` groups by."""

    PROJECT = "project"  # the gpufleet project the cluster belongs to
    CLUSTER = "cluster"
    USER = "user"
    ACCOUNT = "account"  # the scheduler's account (Slurm -A)
    DAY = "day"  # the UTC day a job ended, YYYY-MM-DD


class GpuHoursRow(_Domain):
    """One group: a value for each key grouped by (the others are left out of the JSON,
    see ``GpuHours``), and its finished jobs' GPU-hours."""

    project: str | None = None
    cluster: str | None = None
    user: str | None = None
    account: str | None = None
    day: str | None = None
    gpu_hours: float
    jobs: int


class GpuHours(_Domain):
    """``GET /api/v1/usage/gpu-hours``: rows sorted by their keys. Sent with None left
    out, so a row carries only the keys in ``group_by``."""

    group_by: list[UsageGroup]
    since: dt.datetime
    until: dt.datetime
    rows: list[GpuHoursRow]
    total_gpu_hours: float
    jobs: int


class ErrorDetail(_Domain):
    code: str  # for programs: not_found, conflict, invalid_input, forbidden, ...
    message: str  # for a person: what was wrong and what is accepted
    field: str | None = None  # the input at fault, when there is one


class ErrorResponse(_Domain):
    """The body of every 4xx and 5xx answer of the API."""

    error: ErrorDetail


T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    """A page of a listing; pass ``next_cursor`` back as ``cursor`` for the next page."""

    items: list[T]
    next_cursor: str | None
