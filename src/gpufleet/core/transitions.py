"""Allowed state changes, as data: one table per lifecycle, one ``Lifecycle`` naming its
column, its event and its audit action. ``server/services/transitions.py`` applies them:
the one function that changes a status writes the event and the audit row."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Generic, TypeVar

from gpufleet.core.acceptance import AcceptanceStatus
from gpufleet.core.agent_protocol import CommandStatus
from gpufleet.core.autoscaling import AutoscaleStatus
from gpufleet.core.enums import (
    AcceptanceStage,
    CheckStatus,
    ClusterStatus,
    EventKind,
    NodeState,
    RepairStatus,
    RolloutNodeStatus,
    RolloutStatus,
    StartupStatus,
)
from gpufleet.core.errors import InvalidTransition
from gpufleet.core.inventory import HostState

C = ClusterStatus
N = NodeState
R = RepairStatus
S = TypeVar("S", bound=StrEnum)

CLUSTER_TRANSITIONS: Mapping[ClusterStatus, frozenset[ClusterStatus]] = {
    C.PROVISIONING: frozenset({C.ACCEPTANCE, C.READY, C.DEGRADED, C.DELETING, C.FAILED}),
    C.ACCEPTANCE: frozenset({C.READY, C.DEGRADED, C.PROVISIONING, C.DELETING, C.FAILED}),
    C.READY: frozenset({C.DEGRADED, C.PROVISIONING, C.DELETING}),
    C.DEGRADED: frozenset({C.READY, C.PROVISIONING, C.DELETING}),
    C.FAILED: frozenset({C.PROVISIONING, C.DELETING}),
    C.DELETING: frozenset({C.DELETED}),
    C.DELETED: frozenset(),
}

NODE_TRANSITIONS: Mapping[NodeState, frozenset[NodeState]] = {
    N.PROVISIONING: frozenset({N.ACCEPTANCE, N.IN_SERVICE, N.FAILED, N.REMOVING}),
    N.ACCEPTANCE: frozenset({N.IN_SERVICE, N.CORDONED, N.FAILED, N.REMOVING}),
    N.IN_SERVICE: frozenset({N.CORDONED, N.DRAINING, N.REMOVING}),
    N.CORDONED: frozenset({N.IN_SERVICE, N.DRAINING, N.REPAIRING, N.REMOVING}),
    N.DRAINING: frozenset({N.DRAINED, N.CORDONED, N.IN_SERVICE, N.REMOVING}),
    N.DRAINED: frozenset({N.REPAIRING, N.IN_SERVICE, N.CORDONED, N.REMOVING}),
    N.REPAIRING: frozenset({N.ACCEPTANCE, N.IN_SERVICE, N.CORDONED, N.FAILED, N.REMOVING}),
    N.FAILED: frozenset({N.PROVISIONING, N.REMOVING}),
    N.REMOVING: frozenset({N.REMOVED}),
    # A Slurm cloud node powered down comes back as itself when Slurm resumes it.
    N.REMOVED: frozenset({N.PROVISIONING}),
}

REPAIR_TRANSITIONS: Mapping[RepairStatus, frozenset[RepairStatus]] = {
    R.PROPOSED: frozenset({R.APPROVED, R.REJECTED, R.SUPERSEDED, R.RESOLVED}),
    R.APPROVED: frozenset({R.CORDONING, R.FAILED, R.RELEASED}),
    R.CORDONING: frozenset({R.DRAINING, R.FAILED, R.RELEASED}),
    R.DRAINING: frozenset({R.ACTING, R.FAILED, R.RELEASED}),
    R.ACTING: frozenset({R.VERIFYING, R.FAILED}),
    R.VERIFYING: frozenset({R.SUCCEEDED, R.FAILED}),
    R.REJECTED: frozenset(),
    R.SUPERSEDED: frozenset(),
    R.RESOLVED: frozenset(),
    R.SUCCEEDED: frozenset(),
    R.FAILED: frozenset(),
    R.RELEASED: frozenset(),
}

K = CheckStatus
CHECK_TRANSITIONS: Mapping[CheckStatus, frozenset[CheckStatus]] = {
    K.PENDING: frozenset({K.RUNNING, K.ERROR, K.CANCELLED}),
    K.RUNNING: frozenset({K.PASSED, K.FAILED, K.ERROR, K.CANCELLED}),
    K.PASSED: frozenset(),
    K.FAILED: frozenset(),
    K.ERROR: frozenset(),
    K.CANCELLED: frozenset(),
}

# pending → sent (an agent took it) → succeeded | failed | timed_out; any of pending/sent
# → expired (not taken by ``expires_at``, or taken and not answered by ``deadline_at``)
# or cancelled.
M = CommandStatus
COMMAND_TRANSITIONS: Mapping[CommandStatus, frozenset[CommandStatus]] = {
    M.PENDING: frozenset({M.SENT, M.EXPIRED, M.CANCELLED}),
    M.SENT: frozenset({M.SUCCEEDED, M.FAILED, M.TIMED_OUT, M.EXPIRED, M.CANCELLED}),
    M.SUCCEEDED: frozenset(),
    M.FAILED: frozenset(),
    M.TIMED_OUT: frozenset(),
    M.EXPIRED: frozenset(),
    M.CANCELLED: frozenset(),
}
FINAL_COMMAND_STATUSES = frozenset(s for s, nxt in COMMAND_TRANSITIONS.items() if not nxt)

# A run starts when the acceptance loop queues its first checks; it ends passed or failed
# by the verdicts, in error (timed out), or cancelled (the cluster went, acceptance tests
# were turned off) — the last two also before it started.
A = AcceptanceStatus
ACCEPTANCE_TRANSITIONS: Mapping[AcceptanceStatus, frozenset[AcceptanceStatus]] = {
    A.PENDING: frozenset({A.RUNNING, A.ERROR, A.CANCELLED}),
    A.RUNNING: frozenset({A.PASSED, A.FAILED, A.ERROR, A.CANCELLED}),
    A.PASSED: frozenset(),
    A.FAILED: frozenset(),
    A.ERROR: frozenset(),
    A.CANCELLED: frozenset(),
}

# Forward only. A run ends (its report written) from the node or the cluster stage: to
# ``gating`` when it still has nodes and a cluster to move, else straight to ``done`` (a
# repair's run, gated by the repair; a cancelled one).
G = AcceptanceStage
ACCEPTANCE_STAGE_TRANSITIONS: Mapping[AcceptanceStage, frozenset[AcceptanceStage]] = {
    G.NODE: frozenset({G.CLUSTER, G.GATING, G.DONE}),
    G.CLUSTER: frozenset({G.GATING, G.DONE}),
    G.GATING: frozenset({G.DONE}),
    G.DONE: frozenset(),
}

U = StartupStatus
STARTUP_TRANSITIONS: Mapping[StartupStatus, frozenset[StartupStatus]] = {
    U.RUNNING: frozenset({U.SUCCEEDED, U.FAILED, U.CANCELLED}),
    U.SUCCEEDED: frozenset(),
    U.FAILED: frozenset(),
    U.CANCELLED: frozenset(),
}

# An inventory host: a spare is claimed by a failover and then runs the new node; a
# removed or replaced host goes out of service (hardware service) and comes back as a
# spare or straight into service once fixed. A claim that was never used goes back.
H = HostState
HOST_TRANSITIONS: Mapping[HostState, frozenset[HostState]] = {
    H.SPARE: frozenset({H.CLAIMED, H.IN_SERVICE, H.OUT_OF_SERVICE}),
    H.CLAIMED: frozenset({H.IN_SERVICE, H.SPARE, H.OUT_OF_SERVICE}),
    H.IN_SERVICE: frozenset({H.SPARE, H.OUT_OF_SERVICE}),
    H.OUT_OF_SERVICE: frozenset({H.SPARE, H.IN_SERVICE}),
}

# A change of a cluster's size acts at once (its nodes are made, or held for removal) and
# ends when they are in service or gone; a step down none of whose nodes could go (each
# took work first) is cancelled.
Z = AutoscaleStatus
AUTOSCALE_TRANSITIONS: Mapping[AutoscaleStatus, frozenset[AutoscaleStatus]] = {
    Z.ACTING: frozenset({Z.SUCCEEDED, Z.FAILED, Z.CANCELLED}),
    Z.SUCCEEDED: frozenset(),
    Z.FAILED: frozenset(),
    Z.CANCELLED: frozenset(),
}

# A rollout waits for its window (scheduled ⇄ running as windows open and close), pauses
# on its failure budget or an admin's word, and ends when every node is done; an abort
# lets the nodes under way finish (aborting) and starts no other.
W = RolloutStatus
ROLLOUT_TRANSITIONS: Mapping[RolloutStatus, frozenset[RolloutStatus]] = {
    W.SCHEDULED: frozenset({W.RUNNING, W.PAUSED, W.ABORTING, W.ABORTED}),
    W.RUNNING: frozenset({W.SCHEDULED, W.PAUSED, W.ABORTING, W.SUCCEEDED}),
    # (a paused rollout whose last nodes under way, or rollbacks, finish has succeeded)
    W.PAUSED: frozenset({W.SCHEDULED, W.RUNNING, W.ABORTING, W.ABORTED, W.SUCCEEDED}),
    W.ABORTING: frozenset({W.ABORTED}),
    W.SUCCEEDED: frozenset(),
    W.ABORTED: frozenset(),
}

# A node's migration is one repair (cordon → drain → reprovision → re-acceptance); its
# end is the repair's. A rollback is one more, to the stack the node came from.
P = RolloutNodeStatus
ROLLOUT_NODE_TRANSITIONS: Mapping[RolloutNodeStatus, frozenset[RolloutNodeStatus]] = {
    P.PENDING: frozenset({P.MIGRATING, P.SKIPPED}),
    # Back in line: its repair was released at the window's close (policy release).
    P.MIGRATING: frozenset({P.DONE, P.FAILED, P.PENDING}),
    P.DONE: frozenset({P.ROLLING_BACK}),
    P.FAILED: frozenset({P.ROLLING_BACK, P.MIGRATING}),
    P.ROLLING_BACK: frozenset({P.ROLLED_BACK, P.FAILED}),
    P.ROLLED_BACK: frozenset(),
    P.SKIPPED: frozenset(),
}


@dataclass(frozen=True)
class Lifecycle(Generic[S]):
    """One lifecycle: its states, its table, and how a change of it is recorded."""

    states: type[S]
    table: Mapping[S, frozenset[S]]
    column: str  # the row's attribute that holds the state
    event_kind: EventKind
    audit_action: str  # the audit row's action, e.g. "repair.status"
    object_type: str  # the audit row's object type, e.g. "repair"


CLUSTER = Lifecycle(
    ClusterStatus, CLUSTER_TRANSITIONS, "status", EventKind.CLUSTER_STATUS,
    "cluster.status", "cluster",
)  # fmt: skip
NODE = Lifecycle(NodeState, NODE_TRANSITIONS, "state", EventKind.NODE_STATE, "node.state", "node")
REPAIR = Lifecycle(
    RepairStatus, REPAIR_TRANSITIONS, "status", EventKind.REPAIR_STATUS,
    "repair.status", "repair",
)  # fmt: skip
CHECK_RUN = Lifecycle(
    CheckStatus, CHECK_TRANSITIONS, "status", EventKind.CHECK_STATUS,
    "check.status", "check_run",
)  # fmt: skip
NODE_COMMAND = Lifecycle(
    CommandStatus, COMMAND_TRANSITIONS, "status", EventKind.NODE_COMMAND,
    "command.status", "node_command",
)  # fmt: skip
ACCEPTANCE_RUN = Lifecycle(
    AcceptanceStatus, ACCEPTANCE_TRANSITIONS, "status", EventKind.ACCEPTANCE_STATUS,
    "acceptance.status", "acceptance_run",
)  # fmt: skip
ACCEPTANCE_RUN_STAGE = Lifecycle(
    AcceptanceStage, ACCEPTANCE_STAGE_TRANSITIONS, "stage", EventKind.ACCEPTANCE_STAGE,
    "acceptance.stage", "acceptance_run",
)  # fmt: skip
STARTUP_RUN = Lifecycle(
    StartupStatus, STARTUP_TRANSITIONS, "status", EventKind.STARTUP_STATUS,
    "startup.status", "node_startup",
)  # fmt: skip
HOST = Lifecycle(HostState, HOST_TRANSITIONS, "state", EventKind.HOST_STATE, "host.state", "host")
AUTOSCALE_ACTION = Lifecycle(
    AutoscaleStatus, AUTOSCALE_TRANSITIONS, "status", EventKind.AUTOSCALE_STATUS,
    "autoscale.status", "autoscale_action",
)  # fmt: skip
ROLLOUT = Lifecycle(
    RolloutStatus, ROLLOUT_TRANSITIONS, "status", EventKind.ROLLOUT_STATUS,
    "rollout.status", "rollout",
)  # fmt: skip
ROLLOUT_NODE = Lifecycle(
    RolloutNodeStatus, ROLLOUT_NODE_TRANSITIONS, "status", EventKind.ROLLOUT_NODE,
    "rollout.node", "rollout_node",
)  # fmt: skip

# Every lifecycle, by name: the table-driven test walks them all.
LIFECYCLES: Mapping[str, Lifecycle[Any]] = {
    "cluster": CLUSTER,
    "node": NODE,
    "repair": REPAIR,
    "check_run": CHECK_RUN,
    "node_command": NODE_COMMAND,
    "acceptance_run": ACCEPTANCE_RUN,
    "acceptance_stage": ACCEPTANCE_RUN_STAGE,
    "startup_run": STARTUP_RUN,
    "host": HOST,
    "autoscale_action": AUTOSCALE_ACTION,
    "rollout": ROLLOUT,
    "rollout_node": ROLLOUT_NODE,
}


def check_transition(
    table: Mapping[S, frozenset[S]], *, entity: str, current: S, target: S
) -> None:
    """Raise ``InvalidTransition`` unless ``current → target`` is in ``table``.

    A transition to the current state is allowed (and a no-op for the caller).
    """
    if current == target:
        return
    if target not in table.get(current, frozenset()):
        allowed = ", ".join(sorted(s.value for s in table.get(current, frozenset()))) or "none"
        raise InvalidTransition(
            f"{entity} cannot go from {current.value} to {target.value} (allowed: {allowed})",
            field="status",
        )
