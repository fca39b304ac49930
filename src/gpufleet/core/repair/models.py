"""What the repair policy reads and what it decides. Pure data, no I/O.

The server loads a cluster's nodes, findings and repairs into ``ClusterFacts``, calls
``plan()`` (``policy.py``) and applies the ``Decision``s it returns in one transaction.
The same functions run over stored history in ``replay()`` for a dry run.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpufleet.core.enums import NodeState, RepairAction, RepairStatus, Severity
from gpufleet.core.errors import InvalidInput


class RepairKind(StrEnum):
    NODE = "node"  # one node's repair
    INCIDENT = "incident"  # several nodes behind one leaf switch, rack or PDU


class RepairSource(StrEnum):
    POLICY = "policy"  # recommended from findings
    MANUAL = "manual"  # an admin's node action ("three clicks")
    ROLLOUT = "rollout"  # a node's migration to another stack (an admin's rollout)


class DrainTimeoutAction(StrEnum):
    WAIT = "wait"  # keep waiting for the jobs (the default: never lose work)
    REQUEUE = "requeue"  # requeue the node's jobs through the scheduler


# A repair is open (blocks a second one on the node) in these states.
PENDING_STATUSES = frozenset({RepairStatus.PROPOSED})
ACTIVE_STATUSES = frozenset(
    {
        RepairStatus.APPROVED,
        RepairStatus.CORDONING,
        RepairStatus.DRAINING,
        RepairStatus.ACTING,
        RepairStatus.VERIFYING,
    }
)
OPEN_STATUSES = PENDING_STATUSES | ACTIVE_STATUSES
ENDED_STATUSES = frozenset({RepairStatus.SUCCEEDED, RepairStatus.FAILED})

# The escalation ladder by host history, least to most drastic.
LADDER: tuple[RepairAction, ...] = (
    RepairAction.RESET_GPU,
    RepairAction.REBOOT,
    RepairAction.REPROVISION,
    RepairAction.FAILOVER,
    RepairAction.REMOVE,
)
# Actions that are node repairs (``none`` and ``restart_workload`` are the workload's).
NODE_ACTIONS = frozenset(LADDER)
# Topology labels an incident can span, most specific first.
TOPOLOGY_LABELS: tuple[str, ...] = ("leaf_switch", "pdu", "rack")


@dataclass(frozen=True, slots=True)
class AutoApproveRule:
    """Approve, without a human, repairs of ``action`` recommended for ``signature_id``."""

    signature_id: str
    action: RepairAction


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """A project's repair policy. Defaults are what an operator gets without asking."""

    ttl_s: float = 300.0  # a proposal whose findings cleared this long ago resolves itself
    cooldown_s: float = 1800.0  # no new repair on a node this soon after one succeeded
    ladder_window_s: float = 7 * 86400.0  # host history counted for the ladder
    breaker_max_share: float = 0.10  # of a cluster's nodes cordoned or repairing at once
    incident_min_nodes: int = 3  # nodes failing together behind one label → one incident
    incident_window_s: float = 300.0  # "together": first seen within this window
    drain_timeout_s: float = 3600.0
    drain_timeout_action: DrainTimeoutAction = DrainTimeoutAction.WAIT
    verify_settle_s: float = 30.0  # a repaired node must report clean for this long
    verify_timeout_s: float = 900.0  # ... and come back within this long
    auto_approve: tuple[AutoApproveRule, ...] = ()

    def __post_init__(self) -> None:
        for name in (
            "ttl_s",
            "cooldown_s",
            "ladder_window_s",
            "incident_window_s",
            "drain_timeout_s",
            "verify_settle_s",
            "verify_timeout_s",
        ):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise InvalidInput(f"{name} must be a finite number >= 0, got {value}", field=name)
        if not 0.0 < self.breaker_max_share <= 1.0:
            raise InvalidInput(
                f"breaker_max_share must be within (0, 1], got {self.breaker_max_share}",
                field="breaker_max_share",
            )
        if self.incident_min_nodes < 2:
            raise InvalidInput(
                f"incident_min_nodes must be >= 2, got {self.incident_min_nodes}",
                field="incident_min_nodes",
            )

    def auto_approves(self, signature_id: str, action: RepairAction) -> bool:
        return any(r.signature_id == signature_id and r.action is action for r in self.auto_approve)


