"""Request bodies of the repair queue, node actions, the repair policy and the breaker."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from gpufleet.core.agent_protocol import MAX_GPUS_PER_NODE
from gpufleet.core.enums import RepairAction
from gpufleet.core.models import NodeAction
from gpufleet.core.repair.models import NODE_ACTIONS, DrainTimeoutAction
from gpufleet.core.signatures.catalog import get_signature
from gpufleet.server.schemas.common import Request

Reason = Annotated[str, Field(min_length=1, max_length=1000)]
Seconds = Annotated[float, Field(ge=0, le=365 * 86400)]


class ApproveRepairRequest(Request):
    reason: Annotated[str, Field(max_length=1000)] = ""
    # Let the drain kill jobs still running at its timeout. Never the default.
    force: Annotated[bool, Field(strict=True)] = False


class DismissRepairRequest(Request):
    reason: Reason


class ForceRepairRequest(Request):
    reason: Reason


# The node actions that run as a repair (cordon → drain → act → verify).
REPAIR_NODE_ACTIONS: dict[NodeAction, RepairAction] = {
    NodeAction.REBOOT: RepairAction.REBOOT,
    NodeAction.REPROVISION: RepairAction.REPROVISION,
    NodeAction.REPLACE: RepairAction.FAILOVER,
    NodeAction.REMOVE: RepairAction.REMOVE,
    NodeAction.RESET_GPU: RepairAction.RESET_GPU,
}


class NodeActionRequest(Request):
    action: NodeAction
    reason: Reason
    force: Annotated[bool, Field(strict=True)] = False
    gpu_index: Annotated[int, Field(ge=0, lt=MAX_GPUS_PER_NODE, strict=True)] | None = None


class AutoApproveRuleIn(Request):
    signature_id: Annotated[str, Field(min_length=1, max_length=80)]
    action: RepairAction

    @field_validator("signature_id")
    @classmethod
    def _known(cls, value: str) -> str:
        if get_signature(value) is None:
            raise ValueError(f"unknown signature {value!r}; use an id from the catalog")
        return value

    @field_validator("action")
    @classmethod
    def _node_action(cls, value: RepairAction) -> RepairAction:
        if value not in NODE_ACTIONS:
            allowed = ", ".join(sorted(a.value for a in NODE_ACTIONS))
            raise ValueError(f"{value.value} is not a node repair; one of: {allowed}")
        return value


class RepairPolicyRequest(Request):
    """A whole policy (PUT replaces it); fields left out take their defaults."""

    ttl_s: Seconds = 300.0
    cooldown_s: Seconds = 1800.0
    ladder_window_s: Seconds = 7 * 86400.0
    breaker_max_share: Annotated[float, Field(gt=0, le=1)] = 0.10
    incident_min_nodes: Annotated[int, Field(ge=2, le=10_000, strict=True)] = 3
    incident_window_s: Seconds = 300.0
    drain_timeout_s: Seconds = 3600.0
    drain_timeout_action: DrainTimeoutAction = DrainTimeoutAction.WAIT
    verify_settle_s: Seconds = 30.0
    verify_timeout_s: Seconds = 900.0
    auto_approve: Annotated[list[AutoApproveRuleIn], Field(max_length=500)] = []


class ReplayRequest(Request):
    days: Annotated[float, Field(gt=0, le=90)] = 7.0
    cluster_id: Annotated[str, Field(max_length=36)] | None = None
    # Try another policy over the same history; None: the project's current one.
    policy: RepairPolicyRequest | None = None


class ResetBreakerRequest(Request):
    reason: Reason
