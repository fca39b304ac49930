"""Allowed state changes, as data. One function per entity applies them (in services)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import TypeVar

from gpufleet.core.enums import CheckStatus, ClusterStatus, NodeState, RepairStatus
from gpufleet.core.errors import InvalidTransition

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
    N.REMOVED: frozenset(),
}

REPAIR_TRANSITIONS: Mapping[RepairStatus, frozenset[RepairStatus]] = {
    R.PROPOSED: frozenset({R.APPROVED, R.REJECTED, R.SUPERSEDED, R.RESOLVED}),
    R.APPROVED: frozenset({R.CORDONING, R.FAILED}),
    R.CORDONING: frozenset({R.DRAINING, R.FAILED}),
    R.DRAINING: frozenset({R.ACTING, R.FAILED}),
    R.ACTING: frozenset({R.VERIFYING, R.FAILED}),
    R.VERIFYING: frozenset({R.SUCCEEDED, R.FAILED}),
    R.REJECTED: frozenset(),
    R.SUPERSEDED: frozenset(),
    R.RESOLVED: frozenset(),
    R.SUCCEEDED: frozenset(),
    R.FAILED: frozenset(),
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