@dataclass(frozen=True, slots=True)
class FindingFact:
    id: str
    node_id: str
    signature_id: str
    severity: Severity
    title: str
    evidence: str
    first_seen: dt.datetime
    last_seen: dt.datetime
    cleared_at: dt.datetime | None = None
    gpu_index: int | None = None
    count: int = 1

    @property
    def open(self) -> bool:
        return self.cleared_at is None


@dataclass(frozen=True, slots=True)
class NodeFact:
    id: str
    name: str
    state: NodeState
    host: str  # the machine: serial, else provider instance id, else node id
    rack: str | None = None
    leaf_switch: str | None = None
    pdu: str | None = None

    def label(self, name: str) -> str | None:
        value = getattr(self, name)
        return value if isinstance(value, str) and value else None


@dataclass(frozen=True, slots=True)
class RepairFact:
    id: str
    kind: RepairKind
    action: RepairAction
    status: RepairStatus
    signature_id: str
    created_at: dt.datetime
    updated_at: dt.datetime
    node_id: str | None = None  # None for an incident
    host: str | None = None  # the node's host when the repair was made
    finding_ids: tuple[str, ...] = ()
    finished_at: dt.datetime | None = None  # when it succeeded / failed / was dismissed
    incident_key: str | None = None  # "leaf_switch=leaf-02" for an incident
    node_ids: tuple[str, ...] = ()  # an incident's member nodes
    source: RepairSource = RepairSource.POLICY


@dataclass(frozen=True, slots=True)
class ClusterFacts:
    """One cluster as the policy sees it at ``now``.

    ``findings``: every open finding of the cluster's nodes, plus closed ones that a
    repair in ``repairs`` names or that closed within the ladder window (for the
    catalog's repeat escalation and for TTL). ``repairs``: every open repair, plus ended,
    rejected and resolved ones that finished within ``max(ladder_window_s, cooldown_s)``.
    """

    cluster_id: str
    nodes: tuple[NodeFact, ...]
    findings: tuple[FindingFact, ...]
    repairs: tuple[RepairFact, ...]
    breaker_tripped: bool = False
    # Actions the cluster's provider cannot take (SSH cannot reinstall; a BMC cannot reset
    # one GPU): a recommendation climbs past them to the next rung it can take.
    unsupported: frozenset[RepairAction] = frozenset()


# -- decisions -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Propose:
    """A new recommendation for one node."""

    node_id: str
    action: RepairAction
    signature_id: str
    finding_ids: tuple[str, ...]
    reason: str  # one line for a human: what is wrong and what to do
    rule: str  # which rule chose the action, e.g. "catalog xid-79 → reboot; ladder: ..."
    evidence: dict[str, Any] = field(default_factory=dict)
    auto_approve: bool = False


@dataclass(frozen=True, slots=True)
class Update:
    """A pending recommendation changes in place: a worse action (``escalated``) or new
    findings behind the same one."""

    repair_id: str
    action: RepairAction
    signature_id: str
    finding_ids: tuple[str, ...]
    reason: str
    rule: str
    evidence: dict[str, Any] = field(default_factory=dict)
    escalated_from: RepairAction | None = None
    node_ids: tuple[str, ...] = ()  # an incident's members, when they change
    auto_approve: bool = False


@dataclass(frozen=True, slots=True)
class Resolve:
    """A pending recommendation whose findings all cleared ``ttl_s`` ago."""

    repair_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Supersede:
    """A pending node recommendation folded into an incident."""

    repair_id: str
    reason: str
    incident_key: str


@dataclass(frozen=True, slots=True)
class ProposeIncident:
    incident_key: str  # "leaf_switch=leaf-02"
    node_ids: tuple[str, ...]
    signature_id: str  # the most severe signature among the members
    finding_ids: tuple[str, ...]
    reason: str
    rule: str
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Hold:
    """Something the policy would recommend but may not yet (cooldown). Informational."""

    node_id: str
    reason: str
    until: dt.datetime | None = None


Decision = Propose | Update | Resolve | Supersede | ProposeIncident | Hold
